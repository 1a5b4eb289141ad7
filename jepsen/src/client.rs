//! The workload's client: the RocketMQ 5 gRPC protocol (`apache.rocketmq.v2`)
//! spoken to one node, as an application would.
//!
//! Every call returns a [`Outcome`]: whether the operation certainly
//! happened, certainly did not, or may have. A definite failure is a refusal
//! the broker gives before it proposes anything (a connection that never
//! opened, a bad request, no leader), everything else that is not a success
//! (a timeout, a reset mid-call, a Raft outcome the broker could not learn)
//! is unknown. The checker holds the broker to this: a message whose send
//! "failed" must never be read. Ending a transaction that is no longer
//! pending is refused, so it too is a definite failure.
//!
//! Besides plain sends and reads, the client sends timed and transactional
//! messages, ends transactions, and opens the producer's Telemetry session
//! on which the broker checks unresolved transactions back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::history::Resolution;
use crate::secure::{Credentials, Security};

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
    /// No valid credentials, or no policy allows the call (ACL).
    pub const UNAUTHORIZED: i32 = 40100;
    /// No leader: raftmq refused before proposing.
    pub const HA_NOT_AVAILABLE: i32 = 50002;
}

#[derive(Debug)]
pub enum Outcome<T> {
    Ok(T),
    Fail(String),
    Unknown(String),
}

/// How long one call may take; a slower one is an unknown outcome. A node
/// that knows no leader answers within about an election timeout, a
/// healthy one in milliseconds: 2.5 s is a client's patience, and a
/// gap in `availability` longer than it is the cluster's, not a call
/// left waiting.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(2500);

#[derive(Clone)]
pub struct Client {
    rpc: MessagingServiceClient<InterceptedService<Channel, Signer>>,
}

/// Signs every call as the workload's user (`--secure`), or passes it on.
#[derive(Clone)]
pub struct Signer(Option<Arc<Credentials>>);

impl Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = &self.0 {
            let (authorization, date_time) = c.sign();
            let md = req.metadata_mut();
            // Both are visible ASCII (hex, digits and the access key).
            if let (Ok(a), Ok(d)) = (authorization.parse(), date_time.parse()) {
                md.insert("authorization", a);
                md.insert("x-mq-date-time", d);
            }
        }
        Ok(req)
    }
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

/// A transaction's half message, as its end names it.
#[derive(Debug, Clone)]
pub struct Half {
    pub message_id: String,
    pub transaction_id: String,
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A fresh message id, shaped as the official clients make theirs.
pub fn message_id() -> String {
    format!("01{:032X}", rand::random::<u128>())
}

/// A message whose body is `value` in decimal.
fn message(
    topic: &str,
    value: u64,
    message_id: String,
    kind: v2::MessageType,
    due: Option<prost_types::Timestamp>,
) -> v2::Message {
    v2::Message {
        topic: resource(topic),
        user_properties: Default::default(),
        system_properties: Some(v2::SystemProperties {
            message_id,
            body_encoding: v2::Encoding::Identity as i32,
            message_type: kind as i32,
            born_timestamp: Some(timestamp(SystemTime::now())),
            born_host: "jepsen".into(),
            delivery_timestamp: due,
            ..Default::default()
        }),
        body: value.to_string().into_bytes().into(),
    }
}

/// The header by which the broker knows a client across calls and nodes.
fn with_client_id<T>(req: &mut tonic::Request<T>, client_id: &str) -> Result<(), String> {
    let id = client_id
        .parse()
        .map_err(|_| format!("{client_id:?} is not a header value"))?;
    req.metadata_mut().insert("x-mq-client-id", id);
    Ok(())
}

/// Whether a failure's error (as the calls here format it) is a refusal
/// for want of credentials or a policy: the v2 `UNAUTHORIZED` code, or
/// gRPC's `UNAUTHENTICATED` or `PERMISSION_DENIED`.
pub fn is_access_refusal(error: &str) -> bool {
    let code = error.split(':').next().unwrap_or("");
    code == code::UNAUTHORIZED.to_string()
        || code == tonic::Code::Unauthenticated.to_string()
        || code == tonic::Code::PermissionDenied.to_string()
}

/// How the error of a call that could not connect begins.
const NOT_CONNECTED: &str = "not connected: ";

/// Sorts a transport error: one before the request left (no connection)
/// is a definite failure; one after may hide an applied request.
fn transport<T>(status: tonic::Status) -> Outcome<T> {
    let not_sent = status.code() == tonic::Code::Unavailable
        && std::error::Error::source(&status)
            .map(|s| format!("{s:?}"))
            .is_some_and(|s| s.contains("ConnectError") || s.contains("Connection refused"));
    let msg = format!("{}: {}", status.code(), status.message());
    if not_sent {
        Outcome::Fail(format!("{NOT_CONNECTED}{msg}"))
    } else {
        Outcome::Unknown(msg)
    }
}

/// Whether an outcome is a failure to connect at all (the node is down or
/// not yet listening), which [`transport`] tells apart.
pub fn not_connected<T>(out: &Outcome<T>) -> bool {
    matches!(out, Outcome::Fail(e) if e.starts_with(NOT_CONNECTED))
}

/// Whether the node itself answered: a result, or a status the broker
/// wrote (a v2 code, or gRPC's access refusals), as opposed to a deadline
/// or a broken connection.
pub fn answered<T>(out: &Outcome<T>) -> bool {
    match out {
        Outcome::Ok(_) => true,
        Outcome::Fail(e) | Outcome::Unknown(e) => {
            e.split(':').next().is_some_and(|c| c.parse::<i32>().is_ok()) || is_access_refusal(e)
        }
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
    /// A lazily connecting client of the node at `addr` (host:port); with
    /// `security`, over TLS and signed as the workload's user.
    pub fn new(addr: &str, security: Option<&Security>) -> anyhow::Result<Client> {
        let scheme = if security.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(CALL_TIMEOUT);
        if let Some(sec) = security {
            endpoint = endpoint.tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&sec.ca_pem))
                    .assume_http2(true),
            )?;
        }
        let signer = Signer(security.map(|s| Arc::new(s.user.clone())));
        Ok(Client {
            rpc: MessagingServiceClient::with_interceptor(endpoint.connect_lazy(), signer),
        })
    }

    /// Sends `value` to the single queue of `topic` as message
    /// `message_id` (a retry keeps its id, as the official clients do);
    /// returns its offset.
    pub async fn send(&self, topic: &str, value: u64, message_id: &str) -> Outcome<u64> {
        let m = message(topic, value, message_id.to_string(), v2::MessageType::Normal, None);
        match self.send_message(m).await {
            Outcome::Ok(e) => match u64::try_from(e.offset) {
                Ok(o) => Outcome::Ok(o),
                Err(_) => Outcome::Unknown(format!("negative offset {}", e.offset)),
            },
            Outcome::Fail(e) => Outcome::Fail(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        }
    }

    /// Sends `value` to `topic` as a timed message, invisible until `due`.
    /// (Its queue offset comes only when the broker releases it.)
    pub async fn timed_send(&self, topic: &str, value: u64, due: SystemTime, message_id: &str) -> Outcome<()> {
        let due = timestamp(due);
        let m = message(topic, value, message_id.to_string(), v2::MessageType::Delay, Some(due));
        match self.send_message(m).await {
            Outcome::Ok(_) => Outcome::Ok(()),
            Outcome::Fail(e) => Outcome::Fail(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        }
    }

    /// Sends `value` to `topic` as a transactional (half) message.
    pub async fn txn_send(&self, topic: &str, value: u64, message_id: &str) -> Outcome<Half> {
        let m = message(topic, value, message_id.to_string(), v2::MessageType::Transaction, None);
        match self.send_message(m).await {
            Outcome::Ok(e) if e.transaction_id.is_empty() => {
                Outcome::Unknown("a transactional send acknowledged without a transaction id".into())
            }
            Outcome::Ok(e) => Outcome::Ok(Half {
                message_id: e.message_id,
                transaction_id: e.transaction_id,
            }),
            Outcome::Fail(e) => Outcome::Fail(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        }
    }

    /// Sends one message; its result entry when the broker took it.
    async fn send_message(&self, message: v2::Message) -> Outcome<v2::SendResultEntry> {
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
        let entry = r.entries.into_iter().next();
        let status = entry.as_ref().and_then(|e| e.status.clone()).or(r.status);
        match (status, entry) {
            (Some(s), Some(e)) if s.code == code::OK => Outcome::Ok(e),
            (s, _) => refused(s.as_ref()),
        }
    }

    /// Ends a transaction, as its producer (`from_check` false) or as the
    /// answer to a check-back. A transaction no longer pending is refused
    /// (a definite failure: it was ended before).
    pub async fn end_txn(&self, topic: &str, half: &Half, resolution: Resolution, from_check: bool) -> Outcome<()> {
        let mut rpc = self.rpc.clone();
        let source = if from_check {
            v2::TransactionSource::SourceServerCheck
        } else {
            v2::TransactionSource::SourceClient
        };
        let resolution = match resolution {
            Resolution::Commit => v2::TransactionResolution::Commit,
            Resolution::Rollback => v2::TransactionResolution::Rollback,
        };
        match rpc
            .end_transaction(v2::EndTransactionRequest {
                topic: resource(topic),
                message_id: half.message_id.clone(),
                transaction_id: half.transaction_id.clone(),
                resolution: resolution as i32,
                source: source as i32,
                trace_context: String::new(),
            })
            .await
        {
            Ok(r) => match r.into_inner().status {
                Some(s) if s.code == code::OK => Outcome::Ok(()),
                s => refused(s.as_ref()),
            },
            Err(s) => transport(s),
        }
    }

    /// Tells the node that the producer `client_id` is alive (the broker
    /// forgets clients silent for two minutes).
    pub async fn heartbeat(&self, client_id: &str) -> Outcome<()> {
        let mut rpc = self.rpc.clone();
        let mut req = tonic::Request::new(v2::HeartbeatRequest {
            group: None,
            client_type: v2::ClientType::Producer as i32,
        });
        if let Err(e) = with_client_id(&mut req, client_id) {
            return Outcome::Fail(e);
        }
        match rpc.heartbeat(req).await {
            Ok(r) => match r.into_inner().status {
                Some(s) if s.code == code::OK => Outcome::Ok(()),
                s => refused(s.as_ref()),
            },
            Err(s) => transport(s),
        }
    }

    /// Opens a Telemetry session as the producer `client_id` of `topics`:
    /// the broker may then push check-backs of their transactions down the
    /// returned stream. The session lasts while the returned sender lives.
    pub async fn producer_session(
        &self,
        client_id: &str,
        topics: &[String],
    ) -> anyhow::Result<(
        mpsc::Sender<v2::TelemetryCommand>,
        tonic::Streaming<v2::TelemetryCommand>,
    )> {
        let (tx, rx) = mpsc::channel(1);
        let settings = v2::Settings {
            client_type: Some(v2::ClientType::Producer as i32),
            pub_sub: Some(v2::settings::PubSub::Publishing(v2::Publishing {
                topics: topics.iter().filter_map(|t| resource(t)).collect(),
                max_body_size: 0,
                validate_message_type: false,
            })),
            ..Default::default()
        };
        tx.send(v2::TelemetryCommand {
            status: None,
            command: Some(v2::telemetry_command::Command::Settings(settings)),
        })
        .await?;
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        with_client_id(&mut req, client_id).map_err(anyhow::Error::msg)?;
        let mut rpc = self.rpc.clone();
        let inbound = rpc.telemetry(req).await?.into_inner();
        Ok((tx, inbound))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_an_answer_and_a_deadline_is_not() {
        assert!(answered(&Outcome::Ok(())));
        assert!(answered::<()>(&Outcome::Unknown(
            "50400: outcome unknown: leader 1 stopped leading".into()
        )));
        assert!(answered::<()>(&Outcome::Fail("50002: unavailable".into())));
        let deadline = transport::<()>(tonic::Status::cancelled("Timeout expired"));
        assert!(!answered(&deadline));
        assert!(!answered::<()>(&Outcome::Fail(format!(
            "{NOT_CONNECTED}connection refused"
        ))));
    }
}
