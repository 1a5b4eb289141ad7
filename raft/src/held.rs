//! Held messages: timed messages waiting to be due and transactional half
//! messages waiting for their producer's verdict, replicated.
//!
//! A held message is stored once, at once, like any other: a send to a
//! system topic ([`TIMER_TOPIC`] or [`HALF_TOPIC`]) whose reserved
//! properties name where it really goes ([`P_REAL_TOPIC`], [`P_REAL_QUEUE`])
//! and, for a timed message, when ([`P_DELIVER_AT`]). Applying that send
//! records the message in [`Held`] under its [`HeldId`]: the Raft log index
//! of its entry and its position in the entry. Only that small key and a
//! few fields live in memory; the body stays in the CommitLog and is read
//! back by its log index when the message is released (so a million
//! pending timers cost tens of megabytes, not their bodies).
//!
//! Releasing is a guarded send proposed by the leader: the guard
//! ([`crate::AdminCommand::ReleaseTimers`] or
//! [`crate::AdminCommand::EndTransaction`] with commit) removes the held
//! entries, and the copies into the real topics are applied only if every
//! one was still held. A release that a failover makes the next leader
//! propose again therefore fails its guard instead of delivering twice, and
//! a recall or rollback that got there first wins.
//!
//! Every time in here comes from a command (the leader's clock, read once),
//! never from the applying node.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::message::{Message, MessageView};

/// System topic of timed messages (RocketMQ 5's name).
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// System topic of transactional half messages (RocketMQ's name).
pub const HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";

/// Reserved property: the topic a held message is for.
pub const P_REAL_TOPIC: &str = "__rmq.real_topic";
/// Reserved property: the queue id (decimal) a held message is for.
pub const P_REAL_QUEUE: &str = "__rmq.real_queue";
/// Reserved property: when a timed message is due (ms since the epoch,
/// decimal). Kept on the released copy, which reports it to consumers.
pub const P_DELIVER_AT: &str = "__rmq.deliver_at";
/// User property with which a producer may shorten or lengthen the first
/// transaction check of one message (RocketMQ's name; seconds).
pub const P_CHECK_IMMUNITY_SECS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";

/// Whether a topic is one of the held-message system topics: clients may
/// neither use nor create nor delete them (half messages and messages not
/// yet due must stay invisible).
pub fn is_system_topic(name: &str) -> bool {
    name == TIMER_TOPIC || name == HALF_TOPIC
}

/// Properties that only the held copy carries.
pub fn is_hold_property(k: &str) -> bool {
    k == P_REAL_TOPIC || k == P_REAL_QUEUE
}

/// Where a held message is in the log: its entry's index and its position
/// among the entry's messages (counted across all of the entry's batches).
/// The same on every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HeldId {
    pub index: u64,
    pub ordinal: u32,
}

/// A pending timed message, ordered by due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(from = "(u64, u64, u32)", into = "(u64, u64, u32)")]
pub struct TimerKey {
    pub due_ms: u64,
    pub id: HeldId,
}

impl From<(u64, u64, u32)> for TimerKey {
    fn from((due_ms, index, ordinal): (u64, u64, u32)) -> Self {
        TimerKey {
            due_ms,
            id: HeldId { index, ordinal },
        }
    }
}

impl From<TimerKey> for (u64, u64, u32) {
    fn from(k: TimerKey) -> Self {
        (k.due_ms, k.id.index, k.id.ordinal)
    }
}

/// A half message waiting for COMMIT or ROLLBACK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HalfMessage {
    /// The topic it is for (check-backs go to producers of this topic:
    /// the v2 protocol has no producer group).
    pub topic: String,
    pub message_id: String,
    /// Leader time it was stored.
    pub stored_ms: u64,
    /// The first check waits this long instead of the broker's default
    /// ([`P_CHECK_IMMUNITY_SECS`]).
    #[serde(default)]
    pub immunity_ms: Option<u64>,
    /// Check-backs sent so far, and the leader time of the last one.
    pub checks: u32,
    pub last_check_ms: u64,
}

/// Every held message of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Timed messages not yet due (or due and not yet released).
    #[serde(default)]
    pub timers: BTreeSet<TimerKey>,
    /// Half messages not yet committed, rolled back or given up.
    #[serde(default, with = "pairs")]
    pub halves: BTreeMap<HeldId, HalfMessage>,
}

/// A map with struct keys as a JSON list of `[key, value]` pairs (JSON
/// object keys must be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(m: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

impl Held {
    /// Records a message applied to a system topic. A message without
    /// valid hold properties (a user writing to a system topic) is stored
    /// but not held.
    pub fn on_applied(&mut self, topic: &str, id: HeldId, view: &MessageView<'_>) {
        let props = view.properties();
        let prop = |name: &str| props.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let Some(real) = prop(P_REAL_TOPIC).filter(|t| !t.is_empty()) else {
            return;
        };
        if prop(P_REAL_QUEUE).and_then(|q| q.parse::<u32>().ok()).is_none() {
            return;
        }
        if topic == TIMER_TOPIC {
            if let Some(due_ms) = prop(P_DELIVER_AT).and_then(|d| d.parse().ok()) {
                self.timers.insert(TimerKey { due_ms, id });
            }
        } else if topic == HALF_TOPIC {
            let immunity_ms = prop(P_CHECK_IMMUNITY_SECS)
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(|s| s.saturating_mul(1000));
            self.halves.insert(
                id,
                HalfMessage {
                    topic: real.to_string(),
                    message_id: view.message_id.to_string(),
                    stored_ms: view.store_timestamp_ms,
                    immunity_ms,
                    checks: 0,
                    last_check_ms: 0,
                },
            );
        }
    }

    /// Removes every key if all are pending; otherwise changes nothing.
    pub fn release_timers(&mut self, keys: &[TimerKey]) -> bool {
        if !keys.iter().all(|k| self.timers.contains(k)) {
            return false;
        }
        for k in keys {
            self.timers.remove(k);
        }
        true
    }

    /// Ends a transaction (commit, rollback or give-up alike: the half
    /// message stops being held). False if it was not pending.
    pub fn end_transaction(&mut self, id: HeldId) -> bool {
        self.halves.remove(&id).is_some()
    }

    /// Counts a check-back sent at `at_ms`.
    pub fn checked(&mut self, id: HeldId, at_ms: u64) -> bool {
        match self.halves.get_mut(&id) {
            Some(h) => {
                h.checks = h.checks.saturating_add(1);
                h.last_check_ms = at_ms;
                true
            }
            None => false,
        }
    }

    /// The lowest log index a held message lives in: the log (and the
    /// CommitLog segments) from there on must be kept.
    pub fn lowest_index(&self) -> Option<u64> {
        let t = self.timers.iter().map(|k| k.id.index).min();
        let h = self.halves.keys().next().map(|id| id.index);
        match (t, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The copy a held message is released as: in its real topic and queue,
/// without the hold's own properties.
pub fn released(mut m: Message) -> Option<(String, u32, Message)> {
    let prop = |name: &str| m.properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let topic = prop(P_REAL_TOPIC)?;
    let queue = prop(P_REAL_QUEUE)?.parse().ok()?;
    m.properties.retain(|(k, _)| !is_hold_property(k));
    Some((topic, queue, m))
}

/// When half messages are checked back with their producers.
#[derive(Debug, Clone, Copy)]
pub struct CheckPolicy {
    /// First check this long after the half message was stored...
    pub immunity_ms: u64,
    /// ...unless the message asks for its own (then at most this long).
    pub max_immunity_ms: u64,
    /// Then every this long.
    pub interval_ms: u64,
}

/// Whether a transaction is due for a check-back at `now_ms`.
pub fn check_due(h: &HalfMessage, now_ms: u64, p: &CheckPolicy) -> bool {
    if h.checks == 0 {
        let immunity = h.immunity_ms.map_or(p.immunity_ms, |i| i.min(p.max_immunity_ms));
        now_ms >= h.stored_ms.saturating_add(immunity)
    } else {
        now_ms >= h.last_check_ms.saturating_add(p.interval_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(props: &[(&str, &str)]) -> Vec<u8> {
        let m = Message {
            message_id: "M1".into(),
            tag: String::new(),
            keys: vec![],
            properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: bytes::Bytes::from_static(b"x"),
            born_timestamp_ms: 1,
        };
        let mut out = Vec::new();
        m.encode(1000, &mut out);
        out
    }

    #[test]
    fn holds_only_well_formed_messages() {
        let mut h = Held::default();
        let id = HeldId { index: 7, ordinal: 0 };
        let ok = stored(&[(P_REAL_TOPIC, "T"), (P_REAL_QUEUE, "1"), (P_DELIVER_AT, "5000")]);
        let (v, _) = MessageView::parse(&ok).unwrap();
        h.on_applied(TIMER_TOPIC, id, &v);
        let bad = stored(&[(P_REAL_TOPIC, "T"), (P_DELIVER_AT, "5000")]);
        let (v, _) = MessageView::parse(&bad).unwrap();
        h.on_applied(TIMER_TOPIC, HeldId { index: 8, ordinal: 0 }, &v);
        assert_eq!(h.timers.len(), 1);
        assert_eq!(h.lowest_index(), Some(7));

        let half = stored(&[(P_REAL_TOPIC, "T"), (P_REAL_QUEUE, "0"), (P_CHECK_IMMUNITY_SECS, "2")]);
        let (v, _) = MessageView::parse(&half).unwrap();
        h.on_applied(HALF_TOPIC, HeldId { index: 3, ordinal: 1 }, &v);
        let hm = &h.halves[&HeldId { index: 3, ordinal: 1 }];
        assert_eq!(
            (hm.stored_ms, hm.immunity_ms, hm.message_id.as_str()),
            (1000, Some(2000), "M1")
        );
        assert_eq!(h.lowest_index(), Some(3));
    }

    #[test]
    fn a_release_is_all_or_nothing() {
        let mut h = Held::default();
        let a = TimerKey::from((10, 1, 0));
        let b = TimerKey::from((20, 1, 1));
        h.timers.extend([a, b]);
        assert!(!h.release_timers(&[a, TimerKey::from((30, 2, 0))]));
        assert_eq!(h.timers.len(), 2);
        assert!(h.release_timers(&[a, b]));
        // Proposed again (a new leader): the guard fails, nothing twice.
        assert!(!h.release_timers(&[a]));
    }

    #[test]
    fn check_backs_follow_immunity_then_interval() {
        let mut h = HalfMessage {
            topic: "T".into(),
            message_id: "M".into(),
            stored_ms: 1_000,
            immunity_ms: None,
            checks: 0,
            last_check_ms: 0,
        };
        let p = CheckPolicy {
            immunity_ms: 6_000,
            max_immunity_ms: 900_000,
            interval_ms: 60_000,
        };
        assert!(!check_due(&h, 6_999, &p));
        assert!(check_due(&h, 7_000, &p));
        h.checks = 1;
        h.last_check_ms = 7_000;
        assert!(!check_due(&h, 66_999, &p));
        assert!(check_due(&h, 67_000, &p));
        h.checks = 0;
        h.immunity_ms = Some(0);
        assert!(check_due(&h, 1_000, &p));
        // A message cannot put its check off past the broker's limit.
        h.immunity_ms = Some(u64::MAX);
        assert!(!check_due(&h, 900_999, &p));
        assert!(check_due(&h, 901_000, &p));
    }

    #[test]
    fn held_state_round_trips_through_json() {
        let k = TimerKey::from((5, 6, 7));
        assert_eq!(serde_json::to_string(&k).unwrap(), "[5,6,7]");
        assert_eq!(serde_json::from_str::<TimerKey>("[5,6,7]").unwrap(), k);
        // Snapshots are JSON: struct keys must not reach a JSON object.
        let mut h = Held::default();
        h.timers.insert(k);
        h.halves.insert(
            HeldId { index: 1, ordinal: 2 },
            HalfMessage {
                topic: "T".into(),
                message_id: "M".into(),
                stored_ms: 3,
                immunity_ms: None,
                checks: 1,
                last_check_ms: 4,
            },
        );
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Held>(&json).unwrap(), h);
    }
}
