//! Check 3, `duplicates`: a value of a plain send is stored at one position
//! (see the [checker](super) documentation).

use std::collections::HashMap;

use super::facts::{Facts, MAX_REMEMBERED, Sink, Source};
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
        let unknown = attempts.iter().filter(|a| a.unknown()).count();
        sink.add("duplicate", || {
            let each: Vec<String> = at
                .iter()
                .map(|&(k, o, p)| format!("key {} offset {o} (op {})", f.key_name(k), f.ops[p].index))
                .collect();
            let d = format!(
                "value {value} read at {} positions: {}; sent {} times, {unknown} with an unknown outcome",
                at.len(),
                each.join(", "),
                attempts.len(),
            );
            (d, at.iter().map(|a| a.2).collect())
        });
    }
    // Plain sends whose outcome was unknown: each was sent again with its
    // message id (the workload's retries), the case deduplication is for.
    let unknown = f
        .sends
        .iter()
        .filter(|(value, _)| !f.held.contains_key(value))
        .flat_map(|(_, attempts)| attempts)
        .filter(|a| a.unknown())
        .count();
    let description = format!(
        "duplicates: {} (unknown outcomes: {unknown}). No value is stored at two offsets: {} values read. A plain \
         send whose outcome was unknown is retried with the same message id, as the official clients retry, and \
         must still be stored once.",
        order.len(),
        seen.len(),
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
    fn a_duplicate_after_an_unknown_send_is_a_duplicate_too() {
        let mut h = H::default();
        h.send(1, "k", 1, OpType::Info, None);
        h.ok_send(1, "k", 1, 1);
        drain_all(&mut h, "k", &[(0, 1), (1, 1)]);
        let r = h.check();
        only_failure(&r, "duplicates", "duplicate");
        let a = anomaly(&r, "duplicates", "duplicate");
        assert!(
            a.detail.contains("sent 2 times, 1 with an unknown outcome"),
            "{}",
            a.detail
        );
        assert!(
            summary(&r).contains("duplicates: 1 (unknown outcomes: 1)"),
            "{}",
            summary(&r)
        );
    }

    #[test]
    fn a_retry_answered_with_the_first_offset_is_no_duplicate() {
        let mut h = H::default();
        h.send(1, "k", 1, OpType::Info, None);
        h.ok_send(1, "k", 1, 0);
        drain_all(&mut h, "k", &[(0, 1)]);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
        assert!(
            summary(&r).contains("duplicates: 0 (unknown outcomes: 1)"),
            "{}",
            summary(&r)
        );
    }
}
