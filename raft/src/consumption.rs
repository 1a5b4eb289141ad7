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
//!
//! [`InFlightCounts`] keeps, beside this state, how many deliveries are in
//! flight per group and in all: every change goes through this module's
//! `apply_*` and `remove_*` functions, which keep the counts, so that
//! receive planning can bound them without walking every queue.

use std::collections::{BTreeMap, HashMap};

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

/// Deliveries in flight, per consumer group and over all groups. Derived
/// from a [`Consumption`] and never stored: counted anew whenever the state
/// is replaced (a snapshot loaded or installed), then kept by every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlightCounts {
    total: usize,
    /// Groups with none in flight are left out.
    groups: HashMap<String, usize>,
}

impl InFlightCounts {
    /// Counts `c` (one look per queue state, not per message).
    pub fn of(c: &Consumption) -> InFlightCounts {
        let mut counts = InFlightCounts::default();
        for (group, topics) in c {
            let n = topics.values().map(topic_inflight).sum();
            counts.moved(group, 0, n);
        }
        counts
    }

    /// In flight over every group.
    pub fn total(&self) -> usize {
        self.total
    }

    /// In flight for `group`, over all its topics and queues.
    pub fn group(&self, group: &str) -> usize {
        self.groups.get(group).copied().unwrap_or(0)
    }

    /// Fresh deliveries `group` may still take under `bounds` (redeliveries
    /// are in flight already): the planner's answer, and applying's again.
    pub fn room(&self, group: &str, bounds: InFlightBounds) -> usize {
        let left = |bound: u64, n: usize| usize::try_from(bound).unwrap_or(usize::MAX).saturating_sub(n);
        left(bounds.group, self.group(group)).min(left(bounds.total, self.total))
    }

    /// `group` had `before` in flight in some of its queues, and now has
    /// `after` there.
    fn moved(&mut self, group: &str, before: usize, after: usize) {
        if before == after {
            return;
        }
        let now = self.group(group).saturating_sub(before).saturating_add(after);
        self.total = self.total.saturating_sub(before).saturating_add(after);
        if now == 0 {
            self.groups.remove(group);
        } else if let Some(n) = self.groups.get_mut(group) {
            *n = now;
        } else {
            self.groups.insert(group.to_string(), now);
        }
    }
}

/// In flight in one topic's queues (of one group).
fn topic_inflight(queues: &BTreeMap<u32, QueueState>) -> usize {
    queues.values().map(|q| q.inflight.len()).sum()
}

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
    /// The in-flight bounds the leader planned under, enforced again when
    /// applied: plans for other topics made at the same moment cannot push
    /// the counts past them. `None` in entries from before the bounds.
    #[serde(default)]
    pub bounds: Option<InFlightBounds>,
}

/// Deliveries in flight a plan may leave, at most: of its group, and over
/// all groups; and `positions`, the most queue states (one per group,
/// topic and queue that was received from) the broker group keeps, each
/// in every snapshot: a plan that would start one past it delivers
/// nothing (plans from before it existed carry none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlightBounds {
    pub group: u64,
    pub total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions: Option<u64>,
}

/// Queue states over every group and topic: the receive positions a
/// broker group keeps. Walks the groups and their topics, not the queues.
pub fn positions(c: &Consumption) -> u64 {
    c.values().flat_map(|t| t.values()).map(|q| q.len() as u64).sum()
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
pub fn apply_pop(c: &mut Consumption, counts: &mut InFlightCounts, p: PopPlan, handle: u64) -> Popped {
    let mut delivered = Vec::new();
    let known = c
        .get(&p.group)
        .and_then(|t| t.get(&p.topic))
        .is_some_and(|q| q.contains_key(&p.queue_id));
    if !known && p.bounds.and_then(|b| b.positions).is_some_and(|b| positions(c) >= b) {
        return Popped { handle, delivered };
    }
    let queues = c.entry(p.group.clone()).or_default().entry(p.topic).or_default();
    let q = match (queues.get_mut(&p.queue_id), &p.fresh) {
        (Some(q), _) => q,
        // A queue's state starts with its first fresh delivery.
        (None, Some(f)) => queues.entry(p.queue_id).or_insert_with(|| QueueState {
            next: f.from,
            ..QueueState::default()
        }),
        (None, None) => return Popped { handle, delivered },
    };
    let before = q.inflight.len();
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
    if let Some(mut f) = p.fresh
        && f.from == q.next
        && f.to >= f.from
        && f.offsets.iter().all(|o| (f.from..f.to).contains(o))
    {
        if let Some(b) = p.bounds {
            let room = counts.room(&p.group, b);
            f.offsets.sort_unstable();
            f.offsets.dedup();
            if f.offsets.len() > room {
                // Deliver the first `room` only; the frontier stops right
                // after the last of them (what lies between matched no filter).
                f.offsets.truncate(room);
                f.to = f.offsets.last().map_or(f.from, |o| o + 1);
            }
        }
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
    counts.moved(&p.group, before, q.inflight.len());
    Popped { handle, delivered }
}

/// Acknowledges deliveries; one result per receipt (false: the receipt is
/// stale or the message was never in flight).
pub fn apply_ack(
    c: &mut Consumption,
    counts: &mut InFlightCounts,
    group: &str,
    topic: &str,
    receipts: &[Receipt],
) -> Vec<bool> {
    let Some(queues) = c.get_mut(group).and_then(|t| t.get_mut(topic)) else {
        return vec![false; receipts.len()];
    };
    let acked: Vec<bool> = receipts
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
        .collect();
    // Each `true` removed one delivery (a receipt repeated in the same ack
    // finds it gone).
    let removed = acked.iter().filter(|a| **a).count();
    counts.moved(group, removed, 0);
    acked
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
pub fn apply_reset(
    c: &mut Consumption,
    counts: &mut InFlightCounts,
    group: &str,
    topic: &str,
    queue_id: u32,
    offset: u64,
) {
    let q = c
        .entry(group.to_string())
        .or_default()
        .entry(topic.to_string())
        .or_default()
        .entry(queue_id)
        .or_default();
    q.next = offset;
    counts.moved(group, q.inflight.len(), 0);
    q.inflight.clear();
    q.changes = q.changes.wrapping_add(1);
}

/// Drops every group's state of a deleted topic.
pub fn remove_topic(c: &mut Consumption, counts: &mut InFlightCounts, topic: &str) {
    for (group, topics) in c.iter_mut() {
        if let Some(queues) = topics.remove(topic) {
            counts.moved(group, topic_inflight(&queues), 0);
        }
    }
}

/// Drops a deleted group's state.
pub fn remove_group(c: &mut Consumption, counts: &mut InFlightCounts, group: &str) {
    if c.remove(group).is_some() {
        let n = counts.group(group);
        counts.moved(group, n, 0);
    }
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
            bounds: None,
        }
    }

    fn queue(c: &Consumption) -> &QueueState {
        &c["G"]["T"][&0]
    }

    #[test]
    fn pop_ack_redeliver() {
        let mut c = Consumption::new();
        let mut n = InFlightCounts::default();
        // Offsets 5..9, of which 6 did not match the filter.
        let p = apply_pop(&mut c, &mut n, plan(vec![], Some((5, 9, vec![5, 7, 8])), 100), 10);
        assert_eq!(p.delivered, vec![(5, 1), (7, 1), (8, 1)]);
        assert_eq!((queue(&c).next, queue(&c).done_below()), (9, 5));
        // A plan made from a stale frontier is skipped.
        let p = apply_pop(&mut c, &mut n, plan(vec![], Some((5, 9, vec![5])), 100), 11);
        assert!(p.delivered.is_empty());
        let r = |offset, handle| Receipt {
            queue_id: 0,
            offset,
            handle,
        };
        assert_eq!(
            apply_ack(&mut c, &mut n, "G", "T", &[r(5, 10), r(7, 99)]),
            vec![true, false]
        );
        assert_eq!(queue(&c).done_below(), 7);
        // Redelivery of 7 gives a new handle; the old receipt is then stale.
        let p = apply_pop(&mut c, &mut n, plan(vec![(7, 10), (8, 3)], None, 200), 12);
        assert_eq!(p.delivered, vec![(7, 2)]);
        assert_eq!(apply_ack(&mut c, &mut n, "G", "T", &[r(7, 10)]), vec![false]);
        assert_eq!(apply_change_invisible(&mut c, "G", "T", &r(7, 12), 300, 13), Some(13));
        assert_eq!(apply_change_invisible(&mut c, "G", "T", &r(7, 12), 300, 14), None);
        assert_eq!(queue(&c).inflight[&7].visible_at_ms, 300);
        assert_eq!(
            apply_ack(&mut c, &mut n, "G", "T", &[r(7, 13), r(8, 10)]),
            vec![true, true]
        );
        assert_eq!(queue(&c).done_below(), 9);
        // Unknown groups and queues are stale receipts, not errors.
        assert_eq!(apply_ack(&mut c, &mut n, "X", "T", &[r(1, 1)]), vec![false]);
        apply_reset(&mut c, &mut n, "G", "T", 0, 2);
        assert_eq!(queue(&c).done_below(), 2);
    }

    #[test]
    fn counts_follow_every_change() {
        let mut c = Consumption::new();
        let mut n = InFlightCounts::default();
        let pop = |g: &str, t: &str, q: u32, from: u64, to: u64| PopPlan {
            group: g.into(),
            topic: t.into(),
            queue_id: q,
            visible_at_ms: 100,
            redeliver: vec![],
            fresh: Some(FreshRange {
                from,
                to,
                offsets: (from..to).collect(),
            }),
            bounds: None,
        };
        apply_pop(&mut c, &mut n, pop("G", "T", 0, 0, 5), 1);
        apply_pop(&mut c, &mut n, pop("G", "T", 1, 0, 3), 2);
        apply_pop(&mut c, &mut n, pop("G", "U", 0, 0, 2), 3);
        apply_pop(&mut c, &mut n, pop("H", "T", 0, 0, 4), 4);
        // A stale plan (its frontier moved on) adds nothing.
        apply_pop(&mut c, &mut n, pop("H", "T", 0, 0, 4), 5);
        assert_eq!((n.group("G"), n.group("H"), n.total()), (10, 4, 14));
        assert_eq!(n, InFlightCounts::of(&c));
        let r = |queue_id, offset, handle| Receipt {
            queue_id,
            offset,
            handle,
        };
        // The same receipt twice, and a stale one, remove one delivery.
        apply_ack(&mut c, &mut n, "G", "T", &[r(0, 0, 1), r(0, 0, 1), r(0, 1, 9)]);
        assert_eq!((n.group("G"), n.total()), (9, 13));
        apply_reset(&mut c, &mut n, "G", "T", 1, 3);
        assert_eq!((n.group("G"), n.total()), (6, 10));
        remove_topic(&mut c, &mut n, "U");
        assert_eq!((n.group("G"), n.total()), (4, 8));
        remove_group(&mut c, &mut n, "H");
        assert_eq!((n.group("H"), n.total()), (0, 4));
        assert_eq!(n, InFlightCounts::of(&c));
        remove_group(&mut c, &mut n, "G");
        assert_eq!(n, InFlightCounts::default());
    }

    #[test]
    fn fresh_offsets_outside_the_range_are_refused() {
        let mut c = Consumption::new();
        let mut n = InFlightCounts::default();
        let p = apply_pop(&mut c, &mut n, plan(vec![], Some((0, 2, vec![0, 5])), 1), 1);
        assert!(p.delivered.is_empty());
        assert_eq!(queue(&c).next, 0);
    }

    #[test]
    fn applying_keeps_the_bounds_plans_were_made_under() {
        let mut c = Consumption::new();
        let mut n = InFlightCounts::default();
        let pop = |t: &str, from, to, offsets: Vec<u64>| PopPlan {
            group: "G".into(),
            topic: t.into(),
            queue_id: 0,
            visible_at_ms: 100,
            redeliver: vec![],
            fresh: Some(FreshRange { from, to, offsets }),
            bounds: Some(InFlightBounds {
                group: 100,
                total: 6,
                positions: None,
            }),
        };
        // Two plans made at the same moment, each with room for 4 of 6.
        let first = apply_pop(&mut c, &mut n, pop("T", 0, 10, vec![0, 1, 2, 3]), 1);
        assert_eq!(first.delivered.len(), 4);
        assert_eq!(c["G"]["T"][&0].next, 10);
        // The second gets 2 (offsets 1 and 3; 2 matched no filter), and its
        // queue's frontier stops after them, so 5 and 7 are delivered later.
        let second = apply_pop(&mut c, &mut n, pop("U", 0, 10, vec![7, 1, 3, 5]), 2);
        assert_eq!(second.delivered, vec![(1, 1), (3, 1)]);
        assert_eq!(c["G"]["U"][&0].next, 4);
        assert_eq!(n.total(), 6);
        // At the bound nothing fresh is delivered and the frontier stays.
        let third = apply_pop(&mut c, &mut n, pop("T", 10, 12, vec![10, 11]), 3);
        assert!(third.delivered.is_empty());
        assert_eq!(c["G"]["T"][&0].next, 10);
        assert_eq!(n, InFlightCounts::of(&c));
    }

    #[test]
    fn a_new_receive_position_past_its_bound_is_not_started() {
        let mut c = Consumption::new();
        let mut n = InFlightCounts::default();
        let pop = |t: &str, from: u64| PopPlan {
            group: "G".into(),
            topic: t.into(),
            queue_id: 0,
            visible_at_ms: 100,
            redeliver: vec![],
            fresh: Some(FreshRange {
                from,
                to: from + 1,
                offsets: vec![from],
            }),
            bounds: Some(InFlightBounds {
                group: 100,
                total: 100,
                positions: Some(2),
            }),
        };
        assert_eq!(apply_pop(&mut c, &mut n, pop("T", 0), 1).delivered.len(), 1);
        assert_eq!(apply_pop(&mut c, &mut n, pop("U", 0), 2).delivered.len(), 1);
        assert_eq!(positions(&c), 2);
        let third = apply_pop(&mut c, &mut n, pop("V", 0), 3);
        assert!(third.delivered.is_empty(), "a third position past a bound of two");
        assert!(!c["G"].contains_key("V"), "nothing left behind");
        assert_eq!(
            apply_pop(&mut c, &mut n, pop("T", 1), 4).delivered.len(),
            1,
            "a kept one moves"
        );
        assert_eq!(n, InFlightCounts::of(&c));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Pop(u8, u8, u32, u8, Vec<(u64, u64)>),
        Ack(u8, u8, Vec<(u32, u64, u64)>),
        Reset(u8, u8, u32, u64),
        RemoveTopic(u8),
        RemoveGroup(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let pairs = proptest::collection::vec((0..12u64, 0..12u64), 0..4);
        prop_oneof![
            (0..2u8, 0..2u8, 0..2u32, 0..6u8, pairs).prop_map(|(g, t, q, k, r)| Op::Pop(g, t, q, k, r)),
            (
                0..2u8,
                0..2u8,
                proptest::collection::vec((0..2u32, 0..12u64, 0..12u64), 0..5)
            )
                .prop_map(|(g, t, r)| Op::Ack(g, t, r)),
            (0..2u8, 0..2u8, 0..2u32, 0..12u64).prop_map(|(g, t, q, o)| Op::Reset(g, t, q, o)),
            (0..2u8).prop_map(Op::RemoveTopic),
            (0..2u8).prop_map(Op::RemoveGroup),
        ]
    }

    proptest::proptest! {
        /// Whatever the changes, the kept counts are what counting anew gives.
        #[test]
        fn counts_match_a_recount(ops in proptest::collection::vec(op(), 0..40)) {
            let mut c = Consumption::new();
            let mut n = InFlightCounts::default();
            let name = |p: &str, i: u8| format!("{p}{i}");
            for (index, op) in ops.into_iter().enumerate() {
                let index = index as u64 + 1;
                match op {
                    Op::Pop(g, t, q, k, redeliver) => {
                        let from = c.get(&name("G", g)).and_then(|x| x.get(&name("T", t)))
                            .and_then(|x| x.get(&q)).map_or(0, |s| s.next);
                        let to = from + u64::from(k);
                        let plan = PopPlan {
                            group: name("G", g),
                            topic: name("T", t),
                            queue_id: q,
                            visible_at_ms: index,
                            redeliver,
                            // Repeated offsets, as a plan could hold.
                            fresh: Some(FreshRange { from, to, offsets: (from..to).chain(from..to).collect() }),
                            bounds: None,
                        };
                        apply_pop(&mut c, &mut n, plan, index);
                    }
                    Op::Ack(g, t, rs) => {
                        let rs: Vec<Receipt> = rs.into_iter()
                            .map(|(queue_id, offset, handle)| Receipt { queue_id, offset, handle })
                            .collect();
                        apply_ack(&mut c, &mut n, &name("G", g), &name("T", t), &rs);
                    }
                    Op::Reset(g, t, q, o) => apply_reset(&mut c, &mut n, &name("G", g), &name("T", t), q, o),
                    Op::RemoveTopic(t) => remove_topic(&mut c, &mut n, &name("T", t)),
                    Op::RemoveGroup(g) => remove_group(&mut c, &mut n, &name("G", g)),
                }
                proptest::prop_assert_eq!(&n, &InFlightCounts::of(&c));
            }
        }
    }
}
