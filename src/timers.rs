//! Timed and delay messages at the leader: releasing due ones into their
//! topics, and recalls.
//!
//! A timed message is stored at once in `rmq_sys_wheel_timer` and recorded in
//! the replicated timer set ([`raftmq_raft::held`]). The leader looks at the
//! set every [`TICK`]: whatever is due (by the leader's clock) is released
//! in due order with one guarded send, so a message appears in its topic
//! once, after its time, whichever leader does it. A new leader simply
//! finds the due messages still in the set.
//!
//! A recall handle names a pending timer: `t1.<due ms>.<log index>.<ordinal>`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use raftmq_raft::command::AdminCommand;
use raftmq_raft::held::{HeldId, TimerKey};
use tokio::sync::watch;

use crate::batcher::Batcher;
use crate::broker::Broker;
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::held::{self, Release};
use crate::rocketmq::v2::Code;

/// How often the leader looks for due messages: the delivery precision.
pub const TICK: Duration = Duration::from_millis(100);
/// Most messages released by one entry: their keys are the guard, which
/// must fit the room the batcher keeps in a record for framing.
const MAX_PER_RELEASE: usize = 64;
/// Most message bytes released by one entry (also bounded by the record).
const MAX_BYTES_PER_RELEASE: usize = 1 << 20;
/// Timers that could not be released (unreadable, or their topic refuses
/// writes) are tried again after this long.
const RETRY_SKIPPED: Duration = Duration::from_secs(10);

pub fn recall_handle(k: &TimerKey) -> String {
    format!("t1.{}.{}.{}", k.due_ms, k.id.index, k.id.ordinal)
}

pub fn parse_recall_handle(s: &str) -> Option<TimerKey> {
    let mut parts = s.strip_prefix("t1.")?.split('.');
    let due_ms = parts.next()?.parse().ok()?;
    let index = parts.next()?.parse().ok()?;
    let ordinal = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some(TimerKey {
        due_ms,
        id: HeldId { index, ordinal },
    })
}

/// Cancels a pending timed message of `topic`; returns its message id.
pub async fn recall(broker: &Broker, topic: &str, handle: &str) -> Result<String, BrokerError> {
    let key = parse_recall_handle(handle)
        .ok_or_else(|| BrokerError::Refused(Code::BadRequest, format!("{handle:?} is not a recall handle")))?;
    let not_pending = || {
        BrokerError::Refused(
            Code::NotFound,
            "the timed message is not pending: delivered or recalled already".into(),
        )
    };
    // A new leader may not have applied everything committed yet.
    broker.node.linearizable().await?;
    if !broker.node.sm.with_metadata(|m| m.held.timers.contains(&key)) {
        return Err(not_pending());
    }
    let r = held::read(broker, key.id).await?;
    if r.topic != topic {
        return Err(BrokerError::Refused(
            Code::BadRequest,
            format!("the recall handle is for another topic than {topic}"),
        ));
    }
    let id = r.message.message_id;
    if !held::apply(&broker.node, &AdminCommand::ReleaseTimers { keys: vec![key] }).await? {
        return Err(not_pending());
    }
    tracing::info!(topic, message_id = id, "recalled a timed message");
    Ok(id)
}

/// Releases every timed message due now; returns how many were delivered.
/// Timers that cannot go now are put in `skipped`.
pub async fn release_due(broker: &Broker, skipped: &mut HashSet<TimerKey>) -> Result<usize, BrokerError> {
    let node = &broker.node;
    let max_bytes = MAX_BYTES_PER_RELEASE.min(Batcher::max_batch_bytes(broker.cfg.store.max_record_size as usize));
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
            let mut r = match held::read(broker, k.id).await {
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
        if held::release(node, &AdminCommand::ReleaseTimers { keys }, releases).await? {
            delivered += n;
            broker.metrics.timers_released.inc_by(n as u64);
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
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut skipped = HashSet::new();
        let mut skipped_since = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            if !broker.node.is_leader() || skipped_since.elapsed() >= RETRY_SKIPPED {
                skipped.clear();
                skipped_since = tokio::time::Instant::now();
            }
            if !broker.node.is_leader() {
                continue;
            }
            if let Err(e) = release_due(&broker, &mut skipped).await {
                tracing::warn!(error = %e, "releasing due timed messages failed; retrying");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_handles_round_trip_and_reject_garbage() {
        let k = TimerKey::from((1_700_000_000_123, 42, 3));
        assert_eq!(parse_recall_handle(&recall_handle(&k)), Some(k));
        for bad in ["", "t1.", "t1.1.2", "t1.1.2.3.4", "t2.1.2.3", "t1.a.2.3", "t1.1.2.-3"] {
            assert_eq!(parse_recall_handle(bad), None, "{bad}");
        }
    }
}
