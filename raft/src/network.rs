//! The client side of the Raft transport: openraft's network calls become
//! gRPC calls to the peer's `raftmq.v1.Raft` service.
//!
//! One lazily connected channel per peer address is shared by all of
//! openraft's clients for that peer; tonic reconnects it on failure.
//! Replication and heartbeats use the bidirectional `Append` stream.
//!
//! A peer that cannot be reached is retried with a growing delay
//! ([`reconnect_delay`]) by its replication stream: openraft's own backoff
//! only paces the requests of an open stream, so without this a dead peer's
//! replication task would reopen its stream (and log a warning) as fast as
//! the connect fails. Heartbeats are not delayed: openraft sends them on
//! its own interval with its own timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{AnyError, OptionalSend};
use tonic::transport::{Channel, Endpoint};

use crate::pb::raft_client::RaftClient;
use crate::types::{NodeAddr, NodeId, Snapshot, TypeConfig, Vote};
use crate::{pb, wire};

/// Upper bound of one transport message, each way. openraft's
/// `max_payload_entries` times the largest record must fit.
pub const MAX_MESSAGE_SIZE: usize = 256 << 20;
/// Snapshot data is sent in chunks of this size.
pub const SNAPSHOT_CHUNK: usize = 1 << 20;
/// First and longest wait before reopening the stream to a peer that could
/// not be reached: short enough that a restarted peer is caught up within
/// about a second, long enough that a dead one costs nothing.
pub const RECONNECT_MIN: Duration = Duration::from_millis(50);
pub const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The wait before the next attempt after `failures` failed ones in a row:
/// doubling from [`RECONNECT_MIN`] up to [`RECONNECT_MAX`], none after a
/// success.
pub fn reconnect_delay(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => RECONNECT_MIN.saturating_mul(1u32 << (n - 1).min(16)).min(RECONNECT_MAX),
    }
}

/// Makes openraft's per-peer clients.
#[derive(Clone)]
pub struct NetworkFactory {
    /// The group every call is addressed in (see `raft.proto`).
    group: Arc<str>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Addresses to dial for some peers instead of the ones in the
    /// membership (a peer reachable from here through a NAT or a proxy).
    dial: Arc<HashMap<NodeId, String>>,
    dialer: crate::tls::Dialer,
}

impl NetworkFactory {
    pub fn new(group: &str, dial: HashMap<NodeId, String>, dialer: crate::tls::Dialer) -> NetworkFactory {
        NetworkFactory {
            group: Arc::from(group),
            channels: Arc::default(),
            dial: Arc::new(dial),
            dialer,
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad raft address {addr:?}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10));
        let channel = self.dialer.channel(endpoint, crate::tls::dial::host_of(addr));
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

impl NetworkFactory {
    /// Asks `leader`, at `node`, for a ReadIndex (the `ReadIndex` RPC): the
    /// log index this node must apply to see everything its group
    /// committed before now.
    pub async fn read_index(&self, leader: NodeId, node: &NodeAddr, within: Duration) -> Result<u64, String> {
        let conn = self.clone().new_client(leader, node).await;
        let mut client = conn.client().map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(within, client.read_index(conn.addressed(pb::ReadIndexRequest {})))
            .await
            .map_err(|_| format!("leader {leader} did not answer a ReadIndex in time"))?
            .map_err(|s| format!("leader {leader} gave no ReadIndex: {}", s.message()))?;
        Ok(reply.into_inner().index)
    }
}

/// openraft's client for one peer.
pub struct Connection {
    group: Arc<str>,
    target: NodeId,
    client: Result<RaftClient<Channel>, String>,
    /// Replication streams in a row that could not be opened because the
    /// peer was unreachable, and when the last of them failed.
    failures: u32,
    failed_at: Option<tokio::time::Instant>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> Connection {
        let addr = self.dial.get(&target).unwrap_or(&node.raft_addr).clone();
        let client = self.channel(&addr).map(|ch| {
            RaftClient::new(ch)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE)
        });
        Connection {
            group: self.group.clone(),
            target,
            client,
            failures: 0,
            failed_at: None,
        }
    }
}

fn unreachable(msg: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(msg.to_string())))
}

fn network(msg: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&AnyError::error(msg.to_string())))
}

fn from_status(target: NodeId, s: tonic::Status) -> RPCError<TypeConfig> {
    let msg = format!("node {target}: {}: {}", s.code(), s.message());
    match s.code() {
        tonic::Code::Unavailable => unreachable(msg),
        _ => network(msg),
    }
}

/// Metadata headers naming the group and node a call is meant for.
pub const GROUP_HEADER: &str = "x-raftmq-group";
pub const TARGET_HEADER: &str = "x-raftmq-target";

impl Connection {
    /// Wraps a message with the addressing headers.
    fn addressed<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Ok(g) = self.group.parse() {
            r.metadata_mut().insert(GROUP_HEADER, g);
        }
        r.metadata_mut().insert(TARGET_HEADER, self.target.into());
        r
    }

    fn client(&self) -> Result<RaftClient<Channel>, RPCError<TypeConfig>> {
        self.client.clone().map_err(unreachable)
    }

    /// Opens the append stream. `paced` (replication streams, not
    /// heartbeats, whose own timeout must stay theirs) first waits out the
    /// reconnect delay since the last failure to reach the peer; the wait
    /// is measured from that failure, so an attempt cancelled while waiting
    /// does not start the wait again.
    async fn open_append<S>(
        &mut self,
        input: S,
        option: &RPCOption,
        paced: bool,
    ) -> Result<
        impl Stream<Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> + use<S>,
        RPCError<TypeConfig>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let mut client = self.client()?;
        let target = self.target;
        if paced && let Some(at) = self.failed_at {
            tokio::time::sleep_until(at + reconnect_delay(self.failures)).await;
        }
        let requests = input.map(|r| wire::append_to_pb(&r));
        let opened = tokio::time::timeout(
            option.soft_ttl().max(Duration::from_millis(200)),
            client.append(self.addressed(requests)),
        )
        .await
        .map_err(|_| network(format!("node {target}: opening the append stream timed out")))
        .and_then(|r| r.map_err(|s| from_status(target, s)));
        let response = match opened {
            Ok(r) => {
                (self.failures, self.failed_at) = (0, None);
                r
            }
            Err(e) => {
                if paced && matches!(e, RPCError::Unreachable(_)) {
                    self.failures = self.failures.saturating_add(1);
                    self.failed_at = Some(tokio::time::Instant::now());
                }
                return Err(e);
            }
        };
        Ok(response.into_inner().map(move |r| match r {
            Ok(pb) => wire::append_result_from_pb(pb).map_err(|e| network(format!("node {target}: {e}"))),
            Err(s) => Err(from_status(target, s)),
        }))
    }
}

impl RaftNetworkV2<TypeConfig> for Connection {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut responses = Box::pin(self.open_append(futures::stream::iter([rpc]), &option, false).await?);
        match responses.next().await {
            Some(r) => r.map(AppendEntriesResponse::from),
            None => Err(network(format!(
                "node {}: append stream ended without a response",
                self.target
            ))),
        }
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>, RPCError<TypeConfig>>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        Box::pin(async move {
            let responses = self.open_append(input, &option, true).await?;
            let boxed: BoxStream<'s, _> = Box::pin(responses);
            Ok(boxed)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut client = self.client()?;
        let target = self.target;
        let resp = tokio::time::timeout(
            option.hard_ttl(),
            client.vote(self.addressed(wire::vote_req_to_pb(&rpc))),
        )
        .await
        .map_err(|_| network(format!("node {target}: vote timed out")))?
        .map_err(|s| from_status(target, s))?;
        wire::vote_resp_from_pb(resp.into_inner()).map_err(|e| network(format!("node {target}: {e}")))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self.client()?;
        let target = self.target;
        let meta_json = serde_json::to_vec(&snapshot.meta).map_err(|e| network(e.to_string()))?;
        let data = bytes::Bytes::from(snapshot.snapshot);
        let mut chunks = vec![pb::SnapshotChunk {
            chunk: Some(pb::snapshot_chunk::Chunk::Header(pb::SnapshotHeader {
                vote: Some(wire::vote_to_pb(&vote)),
                meta_json,
                total_len: data.len() as u64,
            })),
        }];
        let mut at = 0;
        while at < data.len() {
            let end = (at + SNAPSHOT_CHUNK).min(data.len());
            chunks.push(pb::SnapshotChunk {
                chunk: Some(pb::snapshot_chunk::Chunk::Data(data.slice(at..end))),
            });
            at = end;
        }
        let send = client.install_snapshot(self.addressed(futures::stream::iter(chunks)));
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            r = send => r.map_err(|s| from_status(target, s))?,
        };
        let vote = wire::vote_from_pb(reply.into_inner().vote).map_err(|e| network(format!("node {target}: {e}")))?;
        Ok(SnapshotResponse::new(vote))
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut client = self.client()?;
        let target = self.target;
        let reply = tokio::time::timeout(
            option.hard_ttl(),
            client.transfer_leader(self.addressed(wire::transfer_to_pb(&req))),
        )
        .await
        .map_err(|_| network(format!("node {target}: transfer-leader timed out")))?
        .map_err(|s| from_status(target, s))?
        .into_inner();
        if reply.error.is_empty() {
            Ok(Ok(()))
        } else {
            Err(network(format!(
                "node {target} refused the leadership transfer: {}",
                reply.error
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_double_up_to_the_cap_and_reset() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        assert_eq!(reconnect_delay(1), RECONNECT_MIN);
        assert_eq!(reconnect_delay(2), RECONNECT_MIN * 2);
        assert_eq!(reconnect_delay(5), RECONNECT_MIN * 16);
        assert_eq!(reconnect_delay(6), RECONNECT_MAX);
        assert_eq!(reconnect_delay(u32::MAX), RECONNECT_MAX);
    }
}
