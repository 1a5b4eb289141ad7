//! Check 4, `monotonic-consumers`: a consumer reads its queue in order, and
//! committed offsets never go backwards (see the [checker](super)
//! documentation).

use std::collections::HashMap;

use super::facts::{Facts, Sink};
use super::report::CheckResult;
use crate::history::{Call, OpType, Process};

pub(super) fn monotonic_consumers(f: &Facts) -> CheckResult {
    let mut sink = Sink::new(f.ops);
    // (process, key) -> (next offset expected, position that set it).
    let mut next: HashMap<(Process, usize), (u64, usize)> = HashMap::new();
    // (group, key) -> (offset, position) of the last and the largest ok commit.
    let mut last_commit: HashMap<(usize, usize), (u64, usize)> = HashMap::new();
    let mut best_commit: HashMap<(usize, usize), (u64, usize)> = HashMap::new();
    // Assign invocation position -> the largest ok commit completed before.
    let mut at_invoke: HashMap<usize, (u64, usize)> = HashMap::new();
    // (group, key) -> offsets of commits that may still take effect: invoked
    // and not yet answered, or answered with an unknown outcome (those may
    // land at any later time, after a newer commit too: a forward the
    // broker gave up on can still reach the leader).
    let mut in_doubt: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
    let mut polls = 0u64;
    // Assigns that returned a commit in doubt below a newer ok one.
    let mut late_commits = 0u64;
    for (pos, op) in f.ops.iter().enumerate() {
        let key = f.key[pos];
        let group = f.group[pos];
        match (&op.call, op.kind) {
            (Call::Assign { .. }, OpType::Invoke) => {
                if let Some(&c) = best_commit.get(&(group, key)) {
                    at_invoke.insert(pos, c);
                }
            }
            (Call::Assign { offset, .. }, OpType::Ok) => {
                let start = offset.unwrap_or(0);
                next.insert((op.process, key), (start, pos));
                let Some(inv) = f.inv_of[pos] else { continue };
                // Compare only when the completion is of what was invoked.
                if f.key[inv] != key || f.group[inv] != group {
                    continue;
                }
                let below = at_invoke.remove(&inv).filter(|(c, _)| start < *c);
                if below.is_some() && in_doubt.get(&(group, key)).is_some_and(|d| d.contains(&start)) {
                    // The group's offset fell back to that commit's: what
                    // follows is held against it, not against the older.
                    late_commits += 1;
                    last_commit.insert((group, key), (start, pos));
                    best_commit.insert((group, key), (start, pos));
                } else if let Some((c, cpos)) = below {
                    sink.add("commit-regressed", || {
                        let got = offset.map_or("none (0)".to_string(), |o| o.to_string());
                        let d = format!(
                            "group {} key {}: assign returned committed offset {got}, but a commit of {c} had \
                             completed before it was invoked",
                            f.ops_group(pos),
                            f.key_name(key)
                        );
                        (d, vec![cpos, inv, pos])
                    });
                }
            }
            (Call::Assign { .. }, _) => {
                next.remove(&(op.process, key));
                if let Some(inv) = f.inv_of[pos] {
                    at_invoke.remove(&inv);
                }
            }
            (Call::Poll { from, msgs, .. }, OpType::Ok) => {
                polls += 1;
                let from = *from;
                if let Some(&(expect, src)) = next.get(&(op.process, key)) {
                    let kind = if from < expect {
                        Some("backwards")
                    } else if from > expect {
                        Some("skip")
                    } else {
                        None
                    };
                    if let Some(kind) = kind {
                        sink.add(kind, || {
                            let d = format!(
                                "process {} key {}: poll from {from}, but the consumer was at {expect}",
                                process_name(op.process),
                                f.key_name(key)
                            );
                            (d, vec![src, f.inv_of[pos].unwrap_or(pos), pos])
                        });
                    }
                }
                // The first irregularity inside the poll, if any.
                let mut prev: Option<u64> = None;
                for &(o, _) in msgs {
                    let want = prev.map_or(from, |p| p.saturating_add(1));
                    if o != want {
                        let kind = if o > want { "skip" } else { "nonconsecutive" };
                        sink.add(kind, || {
                            let after = prev.map_or(format!("starting at {from}"), |p| format!("after offset {p}"));
                            let d = format!(
                                "process {} key {}: poll from {from} returned offset {o} {after}",
                                process_name(op.process),
                                f.key_name(key)
                            );
                            (d, vec![pos])
                        });
                        break;
                    }
                    prev = Some(o);
                }
                let after = msgs.last().map_or(from, |&(o, _)| o.saturating_add(1));
                next.insert((op.process, key), (after, pos));
            }
            (Call::Commit { offset, .. }, OpType::Invoke) => in_doubt.entry((group, key)).or_default().push(*offset),
            (Call::Commit { offset, .. }, OpType::Fail) => forget(&mut in_doubt, (group, key), *offset),
            (Call::Commit { offset, .. }, OpType::Ok) => {
                let gk = (group, key);
                forget(&mut in_doubt, gk, *offset);
                if let Some(&(prev, ppos)) = last_commit.get(&gk)
                    && *offset < prev
                {
                    sink.add("commit-regressed", || {
                        let d = format!(
                            "group {} key {}: commit of {offset} completed after a commit of {prev}",
                            f.ops_group(pos),
                            f.key_name(key)
                        );
                        (d, vec![ppos, pos])
                    });
                }
                last_commit.insert(gk, (*offset, pos));
                let best = best_commit.entry(gk).or_insert((*offset, pos));
                if *offset > best.0 {
                    *best = (*offset, pos);
                }
            }
            _ => {}
        }
    }
    let description = format!(
        "Each consumer reads its queue in order, from where it was assigned or left off, and committed offsets \
         never go backwards: {polls} ok polls, {} (group, key) pairs committed; {late_commits} assigns returned \
         the offset of a commit with an unknown or pending outcome that landed after a newer one (allowed, \
         reported).",
        last_commit.len()
    );
    sink.finish("monotonic-consumers", description)
}

/// Drops one `offset` from `gk`'s commits in doubt: that commit is settled.
fn forget(in_doubt: &mut HashMap<(usize, usize), Vec<u64>>, gk: (usize, usize), offset: u64) {
    if let Some(d) = in_doubt.get_mut(&gk)
        && let Some(i) = d.iter().position(|o| *o == offset)
    {
        d.swap_remove(i);
    }
}

fn process_name(p: Process) -> String {
    match p {
        Process::Client(n) => n.to_string(),
        Process::Nemesis(_) => "nemesis".to_string(),
    }
}

impl Facts<'_> {
    /// The group named by the operation at `pos`.
    fn ops_group(&self, pos: usize) -> &str {
        match self.ops.get(pos).map(|o| &o.call) {
            Some(Call::Poll { group, .. } | Call::Assign { group, .. } | Call::Commit { group, .. }) => group,
            _ => "?",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::summary;
    use crate::checker::test_support::*;

    #[test]
    fn a_poll_beyond_where_the_consumer_was_is_a_skip() {
        let mut h = H::default();
        for v in 0..4 {
            h.ok_send(1, "k", v, v);
        }
        let (_, a) = h.assign(5, "k", "g", OpType::Ok, Some(1));
        let p = h.poll(5, "k", "g", 2, &[(2, 2)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 2), (3, 3)]);
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "skip");
        let x = anomaly(&r, "monotonic-consumers", "skip");
        assert_eq!(x.ops, vec![a, p - 1, p]);
        assert!(
            x.detail.contains("poll from 2, but the consumer was at 1"),
            "{}",
            x.detail
        );
    }

    #[test]
    fn a_gap_inside_a_poll_is_a_skip() {
        let mut h = H::default();
        for v in 0..3 {
            h.ok_send(1, "k", v, v);
        }
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0), (2, 2)]);
        // Continues after the last message it got: no second report.
        h.poll(5, "k", "g", 3, &[]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 2)]);
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "skip");
        assert_eq!(count(&r, "monotonic-consumers", "skip"), 1);
        // A first message after `from` is a skip too.
        let mut h = H::default();
        h.ok_send(1, "k", 0, 0);
        h.ok_send(1, "k", 1, 1);
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(1, 1)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1)]);
        only_failure(&h.check(), "monotonic-consumers", "skip");
    }

    #[test]
    fn a_poll_before_where_the_consumer_was_is_backwards() {
        let mut h = H::default();
        for v in 0..3 {
            h.ok_send(1, "k", v, v);
        }
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0), (1, 1)]);
        // Failed and unknown polls do not move the consumer.
        h.invoke(5, poll("k", "g", 2, &[]));
        h.done(5, OpType::Fail, poll("k", "g", 2, &[]));
        h.poll(5, "k", "g", 1, &[(1, 1), (2, 2)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 2)]);
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "backwards");
        assert!(
            anomaly(&r, "monotonic-consumers", "backwards")
                .detail
                .contains("consumer was at 2")
        );
    }

    #[test]
    fn a_reassign_resets_the_consumer() {
        let mut h = H::default();
        for v in 0..3 {
            h.ok_send(1, "k", v, v);
        }
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0), (1, 1), (2, 2)]);
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0)]);
        // Another process's position is its own.
        h.assign(6, "k", "g2", OpType::Ok, Some(2));
        h.poll(6, "k", "g2", 2, &[(2, 2)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 2)]);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
    }

    #[test]
    fn repeated_or_reordered_messages_are_nonconsecutive() {
        let mut h = H::default();
        for v in 0..3 {
            h.ok_send(1, "k", v, v);
        }
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0), (1, 1), (1, 1), (2, 2)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 2)]);
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "nonconsecutive");
        let a = anomaly(&r, "monotonic-consumers", "nonconsecutive");
        assert!(a.detail.contains("returned offset 1 after offset 1"), "{}", a.detail);
    }

    #[test]
    fn ok_commits_of_a_group_must_not_decrease() {
        let mut h = H::default();
        let c1 = h.commit(5, "k", "g", 5, OpType::Ok);
        // Unknown and failed commits do not count; other groups are apart.
        h.commit(5, "k", "g", 1, OpType::Info);
        h.commit(6, "k", "g", 2, OpType::Fail);
        h.commit(6, "k", "other", 1, OpType::Ok);
        let c2 = h.commit(6, "k", "g", 3, OpType::Ok);
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "commit-regressed");
        assert_eq!(count(&r, "monotonic-consumers", "commit-regressed"), 1);
        let a = anomaly(&r, "monotonic-consumers", "commit-regressed");
        assert_eq!(a.ops, vec![c1, c2]);
        assert!(
            a.detail.contains("commit of 3 completed after a commit of 5"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn an_assign_must_start_at_or_after_the_last_commit() {
        let mut h = H::default();
        let c = h.commit(5, "k", "g", 4, OpType::Ok);
        let (i, a) = h.assign(6, "k", "g", OpType::Ok, Some(3));
        let r = h.check();
        only_failure(&r, "monotonic-consumers", "commit-regressed");
        assert_eq!(
            anomaly(&r, "monotonic-consumers", "commit-regressed").ops,
            vec![c, i, a]
        );

        // Nothing committed at all is a regression too.
        let mut h = H::default();
        h.commit(5, "k", "g", 4, OpType::Ok);
        h.assign(6, "k", "g", OpType::Ok, None);
        only_failure(&h.check(), "monotonic-consumers", "commit-regressed");

        // A commit with an unknown outcome may land after a newer one: an
        // assign may then see its offset.
        let mut h = H::default();
        h.commit(5, "k", "g", 3, OpType::Info);
        h.commit(6, "k", "g", 4, OpType::Ok);
        h.assign(7, "k", "g", OpType::Ok, Some(3));
        // ...and the consumer goes on from there: its next commits are
        // held against the offset it found, not the older one.
        h.commit(8, "k", "g", 3, OpType::Ok);
        h.commit(8, "k", "g", 4, OpType::Ok);
        assert!(h.check().valid, "an unknown commit may take effect late");
        // ...but only its own offset: any other value is still a regression.
        let mut h = H::default();
        h.commit(5, "k", "g", 3, OpType::Info);
        h.commit(6, "k", "g", 4, OpType::Ok);
        h.assign(7, "k", "g", OpType::Ok, Some(2));
        only_failure(&h.check(), "monotonic-consumers", "commit-regressed");

        // An assign invoked before the commit completed may see the old offset.
        let mut h = H::default();
        h.invoke(6, assign("k", "g", None));
        h.commit(5, "k", "g", 4, OpType::Ok);
        h.done(6, OpType::Ok, assign("k", "g", Some(1)));
        h.assign(7, "k", "g", OpType::Ok, Some(4));
        h.assign(7, "k", "other", OpType::Ok, None);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
    }
}
