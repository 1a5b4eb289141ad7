//! Check 3, `duplicates`: a value of a plain send is stored at one position
//! (see the [checker](super) documentation).

use std::collections::HashMap;

use super::facts::{Attempt, Facts, MAX_REMEMBERED, Sink, Source};
use super::report::CheckResult;

pub(super) fn duplicates(f: &Facts) -> CheckResult {
    // Distinct (key, offset) positions each value was read at, with the
    // first op that read it there.
    let mut seen: HashMap<u64, Vec<(usize, u64, usize)>> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    f.each_position(|pos, src, key, offset, value| {
        if src == Source::Send || f.held.contains_key(&value) {
            return;
        }
        let at = seen.entry(value).or_default();
        if at.len() < MAX_REMEMBERED && !at.iter().any(|&(k, o, _)| k == key && o == offset) {
            at.push((key, offset, pos));
            if at.len() == 2 {
                order.push(value);
            }
        }
    });
    let mut sink = Sink::new(f.ops);
    for value in &order {
        let Some(at) = seen.get(value) else { continue };
        let attempts = f.sends.get(value).map(Vec::as_slice).unwrap_or(&[]);
        let unknown = attempts.iter().any(Attempt::unknown);
        let kind = if unknown {
            "duplicate-after-unknown"
        } else {
            "duplicate"
        };
        sink.add(kind, || {
            let each: Vec<String> = at
                .iter()
                .map(|&(k, o, p)| format!("key {} offset {o} (op {})", f.key_name(k), f.ops[p].index))
                .collect();
            let d = format!(
                "value {value} read at {} positions: {}{}",
                at.len(),
                each.join(", "),
                if unknown {
                    "; its send's outcome was unknown"
                } else {
                    ""
                }
            );
            (d, at.iter().map(|a| a.2).collect())
        });
    }
    let description = format!(
        "No value is stored at two offsets: {} values read, {} duplicated ({} after a send with an unknown \
         outcome, reported but not judged: a broker may retry forwarding a write it never heard back about).",
        seen.len(),
        order.len(),
        sink.count("duplicate-after-unknown")
    );
    sink.finish("duplicates", description)
}

#[cfg(test)]
mod tests {
    use crate::checker::summary;
    use crate::checker::test_support::*;
    use crate::history::OpType;

    #[test]
    fn a_value_at_two_offsets_is_a_duplicate() {
        let mut h = H::default();
        h.ok_send(1, "k", 1, 0);
        drain_all(&mut h, "k", &[(0, 1), (1, 1)]);
        let r = h.check();
        only_failure(&r, "duplicates", "duplicate");
        let a = anomaly(&r, "duplicates", "duplicate");
        assert!(
            a.detail.contains("offset 0") && a.detail.contains("offset 1"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn a_duplicate_after_an_unknown_send_is_reported_but_passes() {
        let mut h = H::default();
        h.send(1, "k", 1, OpType::Info, None);
        drain_all(&mut h, "k", &[(0, 1), (1, 1)]);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
        let c = result(&r, "duplicates");
        assert!(c.passed);
        assert_eq!(c.counts.get("duplicate-after-unknown"), Some(&1));
        assert!(summary(&r).contains("duplicate-after-unknown: 1"));
    }
}
