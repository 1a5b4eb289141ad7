//! What pop consumers (SimpleConsumer, PushConsumer) call: receive with
//! long polling, ack, change of invisibility, and moves to the dead-letter
//! queue. All run on the leader, which owns the consumption state.

use std::time::Duration;

use raftmq_raft::consumption::Receipt;
use raftmq_raft::message::MessageView;
use tonic::{Request, Response, Status};

use super::service::*;
use crate::broker::pop::Receive;
use crate::broker::{receipt, seal};
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::filter::Filter;
use crate::grpc::grpc_timeout;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::v2_message::{self, Delivery, from_duration, ok, status};

pub(super) async fn receive_message(
    svc: &MessagingService,
    request: Request<v2::ReceiveMessageRequest>,
) -> Vec<v2::ReceiveMessageResponse> {
    let client_deadline = grpc_timeout(request.metadata());
    let client = crate::grpc::header(request.metadata(), CLIENT_ID).to_string();
    // Counted where the client sent it, not again where it was forwarded.
    let counted = !crate::grpc::is_forwarded(request.metadata());
    let owner = crate::broker::auth::owner_of(&request);
    // Held while the receive waits, here and (forwarded) on the leader.
    let out = match svc.broker.long_polls.acquire(&client) {
        Ok(_slot) => {
            svc.on_leader(
                request,
                |req| async move { receive_local(svc, req, client_deadline).await },
                |mut c, r| async move { collect(c.receive_message(r).await?.into_inner()).await },
            )
            .await
        }
        Err(e) => Err(e),
    };
    match out {
        Ok(items) => {
            let n = items
                .iter()
                .filter(|i| matches!(i.content, Some(v2::receive_message_response::Content::Message(_))))
                .count();
            if counted {
                svc.broker.clients.consumed(&client, &owner, n as u64, 0);
            }
            items
        }
        Err(e) => vec![v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Status(e.v2_status())),
        }],
    }
}

pub(super) async fn ack_message(
    svc: &MessagingService,
    request: Request<v2::AckMessageRequest>,
) -> Result<Response<v2::AckMessageResponse>, Status> {
    let n = request.get_ref().entries.len();
    let client = crate::grpc::header(request.metadata(), CLIENT_ID).to_string();
    let counted = !crate::grpc::is_forwarded(request.metadata());
    let owner = crate::broker::auth::owner_of(&request);
    let out = svc
        .on_leader(
            request,
            |req| async move {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let seal = seal::of(&svc.broker.node).await?;
                let decoded: Vec<Option<Receipt>> = req
                    .entries
                    .iter()
                    .map(|e| receipt::decode(&seal, &group, &topic, &e.receipt_handle))
                    .collect();
                let valid: Vec<Receipt> = decoded.iter().flatten().copied().collect();
                let mut acked = if valid.is_empty() {
                    Vec::new()
                } else {
                    svc.broker.popper.ack(&group, &topic, &valid).await?
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
                            None => decode_receipt(&seal, &group, &topic, &e.receipt_handle)
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
            },
            |mut c, r| async move { c.ack_message(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(match out {
        Ok(r) => {
            let acked = r
                .entries
                .iter()
                .filter(|e| e.status.as_ref().is_some_and(|s| s.code == Code::Ok as i32))
                .count();
            if counted {
                svc.broker.clients.consumed(&client, &owner, 0, acked as u64);
            }
            r
        }
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

pub(super) async fn change_invisible_duration(
    svc: &MessagingService,
    request: Request<v2::ChangeInvisibleDurationRequest>,
) -> Result<Response<v2::ChangeInvisibleDurationResponse>, Status> {
    let out = svc
        .on_leader(
            request,
            |req| async move {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let seal = seal::of(&svc.broker.node).await?;
                let r = decode_receipt(&seal, &group, &topic, &req.receipt_handle)?;
                // Zero is allowed here: it makes the message visible again now (a nack).
                let invisible = invisible_time(req.invisible_duration.as_ref(), Duration::ZERO, Duration::ZERO)?;
                Ok(
                    match svc
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
            },
            |mut c, r| async move { c.change_invisible_duration(r).await.map(Response::into_inner) },
        )
        .await;
    Ok(Response::new(out.unwrap_or_else(|e| {
        v2::ChangeInvisibleDurationResponse {
            status: Some(e.v2_status()),
            receipt_handle: String::new(),
        }
    })))
}

pub(super) async fn forward_message_to_dead_letter_queue(
    svc: &MessagingService,
    request: Request<v2::ForwardMessageToDeadLetterQueueRequest>,
) -> Result<Response<v2::ForwardMessageToDeadLetterQueueResponse>, Status> {
    let out = svc
        .on_leader(
            request,
            |req| async move {
                let group = group_name(req.group.as_ref())?;
                let topic = topic_name(req.topic.as_ref())?;
                let seal = seal::of(&svc.broker.node).await?;
                let r = decode_receipt(&seal, &group, &topic, &req.receipt_handle)?;
                let moved = svc.broker.popper.dead_letter(&group, &topic, &r).await?;
                Ok(v2::ForwardMessageToDeadLetterQueueResponse {
                    status: Some(if moved { ok() } else { stale_receipt() }),
                })
            },
            |mut c, r| async move {
                c.forward_message_to_dead_letter_queue(r)
                    .await
                    .map(Response::into_inner)
            },
        )
        .await;
    Ok(Response::new(v2::ForwardMessageToDeadLetterQueueResponse {
        status: Some(match out {
            Ok(r) => r.status.unwrap_or_else(ok),
            Err(e) => e.v2_status(),
        }),
    }))
}

/// A pop receive on the leader, as the response stream's items.
async fn receive_local(
    svc: &MessagingService,
    req: v2::ReceiveMessageRequest,
    client_deadline: Option<Duration>,
) -> Result<Vec<v2::ReceiveMessageResponse>, BrokerError> {
    let group = group_name(req.group.as_ref())?;
    let QueueRef { topic, namespace, id } = QueueRef::of(req.message_queue.as_ref())?;
    let filter = Filter::of_v2(req.filter_expression.as_ref())?;
    let live = svc.broker.live();
    let invisible = invisible_time(
        req.invisible_duration.as_ref(),
        Duration::from_millis(live.default_invisible_ms),
        Duration::from_millis(live.min_invisible_ms),
    )?;
    let wait = match req.long_polling_timeout.as_ref() {
        Some(d) => from_duration(d).ok_or_else(|| {
            BrokerError::Refused(Code::IllegalPollingTime, "the long polling timeout is negative".into())
        })?,
        None => Duration::from_millis(live.long_polling_timeout_ms),
    };
    let batch = if req.batch_size <= 0 {
        32
    } else {
        req.batch_size as usize
    };
    let r = std::sync::Arc::new(Receive {
        group,
        topic: topic.clone(),
        filter,
        batch,
        invisible,
        first_queue: id.max(0) as u32,
        deadline: poll_deadline(wait, client_deadline),
        max_bytes: live.limits.max_response_bytes,
    });
    let started = std::time::Instant::now();
    let delivered = svc.broker.popper.receive(r.clone()).await?;
    if !delivered.is_empty() {
        svc.broker
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
    let host = svc.broker.client_addr();
    let (mut count, mut body_bytes) = (0, 0);
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
                stored: Some(&d.bytes),
            },
        );
        count += 1;
        body_bytes += view.body.len();
        out.push(v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Message(m)),
        });
    }
    if count > 0 {
        svc.broker.metrics.messages_out(&topic, &r.group, count, body_bytes);
    }
    out.push(v2::ReceiveMessageResponse {
        content: Some(v2::receive_message_response::Content::DeliveryTimestamp(
            v2_message::timestamp(now_ms()),
        )),
    });
    Ok(out)
}
