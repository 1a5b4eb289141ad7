//! Check 5, `replicas`: the Raft logs agree, and each node's commit index
//! never decreases (see the [checker](super) documentation).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::facts::{Sink, ms};
use super::report::{CheckResult, MAX_ANOMALIES_PER_KIND};
use crate::observations::{CommitSample, ReplicaLog};

pub(super) fn replicas(replicas: &[ReplicaLog], commits: &[CommitSample]) -> CheckResult {
    const NODES_SHOWN: usize = 8;
    let mut sink = Sink::new(&[]);
    let mut notes: Vec<String> = Vec::new();

    for r in replicas {
        for w in r.records.windows(2) {
            let (a, b) = (w[0].index, w[1].index);
            if a.checked_add(1) != Some(b) {
                sink.add("log-gap", || {
                    let what = if b <= a { "does not increase" } else { "skips" };
                    (
                        format!("node {}: record index {a} is followed by {b} ({what})", r.node),
                        Vec::new(),
                    )
                });
            }
        }
    }

    // A node that ran but whose log was not read back after the run would
    // pass unchecked (its store left unreadable, say): that is a failure.
    let read: BTreeSet<u64> = replicas.iter().map(|r| r.node).collect();
    let ran: BTreeSet<u64> = commits.iter().map(|c| c.node).collect();
    for node in ran.difference(&read) {
        sink.add("replica-unread", || {
            (
                format!("node {node}'s log could not be read after the run, so it was not compared"),
                Vec::new(),
            )
        });
    }
    if replicas.is_empty() {
        notes.push("no replica logs were collected".to_string());
    } else {
        let limit = replicas
            .iter()
            .filter_map(|r| r.committed.or_else(|| r.records.last().map(|x| x.index)))
            .min();
        let mut first: HashMap<u64, (usize, u64, u32)> = HashMap::new();
        let mut divergent: BTreeSet<u64> = BTreeSet::new();
        let mut compared = 0u64;
        if let Some(limit) = limit {
            for (ri, r) in replicas.iter().enumerate() {
                for rec in r.records.iter().filter(|x| x.index <= limit) {
                    match first.entry(rec.index) {
                        Entry::Vacant(e) => {
                            e.insert((ri, rec.term, rec.crc));
                        }
                        Entry::Occupied(e) => {
                            let &(fr, term, crc) = e.get();
                            if fr != ri {
                                compared += 1;
                                if (term, crc) != (rec.term, rec.crc) {
                                    divergent.insert(rec.index);
                                }
                            }
                        }
                    }
                }
            }
        }
        // Details only for the indexes that will be kept.
        let shown: HashSet<u64> = divergent.iter().take(MAX_ANOMALIES_PER_KIND).copied().collect();
        let mut detail: HashMap<u64, Vec<String>> = HashMap::new();
        if !shown.is_empty() {
            for r in replicas {
                for rec in r.records.iter().filter(|x| shown.contains(&x.index)) {
                    let d = detail.entry(rec.index).or_default();
                    if d.len() < NODES_SHOWN {
                        d.push(format!("node {} term {} crc {:#010x}", r.node, rec.term, rec.crc));
                    }
                }
            }
        }
        for index in &divergent {
            sink.add("log-divergence", || {
                let each = detail.get(index).map(|d| d.join(", ")).unwrap_or_default();
                (format!("index {index}: {each}"), Vec::new())
            });
        }
        match limit {
            Some(limit) => notes.push(format!(
                "{} replicas agree up to index {limit} ({compared} records compared, {} indexes differ)",
                replicas.len(),
                divergent.len()
            )),
            None => notes.push(format!("{} replica logs, all empty", replicas.len())),
        }
    }

    if commits.is_empty() {
        notes.push("no commit-index samples were collected".to_string());
    } else {
        let mut by_node: BTreeMap<u64, Vec<&CommitSample>> = BTreeMap::new();
        for s in commits {
            by_node.entry(s.node).or_default().push(s);
        }
        for (node, samples) in &mut by_node {
            samples.sort_by_key(|s| (s.time, s.incarnation));
            for w in samples.windows(2) {
                let (a, b) = (w[0], w[1]);
                if b.commit_index < a.commit_index {
                    // The committed index is kept without fsync (Raft lets
                    // it be volatile): a power loss may take it back, a
                    // process kill must not.
                    let kind = if b.after_power_loss && a.incarnation != b.incarnation {
                        "commit-index-regressed-after-power-loss"
                    } else {
                        "commit-index-regressed"
                    };
                    sink.add(kind, || {
                        let restart = if a.incarnation != b.incarnation {
                            format!(" (incarnation {} -> {})", a.incarnation, b.incarnation)
                        } else {
                            String::new()
                        };
                        let d = format!(
                            "node {node}: commit index {} at {:.0} ms fell to {} at {:.0} ms{restart}",
                            a.commit_index,
                            ms(a.time),
                            b.commit_index,
                            ms(b.time)
                        );
                        (d, Vec::new())
                    });
                }
            }
        }
        notes.push(format!(
            "{} commit-index samples from {} nodes, {} decreases",
            commits.len(),
            by_node.len(),
            sink.count("commit-index-regressed")
        ));
    }

    let description = format!(
        "Replica logs have no gaps and agree (term, CRC) on every committed index; each node's commit index \
         never decreases, across restarts too: {}.",
        notes.join("; ")
    );
    sink.finish("replicas", description)
}

#[cfg(test)]
mod tests {
    use crate::checker::test_support::*;
    use crate::checker::{Inputs, check, summary};
    use crate::observations::ReplicaLog;

    #[test]
    fn committed_entries_that_differ_are_a_log_divergence() {
        let replicas = [
            replica(1, Some(3), &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc)]),
            replica(2, Some(3), &[(1, 1, 0xa), (2, 2, 0xe), (3, 2, 0xc)]),
            replica(3, None, &[(2, 1, 0xb), (3, 2, 0xf), (4, 3, 0x1)]),
        ];
        let r = check(&Inputs {
            ops: &[],
            replicas: &replicas,
            commits: &[],
            ..Default::default()
        });
        only_failure(&r, "replicas", "log-divergence");
        assert_eq!(count(&r, "replicas", "log-divergence"), 2);
        let a = anomaly(&r, "replicas", "log-divergence");
        assert!(a.detail.starts_with("index 2:"), "{}", a.detail);
        assert!(a.detail.contains("node 2 term 2 crc 0x0000000e"), "{}", a.detail);
        assert!(a.ops.is_empty());

        // Beyond the smallest committed index tails may differ.
        let replicas = [
            replica(1, Some(1), &[(1, 1, 0xa), (2, 1, 0xb)]),
            replica(2, Some(2), &[(1, 1, 0xa), (2, 2, 0xe)]),
        ];
        let r = check(&Inputs {
            ops: &[],
            replicas: &replicas,
            commits: &[],
            ..Default::default()
        });
        assert!(r.valid, "{}", summary(&r));
    }

    #[test]
    fn a_log_with_a_hole_or_a_repeat_is_a_log_gap() {
        let replicas = [
            replica(1, Some(4), &[(1, 1, 0xa), (2, 1, 0xb), (4, 1, 0xd), (4, 1, 0xd)]),
            replica(2, Some(4), &[(1, 1, 0xa), (2, 1, 0xb), (3, 1, 0xc), (4, 1, 0xd)]),
        ];
        let r = check(&Inputs {
            ops: &[],
            replicas: &replicas,
            commits: &[],
            ..Default::default()
        });
        only_failure(&r, "replicas", "log-gap");
        assert_eq!(count(&r, "replicas", "log-gap"), 2);
        let d: Vec<&str> = result(&r, "replicas")
            .anomalies
            .iter()
            .map(|a| a.detail.as_str())
            .collect();
        assert!(
            d[0].contains("node 1: record index 2 is followed by 4 (skips)"),
            "{d:?}"
        );
        assert!(d[1].contains("does not increase"), "{d:?}");
    }

    #[test]
    fn a_commit_index_must_not_fall_across_a_restart() {
        // Out of order in the input; node 2 is fine.
        let commits = [
            sample(30, 1, 1, 7),
            sample(10, 1, 0, 5),
            sample(20, 1, 0, 9),
            sample(10, 2, 0, 1),
            sample(20, 2, 1, 1),
            sample(40, 1, 1, 12),
        ];
        let r = check(&Inputs {
            ops: &[],
            replicas: &[read_back(1), read_back(2)],
            commits: &commits,
            ..Default::default()
        });
        only_failure(&r, "replicas", "commit-index-regressed");
        assert_eq!(count(&r, "replicas", "commit-index-regressed"), 1);
        let a = anomaly(&r, "replicas", "commit-index-regressed");
        assert!(
            a.detail.contains("node 1: commit index 9 at 20 ms fell to 7 at 30 ms"),
            "{}",
            a.detail
        );
        assert!(a.detail.contains("incarnation 0 -> 1"), "{}", a.detail);
    }

    /// A node's log as read back after a run, empty.
    fn read_back(node: u64) -> ReplicaLog {
        ReplicaLog {
            node,
            committed: None,
            records: Vec::new(),
        }
    }

    #[test]
    fn a_node_that_ran_but_whose_log_was_not_read_is_a_failure() {
        let commits = [sample(10, 1, 0, 5), sample(10, 2, 0, 5)];
        let r = check(&Inputs {
            ops: &[],
            replicas: &[read_back(2)],
            commits: &commits,
            ..Default::default()
        });
        only_failure(&r, "replicas", "replica-unread");
        assert!(
            anomaly(&r, "replicas", "replica-unread")
                .detail
                .contains("node 1's log")
        );
        // None read at all, the case that once hid every comparison.
        let r = check(&Inputs {
            ops: &[],
            replicas: &[],
            commits: &commits,
            ..Default::default()
        });
        assert_eq!(count(&r, "replicas", "replica-unread"), 2);
    }

    #[test]
    fn a_commit_index_may_fall_only_across_a_power_loss() {
        let commits_of = |late: bool| {
            let mut after = sample(30, 2, 1, 5);
            after.after_power_loss = true;
            let mut v = vec![sample(10, 2, 0, 9), after, sample(40, 2, 1, 12)];
            if late {
                // Within one incarnation it is judged, power loss or not.
                let mut s = sample(50, 2, 1, 4);
                s.after_power_loss = true;
                v.push(s);
            }
            v
        };
        let commits = commits_of(false);
        let r = check(&Inputs {
            ops: &[],
            replicas: &[read_back(2)],
            commits: &commits,
            ..Default::default()
        });
        assert!(r.valid, "{}", summary(&r));
        assert_eq!(count(&r, "replicas", "commit-index-regressed-after-power-loss"), 1);
        let commits = commits_of(true);
        let r = check(&Inputs {
            ops: &[],
            replicas: &[read_back(2)],
            commits: &commits,
            ..Default::default()
        });
        assert_eq!(count(&r, "replicas", "commit-index-regressed"), 1, "{}", summary(&r));
    }
}
