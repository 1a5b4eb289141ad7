//! The workload's client: the RocketMQ 5 gRPC protocol (`apache.rocketmq.v2`)
//! spoken to one node, as an application would.
//!
//! Every call returns a [`Outcome`]: whether the operation certainly
//! happened, certainly did not, or may have. A definite failure is a refusal
//! the broker gives before it proposes anything (a connection that never
//! opened, a bad request, no leader), everything else that is not a success
//! (a timeout, a reset mid-call, a Raft outcome the broker could not learn)
//! is unknown. The checker holds the broker to this: a message whose send
//! "failed" must never be read.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

pub mod v2 {
    //! Generated from `proto/apache/rocketmq/v2/`.
    #![allow(clippy::all)]
    tonic::include_proto!("apache.rocketmq.v2");
}

use v2::messaging_service_client::MessagingServiceClient;

/// Status codes of `apache.rocketmq.v2.Code` the harness tells apart.
mod code {
    pub const OK: i32 = 20000;
    /// 40000..=49999: the request was refused as it stood.
    pub const BAD_REQUEST_FIRST: i32 = 40000;
    pub const BAD_REQUEST_LAST: i32 = 49999;
    pub const OFFSET_NOT_FOUND: i32 = 40404;
    /// A pull past the end of the queue (a lagging follower's).
    pub const ILLEGAL_OFFSET: i32 = 40019;
    /// A pull at the end of the queue: nothing new.
    pub const MESSAGE_NOT_FOUND: i32 = 40401;
    /// No leader: raftmq refused before proposing.
    pub const HA_NOT_AVAILABLE: i32 = 50002;
}

#[derive(Debug)]
pub enum Outcome<T> {
    Ok(T),
    Fail(String),
    Unknown(String),
}

/// How long one call may take; a slower one is an unknown outcome.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Client {
    rpc: MessagingServiceClient<Channel>,
}

fn resource(name: &str) -> Option<v2::Resource> {
    Some(v2::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    })
}

fn queue(topic: &str) -> Option<v2::MessageQueue> {
    Some(v2::MessageQueue {
        topic: resource(topic),
        id: 0,
        permission: v2::Permission::ReadWrite as i32,
        broker: None,
        accept_message_types: vec![],
    })
}

/// Sorts a transport error: one before the request left is a definite
/// failure; one after may hide an applied request.
fn transport<T>(status: tonic::Status) -> Outcome<T> {
    let not_sent = status.code() == tonic::Code::Unavailable
        && std::error::Error::source(&status)
            .map(|s| format!("{s:?}"))
            .is_some_and(|s| s.contains("ConnectError") || s.contains("Connection refused"));
    let msg = format!("{}: {}", status.code(), status.message());
    if not_sent {
        Outcome::Fail(msg)
    } else {
        Outcome::Unknown(msg)
    }
}

/// Sorts a v2 status that is not OK.
fn refused<T>(status: Option<&v2::Status>) -> Outcome<T> {
    let (code, message) = status.map_or((0, "no status"), |s| (s.code, s.message.as_str()));
    let msg = format!("{code}: {message}");
    if (code::BAD_REQUEST_FIRST..=code::BAD_REQUEST_LAST).contains(&code) || code == code::HA_NOT_AVAILABLE {
        Outcome::Fail(msg)
    } else {
        Outcome::Unknown(msg)
    }
}

impl Client {
    /// A lazily connecting client of the node at `addr` (host:port).
    pub fn new(addr: &str) -> anyhow::Result<Client> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(CALL_TIMEOUT)
            .connect_lazy();
        Ok(Client {
            rpc: MessagingServiceClient::new(channel),
        })
    }

    /// Sends `value` to the single queue of `topic`; returns its offset.
    pub async fn send(&self, topic: &str, value: u64) -> Outcome<u64> {
        let born = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let message = v2::Message {
            topic: resource(topic),
            user_properties: Default::default(),
            system_properties: Some(v2::SystemProperties {
                message_id: format!("01{:032X}", rand::random::<u128>()),
                body_encoding: v2::Encoding::Identity as i32,
                message_type: v2::MessageType::Normal as i32,
                born_timestamp: Some(prost_types::Timestamp {
                    seconds: born.as_secs() as i64,
                    nanos: born.subsec_nanos() as i32,
                }),
                born_host: "jepsen".into(),
                ..Default::default()
            }),
            body: value.to_string().into_bytes().into(),
        };
        let mut rpc = self.rpc.clone();
        let r = match rpc
            .send_message(v2::SendMessageRequest {
                messages: vec![message],
            })
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) => return transport(s),
        };
        let entry = r.entries.first();
        let status = entry.and_then(|e| e.status.as_ref()).or(r.status.as_ref());
        match (status, entry) {
            (Some(s), Some(e)) if s.code == code::OK => match u64::try_from(e.offset) {
                Ok(o) => Outcome::Ok(o),
                Err(_) => Outcome::Unknown(format!("negative offset {}", e.offset)),
            },
            (s, _) => refused(s),
        }
    }

    /// Reads up to `max` messages of `topic`'s queue from `offset` with
    /// `PullMessage`, as `(offset, value)` pairs.
    pub async fn pull(&self, group: &str, topic: &str, offset: u64, max: i32) -> Outcome<Vec<(u64, u64)>> {
        let mut rpc = self.rpc.clone();
        let mut stream = match rpc
            .pull_message(v2::PullMessageRequest {
                group: resource(group),
                message_queue: queue(topic),
                offset: offset as i64,
                batch_size: max,
                filter_expression: Some(v2::FilterExpression {
                    r#type: v2::FilterType::Tag as i32,
                    expression: "*".into(),
                }),
                long_polling_timeout: Some(prost_types::Duration { seconds: 0, nanos: 0 }),
            })
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) => return transport(s),
        };
        let mut msgs = Vec::new();
        loop {
            let item = match stream.message().await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(s) => return transport(s),
            };
            match item.content {
                Some(v2::pull_message_response::Content::Status(s)) if s.code != code::OK => {
                    // At or past this node's end is an empty read, not an error.
                    if s.code == code::ILLEGAL_OFFSET || s.code == code::MESSAGE_NOT_FOUND {
                        return Outcome::Ok(msgs);
                    }
                    return refused(Some(&s));
                }
                Some(v2::pull_message_response::Content::Message(m)) => {
                    let Some(off) = m
                        .system_properties
                        .as_ref()
                        .and_then(|p| p.queue_offset)
                        .and_then(|o| u64::try_from(o).ok())
                    else {
                        return Outcome::Unknown("a message without a queue offset".into());
                    };
                    let Some(v) = std::str::from_utf8(&m.body).ok().and_then(|b| b.parse::<u64>().ok()) else {
                        return Outcome::Unknown(format!("a body that is not a value at offset {off}"));
                    };
                    msgs.push((off, v));
                }
                _ => {}
            }
        }
        Outcome::Ok(msgs)
    }

    /// The group's committed offset of `topic`'s queue (`None`: none yet).
    pub async fn committed(&self, group: &str, topic: &str) -> Outcome<Option<u64>> {
        let mut rpc = self.rpc.clone();
        match rpc
            .get_offset(v2::GetOffsetRequest {
                group: resource(group),
                message_queue: queue(topic),
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                match r.status.as_ref().map(|s| s.code) {
                    Some(code::OK) => Outcome::Ok(Some(r.offset.max(0) as u64)),
                    Some(code::OFFSET_NOT_FOUND) => Outcome::Ok(None),
                    _ => refused(r.status.as_ref()),
                }
            }
            Err(s) => transport(s),
        }
    }

    /// Stores the group's committed offset of `topic`'s queue.
    pub async fn commit(&self, group: &str, topic: &str, offset: u64) -> Outcome<()> {
        let mut rpc = self.rpc.clone();
        match rpc
            .update_offset(v2::UpdateOffsetRequest {
                group: resource(group),
                message_queue: queue(topic),
                offset: offset as i64,
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                match r.status.as_ref().map(|s| s.code) {
                    Some(code::OK) => Outcome::Ok(()),
                    _ => refused(r.status.as_ref()),
                }
            }
            Err(s) => transport(s),
        }
    }
}
