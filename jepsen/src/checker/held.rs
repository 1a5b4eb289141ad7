//! Check 6, `held-messages`: timed and transactional messages (see the
//! [checker](super) documentation).

use std::collections::{BTreeMap, HashMap};

use super::facts::{
    Attempt, Drains, End, Facts, HeldKind, MAX_OPS_PER_ANOMALY, MAX_REMEMBERED, NO_ID, Sink, Source, ms, send_positions,
};
use super::report::{CheckResult, HeldStats};
use crate::history::{Call, OpType, Resolution, check_back_answer};

pub(super) fn held_messages(f: &Facts, d: &Drains) -> (CheckResult, HeldStats) {
    /// Where a held value was read: its distinct (key, offset) positions
    /// with the first reader of each, and the earliest read (completion
    /// time, position).
    struct Reads {
        at: Vec<(usize, u64, usize)>,
        first: (u64, usize),
    }
    let stats = held_stats(f);
    let mut sink = Sink::new(f.ops);
    let mut reads: HashMap<u64, Reads> = HashMap::new();
    f.each_position(|pos, src, key, offset, value| {
        if src == Source::Send || !f.held.contains_key(&value) {
            return;
        }
        let time = f.ops[pos].time;
        let r = reads.entry(value).or_insert(Reads {
            at: Vec::new(),
            first: (time, pos),
        });
        if r.at.len() < MAX_REMEMBERED && !r.at.iter().any(|&(k, o, _)| k == key && o == offset) {
            r.at.push((key, offset, pos));
        }
        if time < r.first.0 {
            r.first = (time, pos);
        }
    });
    let nodes_of = d.nodes_of();
    // Held keys with an ok held send -> that send, for `held-undrained`.
    let mut acked_on: BTreeMap<usize, usize> = BTreeMap::new();
    for &value in &f.held_order {
        let Some(&held) = f.held.get(&value) else { continue };
        let attempts = f.sends.get(&value).map(Vec::as_slice).unwrap_or(&[]);
        let acked = attempts.iter().find(|a| a.outcome == Some(OpType::Ok));
        let unsure = attempts.iter().any(Attempt::unknown);
        // Values whose sends all failed are `failed-write-read`'s.
        if acked.is_none() && !unsure {
            continue;
        }
        if let Some(a) = acked {
            acked_on.entry(held.key).or_insert(a.done.unwrap_or(NO_ID));
        }
        let read = reads.get(&value);
        let involved = || {
            let mut positions = send_positions(f, value);
            positions.extend(
                f.ends
                    .get(&value)
                    .into_iter()
                    .flatten()
                    .flat_map(|e| e.attempt.inv.into_iter().chain(e.attempt.done))
                    .take(MAX_OPS_PER_ANOMALY / 4),
            );
            positions
        };
        // In every node's drain of its key that began at or after `from`.
        let missing = |sink: &mut Sink, kind: &str, from: u64| {
            for &(node, drains) in nodes_of.get(&held.key).map(Vec::as_slice).unwrap_or(&[]) {
                let start = drains.first().map_or(0, |&p| f.ops[f.inv_of[p].unwrap_or(p)].time);
                if start < from || d.values.contains(&(held.key, node, value)) {
                    continue;
                }
                sink.add(kind, || {
                    let detail = format!(
                        "key {} value {value} is missing from node {node}'s drain",
                        f.key_name(held.key)
                    );
                    let mut positions = involved();
                    positions.extend(drains);
                    (detail, positions)
                });
            }
        };
        match held.kind {
            HeldKind::Timed { due } => {
                if acked.is_some() {
                    missing(&mut sink, "timed-lost", due);
                }
                if let Some(r) = read
                    && r.first.0 < due
                {
                    sink.add("timed-visible-early", || {
                        let detail = format!("value {value} was read {:.1} ms before it was due", ms(due - r.first.0));
                        let mut positions = involved();
                        positions.push(r.first.1);
                        (detail, positions)
                    });
                }
            }
            HeldKind::Txn => {
                let ok_ends: Vec<&End> = f
                    .ends
                    .get(&value)
                    .into_iter()
                    .flatten()
                    .filter(|e| e.attempt.outcome == Some(OpType::Ok))
                    .collect();
                if ok_ends.len() > 1 {
                    sink.add("txn-resolved-twice", || {
                        let each: Vec<String> = ok_ends
                            .iter()
                            .map(|e| {
                                let by = if e.check_back {
                                    "a check-back answer"
                                } else {
                                    "its producer"
                                };
                                format!("{:?} by {by}", e.resolution)
                            })
                            .collect();
                        let detail = format!(
                            "the transaction of value {value} ended ok {} times: {}",
                            ok_ends.len(),
                            each.join(", ")
                        );
                        (detail, involved())
                    });
                }
                let (may_commit, may_hide) = txn_outcomes(f, value, stats.settled, acked.is_none());
                if may_commit && !may_hide {
                    missing(&mut sink, "committed-lost", 0);
                }
                if let Some(r) = read
                    && !may_commit
                {
                    sink.add("rolled-back-visible", || {
                        let at: Vec<String> =
                            r.at.iter()
                                .map(|&(k, o, _)| format!("key {} offset {o}", f.key_name(k)))
                                .collect();
                        let detail = format!(
                            "value {value}, whose transaction cannot have committed, was read at {}",
                            at.join(", ")
                        );
                        let mut positions = involved();
                        positions.extend(r.at.iter().map(|a| a.2));
                        (detail, positions)
                    });
                }
            }
        }
        if let Some(r) = read
            && r.at.len() > 1
        {
            let kind = match held.kind {
                HeldKind::Timed { .. } => "timed-duplicate",
                HeldKind::Txn => "txn-duplicate",
            };
            sink.add(kind, || {
                let at: Vec<String> =
                    r.at.iter()
                        .map(|&(k, o, p)| format!("key {} offset {o} (op {})", f.key_name(k), f.ops[p].index))
                        .collect();
                let detail = format!("value {value} read at {} positions: {}", r.at.len(), at.join(", "));
                let mut positions = involved();
                positions.extend(r.at.iter().map(|a| a.2));
                (detail, positions)
            });
        }
    }
    d.undrained(f, &mut sink, "held-undrained", &acked_on);
    let s = &stats;
    let mut description = format!(
        "A timed message is read once and, once due, from every node; a transaction is read once if it \
         committed and never if it rolled back. Timed sends: {} ok, {} failed, {} unknown. Transactional \
         sends: {} ok, {} failed, {} unknown; their producers committed {} and rolled back {} ({} ends refused, \
         {} unknown) and left {} to the check-back, whose answers committed {} and rolled back {} ({} refused, \
         {} unknown).",
        s.timed_sends_ok,
        s.timed_sends_failed,
        s.timed_sends_info,
        s.txn_sends_ok,
        s.txn_sends_failed,
        s.txn_sends_info,
        s.commits_ok,
        s.rollbacks_ok,
        s.ends_failed,
        s.ends_info,
        s.left_to_check_back,
        s.checks_commit_ok,
        s.checks_rollback_ok,
        s.checks_failed,
        s.checks_info
    );
    if !s.settled {
        description.push_str(
            " Held messages did not settle before the drain: transactions left to the check-back were not \
             judged lost.",
        );
    }
    let mut stats = stats;
    stats.timed_visible_early = sink.count("timed-visible-early");
    (sink.finish("held-messages", description), stats)
}

/// What the transaction of `value` may have ended as: (committed, not
/// visible), by the rules in the [checker](super) documentation. `unsent`:
/// no send of it was acknowledged (its outcome is unknown).
fn txn_outcomes(f: &Facts, value: u64, settled: bool, unsent: bool) -> (bool, bool) {
    let ends = f.ends.get(&value).map(Vec::as_slice).unwrap_or(&[]);
    let (mut commit, mut hide) = (false, false);
    let mut may_be = |r: Resolution| match r {
        Resolution::Commit => commit = true,
        Resolution::Rollback => hide = true,
    };
    let certain: Vec<Resolution> = ends
        .iter()
        .filter(|e| e.attempt.outcome == Some(OpType::Ok))
        .map(|e| e.resolution)
        .collect();
    if !certain.is_empty() {
        certain.into_iter().for_each(&mut may_be);
        return (commit, hide);
    }
    may_be(check_back_answer(value));
    ends.iter()
        .filter(|e| e.attempt.unknown())
        .for_each(|e| may_be(e.resolution));
    (commit, hide || unsent || !settled)
}

/// The held operations' completions, counted.
fn held_stats(f: &Facts) -> HeldStats {
    let mut s = HeldStats::default();
    for op in f.ops {
        let (ok, failed, info) = match &op.call {
            Call::TimedSend { .. } => (
                &mut s.timed_sends_ok,
                &mut s.timed_sends_failed,
                &mut s.timed_sends_info,
            ),
            Call::TxnSend { .. } => (&mut s.txn_sends_ok, &mut s.txn_sends_failed, &mut s.txn_sends_info),
            Call::TxnEnd { resolution, .. } => (
                match resolution {
                    Resolution::Commit => &mut s.commits_ok,
                    Resolution::Rollback => &mut s.rollbacks_ok,
                },
                &mut s.ends_failed,
                &mut s.ends_info,
            ),
            Call::TxnCheck { resolution, .. } => (
                match resolution {
                    Resolution::Commit => &mut s.checks_commit_ok,
                    Resolution::Rollback => &mut s.checks_rollback_ok,
                },
                &mut s.checks_failed,
                &mut s.checks_info,
            ),
            Call::Settle {} => {
                s.settled |= op.kind == OpType::Ok;
                continue;
            }
            _ => continue,
        };
        match op.kind {
            OpType::Ok => *ok += 1,
            OpType::Fail => *failed += 1,
            OpType::Info => *info += 1,
            OpType::Invoke => {}
        }
    }
    s.left_to_check_back = f
        .held_order
        .iter()
        .filter(|v| f.held.get(v).is_some_and(|h| h.kind == HeldKind::Txn))
        .filter(|v| {
            let acked = f
                .sends
                .get(v)
                .into_iter()
                .flatten()
                .any(|a| a.outcome == Some(OpType::Ok));
            let ended = f.ends.get(v).into_iter().flatten().any(|e| !e.check_back);
            acked && !ended
        })
        .count() as u64;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::summary;
    use crate::checker::test_support::*;
    use crate::history::CHECK_PROCESS;

    use Resolution::{Commit, Rollback};

    /// Every way a held message may go right: timed sends ok, unknown and
    /// failed; transactions committed, rolled back, left to the check-back,
    /// ended after the check-back came first, ended with an unknown outcome,
    /// sent with an unknown outcome; a consumer reading the released ones.
    fn held_clean() -> H {
        let mut h = H::default();
        h.timed(1, "h", 100, 5, OpType::Ok);
        h.timed(1, "h", 102, 6, OpType::Info);
        h.timed(1, "h", 104, 7, OpType::Fail);
        h.timed(2, "h", 106, 8, OpType::Info); // never stored
        h.txn(3, "h", 11, OpType::Ok);
        h.end(3, "h", 11, Commit, OpType::Ok);
        h.txn(3, "h", 12, OpType::Ok);
        h.end(3, "h", 12, Rollback, OpType::Ok);
        h.txn(3, "h", 13, OpType::Ok); // left: odd commits
        h.txn(3, "h", 14, OpType::Ok); // left: even rolls back
        h.txn(3, "h", 16, OpType::Ok);
        h.end(3, "h", 16, Commit, OpType::Info); // may have committed
        h.txn(3, "h", 18, OpType::Ok);
        h.end(CHECK_PROCESS, "h", 18, Rollback, OpType::Ok);
        h.end(3, "h", 18, Commit, OpType::Fail); // the check-back came first
        h.txn(4, "h", 15, OpType::Info); // stored after all: the check-back commits it
        h.txn(5, "h", 17, OpType::Fail);
        h.end(CHECK_PROCESS, "h", 13, Commit, OpType::Ok);
        h.end(CHECK_PROCESS, "h", 14, Rollback, OpType::Ok);
        h.end(CHECK_PROCESS, "h", 13, Commit, OpType::Fail); // a stale check-back
        h.end(CHECK_PROCESS, "h", 15, Commit, OpType::Ok);
        let released = [(0, 100), (1, 11), (2, 102), (3, 13), (4, 16), (5, 15)];
        h.assign(6, "h", "g", OpType::Ok, None);
        h.poll(6, "h", "g", 0, &released[..3]);
        h.settle(OpType::Ok);
        drain_all(&mut h, "h", &released);
        h
    }

    #[test]
    fn a_clean_held_history_passes_every_check() {
        let r = held_clean().check();
        assert!(r.valid, "{}", summary(&r));
        assert!(r.checks.iter().all(|c| c.counts.is_empty()), "{}", summary(&r));
        let s = &r.stats.held;
        assert_eq!((s.timed_sends_ok, s.timed_sends_failed, s.timed_sends_info), (1, 1, 2));
        assert_eq!((s.txn_sends_ok, s.txn_sends_failed, s.txn_sends_info), (6, 1, 1));
        assert_eq!((s.commits_ok, s.rollbacks_ok, s.ends_failed, s.ends_info), (1, 1, 1, 1));
        assert_eq!(s.left_to_check_back, 2);
        assert_eq!(
            (s.checks_commit_ok, s.checks_rollback_ok, s.checks_failed, s.checks_info),
            (2, 2, 1, 0)
        );
        assert!(s.settled && s.timed_visible_early == 0);
        // Held operations are not plain sends.
        assert_eq!(r.stats.sends_ok, 0);
        let d = &result(&r, "held-messages").description;
        assert!(d.contains("Timed sends: 1 ok, 1 failed, 2 unknown"), "{d}");
    }

    #[test]
    fn a_due_timed_message_missing_from_a_drain_is_lost() {
        let mut h = H::default();
        let s = h.timed(1, "h", 100, 5, OpType::Ok);
        // Due long after the drains: not judged.
        h.timed(1, "h", 101, 60_000, OpType::Ok);
        h.settle(OpType::Fail);
        h.drain(101, "h", 1, &[(0, 100)]);
        h.drain(102, "h", 2, &[(0, 100)]);
        let d3 = h.drain(103, "h", 3, &[]);
        let r = h.check();
        // Node 3's shorter drain is also a replica divergence.
        assert_eq!(count(&r, "held-messages", "timed-lost"), 1, "{}", summary(&r));
        let a = anomaly(&r, "held-messages", "timed-lost");
        assert!(a.detail.contains("value 100 is missing from node 3"), "{}", a.detail);
        assert!(a.ops.contains(&s) && a.ops.contains(&d3), "{:?}", a.ops);
        assert!(!r.valid);
    }

    #[test]
    fn a_timed_value_at_two_offsets_is_a_duplicate_whatever_its_send() {
        let mut h = H::default();
        h.timed(1, "h", 100, 2, OpType::Info);
        drain_all(&mut h, "h", &[(0, 100), (1, 100)]);
        let r = h.check();
        only_failure(&r, "held-messages", "timed-duplicate");
        assert!(
            anomaly(&r, "held-messages", "timed-duplicate")
                .detail
                .contains("value 100 read at 2 positions")
        );
    }

    #[test]
    fn a_timed_value_read_before_it_is_due_is_reported() {
        let mut h = H::default();
        h.timed(1, "h", 100, 1_000, OpType::Ok);
        h.assign(6, "h", "g", OpType::Ok, None);
        h.poll(6, "h", "g", 0, &[(0, 100)]);
        h.wait(1_000);
        h.settle(OpType::Ok);
        drain_all(&mut h, "h", &[(0, 100)]);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
        assert_eq!(count(&r, "held-messages", "timed-visible-early"), 1);
        assert_eq!(r.stats.held.timed_visible_early, 1);
    }

    #[test]
    fn a_committed_transaction_missing_from_a_drain_is_lost() {
        let mut h = H::default();
        h.txn(1, "h", 10, OpType::Ok);
        let e = h.end(1, "h", 10, Commit, OpType::Ok);
        drain_all(&mut h, "h", &[]);
        let r = h.check();
        only_failure(&r, "held-messages", "committed-lost");
        assert_eq!(count(&r, "held-messages", "committed-lost"), 3);
        assert!(anomaly(&r, "held-messages", "committed-lost").ops.contains(&e));
    }

    #[test]
    fn a_transaction_left_to_the_check_back_is_judged_only_once_settled() {
        let history = |settled: bool| {
            let mut h = H::default();
            // Odd: the check-back commits it; even: rolls it back.
            h.txn(1, "h", 11, OpType::Ok);
            h.txn(1, "h", 12, OpType::Ok);
            h.end(1, "h", 12, Commit, OpType::Info);
            h.settle(if settled { OpType::Ok } else { OpType::Fail });
            drain_all(&mut h, "h", &[]);
            h.check()
        };
        let r = history(true);
        only_failure(&r, "held-messages", "committed-lost");
        assert_eq!(count(&r, "held-messages", "committed-lost"), 3);
        assert!(
            anomaly(&r, "held-messages", "committed-lost")
                .detail
                .contains("value 11 ")
        );
        let r = history(false);
        assert!(r.valid, "{}", summary(&r));
        assert!(result(&r, "held-messages").description.contains("did not settle"));
    }

    #[test]
    fn a_rolled_back_transaction_must_never_be_read() {
        // Rolled back by its producer, read by a poll.
        let mut h = H::default();
        h.txn(1, "h", 10, OpType::Ok);
        let e = h.end(1, "h", 10, Rollback, OpType::Ok);
        h.assign(6, "h", "g", OpType::Ok, None);
        let p = h.poll(6, "h", "g", 0, &[(0, 10)]);
        drain_all(&mut h, "h", &[(0, 10)]);
        let r = h.check();
        only_failure(&r, "held-messages", "rolled-back-visible");
        let a = anomaly(&r, "held-messages", "rolled-back-visible");
        assert!(a.ops.contains(&e) && a.ops.contains(&p), "{:?}", a.ops);

        // Left with an even value, settled or not; or ended by a check-back
        // answer although the producer's commit is unknown.
        for settled in [true, false] {
            let mut h = H::default();
            h.txn(1, "h", 12, OpType::Ok);
            h.txn(2, "h", 14, OpType::Info);
            h.txn(3, "h", 13, OpType::Ok);
            h.end(3, "h", 13, Commit, OpType::Info);
            h.end(CHECK_PROCESS, "h", 13, Rollback, OpType::Ok);
            h.settle(if settled { OpType::Ok } else { OpType::Fail });
            drain_all(&mut h, "h", &[(0, 12), (1, 14), (2, 13)]);
            let r = h.check();
            only_failure(&r, "held-messages", "rolled-back-visible");
            assert_eq!(count(&r, "held-messages", "rolled-back-visible"), 3);
        }

        // An end whose outcome is unknown may have gone either way.
        for visible in [true, false] {
            let mut h = H::default();
            h.txn(1, "h", 12, OpType::Ok);
            h.end(1, "h", 12, Commit, OpType::Info);
            h.settle(OpType::Ok);
            drain_all(&mut h, "h", if visible { &[(0, 12)] } else { &[] });
            let r = h.check();
            assert!(r.valid, "{}", summary(&r));
        }
    }

    #[test]
    fn a_transaction_ended_ok_twice_is_resolved_twice() {
        let mut h = H::default();
        h.txn(1, "h", 10, OpType::Ok);
        h.end(CHECK_PROCESS, "h", 10, Rollback, OpType::Ok);
        h.end(1, "h", 10, Commit, OpType::Ok);
        h.settle(OpType::Ok);
        drain_all(&mut h, "h", &[(0, 10)]);
        let r = h.check();
        only_failure(&r, "held-messages", "txn-resolved-twice");
        let a = anomaly(&r, "held-messages", "txn-resolved-twice");
        assert!(
            a.detail
                .contains("Rollback by a check-back answer, Commit by its producer"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn a_transaction_at_two_offsets_is_a_duplicate() {
        let mut h = H::default();
        h.txn(1, "h", 11, OpType::Ok);
        h.end(1, "h", 11, Commit, OpType::Ok);
        h.settle(OpType::Ok);
        drain_all(&mut h, "h", &[(0, 11), (1, 11)]);
        let r = h.check();
        only_failure(&r, "held-messages", "txn-duplicate");
    }

    #[test]
    fn a_failed_transactional_send_read_is_a_failed_write_read() {
        let mut h = H::default();
        h.txn(1, "h", 11, OpType::Fail);
        h.settle(OpType::Ok);
        drain_all(&mut h, "h", &[(0, 11)]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "failed-write-read");
    }

    #[test]
    fn a_held_key_without_an_ok_drain_from_every_drained_node_is_undrained() {
        let mut h = H::default();
        h.timed(1, "h", 100, 5, OpType::Ok);
        h.settle(OpType::Ok);
        h.drain(101, "h", 1, &[(0, 100)]);
        drain_all(&mut h, "k", &[]);
        let r = h.check();
        only_failure(&r, "held-messages", "held-undrained");
        assert_eq!(count(&r, "held-messages", "held-undrained"), 2);
    }
}
