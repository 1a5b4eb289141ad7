//! What producers call: sends (plain, FIFO, batched, timed and half
//! messages), ending transactions, and recalling timed messages. All run
//! on the leader.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use raftmq_raft::message::{Message, tag_hash};
use tonic::{Request, Response, Status};

use super::service::*;
use crate::broker::held::ToHold;
use crate::broker::seal;
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::v2_message::{self, Hold, Limits, Refusal, ok};

pub(super) async fn send_message(
    svc: &MessagingService,
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
    let out = match svc.broker.admit_send() {
        Ok(_in_progress) => {
            svc.on_leader(
                request,
                |req| async move { send_local(svc, req).await },
                |mut c, r| async move { c.send_message(r).await.map(Response::into_inner) },
            )
            .await
        }
        Err(e) => Err(e),
    };
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

pub(super) async fn end_transaction(
    svc: &MessagingService,
    request: Request<v2::EndTransactionRequest>,
) -> Result<Response<v2::EndTransactionResponse>, Status> {
    let out = svc
        .on_leader(
            request,
            |req| async move { end_transaction_local(svc, req).await },
            |mut c, r| async move { c.end_transaction(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(match out {
        Ok(r) => r,
        Err(e) => v2::EndTransactionResponse {
            status: Some(e.v2_status()),
        },
    }))
}

pub(super) async fn recall_message(
    svc: &MessagingService,
    request: Request<v2::RecallMessageRequest>,
) -> Result<Response<v2::RecallMessageResponse>, Status> {
    let out = svc
        .on_leader(
            request,
            |req| async move { recall_local(svc, req).await },
            |mut c, r| async move { c.recall_message(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(match out {
        Ok(r) => r,
        Err(e) => v2::RecallMessageResponse {
            status: Some(e.v2_status()),
            message_id: String::new(),
        },
    }))
}

/// Picks each message's queue and sends the request's messages, one
/// batch per (topic, queue). Runs on the leader.
async fn send_local(
    svc: &MessagingService,
    req: v2::SendMessageRequest,
) -> Result<v2::SendMessageResponse, BrokerError> {
    if req.messages.is_empty() {
        return Err(BrokerError::Refused(
            Code::BadRequest,
            "a send needs at least one message".into(),
        ));
    }
    svc.broker.check_group_writable()?;
    let n = req.messages.len();
    // A request's messages without a message group share one queue.
    let rr = svc.next_queue.fetch_add(1, Ordering::Relaxed);
    let mut batches: BTreeMap<(String, u32), Vec<(usize, Message)>> = BTreeMap::new();
    // Timed and half messages, stored apart ([`crate::broker::held`]).
    let mut timed: Vec<(usize, ToHold)> = Vec::new();
    let mut halves: Vec<(usize, ToHold)> = Vec::new();
    let mut ids = Vec::with_capacity(n);
    let limits = Limits {
        max_body: svc.broker.live().max_body_bytes,
        now_ms: now_ms(),
        max_delay_ms: svc.broker.cfg.timer.max_delay_ms,
        delay_levels_ms: &svc.delay_levels_ms,
    };
    for (i, m) in req.messages.into_iter().enumerate() {
        let name = topic_name(m.topic.as_ref())?;
        let topic = svc.broker.topic(&name)?;
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
            .find(|(k, _)| k == v2_message::P_GROUP)
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
        let r = svc.broker.send_local(&topic, queue, msgs).await;
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
                Ok(stored) => v2::SendResultEntry {
                    status: Some(ok()),
                    message_id: ids[*i].clone(),
                    transaction_id: String::new(),
                    // A retry stored before answers with the first copy's offset.
                    offset: stored.position(k).1 as i64,
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
        let dues: Vec<(String, Option<u64>)> = held.iter().map(|h| (h.topic.clone(), h.due_ms)).collect();
        // Before storing: a held message must get a handle its producer can use.
        let seal = seal::of(&svc.broker.node).await?;
        let r = crate::broker::held::store(&svc.broker, system_topic, held).await;
        for (k, i) in idx.iter().enumerate() {
            entries[*i] = Some(match &r {
                Ok(held_ids) => {
                    let id = held_ids[k];
                    let (topic, due) = &dues[k];
                    let (transaction_id, recall_handle) = match *due {
                        Some(due_ms) => (
                            String::new(),
                            crate::broker::held::timers::recall_handle(
                                &seal,
                                topic,
                                &raftmq_raft::held::TimerKey { due_ms, id },
                                &ids[*i],
                            ),
                        ),
                        None => (
                            crate::broker::held::transactions::transaction_id(&seal, topic, &ids[*i], id),
                            String::new(),
                        ),
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
    svc: &MessagingService,
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
        &svc.broker,
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
async fn recall_local(
    svc: &MessagingService,
    req: v2::RecallMessageRequest,
) -> Result<v2::RecallMessageResponse, BrokerError> {
    let topic = topic_name(req.topic.as_ref())?;
    let message_id = crate::broker::held::timers::recall(&svc.broker, &topic, &req.recall_handle).await?;
    Ok(v2::RecallMessageResponse {
        status: Some(ok()),
        message_id,
    })
}
