//! Check 1, `unique-offsets`: a queue offset names one message forever
//! (see the [checker](super) documentation).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt::Write as _;

use super::facts::{Facts, MAX_REMEMBERED, Sink};
use super::report::CheckResult;

pub(super) fn unique_offsets(f: &Facts) -> CheckResult {
    struct Slot {
        value: u64,
        pos: usize,
        others: Vec<(u64, usize)>,
    }
    let mut slots: HashMap<(usize, u64), Slot> = HashMap::new();
    // In the order first found, so the report is deterministic.
    let mut conflicted: Vec<(usize, u64)> = Vec::new();
    f.each_position(|pos, _, key, offset, value| match slots.entry((key, offset)) {
        Entry::Vacant(e) => {
            e.insert(Slot {
                value,
                pos,
                others: Vec::new(),
            });
        }
        Entry::Occupied(mut e) => {
            let s = e.get_mut();
            if s.value != value && s.others.len() < MAX_REMEMBERED && !s.others.iter().any(|&(v, _)| v == value) {
                if s.others.is_empty() {
                    conflicted.push((key, offset));
                }
                s.others.push((value, pos));
            }
        }
    });
    let mut sink = Sink::new(f.ops);
    for k in &conflicted {
        let Some(s) = slots.get(k) else { continue };
        sink.add("inconsistent-offset", || {
            let mut d = format!(
                "key {} offset {} holds values {} (op {})",
                f.key_name(k.0),
                k.1,
                s.value,
                f.ops[s.pos].index
            );
            let mut positions = vec![s.pos];
            for &(v, p) in &s.others {
                let _ = write!(d, ", {v} (op {})", f.ops[p].index);
                positions.push(p);
            }
            (d, positions)
        });
    }
    let n = sink.count("inconsistent-offset");
    let description = format!(
        "No (key, offset) ever holds two different values, across ok sends, polls and drains: \
         {} positions observed, {n} with more than one value.",
        slots.len()
    );
    sink.finish("unique-offsets", description)
}

#[cfg(test)]
mod tests {
    use crate::checker::test_support::*;

    #[test]
    fn an_offset_holding_two_values_is_inconsistent() {
        let mut h = clean();
        let s = h.ok_send(1, "k0", 12, 2);
        let p = h.poll(5, "k0", "g0", 2, &[(2, 13)]);
        h.ok_send(1, "k0", 13, 3);
        let r = h.check();
        let a = anomaly(&r, "unique-offsets", "inconsistent-offset");
        assert!(a.detail.contains("key k0 offset 2 holds values 12"), "{}", a.detail);
        assert_eq!(a.ops, vec![s, p]);
        assert!(!result(&r, "unique-offsets").passed);
    }
}
