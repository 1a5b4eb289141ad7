//! The state of the `apache.rocketmq.v2` service and what its RPC families
//! share: checking the names a request carries, receipts, invisible and
//! long-polling durations, multi-result statuses, and running a call on the
//! leader.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use futures::Stream;
use raftmq_raft::consumption::Receipt;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::broker::Broker;
use crate::broker::auth::CallInfo;
use crate::broker::pop::{self, MAX_INVISIBLE};
use crate::broker::receipt;
use crate::broker::seal::Seal;
use crate::client::route_cache::RouteCache;
use crate::error::BrokerError;
use crate::grpc;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use crate::proto::rocketmq::v2::messaging_service_server::MessagingServiceServer;
use crate::proto::v2_message::{from_duration, ok, status};

pub(super) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Client id header of the official clients.
pub(super) const CLIENT_ID: &str = "x-mq-client-id";
pub(super) const LANGUAGE: &str = "x-mq-language";
pub(super) const CLIENT_VERSION: &str = "x-mq-client-version";
/// Time left before a client's deadline that a long poll keeps in reserve
/// for the answer to travel back.
const DEADLINE_RESERVE: Duration = Duration::from_millis(500);
/// Longest long poll, whatever the client asks for.
const MAX_LONG_POLL: Duration = Duration::from_secs(60);

/// A response that carries its outcome in a v2 status: it can carry a
/// refusal, and says its code (for `rocketmq_rpc_latency`).
pub(super) trait Answer {
    fn refused(status: v2::Status) -> Self;
    /// The v2 code the answer carries (OK when it carries none).
    fn code(&self) -> i32;
}

macro_rules! answer {
    ($($t:ty),* $(,)?) => {
        $(impl Answer for $t {
            // Some responses have nothing but their status.
            #[allow(clippy::needless_update)]
            fn refused(status: v2::Status) -> Self {
                Self { status: Some(status), ..Default::default() }
            }

            fn code(&self) -> i32 {
                self.status.as_ref().map_or(Code::Ok as i32, |s| s.code)
            }
        })*
    };
}

/// An item of a response stream whose first item carries the status.
pub(super) trait StatusItem {
    fn status(status: v2::Status) -> Self;
    fn code(&self) -> Option<i32>;
}

impl StatusItem for v2::ReceiveMessageResponse {
    fn status(status: v2::Status) -> Self {
        v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Status(status)),
        }
    }

    fn code(&self) -> Option<i32> {
        match &self.content {
            Some(v2::receive_message_response::Content::Status(s)) => Some(s.code),
            _ => None,
        }
    }
}

impl StatusItem for v2::PullMessageResponse {
    fn status(status: v2::Status) -> Self {
        v2::PullMessageResponse {
            content: Some(v2::pull_message_response::Content::Status(status)),
        }
    }

    fn code(&self) -> Option<i32> {
        match &self.content {
            Some(v2::pull_message_response::Content::Status(s)) => Some(s.code),
            _ => None,
        }
    }
}

/// A streamed answer, before it is streamed.
impl<T: StatusItem> Answer for Vec<T> {
    fn refused(status: v2::Status) -> Self {
        vec![T::status(status)]
    }

    fn code(&self) -> i32 {
        self.first().and_then(T::code).unwrap_or(Code::Ok as i32)
    }
}

answer!(
    v2::QueryRouteResponse,
    v2::HeartbeatResponse,
    v2::SendMessageResponse,
    v2::QueryAssignmentResponse,
    v2::AckMessageResponse,
    v2::ForwardMessageToDeadLetterQueueResponse,
    v2::UpdateOffsetResponse,
    v2::GetOffsetResponse,
    v2::QueryOffsetResponse,
    v2::EndTransactionResponse,
    v2::NotifyClientTerminationResponse,
    v2::ChangeInvisibleDurationResponse,
    v2::RecallMessageResponse,
    v2::SyncLiteSubscriptionResponse,
);

pub struct MessagingService {
    pub(super) broker: Arc<Broker>,
    pub(super) routes: Option<RouteCache>,
    /// Round-robin queue choice for sends that name no message group.
    pub(super) next_queue: AtomicU32,
    /// The configured delay levels, in milliseconds.
    pub(super) delay_levels_ms: Vec<u64>,
}

impl MessagingService {
    pub fn new(broker: Arc<Broker>) -> MessagingServiceServer<MessagingService> {
        let routes = (!broker.cfg.namesrv_addrs.is_empty()).then(|| {
            RouteCache::new(
                &broker.cfg.namesrv_addrs,
                crate::client::route_cache::REFRESH,
                &broker.dialer,
            )
        });
        // Validated with the config.
        let delay_levels_ms = broker.cfg.timer.levels_ms().unwrap_or_default();
        MessagingServiceServer::new(MessagingService {
            broker,
            routes,
            delay_levels_ms,
            next_queue: AtomicU32::new(rand::random()),
        })
        .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
    }

    /// The caller's flow-control verdict ([`crate::broker::flow_control`]):
    /// its client id, or its address when it sends none.
    pub(super) fn admit<T>(&self, r: &Request<T>) -> Result<(), BrokerError> {
        let id = grpc::header(r.metadata(), CLIENT_ID);
        if id.is_empty() {
            let peer = raftmq_raft::tls::PeerInfo::ip(r)
                .map(|a| a.to_string())
                .unwrap_or_default();
            self.broker.flow_control.admit(&peer)
        } else {
            self.broker.flow_control.admit(id)
        }
    }

    /// Answers `r` with `handler`, unless flow control refuses it, and
    /// times the answer as `rpc` (its name in the protocol) with its code.
    pub(super) async fn answer<Q, T, F, Fut>(
        &self,
        rpc: &'static str,
        r: Request<Q>,
        handler: F,
    ) -> Result<Response<T>, Status>
    where
        Q: super::access::Guarded,
        T: Answer,
        F: FnOnce(Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let started = std::time::Instant::now();
        // A forwarded call was counted at the node the client called.
        let forwarded = crate::grpc::is_forwarded(r.metadata());
        let mut r = r;
        let allowed = match self.broker.acl_enabled() {
            true => {
                let (call, checks) = (CallInfo::of(&r), r.get_ref().checks());
                let caller = self.broker.checked(|| self.broker.access(&call, &checks)).await;
                // Client ids are bound to who the caller is (clients::Owner).
                caller
                    .map(|c| drop(r.extensions_mut().insert(c)))
                    .map_err(BrokerError::from)
            }
            false => Ok(()),
        };
        let out = match allowed.and_then(|()| self.admit(&r)) {
            Ok(()) => handler(r).await,
            Err(e) => Ok(Response::new(T::refused(e.v2_status()))),
        };
        if forwarded {
            return out;
        }
        let code = match &out {
            Ok(answer) => Code::try_from(answer.get_ref().code()).map_or("UNKNOWN", |c| c.as_str_name()),
            // Not understood at all: no v2 code.
            Err(_) => "GRPC_ERROR",
        };
        self.broker.metrics.rpc(rpc, code, started);
        out
    }

    /// Runs `local` here when this node leads, or forwards the request to
    /// the leader with `forward` ([`grpc::on_leader`]).
    pub(super) async fn on_leader<Req, Resp, L, LF, F, FF>(
        &self,
        request: Request<Req>,
        local: L,
        forward: F,
    ) -> Result<Resp, BrokerError>
    where
        Req: Clone,
        L: FnOnce(Req) -> LF,
        LF: Future<Output = Result<Resp, BrokerError>>,
        F: Fn(MessagingServiceClient<Channel>, Request<Req>) -> FF,
        FF: Future<Output = Result<Resp, Status>>,
    {
        grpc::on_leader(&self.broker, request, local, |channel, r| {
            forward(leader_client(channel), r)
        })
        .await
    }
}

fn leader_client(channel: Channel) -> MessagingServiceClient<Channel> {
    MessagingServiceClient::new(channel)
        .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
}

/// The overall status of several results: OK if all are, the common code if
/// all failed alike, MULTIPLE_RESULTS otherwise.
pub(super) fn overall(statuses: &[v2::Status]) -> v2::Status {
    match statuses.first() {
        None => ok(),
        Some(first) if statuses.iter().all(|s| s.code == first.code) => first.clone(),
        Some(_) => status(Code::MultipleResults, "the entries have different results"),
    }
}

pub(super) fn topic_name(r: Option<&v2::Resource>) -> Result<String, BrokerError> {
    let name = r.map(|r| r.name.clone()).unwrap_or_default();
    raftmq_store::queue_table::validate_topic(&name)
        .map_err(|e| BrokerError::Refused(Code::IllegalTopic, format!("topic: {e}")))?;
    if raftmq_raft::held::is_system_topic(&name) {
        return Err(BrokerError::Refused(
            Code::Forbidden,
            format!("{name} is a system topic"),
        ));
    }
    Ok(name)
}

pub(super) fn group_name(r: Option<&v2::Resource>) -> Result<String, BrokerError> {
    let name = r.map(|r| r.name.clone()).unwrap_or_default();
    pop::validate_group(&name)?;
    Ok(name)
}

/// The queue a request names.
pub(super) struct QueueRef {
    pub(super) topic: String,
    pub(super) namespace: String,
    pub(super) id: i32,
}

impl QueueRef {
    pub(super) fn of(mq: Option<&v2::MessageQueue>) -> Result<QueueRef, BrokerError> {
        let mq = mq.cloned().unwrap_or_default();
        Ok(QueueRef {
            topic: topic_name(mq.topic.as_ref())?,
            namespace: mq.topic.map(|t| t.resource_namespace).unwrap_or_default(),
            id: mq.id,
        })
    }

    pub(super) fn queue_id(&self) -> Result<u32, BrokerError> {
        u32::try_from(self.id).map_err(|_| BrokerError::Refused(Code::BadRequest, "negative queue id".into()))
    }
}

/// An offset answer: the offset with OK, or the error's status and 0.
pub(super) fn offset_reply<T>(r: Result<u64, BrokerError>, reply: impl FnOnce(v2::Status, i64) -> T) -> T {
    match r {
        Ok(offset) => reply(ok(), offset as i64),
        Err(e) => reply(e.v2_status(), 0),
    }
}

/// A receipt handle of `group` and `topic`, checked against its seal.
pub(super) fn decode_receipt(seal: &Seal, group: &str, topic: &str, s: &str) -> Result<Receipt, BrokerError> {
    receipt::decode(seal, group, topic, s).ok_or_else(|| {
        BrokerError::Refused(
            Code::InvalidReceiptHandle,
            "the receipt handle is malformed, or not one this broker gave this group for this topic".into(),
        )
    })
}

pub(super) fn stale_receipt() -> v2::Status {
    status(
        Code::InvalidReceiptHandle,
        "the receipt handle has expired: the message was acknowledged, redelivered or dead-lettered since",
    )
}

/// An invisible duration between `min` and [`MAX_INVISIBLE`].
pub(super) fn invisible_time(
    d: Option<&prost_types::Duration>,
    default: Duration,
    min: Duration,
) -> Result<Duration, BrokerError> {
    let Some(d) = d else { return Ok(default) };
    match from_duration(d) {
        Some(t) if t >= min && t <= MAX_INVISIBLE => Ok(t),
        _ => Err(BrokerError::Refused(
            Code::IllegalInvisibleTime,
            format!(
                "invisible duration must be between {} ms and {} s",
                min.as_millis(),
                MAX_INVISIBLE.as_secs()
            ),
        )),
    }
}

/// The deadline of a long poll: `wait`, capped, answering before the
/// client's own deadline.
pub(super) fn poll_deadline(mut wait: Duration, client_deadline: Option<Duration>) -> Instant {
    wait = wait.min(MAX_LONG_POLL);
    if let Some(d) = client_deadline {
        wait = wait.min(d.saturating_sub(DEADLINE_RESERVE.max(d / 20)));
    }
    Instant::now() + wait
}

/// The items of a forwarded call's response stream.
pub(super) async fn collect<T>(mut s: Streaming<T>) -> Result<Vec<T>, Status> {
    let mut out = Vec::new();
    while let Some(item) = s.message().await? {
        out.push(item);
    }
    Ok(out)
}

pub(super) fn stream_of<T: Send + 'static>(items: Vec<T>) -> BoxStream<T> {
    Box::pin(tokio_stream::iter(items.into_iter().map(Ok)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overall_status() {
        assert_eq!(overall(&[ok(), ok()]).code, Code::Ok as i32);
        assert_eq!(
            overall(&[stale_receipt(), stale_receipt()]).code,
            Code::InvalidReceiptHandle as i32
        );
        assert_eq!(overall(&[ok(), stale_receipt()]).code, Code::MultipleResults as i32);
    }
}
