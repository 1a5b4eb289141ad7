//! Pop-style consumption, replicated: which messages a consumer group has in
//! flight, when each becomes visible again, how often it was delivered.
//!
//! A receive does not change state on one node only: the leader plans it (a
//! [`PopPlan`]: which redeliveries, which fresh offsets) and proposes the
//! plan; every node applies it the same way. An ack or a change of
//! invisibility is a command too. A new leader therefore continues exactly
//! where the old one stopped: an acknowledged message is never redelivered,
//! an unacknowledged one is redelivered after its invisible time.
//!
//! Applying is deterministic: every time and offset comes from the command
//! (the leader's clock, read once when planning), never from the applying
//! node. Each applied pop or change gets a *handle*, the Raft log index of
//! its entry: unique, and the same on every node. A receipt names
//! (queue, offset, handle); it is valid while the message is in flight under
//! that handle, so a stale receipt (the message was redelivered to someone
//! else since) can neither ack nor extend the new delivery.
//!
//! Plans carry what the leader expected (the queue's pop frontier, each
//! redelivery's current handle); an item that no longer matches when applied
//! (a concurrent plan or a new leader got there first) is skipped, not
//! applied twice.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// RocketMQ's default: a message is delivered at most 16 times, then moved
/// to the group's dead-letter queue.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 16;

/// Prefix of a consumer group's dead-letter topic, as RocketMQ.
pub const DLQ_PREFIX: &str = "%DLQ%";

/// The dead-letter topic of a consumer group.
pub fn dlq_topic(group: &str) -> String {
    format!("{DLQ_PREFIX}{group}")
}

/// A consumer group's configuration (RocketMQ's subscription group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    pub name: String,
    /// Deliver each queue in order: a queue's next message only after the
    /// previous ones are acknowledged or dead-lettered.
    pub fifo: bool,
    pub max_delivery_attempts: u32,
}

/// One queue's consumption by one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The pop frontier: the first offset never delivered.
    pub next: u64,
    /// Delivered, not yet acknowledged.
    pub inflight: BTreeMap<u64, InFlight>,
    /// Counts the changes applied to this state (wrapping), so a waiting
    /// receive can tell cheaply whether re-planning could find anything new.
    #[serde(default)]
    pub changes: u64,
}

impl QueueState {
    /// Everything below this offset is done (acknowledged, dead-lettered or
    /// filtered out): the group's progress in the queue.
    pub fn done_below(&self) -> u64 {
        self.inflight.keys().next().copied().unwrap_or(self.next)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// Leader time (ms since the epoch) at which it may be delivered again.
    pub visible_at_ms: u64,
    /// Deliveries so far (1 after the first).
    pub attempt: u32,
    /// Log index of the entry that delivered it last (or changed its
    /// invisibility): the receipt's handle.
    pub handle: u64,
}

/// Consumption state: group -> topic -> queue id.
pub type Consumption = BTreeMap<String, BTreeMap<String, BTreeMap<u32, QueueState>>>;

/// What a receive takes from one queue, planned by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopPlan {
    pub group: String,
    pub topic: String,
    pub queue_id: u32,
    /// The deliveries' new invisibility deadline.
    pub visible_at_ms: u64,
    /// In-flight messages whose time ran out: (offset, the handle they had).
    pub redeliver: Vec<(u64, u64)>,
    pub fresh: Option<FreshRange>,
}

/// Advances the pop frontier from `from` to `to`, delivering `offsets` (the
/// messages in between that matched the filter; the others are skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreshRange {
    pub from: u64,
    pub to: u64,
    pub offsets: Vec<u64>,
}

/// Names one delivery of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub queue_id: u32,
    pub offset: u64,
    pub handle: u64,
}

/// What applying a pop delivered: the handle of every delivery, and each
/// delivered (offset, attempt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Popped {
    pub handle: u64,
    pub delivered: Vec<(u64, u32)>,
}

/// Applies a pop planned by the leader. `handle` is the entry's log index.
pub fn apply_pop(c: &mut Consumption, p: PopPlan, handle: u64) -> Popped {
    let mut delivered = Vec::new();
    let queues = c.entry(p.group).or_default().entry(p.topic).or_default();
    let q = match (queues.get_mut(&p.queue_id), &p.fresh) {
        (Some(q), _) => q,
        // A queue's state starts with its first fresh delivery.
        (None, Some(f)) => queues.entry(p.queue_id).or_insert_with(|| QueueState {
            next: f.from,
            ..QueueState::default()
        }),
        (None, None) => return Popped { handle, delivered },
    };
    q.changes = q.changes.wrapping_add(1);
    for (offset, expected) in p.redeliver {
        if let Some(f) = q.inflight.get_mut(&offset)
            && f.handle == expected
        {
            f.attempt = f.attempt.saturating_add(1);
            f.handle = handle;
            f.visible_at_ms = p.visible_at_ms;
            delivered.push((offset, f.attempt));
        }
    }
    if let Some(f) = p.fresh
        && f.from == q.next
        && f.to >= f.from
        && f.offsets.iter().all(|o| (f.from..f.to).contains(o))
    {
        q.next = f.to;
        for o in f.offsets {
            q.inflight.insert(
                o,
                InFlight {
                    visible_at_ms: p.visible_at_ms,
                    attempt: 1,
                    handle,
                },
            );
            delivered.push((o, 1));
        }
    }
    Popped { handle, delivered }
}

/// Acknowledges deliveries; one result per receipt (false: the receipt is
/// stale or the message was never in flight).
pub fn apply_ack(c: &mut Consumption, group: &str, topic: &str, receipts: &[Receipt]) -> Vec<bool> {
    let Some(queues) = c.get_mut(group).and_then(|t| t.get_mut(topic)) else {
        return vec![false; receipts.len()];
    };
    receipts
        .iter()
        .map(|r| {
            let Some(q) = queues.get_mut(&r.queue_id) else {
                return false;
            };
            match q.inflight.get(&r.offset) {
                Some(f) if f.handle == r.handle => {
                    q.inflight.remove(&r.offset);
                    q.changes = q.changes.wrapping_add(1);
                    true
                }
                _ => false,
            }
        })
        .collect()
}

/// Moves a delivery's invisibility deadline; the delivery gets `handle` (the
/// entry's log index), which the new receipt names. `None`: stale receipt.
pub fn apply_change_invisible(
    c: &mut Consumption,
    group: &str,
    topic: &str,
    r: &Receipt,
    visible_at_ms: u64,
    handle: u64,
) -> Option<u64> {
    let q = c.get_mut(group)?.get_mut(topic)?.get_mut(&r.queue_id)?;
    let f = q.inflight.get_mut(&r.offset)?;
    if f.handle != r.handle {
        return None;
    }
    f.handle = handle;
    f.visible_at_ms = visible_at_ms;
    q.changes = q.changes.wrapping_add(1);
    Some(handle)
}

/// Sets a group's position in a queue (offset resets): everything in flight
/// is dropped and delivery continues at `offset`.
pub fn apply_reset(c: &mut Consumption, group: &str, topic: &str, queue_id: u32, offset: u64) {
    let q = c
        .entry(group.to_string())
        .or_default()
        .entry(topic.to_string())
        .or_default()
        .entry(queue_id)
        .or_default();
    q.next = offset;
    q.inflight.clear();
    q.changes = q.changes.wrapping_add(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(redeliver: Vec<(u64, u64)>, fresh: Option<(u64, u64, Vec<u64>)>, at: u64) -> PopPlan {
        PopPlan {
            group: "G".into(),
            topic: "T".into(),
            queue_id: 0,
            visible_at_ms: at,
            redeliver,
            fresh: fresh.map(|(from, to, offsets)| FreshRange { from, to, offsets }),
        }
    }

    fn queue(c: &Consumption) -> &QueueState {
        &c["G"]["T"][&0]
    }

    #[test]
    fn pop_ack_redeliver() {
        let mut c = Consumption::new();
        // Offsets 5..9, of which 6 did not match the filter.
        let p = apply_pop(&mut c, plan(vec![], Some((5, 9, vec![5, 7, 8])), 100), 10);
        assert_eq!(p.delivered, vec![(5, 1), (7, 1), (8, 1)]);
        assert_eq!((queue(&c).next, queue(&c).done_below()), (9, 5));
        // A plan made from a stale frontier is skipped.
        let p = apply_pop(&mut c, plan(vec![], Some((5, 9, vec![5])), 100), 11);
        assert!(p.delivered.is_empty());
        let r = |offset, handle| Receipt {
            queue_id: 0,
            offset,
            handle,
        };
        assert_eq!(apply_ack(&mut c, "G", "T", &[r(5, 10), r(7, 99)]), vec![true, false]);
        assert_eq!(queue(&c).done_below(), 7);
        // Redelivery of 7 gives a new handle; the old receipt is then stale.
        let p = apply_pop(&mut c, plan(vec![(7, 10), (8, 3)], None, 200), 12);
        assert_eq!(p.delivered, vec![(7, 2)]);
        assert_eq!(apply_ack(&mut c, "G", "T", &[r(7, 10)]), vec![false]);
        assert_eq!(apply_change_invisible(&mut c, "G", "T", &r(7, 12), 300, 13), Some(13));
        assert_eq!(apply_change_invisible(&mut c, "G", "T", &r(7, 12), 300, 14), None);
        assert_eq!(queue(&c).inflight[&7].visible_at_ms, 300);
        assert_eq!(apply_ack(&mut c, "G", "T", &[r(7, 13), r(8, 10)]), vec![true, true]);
        assert_eq!(queue(&c).done_below(), 9);
        // Unknown groups and queues are stale receipts, not errors.
        assert_eq!(apply_ack(&mut c, "X", "T", &[r(1, 1)]), vec![false]);
        apply_reset(&mut c, "G", "T", 0, 2);
        assert_eq!(queue(&c).done_below(), 2);
    }

    #[test]
    fn fresh_offsets_outside_the_range_are_refused() {
        let mut c = Consumption::new();
        let p = apply_pop(&mut c, plan(vec![], Some((0, 2, vec![0, 5])), 1), 1);
        assert!(p.delivered.is_empty());
        assert_eq!(queue(&c).next, 0);
    }
}
