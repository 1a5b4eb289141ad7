//! Check 2, `no-lost-writes`: an acknowledged send survives every fault, and
//! every value read was sent to its key (see the [checker](super)
//! documentation).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use super::facts::{Drains, Facts, MAX_OPS_PER_ANOMALY, NO_ID, Sink, Source, send_positions};
use super::report::CheckResult;
use crate::history::{Call, OpType};

pub(super) fn no_lost_writes(f: &Facts, d: &Drains) -> CheckResult {
    let mut sink = Sink::new(f.ops);
    let nodes_of = d.nodes_of();
    let mut acked_on: BTreeMap<usize, usize> = BTreeMap::new();

    // Acknowledged sends.
    let mut unchecked = 0u64;
    let mut acknowledged = 0u64;
    let mut offsetless: Vec<(usize, usize, u64)> = Vec::new();
    for (pos, op) in f.ops.iter().enumerate() {
        let (OpType::Ok, Call::Send { value, offset, .. }) = (op.kind, &op.call) else {
            continue;
        };
        acknowledged += 1;
        let key = f.key[pos];
        acked_on.entry(key).or_insert(pos);
        let Some(nodes) = nodes_of.get(&key) else {
            unchecked += 1;
            continue;
        };
        let Some(o) = *offset else {
            offsetless.push((pos, key, *value));
            continue;
        };
        for &(node, drains) in nodes {
            let there = d.at.get(&(key, node, o)).copied();
            if there == Some(*value) || d.extra.contains(&(key, node, o, *value)) {
                continue;
            }
            sink.add("lost-write", || {
                let found = there.map_or("nothing".to_string(), |v| format!("value {v}"));
                let detail = format!(
                    "key {} offset {o} value {value} (acknowledged) is missing from node {node}'s drain, \
                     which has {found} there",
                    f.key_name(key)
                );
                let mut positions = vec![f.inv_of[pos].unwrap_or(pos), pos];
                positions.extend(drains);
                (detail, positions)
            });
        }
    }
    for (pos, key, value) in offsetless {
        for &(node, drains) in nodes_of.get(&key).map(Vec::as_slice).unwrap_or(&[]) {
            if !d.values.contains(&(key, node, value)) {
                sink.add("lost-write", || {
                    let detail = format!(
                        "key {} value {value} (acknowledged without an offset) is nowhere in node {node}'s drain",
                        f.key_name(key)
                    );
                    let mut positions = vec![f.inv_of[pos].unwrap_or(pos), pos];
                    positions.extend(drains);
                    (detail, positions)
                });
            }
        }
    }

    // Where each value read came from: one report per (kind, key, value).
    let mut bad: HashMap<(&'static str, usize, u64), Vec<usize>> = HashMap::new();
    let mut bad_order: Vec<(&'static str, usize, u64)> = Vec::new();
    // (key, value) -> verdict, so a value read many times is judged once.
    let mut verdicts: HashMap<(usize, u64), Option<&'static str>> = HashMap::new();
    let mut reads = 0u64;
    f.each_position(|pos, src, key, _, value| {
        if src == Source::Send {
            return;
        }
        reads += 1;
        let verdict = *verdicts.entry((key, value)).or_insert_with(|| origin(f, key, value));
        let Some(kind) = verdict else { return };
        let entry = bad.entry((kind, key, value)).or_insert_with(|| {
            bad_order.push((kind, key, value));
            Vec::new()
        });
        if entry.len() < MAX_OPS_PER_ANOMALY && entry.last() != Some(&pos) {
            entry.push(pos);
        }
    });
    for (kind, key, value) in bad_order {
        let readers = bad.remove(&(kind, key, value)).unwrap_or_default();
        sink.add(kind, || {
            let why = match kind {
                "phantom-read" => "was never sent".to_string(),
                "wrong-key" => {
                    let to: BTreeSet<&str> = f
                        .sends
                        .get(&value)
                        .into_iter()
                        .flatten()
                        .filter(|a| a.inv.is_some())
                        .map(|a| f.key_name(a.key))
                        .collect();
                    format!("was sent to {:?}, not to this key", to)
                }
                _ => "was sent by a send that failed".to_string(),
            };
            let mut positions = send_positions(f, value);
            positions.extend(readers);
            (
                format!("value {value} read from key {} {why}", f.key_name(key)),
                positions,
            )
        });
    }

    // After healing every replica should serve the same queue.
    for (key, nodes) in &nodes_of {
        let lens: Vec<(u64, u64, usize)> = nodes
            .iter()
            .map(|&(n, drains)| {
                (
                    n,
                    d.len.get(&(*key, n)).copied().unwrap_or(0),
                    drains.first().copied().unwrap_or(NO_ID),
                )
            })
            .collect();
        if lens.windows(2).any(|w| w[0].1 != w[1].1) {
            sink.add("replica-divergence", || {
                let each: Vec<String> = lens.iter().map(|(n, l, _)| format!("node {n} has {l}")).collect();
                let detail = format!("key {} drains differ in length: {}", f.key_name(*key), each.join(", "));
                (detail, lens.iter().map(|l| l.2).collect())
            });
        }
    }

    d.undrained(f, &mut sink, "undrained", &acked_on);

    let mut description = format!(
        "Every acknowledged send is at its offset in every node's drain, every value read was sent to that key \
         and not by a failed send, and drains of a key agree in length: {acknowledged} acknowledged sends, \
         {reads} messages read, {} (key, node) drains.",
        d.drained.len()
    );
    if unchecked > 0 {
        let _ = write!(
            description,
            " {unchecked} acknowledged sends were on keys with no ok drain (not checked)."
        );
    }
    sink.finish("no-lost-writes", description)
}

/// What is wrong with reading `value` from `key`, if anything.
fn origin(f: &Facts, key: usize, value: u64) -> Option<&'static str> {
    let attempts = f.sends.get(&value).map(Vec::as_slice).unwrap_or(&[]);
    let mut invoked = attempts.iter().filter(|a| a.inv.is_some()).peekable();
    if invoked.peek().is_none() {
        Some("phantom-read")
    } else if !invoked.clone().any(|a| a.key == key) {
        Some("wrong-key")
    } else if invoked
        .filter(|a| a.key == key)
        .all(|a| a.outcome == Some(OpType::Fail))
    {
        Some("failed-write-read")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::summary;
    use crate::checker::test_support::*;

    #[test]
    fn a_write_missing_from_one_node_is_lost() {
        let mut h = clean();
        let s = h.ok_send(1, "k0", 12, 2);
        h.drain(101, "k0", 1, &[(0, 10), (1, 11), (2, 12)]);
        h.drain(102, "k0", 2, &[(0, 10), (1, 11), (2, 12)]);
        let d3 = h.drain(103, "k0", 3, &[(0, 10), (1, 11)]);
        let r = h.check();
        // Node 3 also drained a shorter queue.
        assert_eq!(count(&r, "no-lost-writes", "lost-write"), 1, "{}", summary(&r));
        let a = anomaly(&r, "no-lost-writes", "lost-write");
        assert!(a.detail.contains("node 3"), "{}", a.detail);
        assert!(a.detail.contains("value 12"), "{}", a.detail);
        assert!(a.ops.contains(&s) && a.ops.contains(&d3), "{:?}", a.ops);
        assert!(!r.valid);
    }

    #[test]
    fn a_write_missing_from_every_drain_is_lost_on_each_node() {
        let mut h = H::default();
        h.ok_send(1, "k", 1, 0);
        h.ok_send(1, "k", 2, 1);
        drain_all(&mut h, "k", &[(0, 1)]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "lost-write");
        assert_eq!(count(&r, "no-lost-writes", "lost-write"), 3);
    }

    #[test]
    fn a_key_without_an_ok_drain_from_every_drained_node_is_undrained() {
        let mut h = H::default();
        h.ok_send(1, "k", 1, 0);
        h.ok_send(1, "j", 2, 0);
        drain_all(&mut h, "k", &[(0, 1)]);
        h.drain(101, "j", 1, &[(0, 2)]);
        // Node 2's drain of j failed, node 3's never ran.
        h.invoke(102, drain("j", 2, &[]));
        h.done(102, OpType::Fail, drain("j", 2, &[]));
        let r = h.check();
        only_failure(&r, "no-lost-writes", "undrained");
        assert_eq!(count(&r, "no-lost-writes", "undrained"), 2, "{}", summary(&r));
        assert!(anomaly(&r, "no-lost-writes", "undrained").detail.contains("key j"));
    }

    #[test]
    fn a_value_never_sent_is_a_phantom_read() {
        let mut h = H::default();
        h.ok_send(1, "k", 1, 0);
        h.assign(5, "k", "g", OpType::Ok, None);
        let p = h.poll(5, "k", "g", 0, &[(0, 1), (1, 99)]);
        drain_all(&mut h, "k", &[(0, 1), (1, 99)]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "phantom-read");
        // One report per value and key, naming every read.
        assert_eq!(count(&r, "no-lost-writes", "phantom-read"), 1);
        let a = anomaly(&r, "no-lost-writes", "phantom-read");
        assert!(
            a.detail.contains("value 99") && a.detail.contains("never sent"),
            "{}",
            a.detail
        );
        assert_eq!(a.ops.len(), 4);
        assert_eq!(a.ops[0], p);
    }

    #[test]
    fn a_value_read_from_another_key_is_a_wrong_key() {
        let mut h = H::default();
        let (inv, _) = h.send(1, "a", 1, OpType::Info, None);
        drain_all(&mut h, "a", &[]);
        drain_all(&mut h, "b", &[(0, 1)]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "wrong-key");
        let a = anomaly(&r, "no-lost-writes", "wrong-key");
        assert!(
            a.detail.contains("read from key b") && a.detail.contains("\"a\""),
            "{}",
            a.detail
        );
        assert!(a.ops.contains(&inv));
    }

    #[test]
    fn a_value_whose_send_failed_must_not_be_read() {
        let mut h = H::default();
        h.send(1, "k", 1, OpType::Fail, None);
        // Pending (never completed) and unknown sends may legitimately land.
        h.send(2, "k", 2, OpType::Info, None);
        h.invoke(3, send("k", 3, None));
        drain_all(&mut h, "k", &[(0, 1), (1, 2), (2, 3)]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "failed-write-read");
        assert_eq!(count(&r, "no-lost-writes", "failed-write-read"), 1);
        assert!(
            anomaly(&r, "no-lost-writes", "failed-write-read")
                .detail
                .contains("value 1 ")
        );
    }

    #[test]
    fn drains_of_different_lengths_are_a_replica_divergence() {
        let mut h = H::default();
        h.send(1, "k", 1, OpType::Info, None);
        h.drain(101, "k", 1, &[(0, 1)]);
        h.drain(102, "k", 2, &[(0, 1)]);
        h.drain(103, "k", 3, &[]);
        let r = h.check();
        only_failure(&r, "no-lost-writes", "replica-divergence");
        let a = anomaly(&r, "no-lost-writes", "replica-divergence");
        assert!(
            a.detail.contains("node 1 has 1") && a.detail.contains("node 3 has 0"),
            "{}",
            a.detail
        );
        assert_eq!(a.ops.len(), 3);
    }
}
