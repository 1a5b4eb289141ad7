//! `apache.rocketmq.v2.MessagingService`: the protocol of the official
//! RocketMQ 5 clients, served by every node.
//!
//! Reads of replicated state (routes, offset-based pulls, offsets, client
//! settings) are answered by the node itself. Everything that changes state
//! (sends, pop receives, acks, invisibility changes, dead-letter moves,
//! offset commits) runs on the leader: a follower forwards the request
//! there itself, so a client connected to any node never has to find the
//! leader. Outcomes travel as v2 statuses inside the responses; the gRPC
//! status is OK unless the request could not be understood at all.
//!
//! Authentication headers (`authorization`, `x-mq-*`) are accepted and not
//! checked yet.

pub mod route;
pub mod settings;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use futures::Stream;
use raftmq_raft::consumption::Receipt;
use raftmq_raft::message::{Message, MessageView, tag_hash};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::broker::{Broker, FORWARD_WAIT};
use crate::grpc::raftmq::{FORWARDED, not_delivered};
use route::GroupQueues;
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::filter::Filter;
use crate::broker::held::ToHold;
use crate::broker::pop::{self, MAX_INVISIBLE, Receive};
use crate::broker::receipt;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use crate::proto::rocketmq::v2::messaging_service_server::{MessagingService as Service, MessagingServiceServer};
use crate::client::route_cache::RouteCache;
use crate::proto::v2_message::{self, Delivery, Hold, Limits, Refusal, from_duration, ok, status};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Client id header of the official clients.
const CLIENT_ID: &str = "x-mq-client-id";
const LANGUAGE: &str = "x-mq-language";
/// Time left before a client's deadline that a long poll keeps in reserve
/// for the answer to travel back.
const DEADLINE_RESERVE: Duration = Duration::from_millis(500);
/// Longest long poll, whatever the client asks for.
const MAX_LONG_POLL: Duration = Duration::from_secs(60);

pub struct MessagingService {
    broker: Arc<Broker>,
    routes: Option<RouteCache>,
    /// Round-robin queue choice for sends that name no message group.
    next_queue: AtomicU32,
    /// The configured delay levels, in milliseconds.
    delay_levels_ms: Vec<u64>,
}

impl MessagingService {
    pub fn new(broker: Arc<Broker>) -> MessagingServiceServer<MessagingService> {
        let routes = (!broker.cfg.namesrv_addrs.is_empty())
            .then(|| RouteCache::new(&broker.cfg.namesrv_addrs, crate::client::route_cache::REFRESH));
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

    fn leader_client(channel: Channel) -> MessagingServiceClient<Channel> {
        MessagingServiceClient::new(channel)
            .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
    }
}

fn header<'a>(m: &'a MetadataMap, key: &str) -> &'a str {
    m.get(key).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The client's deadline from the `grpc-timeout` header.
fn grpc_timeout(m: &MetadataMap) -> Option<Duration> {
    let v = header(m, "grpc-timeout");
    // At most 8 digits and a unit, as the gRPC spec allows.
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (n, unit) = v.split_at(v.len() - 1);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Runs `$local` on the leader, or forwards the request to it (see
/// [`crate::grpc::raftmq`]'s `on_leader!`, which this mirrors for the v2
/// client). Evaluates to `Result<Response, BrokerError>`.
macro_rules! v2_on_leader {
    ($self:ident, $request:ident, $req:ident, $local:expr, $remote:ident) => {
        v2_on_leader!($self, $request, $req, $local, $remote, |r| async { Ok(r) })
    };
    ($self:ident, $request:ident, $req:ident, $local:expr, $remote:ident, $finish:expr) => {{
        let forwarded = $request.metadata().contains_key(FORWARDED);
        let timeout = grpc_timeout($request.metadata());
        let started = Instant::now();
        let (meta, _, $req) = $request.into_parts();
        let deadline = Instant::now() + FORWARD_WAIT;
        loop {
            match $self.broker.leader_channel().await {
                Err(e) => break Err(e),
                Ok(None) => break $local,
                Ok(Some(_)) if forwarded => {
                    break Err(BrokerError::Unavailable(
                        "this node is not the leader either; retry".into(),
                    ));
                }
                Ok(Some(channel)) => {
                    let mut fwd = Request::from_parts(meta.clone(), Default::default(), $req.clone());
                    fwd.metadata_mut().insert(FORWARDED, MetadataValue::from_static("1"));
                    // What is left of the client's time, not all of it.
                    if let Some(t) = timeout {
                        fwd.set_timeout(t.saturating_sub(started.elapsed()).max(Duration::from_millis(1)));
                    }
                    match MessagingService::leader_client(channel).$remote(fwd).await {
                        Ok(r) => break ($finish)(r.into_inner()).await,
                        Err(s) if not_delivered(&s) && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(s) => break Err(BrokerError::from(s)),
                    }
                }
            }
        }
    }};
}

/// The overall status of several results: OK if all are, the common code if
/// all failed alike, MULTIPLE_RESULTS otherwise.
fn overall(statuses: &[v2::Status]) -> v2::Status {
    match statuses.first() {
        None => ok(),
        Some(first) if statuses.iter().all(|s| s.code == first.code) => first.clone(),
        Some(_) => status(Code::MultipleResults, "the entries have different results"),
    }
}

fn topic_name(r: Option<&v2::Resource>) -> Result<String, BrokerError> {
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

fn group_name(r: Option<&v2::Resource>) -> Result<String, BrokerError> {
    let name = r.map(|r| r.name.clone()).unwrap_or_default();
    pop::validate_group(&name)?;
    Ok(name)
}

/// The queue a request names.
struct QueueRef {
    topic: String,
    namespace: String,
    id: i32,
}

impl QueueRef {
    fn of(mq: Option<&v2::MessageQueue>) -> Result<QueueRef, BrokerError> {
        let mq = mq.cloned().unwrap_or_default();
        Ok(QueueRef {
            topic: topic_name(mq.topic.as_ref())?,
            namespace: mq.topic.map(|t| t.resource_namespace).unwrap_or_default(),
            id: mq.id,
        })
    }

    fn queue_id(&self) -> Result<u32, BrokerError> {
        u32::try_from(self.id).map_err(|_| BrokerError::Refused(Code::BadRequest, "negative queue id".into()))
    }
}

/// An offset answer: the offset with OK, or the error's status and 0.
fn offset_reply<T>(r: Result<u64, BrokerError>, reply: impl FnOnce(v2::Status, i64) -> T) -> T {
    match r {
        Ok(offset) => reply(ok(), offset as i64),
        Err(e) => reply(e.v2_status(), 0),
    }
}

fn decode_receipt(s: &str) -> Result<Receipt, BrokerError> {
    receipt::decode(s).ok_or_else(|| {
        BrokerError::Refused(
            Code::InvalidReceiptHandle,
            "the receipt handle is malformed (not one this broker gave out)".into(),
        )
    })
}

fn stale_receipt() -> v2::Status {
    status(
        Code::InvalidReceiptHandle,
        "the receipt handle has expired: the message was acknowledged, redelivered or dead-lettered since",
    )
}

/// An invisible duration between `min` and [`MAX_INVISIBLE`].
fn invisible_time(
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
fn poll_deadline(mut wait: Duration, client_deadline: Option<Duration>) -> Instant {
    wait = wait.min(MAX_LONG_POLL);
    if let Some(d) = client_deadline {
        wait = wait.min(d.saturating_sub(DEADLINE_RESERVE.max(d / 20)));
    }
    Instant::now() + wait
}

impl MessagingService {
    /// Picks each message's queue and sends the request's messages, one
    /// batch per (topic, queue). Runs on the leader.
    async fn send_local(&self, req: v2::SendMessageRequest) -> Result<v2::SendMessageResponse, BrokerError> {
        if req.messages.is_empty() {
            return Err(BrokerError::Refused(
                Code::BadRequest,
                "a send needs at least one message".into(),
            ));
        }
        let n = req.messages.len();
        // A request's messages without a message group share one queue.
        let rr = self.next_queue.fetch_add(1, Ordering::Relaxed);
        let mut batches: BTreeMap<(String, u32), Vec<(usize, Message)>> = BTreeMap::new();
        // Timed and half messages, stored apart ([`crate::broker::held`]).
        let mut timed: Vec<(usize, ToHold)> = Vec::new();
        let mut halves: Vec<(usize, ToHold)> = Vec::new();
        let mut ids = Vec::with_capacity(n);
        let limits = Limits {
            max_body: self.broker.cfg.max_body_bytes,
            now_ms: now_ms(),
            max_delay_ms: self.broker.cfg.timer.max_delay_ms,
            delay_levels_ms: &self.delay_levels_ms,
        };
        for (i, m) in req.messages.into_iter().enumerate() {
            let name = topic_name(m.topic.as_ref())?;
            let topic = self
                .broker
                .node
                .sm
                .topic(&name)
                .ok_or_else(|| BrokerError::TopicNotFound(name.clone()))?;
            let out = v2_message::incoming(m, &topic, &limits)
                .map_err(|Refusal { code, message }| BrokerError::Refused(code, message))?;
            if !topic.writable() || topic.write_queues == 0 {
                return Err(BrokerError::Refused(
                    Code::Forbidden,
                    format!("topic {name} is not writable"),
                ));
            }
            let group = out
                .message
                .properties
                .iter()
                .find(|(k, _)| k == "__rmq.group")
                .map(|(_, v)| v.clone());
            let queue = match group {
                Some(g) => (tag_hash(&g) % u64::from(topic.write_queues)) as u32,
                None => rr % topic.write_queues,
            };
            ids.push(out.message.message_id.clone());
            if out.hold == Hold::None {
                batches.entry((name, queue)).or_default().push((i, out.message));
                continue;
            }
            let due_ms = match out.hold {
                Hold::Until(due) => Some(due),
                _ => None,
            };
            let held = ToHold {
                topic: name,
                queue_id: queue,
                message: out.message,
                due_ms,
            };
            match due_ms {
                Some(_) => timed.push((i, held)),
                None => halves.push((i, held)),
            }
        }
        let sends = batches.into_iter().map(|((topic, queue), msgs)| async move {
            let (idx, msgs): (Vec<usize>, Vec<Message>) = msgs.into_iter().unzip();
            let r = self.broker.send_local(&topic, queue, msgs).await;
            (idx, r)
        });
        let mut entries: Vec<Option<v2::SendResultEntry>> = vec![None; n];
        let failed = |id: &str, e: &BrokerError| v2::SendResultEntry {
            status: Some(e.v2_status()),
            message_id: id.to_string(),
            ..Default::default()
        };
        for (idx, r) in futures::future::join_all(sends).await {
            for (k, i) in idx.iter().enumerate() {
                entries[*i] = Some(match &r {
                    Ok((first, _)) => v2::SendResultEntry {
                        status: Some(ok()),
                        message_id: ids[*i].clone(),
                        transaction_id: String::new(),
                        offset: (first + k as u64) as i64,
                        recall_handle: String::new(),
                    },
                    Err(e) => failed(&ids[*i], e),
                });
            }
        }
        for (system_topic, held) in [
            (raftmq_raft::held::TIMER_TOPIC, timed),
            (raftmq_raft::held::HALF_TOPIC, halves),
        ] {
            if held.is_empty() {
                continue;
            }
            let (idx, held): (Vec<usize>, Vec<ToHold>) = held.into_iter().unzip();
            let dues: Vec<Option<u64>> = held.iter().map(|h| h.due_ms).collect();
            let r = crate::broker::held::store(&self.broker, system_topic, held).await;
            for (k, i) in idx.iter().enumerate() {
                entries[*i] = Some(match &r {
                    Ok(held_ids) => {
                        let id = held_ids[k];
                        let (transaction_id, recall_handle) = match dues[k] {
                            Some(due_ms) => (
                                String::new(),
                                crate::broker::held::timers::recall_handle(&raftmq_raft::held::TimerKey { due_ms, id }, &ids[*i]),
                            ),
                            None => (crate::broker::held::transactions::transaction_id(id), String::new()),
                        };
                        v2::SendResultEntry {
                            status: Some(ok()),
                            message_id: ids[*i].clone(),
                            transaction_id,
                            // Not in its queue yet: no queue offset.
                            offset: 0,
                            recall_handle,
                        }
                    }
                    Err(e) => failed(&ids[*i], e),
                });
            }
        }
        let entries: Vec<v2::SendResultEntry> = entries.into_iter().flatten().collect();
        let statuses: Vec<v2::Status> = entries.iter().filter_map(|e| e.status.clone()).collect();
        Ok(v2::SendMessageResponse {
            status: Some(overall(&statuses)),
            entries,
        })
    }

    /// Ends a transaction, on the leader.
    async fn end_transaction_local(
        &self,
        req: v2::EndTransactionRequest,
    ) -> Result<v2::EndTransactionResponse, BrokerError> {
        let topic = topic_name(req.topic.as_ref())?;
        let resolution = match v2::TransactionResolution::try_from(req.resolution) {
            Ok(v2::TransactionResolution::Commit) => crate::broker::held::transactions::Resolution::Commit,
            Ok(v2::TransactionResolution::Rollback) => crate::broker::held::transactions::Resolution::Rollback,
            _ => crate::broker::held::transactions::Resolution::Unknown,
        };
        let from_check = req.source == v2::TransactionSource::SourceServerCheck as i32;
        crate::broker::held::transactions::end(
            &self.broker,
            &topic,
            &req.message_id,
            &req.transaction_id,
            resolution,
            from_check,
        )
        .await?;
        Ok(v2::EndTransactionResponse { status: Some(ok()) })
    }

    /// Recalls a timed message, on the leader.
    async fn recall_local(&self, req: v2::RecallMessageRequest) -> Result<v2::RecallMessageResponse, BrokerError> {
        let topic = topic_name(req.topic.as_ref())?;
        let message_id = crate::broker::held::timers::recall(&self.broker, &topic, &req.recall_handle).await?;
        Ok(v2::RecallMessageResponse {
            status: Some(ok()),
            message_id,
        })
    }

    /// A pop receive on the leader, as the response stream's items.
    async fn receive_local(
        &self,
        req: v2::ReceiveMessageRequest,
        client_deadline: Option<Duration>,
    ) -> Result<Vec<v2::ReceiveMessageResponse>, BrokerError> {
        let group = group_name(req.group.as_ref())?;
        let QueueRef { topic, namespace, id } = QueueRef::of(req.message_queue.as_ref())?;
        let filter = Filter::of_v2(req.filter_expression.as_ref())?;
        let invisible = invisible_time(
            req.invisible_duration.as_ref(),
            Duration::from_millis(self.broker.cfg.default_invisible_ms),
            Duration::from_millis(self.broker.cfg.min_invisible_ms),
        )?;
        let wait = match req.long_polling_timeout.as_ref() {
            Some(d) => from_duration(d).ok_or_else(|| {
                BrokerError::Refused(Code::IllegalPollingTime, "the long polling timeout is negative".into())
            })?,
            None => Duration::from_millis(self.broker.cfg.long_polling_timeout_ms),
        };
        let batch = if req.batch_size <= 0 {
            32
        } else {
            req.batch_size as usize
        };
        let r = Receive {
            group,
            topic: topic.clone(),
            filter,
            batch,
            invisible,
            first_queue: id.max(0) as u32,
            deadline: poll_deadline(wait, client_deadline),
        };
        let started = std::time::Instant::now();
        let delivered = self.broker.popper.receive(&r).await?;
        if !delivered.is_empty() {
            self.broker
                .metrics
                .receive_latency
                .observe(started.elapsed().as_secs_f64());
        }
        let mut out = Vec::with_capacity(delivered.len() + 2);
        out.push(v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Status(if delivered.is_empty() {
                status(Code::MessageNotFound, "no new message")
            } else {
                ok()
            })),
        });
        let host = self.broker.client_addr();
        for d in delivered {
            let Ok((view, _)) = MessageView::parse(&d.bytes) else {
                tracing::error!(
                    topic,
                    queue = d.queue_id,
                    offset = d.offset,
                    "stored message does not parse"
                );
                continue;
            };
            let m = v2_message::outgoing(
                &view,
                &Delivery {
                    topic: &topic,
                    namespace: &namespace,
                    queue_id: d.queue_id,
                    queue_offset: d.offset,
                    store_host: &host,
                    receipt_handle: Some(d.receipt),
                    attempt: Some(d.attempt),
                    invisible: Some(invisible),
                },
            );
            out.push(v2::ReceiveMessageResponse {
                content: Some(v2::receive_message_response::Content::Message(m)),
            });
        }
        out.push(v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::DeliveryTimestamp(
                v2_message::timestamp(now_ms()),
            )),
        });
        Ok(out)
    }

    /// Offset-based reads from this node's applied state.
    async fn pull_local(
        &self,
        req: v2::PullMessageRequest,
        client_deadline: Option<Duration>,
    ) -> Result<Vec<v2::PullMessageResponse>, BrokerError> {
        group_name(req.group.as_ref())?;
        let q = QueueRef::of(req.message_queue.as_ref())?;
        let filter = Filter::of_v2(req.filter_expression.as_ref())?;
        let queue_id = q.queue_id()?;
        let QueueRef { topic, namespace, .. } = q;
        let offset = u64::try_from(req.offset)
            .map_err(|_| BrokerError::Refused(Code::IllegalOffset, "negative offset".into()))?;
        if self.broker.node.sm.topic(&topic).is_none() {
            return Err(BrokerError::TopicNotFound(topic));
        }
        let wait = req
            .long_polling_timeout
            .as_ref()
            .and_then(from_duration)
            .unwrap_or(Duration::ZERO);
        let deadline = poll_deadline(wait, client_deadline);
        let batch = req.batch_size.clamp(1, pop::MAX_BATCH as i32) as u64;
        let host = self.broker.client_addr();
        let mut applied = self.broker.node.sm.applied_watch();
        loop {
            applied.borrow_and_update();
            let store = &self.broker.node.store;
            let (min, max) = store
                .queue(&topic, queue_id)
                .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()));
            if offset > max {
                return Err(BrokerError::Refused(
                    Code::IllegalOffset,
                    format!("offset {offset} is past the end of the queue ({max})"),
                ));
            }
            let start = offset.max(min);
            let mut next = start;
            let mut out = Vec::new();
            while next < max && (out.len() as u64) < batch && next - start < 1024 {
                let q = next;
                next += 1;
                let Ok((unit, bytes)) = store.message(&topic, queue_id, q) else {
                    continue;
                };
                let Ok((view, _)) = MessageView::parse(&bytes) else {
                    continue;
                };
                if filter.may_match(unit.tag_hash) && filter.matches(&view) {
                    out.push(self.pulled(&view, &topic, &namespace, queue_id, q, &host));
                }
            }
            if !out.is_empty() || next > start || Instant::now() >= deadline {
                let mut items = vec![v2::PullMessageResponse {
                    content: Some(v2::pull_message_response::Content::Status(if out.is_empty() {
                        status(Code::MessageNotFound, "no new message")
                    } else {
                        ok()
                    })),
                }];
                items.extend(out.into_iter().map(|m| v2::PullMessageResponse {
                    content: Some(v2::pull_message_response::Content::Message(m)),
                }));
                items.push(v2::PullMessageResponse {
                    content: Some(v2::pull_message_response::Content::NextOffset(next as i64)),
                });
                return Ok(items);
            }
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() {
                        return Err(BrokerError::Unavailable("the node is shutting down".into()));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn pulled(
        &self,
        view: &MessageView<'_>,
        topic: &str,
        namespace: &str,
        queue_id: u32,
        offset: u64,
        host: &str,
    ) -> v2::Message {
        v2_message::outgoing(
            view,
            &Delivery {
                topic,
                namespace,
                queue_id,
                queue_offset: offset,
                store_host: host,
                receipt_handle: None,
                attempt: None,
                invisible: None,
            },
        )
    }

    async fn route_groups(&self, topic: &str) -> Result<Vec<GroupQueues>, BrokerError> {
        let groups = route::groups_of(&self.broker, self.routes.as_ref(), topic).await?;
        if !groups.is_empty() {
            return Ok(groups);
        }
        if !self.broker.cfg.auto_create_topics {
            return Err(BrokerError::TopicNotFound(topic.to_string()));
        }
        self.auto_create_topic(topic).await?;
        route::groups_of(&self.broker, self.routes.as_ref(), topic).await
    }

    /// Creates a topic on first use (when `auto_create_topics` is on), on the
    /// leader of this node's group.
    async fn auto_create_topic(&self, topic: &str) -> Result<(), BrokerError> {
        let queues = self.broker.cfg.auto_create_topic_queues;
        match self.broker.leader_client().await? {
            None => {
                self.broker
                    .put_topic_local(raftmq_raft::TopicConfig {
                        name: topic.to_string(),
                        read_queues: queues,
                        write_queues: queues,
                        perm: 6,
                        message_type: raftmq_raft::command::TopicMessageType::Mixed,
                    })
                    .await?
            }
            Some(mut c) => {
                c.put_topic(crate::proto::pb::PutTopicRequest {
                    name: topic.to_string(),
                    read_queues: queues,
                    write_queues: queues,
                    perm: 6,
                    message_type: "MIXED".into(),
                })
                .await
                .map_err(BrokerError::from)?;
            }
        }
        tracing::info!(topic, queues, "created topic on first use");
        // Wait until this node has applied it.
        let deadline = Instant::now() + FORWARD_WAIT;
        let mut applied = self.broker.node.sm.applied_watch();
        while self.broker.node.sm.topic(topic).is_none() && Instant::now() < deadline {
            let _ = tokio::time::timeout(Duration::from_millis(100), applied.changed()).await;
        }
        Ok(())
    }
}

/// The items of a forwarded call's response stream.
async fn collect<T>(mut s: Streaming<T>) -> Result<Vec<T>, BrokerError> {
    let mut out = Vec::new();
    while let Some(item) = s.message().await.map_err(BrokerError::from)? {
        out.push(item);
    }
    Ok(out)
}

fn stream_of<T: Send + 'static>(items: Vec<T>) -> BoxStream<T> {
    Box::pin(tokio_stream::iter(items.into_iter().map(Ok)))
}

#[tonic::async_trait]
impl Service for MessagingService {
    async fn query_route(
        &self,
        request: Request<v2::QueryRouteRequest>,
    ) -> Result<Response<v2::QueryRouteResponse>, Status> {
        let req = request.into_inner();
        let out = async {
            let name = topic_name(req.topic.as_ref())?;
            let groups = self.route_groups(&name).await?;
            let topic = req.topic.clone().unwrap_or_default();
            Ok::<_, BrokerError>(route::message_queues(&topic, &groups))
        }
        .await;
        Ok(Response::new(match out {
            Ok(message_queues) => v2::QueryRouteResponse {
                status: Some(ok()),
                message_queues,
            },
            Err(e) => v2::QueryRouteResponse {
                status: Some(e.v2_status()),
                message_queues: vec![],
            },
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v2::HeartbeatRequest>,
    ) -> Result<Response<v2::HeartbeatResponse>, Status> {
        let id = header(request.metadata(), CLIENT_ID).to_string();
        let language = header(request.metadata(), LANGUAGE).to_string();
        let req = request.into_inner();
        let group = req.group.map(|g| g.name);
        if let Some(g) = group.as_deref().filter(|g| !g.is_empty())
            && let Err(e) = pop::validate_group(g)
        {
            return Ok(Response::new(v2::HeartbeatResponse {
                status: Some(e.v2_status()),
            }));
        }
        let client_type = v2::ClientType::try_from(req.client_type).unwrap_or(v2::ClientType::Unspecified);
        self.broker.clients.seen(&id, client_type, group, &language);
        Ok(Response::new(v2::HeartbeatResponse { status: Some(ok()) }))
    }

    async fn send_message(
        &self,
        request: Request<v2::SendMessageRequest>,
    ) -> Result<Response<v2::SendMessageResponse>, Status> {
        let n = request.get_ref().messages.len().max(1);
        let ids: Vec<String> = request
            .get_ref()
            .messages
            .iter()
            .map(|m| {
                m.system_properties
                    .as_ref()
                    .map(|s| s.message_id.clone())
                    .unwrap_or_default()
            })
            .collect();
        let out = v2_on_leader!(self, request, req, self.send_local(req).await, send_message);
        Ok(Response::new(match out {
            Ok(r) => r,
            // Every message gets an entry (clients index the first one).
            Err(e) => v2::SendMessageResponse {
                status: Some(e.v2_status()),
                entries: (0..n)
                    .map(|i| v2::SendResultEntry {
                        status: Some(e.v2_status()),
                        message_id: ids.get(i).cloned().unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect(),
            },
        }))
    }

    async fn query_assignment(
        &self,
        request: Request<v2::QueryAssignmentRequest>,
    ) -> Result<Response<v2::QueryAssignmentResponse>, Status> {
        let req = request.into_inner();
        let out = async {
            group_name(req.group.as_ref())?;
            let name = topic_name(req.topic.as_ref())?;
            let groups = self.route_groups(&name).await?;
            let topic = req.topic.clone().unwrap_or_default();
            Ok::<_, BrokerError>(
                route::message_queues(&topic, &groups)
                    .into_iter()
                    .filter(|q| {
                        q.permission == v2::Permission::Read as i32 || q.permission == v2::Permission::ReadWrite as i32
                    })
                    .map(|q| v2::Assignment { message_queue: Some(q) })
                    .collect(),
            )
        }
        .await;
        Ok(Response::new(match out {
            Ok(assignments) => v2::QueryAssignmentResponse {
                status: Some(ok()),
                assignments,
            },
            Err(e) => v2::QueryAssignmentResponse {
                status: Some(e.v2_status()),
                assignments: vec![],
            },
        }))
    }

    type ReceiveMessageStream = BoxStream<v2::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<v2::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        let client_deadline = grpc_timeout(request.metadata());
        let out = v2_on_leader!(
            self,
            request,
            req,
            self.receive_local(req, client_deadline).await,
            receive_message,
            collect
        );
        let items = match out {
            Ok(items) => items,
            Err(e) => vec![v2::ReceiveMessageResponse {
                content: Some(v2::receive_message_response::Content::Status(e.v2_status())),
            }],
        };
        Ok(Response::new(stream_of(items)))
    }

    async fn ack_message(
        &self,
        request: Request<v2::AckMessageRequest>,
    ) -> Result<Response<v2::AckMessageResponse>, Status> {
        let n = request.get_ref().entries.len();
        let out = v2_on_leader!(
            self,
            request,
            req,
            async {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let decoded: Vec<Option<Receipt>> =
                    req.entries.iter().map(|e| receipt::decode(&e.receipt_handle)).collect();
                let valid: Vec<Receipt> = decoded.iter().flatten().copied().collect();
                let mut acked = if valid.is_empty() {
                    Vec::new()
                } else {
                    self.broker.popper.ack(&group, &topic, &valid).await?
                }
                .into_iter();
                let entries: Vec<v2::AckMessageResultEntry> = req
                    .entries
                    .iter()
                    .zip(&decoded)
                    .map(|(e, d)| v2::AckMessageResultEntry {
                        message_id: e.message_id.clone(),
                        receipt_handle: e.receipt_handle.clone(),
                        status: Some(match d {
                            None => decode_receipt(&e.receipt_handle)
                                .err()
                                .map_or_else(ok, |e| e.v2_status()),
                            Some(_) if acked.next() == Some(true) => ok(),
                            Some(_) => stale_receipt(),
                        }),
                    })
                    .collect();
                let statuses: Vec<v2::Status> = entries.iter().filter_map(|e| e.status.clone()).collect();
                Ok(v2::AckMessageResponse {
                    status: Some(overall(&statuses)),
                    entries,
                })
            }
            .await,
            ack_message
        );
        Ok(Response::new(match out {
            Ok(r) => r,
            Err(e) => v2::AckMessageResponse {
                status: Some(e.v2_status()),
                entries: (0..n.max(1))
                    .map(|_| v2::AckMessageResultEntry {
                        status: Some(e.v2_status()),
                        ..Default::default()
                    })
                    .collect(),
            },
        }))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<v2::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<v2::ForwardMessageToDeadLetterQueueResponse>, Status> {
        let out = v2_on_leader!(
            self,
            request,
            req,
            async {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let r = decode_receipt(&req.receipt_handle)?;
                let moved = self.broker.popper.dead_letter(&group, &topic, &r).await?;
                Ok(v2::ForwardMessageToDeadLetterQueueResponse {
                    status: Some(if moved { ok() } else { stale_receipt() }),
                })
            }
            .await,
            forward_message_to_dead_letter_queue
        );
        Ok(Response::new(v2::ForwardMessageToDeadLetterQueueResponse {
            status: Some(match out {
                Ok(r) => r.status.unwrap_or_else(ok),
                Err(e) => e.v2_status(),
            }),
        }))
    }

    type PullMessageStream = BoxStream<v2::PullMessageResponse>;

    async fn pull_message(
        &self,
        request: Request<v2::PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, Status> {
        let client_deadline = grpc_timeout(request.metadata());
        let items = match self.pull_local(request.into_inner(), client_deadline).await {
            Ok(items) => items,
            Err(e) => vec![v2::PullMessageResponse {
                content: Some(v2::pull_message_response::Content::Status(e.v2_status())),
            }],
        };
        Ok(Response::new(stream_of(items)))
    }

    async fn update_offset(
        &self,
        request: Request<v2::UpdateOffsetRequest>,
    ) -> Result<Response<v2::UpdateOffsetResponse>, Status> {
        let out = v2_on_leader!(
            self,
            request,
            req,
            async {
                let group = group_name(req.group.as_ref())?;
                let QueueRef { topic, id, .. } = QueueRef::of(req.message_queue.as_ref())?;
                let t = self
                    .broker
                    .node
                    .sm
                    .topic(&topic)
                    .ok_or_else(|| BrokerError::TopicNotFound(topic.clone()))?;
                let queue_id = u32::try_from(id)
                    .ok()
                    .filter(|q| *q < t.read_queues.max(t.write_queues))
                    .ok_or_else(|| BrokerError::Refused(Code::BadRequest, format!("no queue {id} in {topic}")))?;
                let offset = u64::try_from(req.offset)
                    .map_err(|_| BrokerError::Refused(Code::IllegalOffset, "negative offset".into()))?;
                self.broker.popper.group(&group).await?;
                self.broker
                    .commit_offset_local(&group, &topic, queue_id, offset)
                    .await?;
                Ok(v2::UpdateOffsetResponse { status: Some(ok()) })
            }
            .await,
            update_offset
        );
        Ok(Response::new(out.unwrap_or_else(|e| v2::UpdateOffsetResponse {
            status: Some(e.v2_status()),
        })))
    }

    async fn get_offset(
        &self,
        request: Request<v2::GetOffsetRequest>,
    ) -> Result<Response<v2::GetOffsetResponse>, Status> {
        // A consumer resumes where its group last committed, so this read
        // must see every commit acknowledged before it: the leader answers,
        // after confirming it still leads (a follower's or a deposed
        // leader's state may lack the latest commit).
        let out = v2_on_leader!(
            self,
            request,
            req,
            async {
                let group = group_name(req.group.as_ref())?;
                let q = QueueRef::of(req.message_queue.as_ref())?;
                let (topic, queue_id) = (q.topic.clone(), q.queue_id()?);
                self.broker.node.linearizable().await?;
                let offset = self
                    .broker
                    .node
                    .sm
                    .with_metadata(|m| m.offsets.get(&group)?.get(&topic)?.get(&queue_id).copied())
                    .ok_or_else(|| {
                        BrokerError::Refused(
                            Code::OffsetNotFound,
                            format!("group {group} has no offset in {topic}/{queue_id}"),
                        )
                    });
                Ok::<_, BrokerError>(offset_reply(offset, |status, offset| v2::GetOffsetResponse {
                    status: Some(status),
                    offset,
                }))
            }
            .await,
            get_offset
        );
        Ok(Response::new(match out {
            Ok(r) => r,
            Err(e) => v2::GetOffsetResponse {
                status: Some(e.v2_status()),
                offset: 0,
            },
        }))
    }

    async fn query_offset(
        &self,
        request: Request<v2::QueryOffsetRequest>,
    ) -> Result<Response<v2::QueryOffsetResponse>, Status> {
        let req = request.into_inner();
        let out = (|| {
            let q = QueueRef::of(req.message_queue.as_ref())?;
            if self.broker.node.sm.topic(&q.topic).is_none() {
                return Err(BrokerError::TopicNotFound(q.topic));
            }
            let (topic, queue_id) = (q.topic.clone(), q.queue_id()?);
            let store = &self.broker.node.store;
            let Some(cq) = store.queue(&topic, queue_id) else {
                return Ok(0);
            };
            Ok(match v2::QueryOffsetPolicy::try_from(req.query_offset_policy) {
                Ok(v2::QueryOffsetPolicy::Beginning) => cq.min_offset(),
                Ok(v2::QueryOffsetPolicy::End) => cq.max_offset(),
                Ok(v2::QueryOffsetPolicy::Timestamp) => {
                    let ts = req.timestamp.as_ref().map(v2_message::millis_of).ok_or_else(|| {
                        BrokerError::Refused(Code::BadRequest, "a TIMESTAMP query needs a timestamp".into())
                    })?;
                    self.broker.offset_for_timestamp(&topic, queue_id, ts)?
                }
                Err(_) => return Err(BrokerError::Refused(Code::BadRequest, "unknown offset policy".into())),
            })
        })();
        Ok(Response::new(offset_reply(out, |status, offset| {
            v2::QueryOffsetResponse {
                status: Some(status),
                offset,
            }
        })))
    }

    async fn end_transaction(
        &self,
        request: Request<v2::EndTransactionRequest>,
    ) -> Result<Response<v2::EndTransactionResponse>, Status> {
        let out = v2_on_leader!(
            self,
            request,
            req,
            self.end_transaction_local(req).await,
            end_transaction
        );
        Ok(Response::new(match out {
            Ok(r) => r,
            Err(e) => v2::EndTransactionResponse {
                status: Some(e.v2_status()),
            },
        }))
    }

    type TelemetryStream = ReceiverStream<Result<v2::TelemetryCommand, Status>>;

    async fn telemetry(
        &self,
        request: Request<Streaming<v2::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        let id = header(request.metadata(), CLIENT_ID).to_string();
        let language = header(request.metadata(), LANGUAGE).to_string();
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let broker = self.broker.clone();
        static STREAMS: AtomicU64 = AtomicU64::new(0);
        let stream_id = STREAMS.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            loop {
                let cmd = match inbound.message().await {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(client = id, "telemetry stream ended: {e}");
                        break;
                    }
                };
                let Some(v2::telemetry_command::Command::Settings(s)) = cmd.command else {
                    // Answers to server commands (a check-back is answered
                    // with EndTransaction instead).
                    continue;
                };
                let client_type = s
                    .client_type
                    .and_then(|t| v2::ClientType::try_from(t).ok())
                    .unwrap_or(v2::ClientType::Unspecified);
                let group = match &s.pub_sub {
                    Some(v2::settings::PubSub::Subscription(sub)) => sub.group.as_ref().map(|g| g.name.clone()),
                    _ => None,
                };
                let published: Option<Vec<String>> = match &s.pub_sub {
                    Some(v2::settings::PubSub::Publishing(p)) => {
                        Some(p.topics.iter().map(|t| t.name.clone()).collect())
                    }
                    _ => None,
                };
                let config = group.as_deref().map(|g| broker.popper.group_or_default(g));
                let reply = crate::grpc::rocketmq::settings::effective(&s, &broker.cfg, config.as_ref());
                broker.clients.seen(&id, client_type, group, &language);
                if let Some(topics) = published {
                    broker.clients.publishes(&id, topics);
                }
                broker.clients.attach(&id, stream_id, tx.clone());
                let cmd = v2::TelemetryCommand {
                    status: Some(ok()),
                    command: Some(v2::telemetry_command::Command::Settings(reply)),
                };
                if tx.send(Ok(cmd)).await.is_err() {
                    break;
                }
            }
            broker.clients.detach(&id, stream_id);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn notify_client_termination(
        &self,
        request: Request<v2::NotifyClientTerminationRequest>,
    ) -> Result<Response<v2::NotifyClientTerminationResponse>, Status> {
        let id = header(request.metadata(), CLIENT_ID).to_string();
        self.broker.clients.remove(&id);
        Ok(Response::new(v2::NotifyClientTerminationResponse {
            status: Some(ok()),
        }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<v2::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<v2::ChangeInvisibleDurationResponse>, Status> {
        let out = v2_on_leader!(
            self,
            request,
            req,
            async {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let r = decode_receipt(&req.receipt_handle)?;
                // Zero is allowed here: it makes the message visible again now (a nack).
                let invisible = invisible_time(req.invisible_duration.as_ref(), Duration::ZERO, Duration::ZERO)?;
                Ok(
                    match self
                        .broker
                        .popper
                        .change_invisible(&group, &topic, &r, invisible)
                        .await?
                    {
                        Some(handle) => v2::ChangeInvisibleDurationResponse {
                            status: Some(ok()),
                            receipt_handle: handle,
                        },
                        None => v2::ChangeInvisibleDurationResponse {
                            status: Some(stale_receipt()),
                            receipt_handle: String::new(),
                        },
                    },
                )
            }
            .await,
            change_invisible_duration
        );
        Ok(Response::new(out.unwrap_or_else(|e| {
            v2::ChangeInvisibleDurationResponse {
                status: Some(e.v2_status()),
                receipt_handle: String::new(),
            }
        })))
    }

    async fn recall_message(
        &self,
        request: Request<v2::RecallMessageRequest>,
    ) -> Result<Response<v2::RecallMessageResponse>, Status> {
        let out = v2_on_leader!(self, request, req, self.recall_local(req).await, recall_message);
        Ok(Response::new(match out {
            Ok(r) => r,
            Err(e) => v2::RecallMessageResponse {
                status: Some(e.v2_status()),
                message_id: String::new(),
            },
        }))
    }

    async fn sync_lite_subscription(
        &self,
        _request: Request<v2::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<v2::SyncLiteSubscriptionResponse>, Status> {
        Ok(Response::new(v2::SyncLiteSubscriptionResponse {
            status: Some(status(Code::Unsupported, "lite topics are not supported")),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", MetadataValue::from_static("6000m"));
        assert_eq!(grpc_timeout(&m), Some(Duration::from_secs(6)));
        m.insert("grpc-timeout", MetadataValue::from_static("2S"));
        assert_eq!(grpc_timeout(&m), Some(Duration::from_secs(2)));
        m.insert("grpc-timeout", MetadataValue::from_static("x"));
        assert_eq!(grpc_timeout(&m), None);
        m.insert("grpc-timeout", MetadataValue::from_static("99999999999999999999999H"));
        assert_eq!(grpc_timeout(&m), None);
        // Nine digits: more than the spec allows (and than tonic can send on).
        m.insert("grpc-timeout", MetadataValue::from_static("100000000H"));
        assert_eq!(grpc_timeout(&m), None);
    }

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
