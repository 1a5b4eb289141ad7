//! Offset-based consumption: pulls from this node's applied state (any
//! node serves them), and a group's offsets (committed on the leader, read
//! back linearizably), and offset lookups by policy or time.

use std::time::Duration;

use raftmq_raft::message::MessageView;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::service::*;
use crate::broker::limits::ResponseBudget;
use crate::broker::pop;
use crate::broker::queued::{self, Queued};
use crate::error::BrokerError;
use crate::filter::Filter;
use crate::grpc::grpc_timeout;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::v2_message::{self, Delivery, from_duration, ok, status};

pub(super) async fn pull_message(
    svc: &MessagingService,
    request: Request<v2::PullMessageRequest>,
) -> Vec<v2::PullMessageResponse> {
    let client_deadline = grpc_timeout(request.metadata());
    let client = crate::grpc::header(request.metadata(), CLIENT_ID).to_string();
    let pulled = match svc.broker.long_polls.acquire(&client) {
        Ok(_slot) => pull_local(svc, request.into_inner(), client_deadline).await,
        Err(e) => Err(e),
    };
    match pulled {
        Ok(items) => items,
        Err(e) => vec![v2::PullMessageResponse {
            content: Some(v2::pull_message_response::Content::Status(e.v2_status())),
        }],
    }
}

pub(super) async fn update_offset(
    svc: &MessagingService,
    request: Request<v2::UpdateOffsetRequest>,
) -> Result<Response<v2::UpdateOffsetResponse>, Status> {
    let out = svc
        .on_leader(
            request,
            |req| async move {
                let group = group_name(req.group.as_ref())?;
                let QueueRef { topic, id, .. } = QueueRef::of(req.message_queue.as_ref())?;
                let t = svc.broker.topic(&topic)?;
                let queue_id = u32::try_from(id)
                    .ok()
                    .filter(|q| *q < t.read_queues.max(t.write_queues))
                    .ok_or_else(|| BrokerError::Refused(Code::BadRequest, format!("no queue {id} in {topic}")))?;
                let offset = u64::try_from(req.offset)
                    .map_err(|_| BrokerError::Refused(Code::IllegalOffset, "negative offset".into()))?;
                svc.broker.popper.group(&group).await?;
                svc.broker
                    .commit_offset_local(&group, &topic, queue_id, offset, true)
                    .await?;
                Ok(v2::UpdateOffsetResponse { status: Some(ok()) })
            },
            |mut c, r| async move { c.update_offset(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(out.unwrap_or_else(|e| v2::UpdateOffsetResponse {
        status: Some(e.v2_status()),
    })))
}

pub(super) async fn get_offset(
    svc: &MessagingService,
    request: Request<v2::GetOffsetRequest>,
) -> Result<Response<v2::GetOffsetResponse>, Status> {
    // A consumer resumes where its group last committed, so this read
    // must see every commit acknowledged before it: the leader answers,
    // after confirming it still leads (a follower's or a deposed
    // leader's state may lack the latest commit).
    let out = svc
        .on_leader(
            request,
            |req| async move {
                let group = group_name(req.group.as_ref())?;
                let q = QueueRef::of(req.message_queue.as_ref())?;
                let (topic, queue_id) = (q.topic.clone(), q.queue_id()?);
                svc.broker.node.linearizable().await?;
                let offset = svc
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
            },
            |mut c, r| async move { c.get_offset(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(match out {
        Ok(r) => r,
        Err(e) => v2::GetOffsetResponse {
            status: Some(e.v2_status()),
            offset: 0,
        },
    }))
}

pub(super) async fn query_offset(
    svc: &MessagingService,
    request: Request<v2::QueryOffsetRequest>,
) -> Result<Response<v2::QueryOffsetResponse>, Status> {
    let req = request.into_inner();
    let out = (|| {
        let q = QueueRef::of(req.message_queue.as_ref())?;
        if svc.broker.node.sm.topic(&q.topic).is_none() {
            return Err(BrokerError::TopicNotFound(q.topic));
        }
        let (topic, queue_id) = (q.topic.clone(), q.queue_id()?);
        let store = &svc.broker.node.store;
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
                svc.broker.offset_for_timestamp(&topic, queue_id, ts)?
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

/// Offset-based reads from this node's applied state.
async fn pull_local(
    svc: &MessagingService,
    req: v2::PullMessageRequest,
    client_deadline: Option<Duration>,
) -> Result<Vec<v2::PullMessageResponse>, BrokerError> {
    let group = group_name(req.group.as_ref())?;
    let q = QueueRef::of(req.message_queue.as_ref())?;
    let filter = Filter::of_v2(req.filter_expression.as_ref())?;
    let queue_id = q.queue_id()?;
    let QueueRef { topic, namespace, .. } = q;
    let offset =
        u64::try_from(req.offset).map_err(|_| BrokerError::Refused(Code::IllegalOffset, "negative offset".into()))?;
    if svc.broker.node.sm.topic(&topic).is_none() {
        return Err(BrokerError::TopicNotFound(topic));
    }
    let wait = req
        .long_polling_timeout
        .as_ref()
        .and_then(from_duration)
        .unwrap_or(Duration::ZERO);
    let deadline = poll_deadline(wait, client_deadline);
    let batch = req.batch_size.clamp(1, pop::MAX_BATCH as i32) as u64;
    let host = svc.broker.client_addr();
    let filter = std::sync::Arc::new(filter);
    let mut applied = svc.broker.node.sm.applied_watch();
    loop {
        applied.borrow_and_update();
        // Off the async workers: up to 1024 messages read and parsed.
        let scan = {
            let node = svc.broker.node.clone();
            let (topic, namespace, filter, host) = (topic.clone(), namespace.clone(), filter.clone(), host.clone());
            let max_bytes = svc.broker.live().limits.max_response_bytes;
            let from = Pull {
                queue_id,
                offset,
                batch,
                max_bytes,
            };
            svc.broker
                .reads
                .run(move || from.scan(&node, &topic, &namespace, &filter, &host))
                .await?
        };
        let PullScan {
            out,
            start,
            next,
            body_bytes,
        } = scan;
        if !out.is_empty() || next > start || Instant::now() >= deadline {
            if !out.is_empty() {
                svc.broker.metrics.messages_out(&topic, &group, out.len(), body_bytes);
            }
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

/// Where a pull reads from, and how much it may take.
#[derive(Clone, Copy)]
struct Pull {
    queue_id: u32,
    offset: u64,
    batch: u64,
    max_bytes: usize,
}

/// What one look at a queue found.
struct PullScan {
    out: Vec<v2::Message>,
    /// Where the look started (the offset asked for, or the queue's
    /// oldest kept message if that is later) and where the next begins.
    start: u64,
    next: u64,
    body_bytes: usize,
}

impl Pull {
    /// Reads from the queue what passes `filter`, up to the batch, the
    /// response bound and 1024 messages looked at.
    fn scan(
        &self,
        node: &raftmq_raft::RaftNode,
        topic: &str,
        namespace: &str,
        filter: &Filter,
        host: &str,
    ) -> Result<PullScan, BrokerError> {
        let (min, max) = node
            .store
            .queue(topic, self.queue_id)
            .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()));
        if self.offset > max {
            return Err(BrokerError::Refused(
                Code::IllegalOffset,
                format!("offset {} is past the end of the queue ({max})", self.offset),
            ));
        }
        let start = self.offset.max(min);
        let mut next = start;
        let mut out = Vec::new();
        let mut body_bytes = 0;
        let mut budget = ResponseBudget::new(self.max_bytes);
        while next < max && (out.len() as u64) < self.batch && next - start < 1024 {
            let q = next;
            // A unit that does not lead to its message is damage, refused,
            // never a message to skip (`queued`).
            let (unit, bytes) = match queued::queued(node, topic, self.queue_id, q)? {
                Queued::Found(unit, bytes) => (unit, bytes),
                Queued::Purged => {
                    next += 1;
                    continue;
                }
            };
            if !budget.fits(bytes.len()) {
                break;
            }
            next += 1;
            let view = queued::parse(node, topic, self.queue_id, q, &unit, &bytes)?;
            if filter.may_match(unit.tag_hash) && filter.matches(&view) {
                budget.take(bytes.len());
                body_bytes += view.body.len();
                out.push(pulled(&view, topic, namespace, self.queue_id, q, host));
            }
        }
        Ok(PullScan {
            out,
            start,
            next,
            body_bytes,
        })
    }
}

/// A pulled message as the client protocol carries it.
fn pulled(view: &MessageView<'_>, topic: &str, namespace: &str, queue_id: u32, offset: u64, host: &str) -> v2::Message {
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
            stored: None,
        },
    )
}
