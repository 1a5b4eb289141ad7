//! Held messages at the leader: storing timed and half messages in their
//! system topics, and releasing them into their real topics. The replicated
//! state and its rules are in [`raftmq_raft::held`]; [`timers`] and
//! [`transactions`] decide when to release.

pub mod timers;
pub mod transactions;

use std::sync::atomic::{AtomicUsize, Ordering};

use raftmq_raft::command::{AdminCommand, Command, Response, SendBatch};
use raftmq_raft::held::{self, HeldId};
use raftmq_raft::message::MessageView;
use raftmq_raft::{BatchOutcome, Message, RaftNode};

use crate::broker::Broker;
use crate::broker::batcher::write_bounded;
use crate::broker::internal_topic;
use crate::broker::metrics::{self, TopicLabels};
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::proto::pb;
use crate::proto::rocketmq::v2::Code;

/// How long a call to another node of the group may take.
pub const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A message to hold: where it goes once released, and (timed) when.
pub struct ToHold {
    pub topic: String,
    pub queue_id: u32,
    pub message: Message,
    pub due_ms: Option<u64>,
}

/// Stores messages in `system_topic` through the batcher (so concurrent
/// timed sends share entries as plain sends do) and returns their ids.
pub async fn store(broker: &Broker, system_topic: &str, msgs: Vec<ToHold>) -> Result<Vec<HeldId>, BrokerError> {
    internal_topic::ensure(&broker.node, system_topic).await?;
    let messages: Vec<Message> = msgs
        .into_iter()
        .map(|h| {
            let mut m = h.message;
            m.properties.push((held::P_REAL_TOPIC.into(), h.topic));
            m.properties.push((held::P_REAL_QUEUE.into(), h.queue_id.to_string()));
            if let Some(due) = h.due_ms {
                m.properties.push((held::P_DELIVER_AT.into(), due.to_string()));
            }
            m
        })
        .collect();
    broker.check_send(system_topic, 0, &messages)?;
    // Held until the send is over, applied or not.
    let _room = Room::take(broker, messages.len())?;
    let n = messages.len() as u32;
    // Counted under their real topics, once stored.
    let counted: Vec<(String, usize)> = messages
        .iter()
        .map(|m| {
            let topic = m.properties.iter().find(|(k, _)| k == held::P_REAL_TOPIC);
            (topic.map(|(_, t)| t.clone()).unwrap_or_default(), m.body.len())
        })
        .collect();
    let timed = system_topic == held::TIMER_TOPIC;
    let batch = SendBatch {
        topic: system_topic.to_string(),
        queue_id: 0,
        messages,
    };
    let placed = broker.batcher.send_placed(batch).await?;
    match placed.outcome {
        BatchOutcome::Appended { duplicates, .. } => {
            let message_type = if timed { metrics::DELAY } else { metrics::TRANSACTION };
            let duplicate = |k: u32| raftmq_raft::command::duplicate(&duplicates, k);
            for (k, (topic, bytes)) in counted.into_iter().enumerate() {
                // A retry stored before is not counted again.
                if duplicate(k as u32).is_some() {
                    continue;
                }
                broker.metrics.messages_in(&topic, message_type, [bytes]);
                if timed {
                    broker.metrics.timer_enqueue.get_or_create(&TopicLabels { topic }).inc();
                }
            }
            broker.metrics.send_duplicates.inc_by(duplicates.len() as u64);
            // The timer loop works out its wait again: this one may be
            // due sooner than it was sleeping for (or due already).
            if timed {
                broker.timers_changed.notify_one();
            }
            // A retry answers with its first copy's id (so with the same
            // transaction id or recall handle).
            Ok((0..n)
                .map(|k| {
                    duplicate(k).map_or(
                        HeldId {
                            index: placed.index,
                            ordinal: placed.first_ordinal + k,
                        },
                        |d| d.held_id(),
                    )
                })
                .collect())
        }
        BatchOutcome::Rejected(why) => Err(broker.batch_refused(why)),
    }
}

/// A place for held messages this node admitted, counted against
/// `limits.max_held_messages` beside those applied until the send is over
/// (for a moment after its apply, twice): sends admitted at the same moment
/// cannot pass the bound together, whatever their size.
struct Room<'a> {
    admitted: &'a AtomicUsize,
    n: usize,
}

impl<'a> Room<'a> {
    /// Takes room for `n` more, or refuses when the group holds its bound
    /// already: each is in every snapshot until released.
    fn take(broker: &'a Broker, n: usize) -> Result<Room<'a>, BrokerError> {
        let bound = broker.cfg.limits.max_held_messages;
        let admitted = &broker.held_admitted;
        let before = admitted.fetch_add(n, Ordering::AcqRel);
        let held = broker
            .node
            .sm
            .with_metadata(|m| m.held.timers.len() + m.held.halves.len());
        if held.saturating_add(before).saturating_add(n) > bound {
            admitted.fetch_sub(n, Ordering::AcqRel);
            return Err(BrokerError::Refused(
                Code::TooManyRequests,
                format!(
                    "this broker group holds {held} timed and transactional messages and is storing \
                     {before} more, its limit (limits.max_held_messages): retry once some are due or ended"
                ),
            ));
        }
        Ok(Room { admitted, n })
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        self.admitted.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// A held message read back and made ready for its real topic.
pub struct Release {
    pub topic: String,
    pub queue_id: u32,
    pub message: Message,
    /// When the held copy was stored.
    pub stored_ms: u64,
}

/// Reads a held message from this node's log, with the time it was stored.
pub fn read_local(node: &RaftNode, id: HeldId) -> Result<(Message, u64), BrokerError> {
    node.log.read_held(id).map_err(|e| {
        let what = format!("held message {}/{}: {e}", id.index, id.ordinal);
        // An entry this log does not have, or one without that message, is
        // an answer (the caller may ask another node); anything else a fault.
        match e.kind() == std::io::ErrorKind::NotFound {
            true => BrokerError::Refused(Code::MessageNotFound, what),
            false => BrokerError::Internal(what),
        }
    })
}

/// Reads a held message from this node's log, or else from another node
/// of the group (a node that installed a snapshot past it lacks it).
pub async fn read(broker: &Broker, id: HeldId) -> Result<Release, BrokerError> {
    let (m, stored_ms) = read_held_copy(broker, id).await?;
    release_of(id, m, stored_ms)
}

fn release_of(id: HeldId, m: Message, stored_ms: u64) -> Result<Release, BrokerError> {
    let (topic, queue_id, message) = held::released(m).ok_or_else(|| {
        BrokerError::Internal(format!(
            "held message {}/{} does not say where it goes",
            id.index, id.ordinal
        ))
    })?;
    Ok(Release {
        topic,
        queue_id,
        message,
        stored_ms,
    })
}

/// The held copy itself (with its hold properties) and its store time,
/// from this node's log or another node's.
pub async fn read_held_copy(broker: &Broker, id: HeldId) -> Result<(Message, u64), BrokerError> {
    match read_local(&broker.node, id) {
        Ok(m) => Ok(m),
        Err(local) => read_from_peers(broker, id).await.ok_or(local),
    }
}

/// Reads many held messages, decoding each entry once while consecutive
/// reads stay in it (a release or roll reads the messages of one batched
/// send one after another: their due times are alike).
#[derive(Default)]
pub struct EntryCache {
    entry: Option<(u64, Vec<(Message, u64)>)>,
}

impl EntryCache {
    /// As [`read_held_copy`].
    pub async fn held_copy(&mut self, broker: &Broker, id: HeldId) -> Result<(Message, u64), BrokerError> {
        if self.entry.as_ref().is_none_or(|(index, _)| *index != id.index) {
            self.entry = broker
                .node
                .log
                .messages_at(id.index)
                .ok()
                .map(|messages| (id.index, messages));
        }
        match self.entry.as_ref().and_then(|(_, m)| m.get(id.ordinal as usize)) {
            Some(m) => Ok(m.clone()),
            // Not in this node's log: another node's.
            None => read_held_copy(broker, id).await,
        }
    }

    /// As [`read`].
    pub async fn read(&mut self, broker: &Broker, id: HeldId) -> Result<Release, BrokerError> {
        let (m, stored_ms) = self.held_copy(broker, id).await?;
        release_of(id, m, stored_ms)
    }
}

async fn read_from_peers(broker: &Broker, id: HeldId) -> Option<(Message, u64)> {
    for addr in broker.peer_client_addrs() {
        let Ok(mut client) = broker.peer_client(&addr) else {
            continue;
        };
        let mut req = tonic::Request::new(pb::ReadHeldRequest {
            log_index: id.index,
            ordinal: id.ordinal,
        });
        req.set_timeout(PEER_TIMEOUT);
        let Ok(r) = client.read_held(req).await else { continue };
        let bytes = r.into_inner().message;
        // Validated like anything from the network.
        if let Ok((view, _)) = MessageView::parse(&bytes) {
            tracing::info!(
                index = id.index,
                ordinal = id.ordinal,
                from = addr,
                "read a held message from a peer"
            );
            return Some((view.to_message(), view.store_timestamp_ms));
        }
    }
    None
}

/// Encodes a message in the stored layout (what [`read_from_peers`] and
/// check-backs carry between nodes).
pub fn stored_bytes(m: &Message, store_timestamp_ms: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(m.encoded_len());
    m.encode(store_timestamp_ms, &mut out);
    out
}

/// Whether a release can go to its topic now: `Err(reason)` if the topic is
/// gone (final: the message is dropped), `Ok(false)` if the topic does not
/// take writes at the moment (it waits). A topic that has fewer queues
/// than when the message was sent takes it in `queue % write_queues`.
pub fn deliverable(node: &RaftNode, r: &mut Release) -> Result<bool, String> {
    match node.sm.topic(&r.topic) {
        None => Err(format!("topic {} does not exist", r.topic)),
        Some(t) if !t.writable() || t.write_queues == 0 => Ok(false),
        Some(t) => {
            r.queue_id %= t.write_queues;
            Ok(true)
        }
    }
}

/// Proposes `guard` with the copies of `releases` into their topics (one
/// batch per topic and queue, in the given order). True if the guard held
/// and the copies were appended.
pub async fn release(node: &RaftNode, guard: &AdminCommand, releases: Vec<Release>) -> Result<bool, BrokerError> {
    let mut batches: Vec<SendBatch> = Vec::new();
    for r in releases {
        match batches
            .iter_mut()
            .find(|b| b.topic == r.topic && b.queue_id == r.queue_id)
        {
            Some(b) => b.messages.push(r.message),
            None => batches.push(SendBatch {
                topic: r.topic,
                queue_id: r.queue_id,
                messages: vec![r.message],
            }),
        }
    }
    let cmd = Command::guarded_send(guard, &batches, now_ms()).map_err(|e| BrokerError::Internal(e.to_string()))?;
    match write_bounded(node, cmd).await?.1 {
        Response::Sent(o) => Ok(o.iter().all(|b| matches!(b, BatchOutcome::Appended { .. }))),
        other => Err(BrokerError::Internal(format!("unexpected response {other:?}"))),
    }
}

/// Proposes an admin command; true if it was applied (not rejected).
pub async fn apply(node: &RaftNode, cmd: &AdminCommand) -> Result<bool, BrokerError> {
    Ok(!matches!(
        write_bounded(node, Command::admin(cmd)).await?.1,
        Response::Rejected(_)
    ))
}
