//! Reads from this node's applied state (any node serves them, never past
//! what it has applied): a queue from an offset, and messages by id, key or
//! store time.

use raftmq_raft::Message;
use raftmq_raft::message::MessageView;

use super::Broker;
use super::limits::ResponseBudget;
use super::queued::{Queued, parse, queued};
use crate::error::BrokerError;

/// A message as stored, with where it sits in its queue.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub message: Message,
    pub store_timestamp_ms: u64,
    pub queue_offset: u64,
}

impl StoredMessage {
    pub fn of(v: &MessageView<'_>, queue_offset: u64) -> StoredMessage {
        StoredMessage {
            message: v.to_message(),
            store_timestamp_ms: v.store_timestamp_ms,
            queue_offset,
        }
    }
}

/// Messages read from one queue.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    pub messages: Vec<StoredMessage>,
    /// Where the next read starts.
    pub next_offset: u64,
    /// One past the last message of the queue on this node.
    pub max_offset: u64,
}

/// One queue of a topic as this node holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStatus {
    pub queue: u32,
    /// The oldest offset kept.
    pub min_offset: u64,
    /// The offset the next message gets.
    pub max_offset: u64,
    /// When the queue's last message was stored (0: none is kept).
    pub last_store_ms: u64,
}

impl Broker {
    /// Each queue of `topic`: its offsets and its last message's store time.
    pub fn topic_status(&self, topic: &str) -> Result<Vec<QueueStatus>, BrokerError> {
        let t = self.topic(topic)?;
        let store = &self.node.store;
        Ok((0..t.read_queues.max(t.write_queues))
            .map(|q| {
                let (min, max) = store
                    .queue(topic, q)
                    .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()));
                let last_store_ms = (max > min)
                    .then(|| store.message(topic, q, max - 1).ok())
                    .flatten()
                    .and_then(|(_, bytes)| MessageView::parse(&bytes).ok().map(|(v, _)| v.store_timestamp_ms))
                    .unwrap_or(0);
                QueueStatus {
                    queue: q,
                    min_offset: min,
                    max_offset: max,
                    last_store_ms,
                }
            })
            .collect())
    }

    /// Reads committed messages from this node's applied state: at most
    /// `max` (and 1024), and no more bytes than an answer may carry.
    pub fn read(&self, topic: &str, queue_id: u32, offset: u64, max: u32) -> Result<ReadBatch, BrokerError> {
        if self.node.sm.topic(topic).is_none() {
            return Err(BrokerError::TopicNotFound(topic.to_string()));
        }
        let store = &self.node.store;
        let Some(cq) = store.queue(topic, queue_id) else {
            return Ok(ReadBatch {
                messages: vec![],
                next_offset: offset,
                max_offset: 0,
            });
        };
        let (min, end) = (cq.min_offset(), cq.max_offset());
        let start = offset.max(min);
        let stop = end.min(start.saturating_add(u64::from(max.clamp(1, 1024))));
        let mut messages = Vec::new();
        let mut budget = ResponseBudget::new(self.live().limits.max_response_bytes);
        let mut next = start;
        while next < stop {
            let (unit, bytes) = match queued(&self.node, topic, queue_id, next)? {
                Queued::Found(unit, bytes) => (unit, bytes),
                Queued::Purged => {
                    next += 1;
                    continue;
                }
            };
            if !budget.take(bytes.len()) {
                break;
            }
            let view = parse(&self.node, topic, queue_id, next, &unit, &bytes)?;
            messages.push(StoredMessage::of(&view, next));
            next += 1;
        }
        Ok(ReadBatch {
            messages,
            next_offset: next,
            max_offset: end,
        })
    }

    /// Messages of `topic` whose id (or one of whose keys) is `wanted`, newest
    /// first, from the key index of this node's applied state.
    pub fn query_messages(
        &self,
        topic: &str,
        wanted: &str,
        by_id: bool,
        max: usize,
    ) -> Result<Vec<StoredMessage>, BrokerError> {
        let Some(config) = self.node.sm.topic(topic) else {
            return Err(BrokerError::TopicNotFound(topic.to_string()));
        };
        let store = &self.node.store;
        // The key index holds a hash of `topic#key`: a candidate is this
        // topic's only if one of its queues holds it (never another topic's
        // message whose key hashes alike, by chance or by a name chosen to
        // collide), and that queue gives its offset.
        let queues: Vec<_> = (0..config.read_queues.max(config.write_queues))
            .filter_map(|q| store.queue(topic, q))
            .collect();
        let key = format!("{topic}#{wanted}");
        let candidates = store
            .query_key(key.as_bytes(), 0, u64::MAX, max.saturating_mul(4).max(64))
            .map_err(|e| {
                // Damage is refused, not a lookup that misses messages; the
                // next start sets the store aside (`queued`).
                if matches!(e, raftmq_store::StoreError::Corrupt { .. }) {
                    self.node.note_damage(&format!("the key index: {e}"));
                }
                BrokerError::Internal(e.to_string())
            })?;
        let limit = self.cfg.store.max_record_size;
        let mut out = Vec::new();
        let mut budget = ResponseBudget::new(self.live().limits.max_response_bytes);
        for phys in candidates {
            let log = store.commitlog();
            let Ok(head) = log.read_bytes(phys, 4) else { continue };
            let len = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
            if len == 0 || len > limit {
                continue;
            }
            let Ok(bytes) = log.read_bytes(phys, len) else { continue };
            let Ok((v, _)) = MessageView::parse(&bytes) else {
                continue;
            };
            let hit = if by_id {
                v.message_id == wanted
            } else {
                v.keys().any(|k| k == wanted)
            };
            if !hit {
                continue;
            }
            // Checked last: a few binary searches per hit.
            let mut found = None;
            for cq in &queues {
                match cq.offset_of_phys(phys) {
                    Ok(Some(q)) => {
                        found = Some(q);
                        break;
                    }
                    Ok(None) => {}
                    Err(e @ raftmq_store::StoreError::Corrupt { .. }) => {
                        self.node.note_damage(&format!("{topic}: {e}"));
                        return Err(BrokerError::Internal(e.to_string()));
                    }
                    // Retention moved the queue meanwhile.
                    Err(_) => {}
                }
            }
            let Some(queue_offset) = found else {
                continue;
            };
            if !budget.take(bytes.len()) {
                break;
            }
            out.push(StoredMessage::of(&v, queue_offset));
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    /// Messages of `topic` stored in `[begin_ms, end_ms)`, in one queue or
    /// all, from this node's applied state: (queue id, message) in queue
    /// order, at most `max`.
    pub fn query_time_range(
        &self,
        topic: &str,
        queue: Option<u32>,
        begin_ms: u64,
        end_ms: u64,
        max: usize,
    ) -> Result<Vec<(u32, StoredMessage)>, BrokerError> {
        let t = self.topic(topic)?;
        let queues: Vec<u32> = match queue {
            Some(q) if q < t.read_queues => vec![q],
            Some(q) => {
                // No arithmetic on the id: it may be u32::MAX.
                return Err(BrokerError::Invalid(format!(
                    "topic {topic} has {} queues; there is no queue {q}",
                    t.read_queues
                )));
            }
            None => (0..t.read_queues).collect(),
        };
        let store = &self.node.store;
        let mut out = Vec::new();
        let mut budget = ResponseBudget::new(self.live().limits.max_response_bytes);
        'queues: for q in queues {
            let Some(cq) = store.queue(topic, q) else { continue };
            let mut offset = self.offset_for_timestamp(topic, q, begin_ms)?.max(cq.min_offset());
            while offset < cq.max_offset() && out.len() < max {
                let (unit, bytes) = match queued(&self.node, topic, q, offset)? {
                    Queued::Found(unit, bytes) => (unit, bytes),
                    Queued::Purged => {
                        offset += 1;
                        continue;
                    }
                };
                let view = parse(&self.node, topic, q, offset, &unit, &bytes)?;
                // Store times follow the leader's clock and are not strictly
                // monotonic across leaders: stop at the first one past the end.
                if view.store_timestamp_ms >= end_ms {
                    break;
                }
                if view.store_timestamp_ms >= begin_ms {
                    if !budget.take(bytes.len()) {
                        break 'queues;
                    }
                    out.push((q, StoredMessage::of(&view, offset)));
                }
                offset += 1;
            }
        }
        Ok(out)
    }
}
