//! The server side of the Raft transport: requests from peers, validated and
//! fed into openraft.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use openraft::async_runtime::WatchReceiver;
use tonic::{Request, Response, Status, Streaming};

use crate::Raft;
use crate::catching_up::CatchingUp;
use crate::network::{GROUP_HEADER, TARGET_HEADER};
use crate::pb::raft_server;
use crate::state_machine::MAX_SNAPSHOT_BYTES;
use crate::tls::PeerInfo;
use crate::types::{Snapshot, SnapshotMeta};
use crate::{pb, wire};

/// Serves `raftmq.v1.Raft` for one node.
pub struct RaftService {
    raft: Raft,
    group: String,
    node_id: u64,
    /// One snapshot is received at a time: each buffers up to
    /// [`MAX_SNAPSHOT_BYTES`] (a group has one leader sending them).
    installs: Arc<tokio::sync::Semaphore>,
    catching_up: CatchingUp,
    /// The port is mutual TLS: every call must come from a member of this
    /// group, and may speak only for itself.
    members_only: bool,
    /// The store's `max_record_size`: an entry that would not fit is
    /// refused here, not by the store (whose error openraft takes as fatal).
    max_record_size: u64,
    /// This node's term ([`follow_term`]).
    term: Arc<AtomicU64>,
}

impl RaftService {
    pub fn new(
        raft: Raft,
        group: &str,
        node_id: u64,
        catching_up: CatchingUp,
        members_only: bool,
        max_record_size: u64,
    ) -> RaftService {
        RaftService {
            term: follow_term(&raft),
            raft,
            group: group.to_string(),
            node_id,
            installs: Arc::new(tokio::sync::Semaphore::new(1)),
            catching_up,
            members_only,
            max_record_size,
        }
    }

    /// Refuses a call addressed to another group or node, and, on a mutual
    /// TLS port, one from anyone but a member of this group. Gives the
    /// calling member's node id (none without TLS), which the call's vote
    /// must name: a member cannot campaign or lead in another's name.
    fn check<T>(&self, r: &Request<T>) -> Result<Option<u64>, Status> {
        self.check_address(r)?;
        if !self.members_only {
            return Ok(None);
        }
        let caller = PeerInfo::node_of(r).map_err(Status::unauthenticated)?;
        match caller {
            Some(id) if id.group == self.group => Ok(Some(id.node)),
            Some(id) => Err(Status::permission_denied(format!(
                "the caller's certificate names {id}, not a member of group {}",
                self.group
            ))),
            None => Err(Status::unauthenticated(
                "the Raft port admits only members, whose certificates name their group and node",
            )),
        }
    }

    fn check_address<T>(&self, r: &Request<T>) -> Result<(), Status> {
        let md = r.metadata();
        let group = md.get(GROUP_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        let target = md
            .get(TARGET_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if group != self.group || target != Some(self.node_id) {
            return Err(Status::failed_precondition(format!(
                "call addressed to group {group:?} node {target:?}, but this is group {:?} node {}",
                self.group, self.node_id
            )));
        }
        Ok(())
    }

    pub fn into_server(self) -> raft_server::RaftServer<RaftService> {
        raft_server::RaftServer::new(self)
            .max_decoding_message_size(crate::network::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::network::MAX_MESSAGE_SIZE)
    }
}

fn bad(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Refuses a vote that names another node than the calling member.
fn speaks_for_itself(caller: Option<u64>, vote: &crate::types::Vote) -> Result<(), Status> {
    match caller {
        Some(node) if vote.leader_id.voted_for != node => Err(Status::permission_denied(format!(
            "node {node} sent a vote in the name of node {}",
            vote.leader_id.voted_for
        ))),
        _ => Ok(()),
    }
}

/// How far ahead of this node's term a caller's may be. A real peer gets
/// ahead only by campaigning alone, one term per election timeout: 2^24
/// terms are weeks of that. Without the bound one forged call (on a port
/// without TLS) could raise the group's term to [`wire::MAX_TERM`], past
/// which no candidate may go, and no leader would ever be elected again;
/// with it, forgery must repeat 2^38 times. A peer that is that far
/// ahead still gets the group to its term: the answers it gives carry it.
pub const MAX_TERM_JUMP: u64 = 1 << 24;

/// This node's term, kept by a task that follows openraft's server
/// metrics (which change with the vote, not with every entry), so that
/// the check on every Append costs an atomic load: reading openraft's
/// metrics there, under a load that kept the leader busy, went with
/// elections in every run of `benches/overload.sh`.
fn follow_term(raft: &Raft) -> Arc<AtomicU64> {
    let mut metrics = raft.server_metrics();
    let term = Arc::new(AtomicU64::new(metrics.borrow_watched().vote.leader_id.term));
    let kept = term.clone();
    tokio::spawn(async move {
        // Ends with the node (its metrics sender is dropped).
        while metrics.changed().await.is_ok() {
            let now = metrics.borrow_watched().vote.leader_id.term;
            kept.store(now, Ordering::Relaxed);
        }
    });
    term
}

/// Refuses a call whose term is more than [`MAX_TERM_JUMP`] ahead of ours,
/// unless it comes from a member its certificate names (mutual TLS): a
/// member's term is what the group's is, and a node that never campaigns
/// (a learner, one added empty or catching up) must follow it however far
/// ahead forged calls may have pushed it on a port without TLS.
fn term_in_reach(caller: Option<u64>, current: &AtomicU64, term: u64) -> Result<(), Status> {
    if caller.is_some() {
        return Ok(());
    }
    let current = current.load(Ordering::Relaxed);
    if term > current.saturating_add(MAX_TERM_JUMP) {
        return Err(Status::failed_precondition(format!(
            "term {term} is more than {MAX_TERM_JUMP} ahead of this node's {current}"
        )));
    }
    Ok(())
}

/// Longest wait for the next chunk of a snapshot being received (the
/// sender streams them back to back): one install at a time, so a sender
/// that stalls must not keep the slot.
const SNAPSHOT_CHUNK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The slowest a snapshot may come, in bytes per second, on top of
/// [`SNAPSHOT_CHUNK_WAIT`] (256 MiB, the most, in about 4.5 minutes).
const SNAPSHOT_MIN_RATE: u64 = 1 << 20;

/// How long a ReadIndex may wait for a quorum's heartbeat answers.
const READ_INDEX_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

type AppendStream = Pin<Box<dyn Stream<Item = Result<pb::AppendResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    type AppendStream = AppendStream;

    async fn append(&self, request: Request<Streaming<pb::AppendRequest>>) -> Result<Response<AppendStream>, Status> {
        let caller = self.check(&request)?;
        // A malformed request ends the input; its error is sent after the
        // answers to the requests before it.
        let failure: Arc<Mutex<Option<Status>>> = Arc::default();
        let noted = failure.clone();
        let max_record_size = self.max_record_size;
        let term = self.term.clone();
        let input = request.into_inner().scan((), move |_, r| {
            let decoded = r
                .and_then(|pb| wire::append_from_pb(pb, max_record_size).map_err(bad))
                .and_then(|req| speaks_for_itself(caller, &req.vote).map(|()| req))
                .and_then(|req| term_in_reach(caller, &term, req.vote.leader_id.term).map(|()| req));
            let next = match decoded {
                Ok(req) => Some(req),
                Err(status) => {
                    *noted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status);
                    None
                }
            };
            futures::future::ready(next)
        });
        let input = Box::pin(input);
        let answers = self.raft.stream_append(input).map(|r| match r {
            Ok(result) => Ok(wire::append_result_to_pb(result)),
            Err(fatal) => Err(Status::unavailable(format!("raft stopped: {fatal}"))),
        });
        let trailer =
            futures::stream::once(
                async move { failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() },
            )
            .filter_map(|s| async move { s.map(Err) });
        Ok(Response::new(Box::pin(answers.chain(trailer))))
    }

    async fn vote(&self, request: Request<pb::VoteRequest>) -> Result<Response<pb::VoteResponse>, Status> {
        let caller = self.check(&request)?;
        // Its log may lack entries it helped commit: a vote from it could
        // elect a leader without them.
        if let Some(target) = self.catching_up.target() {
            return Err(Status::unavailable(format!(
                "node {} lost committed entries to damage and votes again once it has applied index {target}",
                self.node_id
            )));
        }
        let req = wire::vote_req_from_pb(request.into_inner()).map_err(bad)?;
        speaks_for_itself(caller, &req.vote)?;
        term_in_reach(caller, &self.term, req.vote.leader_id.term)?;
        let resp = self
            .raft
            .vote(req)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(wire::vote_resp_to_pb(&resp)))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::SnapshotReply>, Status> {
        let caller = self.check(&request)?;
        let _installing = self
            .installs
            .clone()
            .try_acquire_owned()
            .map_err(|_| Status::unavailable("another snapshot is being received; retry"))?;
        use pb::snapshot_chunk::Chunk;
        let mut chunks = request.into_inner();
        // A sender that stalls gives up the one install slot.
        let stalled = || Status::deadline_exceeded(format!("no snapshot chunk for {SNAPSHOT_CHUNK_WAIT:?}"));
        let header = match tokio::time::timeout(SNAPSHOT_CHUNK_WAIT, chunks.next())
            .await
            .map_err(|_| stalled())?
        {
            Some(Ok(pb::SnapshotChunk {
                chunk: Some(Chunk::Header(h)),
            })) => h,
            Some(Err(s)) => return Err(s),
            _ => return Err(bad("a snapshot must start with its header")),
        };
        let vote = wire::vote_from_pb(header.vote).map_err(bad)?;
        speaks_for_itself(caller, &vote)?;
        term_in_reach(caller, &self.term, vote.leader_id.term)?;
        let meta: SnapshotMeta =
            serde_json::from_slice(&header.meta_json).map_err(|e| bad(format!("snapshot meta: {e}")))?;
        if header.total_len > MAX_SNAPSHOT_BYTES {
            return Err(bad(format!(
                "snapshot of {} bytes exceeds {MAX_SNAPSHOT_BYTES}",
                header.total_len
            )));
        }
        // openraft asserts that a snapshot's last log id is not newer than
        // the vote that sends it; a peer must not be able to trip that.
        if meta.last_log_id.is_some_and(|l| l.leader_id.term > vote.leader_id.term) {
            return Err(bad("snapshot newer than the vote that sends it"));
        }
        // Grows as data arrives: the announced length is not trusted for an
        // allocation up front.
        let mut data = Vec::new();
        // A trickle of tiny chunks would keep each wait short: the whole
        // stream must also come at a floor rate.
        let deadline = tokio::time::Instant::now()
            + SNAPSHOT_CHUNK_WAIT
            + std::time::Duration::from_secs(header.total_len / SNAPSHOT_MIN_RATE);
        let slow =
            || Status::deadline_exceeded(format!("a snapshot must come at {SNAPSHOT_MIN_RATE} bytes/s at least"));
        loop {
            let wait = SNAPSHOT_CHUNK_WAIT.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            let next = tokio::time::timeout(wait, chunks.next()).await.map_err(|_| {
                if tokio::time::Instant::now() >= deadline {
                    slow()
                } else {
                    stalled()
                }
            })?;
            let Some(chunk) = next else { break };
            match chunk?.chunk {
                Some(Chunk::Data(d)) if d.is_empty() => return Err(bad("an empty snapshot chunk")),
                Some(Chunk::Data(d)) if (data.len() + d.len()) as u64 <= header.total_len => data.extend_from_slice(&d),
                Some(Chunk::Data(_)) => return Err(bad("snapshot data longer than announced")),
                _ => return Err(bad("a snapshot has one header")),
            }
        }
        if data.len() as u64 != header.total_len {
            return Err(bad("snapshot data shorter than announced"));
        }
        let (meta, data) = tokio::task::spawn_blocking(move || {
            crate::state_machine::check_snapshot(&meta, &data).map(|()| (meta, data))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(bad)?;
        let resp = self
            .raft
            .install_full_snapshot(vote, Snapshot { meta, snapshot: data })
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(pb::SnapshotReply {
            vote: Some(wire::vote_to_pb(&resp.vote)),
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderReply>, Status> {
        let caller = self.check(&request)?;
        let req = wire::transfer_from_pb(request.into_inner()).map_err(bad)?;
        speaks_for_itself(caller, req.from_leader())?;
        let result = self
            .raft
            .handle_transfer_leader(req)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(pb::TransferLeaderReply {
            error: result.err().map(|e| e.to_string()).unwrap_or_default(),
        }))
    }

    async fn read_index(&self, request: Request<pb::ReadIndexRequest>) -> Result<Response<pb::ReadIndexReply>, Status> {
        self.check(&request)?;
        if !self.raft.is_leader() {
            return Err(Status::failed_precondition("not the leader"));
        }
        // The heartbeat round waits for a quorum that may not answer.
        let read = self.raft.get_read_log_id(openraft::ReadPolicy::ReadIndex);
        match tokio::time::timeout(READ_INDEX_WAIT, read).await {
            Ok(Ok((read_log_id, _))) => Ok(Response::new(pb::ReadIndexReply {
                index: read_log_id.index(),
            })),
            Ok(Err(e)) => Err(Status::failed_precondition(e.to_string())),
            Err(_) => Err(Status::unavailable("no quorum confirmed this leader in time")),
        }
    }
}
