//! Timed and delay messages at the leader: releasing due ones into their
//! topics, and recalls.
//!
//! A timed message is stored at once in `rmq_sys_wheel_timer` and recorded in
//! the replicated timer set ([`raftmq_raft::held`]). The leader looks at the
//! set every [`TICK`] (and again whenever a timed message is held):
//! whatever is due (by the leader's clock) is released in due order with
//! one guarded send, so a message appears in its topic once, after its
//! time, whichever leader does it. A new leader simply
//! finds the due messages still in the set.
//!
//! A held copy older than `timer.roll_after_ms` whose message is not due
//! soon is *rolled*: stored again in a new entry by a guarded send whose
//! guard lets the old copy go, so one far-off timer never keeps retention
//! from deleting the log it was first written to.
//!
//! A recall handle names a pending timer and its message:
//! `t1.<due ms>.<log index>.<ordinal>.<message id>`; after a roll the
//! message is found again by its due time and id.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use raftmq_raft::command::AdminCommand;
use raftmq_raft::held::{HeldId, TimerKey};
use tokio::sync::watch;

use crate::broker::Broker;
use crate::broker::batcher::Batcher;
use crate::broker::held::{self, Release};
use crate::broker::metrics::TopicLabels;
use crate::broker::seal::{self, Seal};
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

/// How often the leader looks for new due messages at the least; a known
/// due time is waited for exactly.
pub const TICK: Duration = Duration::from_millis(100);
/// Most messages released by one entry: their keys are the guard, which
/// must fit the room the batcher keeps in a record for framing.
const MAX_PER_RELEASE: usize = 64;
/// Most message bytes released by one entry (also bounded by the record).
const MAX_BYTES_PER_RELEASE: usize = 1 << 20;
/// Timers that could not be released (unreadable, or their topic refuses
/// writes) are tried again after this long.
const RETRY_SKIPPED: Duration = Duration::from_secs(10);
/// Messages due within this long (or within `roll_after_ms`, if shorter)
/// are released soon anyway: not rolled.
const ROLL_MARGIN: Duration = Duration::from_secs(60);
/// Timers with the same due time looked at to find a rolled one by its id.
const MAX_SAME_DUE: usize = 4096;

/// Seal domain of recall handles.
const SEAL_DOMAIN: &str = "recall";
/// Longest recall handle accepted (numbers, tag and a message id).
const MAX_HANDLE_LEN: usize = 512;

/// The handle a producer recalls timed message `message_id` of `topic`
/// with: `t2.<due ms>.<log index>.<ordinal>.<message id>.<tag>`, the tag
/// the group's seal over the topic and the text before it, so a handle
/// cannot be made from a message id alone. (Message ids may hold dots; the
/// tag never does.)
pub fn recall_handle(seal: &Seal, topic: &str, k: &TimerKey, message_id: &str) -> String {
    let body = format!("t2.{}.{}.{}.{message_id}", k.due_ms, k.id.index, k.id.ordinal);
    seal.seal(SEAL_DOMAIN, &[topic.as_bytes()], body)
}

/// The timer and message id a recall handle names, if the handle is one
/// this group gave for `topic`.
pub fn parse_recall_handle<'a>(seal: &Seal, topic: &str, s: &'a str) -> Option<(TimerKey, &'a str)> {
    let body = seal.open(SEAL_DOMAIN, &[topic.as_bytes()], s, MAX_HANDLE_LEN)?;
    let mut parts = body.strip_prefix("t2.")?.splitn(4, '.');
    let due_ms = parts.next()?.parse().ok()?;
    let index = parts.next()?.parse().ok()?;
    let ordinal = parts.next()?.parse().ok()?;
    let message_id = parts.next().filter(|m| !m.is_empty())?;
    Some((
        TimerKey {
            due_ms,
            id: HeldId { index, ordinal },
        },
        message_id,
    ))
}

/// Cancels a pending timed message of `topic`; returns its message id.
pub async fn recall(broker: &Broker, topic: &str, handle: &str) -> Result<String, BrokerError> {
    let seal = seal::of(&broker.node).await?;
    let (key, message_id) = parse_recall_handle(&seal, topic, handle).ok_or_else(|| {
        BrokerError::Refused(
            Code::BadRequest,
            format!("{handle:?} is not a recall handle of topic {topic}"),
        )
    })?;
    let not_pending = || {
        BrokerError::Refused(
            Code::NotFound,
            "the timed message is not pending: delivered or recalled already".into(),
        )
    };
    // A new leader may not have applied everything committed yet.
    broker.node.linearizable().await?;
    // The handle's key, or (rolled since) a timer of the same due time.
    let candidates: Vec<TimerKey> = broker.node.sm.with_metadata(|m| {
        if m.held.timers.contains(&key) {
            return vec![key];
        }
        let from = TimerKey {
            due_ms: key.due_ms,
            id: HeldId { index: 0, ordinal: 0 },
        };
        m.held
            .timers
            .range(from..)
            .take_while(|k| k.due_ms == key.due_ms)
            .take(MAX_SAME_DUE)
            .copied()
            .collect()
    });
    for k in candidates {
        let r = held::read(broker, k.id).await?;
        if r.message.message_id != message_id {
            continue;
        }
        if r.topic != topic {
            return Err(BrokerError::Refused(
                Code::BadRequest,
                format!("the recall handle is for another topic than {topic}"),
            ));
        }
        if !held::apply(&broker.node, &AdminCommand::ReleaseTimers { keys: vec![k] }).await? {
            return Err(not_pending());
        }
        tracing::info!(topic, message_id, "recalled a timed message");
        return Ok(message_id.to_string());
    }
    Err(not_pending())
}

/// Stores again the timed messages whose held copies are older than
/// `roll_after_ms` and not due within [`ROLL_MARGIN`]; returns how many.
pub async fn roll_old(broker: &Broker, roll_after_ms: u64) -> Result<usize, BrokerError> {
    let node = &broker.node;
    let now = now_ms();
    // The timers in the lowest entries (they hold the log back), oldest
    // first: a bounded max-heap over the whole set.
    let oldest: Vec<TimerKey> = node.sm.with_metadata(|m| {
        let mut heap = std::collections::BinaryHeap::with_capacity(MAX_PER_RELEASE + 1);
        for k in &m.held.timers {
            heap.push((k.id, *k));
            if heap.len() > MAX_PER_RELEASE {
                heap.pop();
            }
        }
        let mut v: Vec<(HeldId, TimerKey)> = heap.into_vec();
        v.sort();
        v.into_iter().map(|(_, k)| k).collect()
    });
    let margin = (ROLL_MARGIN.as_millis() as u64).min(roll_after_ms);
    let max_bytes = MAX_BYTES_PER_RELEASE.min(Batcher::max_batch_bytes(broker.cfg.store.max_record_size as usize));
    let (mut keys, mut copies, mut bytes) = (Vec::new(), Vec::new(), 0);
    // Oldest entries first: their messages come one after another.
    let mut entries = held::EntryCache::default();
    for k in oldest {
        if k.due_ms <= now.saturating_add(margin) {
            continue;
        }
        let (m, stored_ms) = entries.held_copy(broker, k.id).await?;
        if stored_ms.saturating_add(roll_after_ms) > now {
            // Entries are in store order: the rest are younger.
            break;
        }
        let size = m.encoded_len();
        if !keys.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        keys.push(k);
        copies.push(m);
    }
    if keys.is_empty() {
        return Ok(0);
    }
    let n = keys.len();
    let batch = raftmq_raft::SendBatch {
        topic: raftmq_raft::held::TIMER_TOPIC.to_string(),
        queue_id: 0,
        messages: copies,
    };
    let cmd = raftmq_raft::Command::guarded_send(&AdminCommand::ReleaseTimers { keys }, &[batch], now)
        .map_err(|e| BrokerError::Internal(e.to_string()))?;
    match crate::broker::batcher::write_bounded(node, cmd).await?.1 {
        raftmq_raft::Response::Sent(o) if matches!(o.first(), Some(raftmq_raft::BatchOutcome::Appended { .. })) => {
            broker.metrics.timers_rolled.inc_by(n as u64);
            tracing::info!(count = n, "rolled timed messages into a new entry");
            Ok(n)
        }
        // A release or recall came first; the next round looks again.
        _ => Ok(0),
    }
}

/// Releases every timed message due now; returns how many were delivered.
/// Timers that cannot go now are put in `skipped`.
pub async fn release_due(broker: &Broker, skipped: &mut HashSet<TimerKey>) -> Result<usize, BrokerError> {
    let node = &broker.node;
    let max_bytes = MAX_BYTES_PER_RELEASE.min(Batcher::max_batch_bytes(broker.cfg.store.max_record_size as usize));
    let mut entries = held::EntryCache::default();
    let mut delivered = 0;
    loop {
        let now = now_ms();
        let due: Vec<TimerKey> = node.sm.with_metadata(|m| {
            m.held
                .timers
                .iter()
                .take_while(|k| k.due_ms <= now)
                .filter(|k| !skipped.contains(k))
                .take(MAX_PER_RELEASE)
                .copied()
                .collect()
        });
        if due.is_empty() {
            return Ok(delivered);
        }
        let (mut keys, mut releases, mut dropped) = (Vec::new(), Vec::<Release>::new(), Vec::new());
        let mut bytes = 0;
        for k in due {
            let mut r = match entries.read(broker, k.id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read a due timed message on any node; retrying later");
                    skipped.insert(k);
                    continue;
                }
            };
            match held::deliverable(node, &mut r) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(topic = r.topic, "a due timed message waits: its topic refuses writes");
                    skipped.insert(k);
                    continue;
                }
                Err(why) => {
                    tracing::warn!(message_id = r.message.message_id, "dropping a due timed message: {why}");
                    dropped.push(k);
                    continue;
                }
            }
            let size = r.message.encoded_len();
            if !keys.is_empty() && bytes + size > max_bytes {
                break;
            }
            bytes += size;
            keys.push(k);
            releases.push(r);
        }
        if !dropped.is_empty() {
            held::apply(node, &AdminCommand::ReleaseTimers { keys: dropped }).await?;
        }
        if keys.is_empty() {
            continue;
        }
        let n = keys.len();
        let topics: Vec<String> = releases.iter().map(|r| r.topic.clone()).collect();
        if held::release(node, &AdminCommand::ReleaseTimers { keys }, releases).await? {
            delivered += n;
            for topic in topics {
                broker.metrics.timer_dequeue.get_or_create(&TopicLabels { topic }).inc();
            }
        } else {
            // A recall (or a topic change) came first; the next round
            // reads the set again.
            tracing::debug!("a timer release lost a race; retrying");
        }
    }
}

/// Runs the release loop on this node; it acts while the node leads.
pub fn spawn(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut skipped = HashSet::new();
        let mut skipped_since = tokio::time::Instant::now();
        let mut last_roll = tokio::time::Instant::now();
        let mut failed = false;
        loop {
            // A leader waits until the next due time, but at least every
            // tick (a new timer may be due sooner than the ones known now);
            // a full tick after a failure, and on followers.
            let next_due = broker
                .node
                .sm
                .with_metadata(|m| m.held.timers.iter().find(|k| !skipped.contains(*k)).map(|k| k.due_ms));
            let wait = match next_due {
                Some(due) if !failed && broker.node.is_leader() => {
                    Duration::from_millis(due.saturating_sub(now_ms())).min(TICK)
                }
                _ => TICK,
            };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
                // A timed message was held: it may be due before this
                // wait ends (or be due already, a past delivery time).
                _ = broker.timers_changed.notified() => {}
            }
            if !broker.node.is_leader() || skipped_since.elapsed() >= RETRY_SKIPPED {
                skipped.clear();
                skipped_since = tokio::time::Instant::now();
            }
            if !broker.node.is_leader() {
                continue;
            }
            let roll_after = broker.cfg.timer.roll_after_ms;
            let roll_every = Duration::from_millis(roll_after / 2).clamp(TICK, Duration::from_secs(60));
            if last_roll.elapsed() >= roll_every {
                last_roll = tokio::time::Instant::now();
                if let Err(e) = roll_old(&broker, roll_after).await {
                    tracing::warn!(error = %e, "rolling old timed messages failed; retrying");
                }
            }
            failed = match release_due(&broker, &mut skipped).await {
                Ok(_) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "releasing due timed messages failed; retrying");
                    true
                }
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_handles_round_trip_and_reject_garbage() {
        let seal = Seal::new(raftmq_raft::secret::GroupSecret::from_bytes([5; 32]));
        let k = TimerKey::from((1_700_000_000_123, 42, 3));
        let h = recall_handle(&seal, "T", &k, "01AB.CD");
        assert_eq!(parse_recall_handle(&seal, "T", &h), Some((k, "01AB.CD")));
        // Another topic, another message id or time, the old unsealed form.
        assert_eq!(parse_recall_handle(&seal, "U", &h), None);
        assert_eq!(parse_recall_handle(&seal, "T", &h.replace("01AB.CD", "01AB.CE")), None);
        assert_eq!(parse_recall_handle(&seal, "T", &h.replacen(".42.", ".43.", 1)), None);
        for bad in [
            "",
            "t1.1.2.3.x",
            "t2.",
            "t2.1.2.3",
            "t2.1.2.3.",
            "t2.1.2.3.00.x",
            "t2.a.2.3.x.y",
            &"t2.".repeat(300),
        ] {
            assert_eq!(parse_recall_handle(&seal, "T", bad), None, "{bad}");
        }
    }
}
