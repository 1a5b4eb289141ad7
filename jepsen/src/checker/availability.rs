//! Check 7, `availability`: reported, not judged; counts, rates, latencies
//! and the longest stretches without an ok send (see the [checker](super)
//! documentation).

use std::collections::BTreeMap;

use super::facts::{FAULT_TAIL_NS, Facts, ms};
use super::report::{CheckResult, FaultStat, Latency, Stats};
use crate::history::{Call, NemesisAction, OpType};

pub(super) fn availability(f: &Facts) -> (CheckResult, Stats) {
    let mut s = Stats::default();
    let mut send_lat: Vec<u64> = Vec::new();
    let mut poll_lat: Vec<u64> = Vec::new();
    let mut ok_sends: Vec<u64> = Vec::new();
    // Ok workload operations with the node that answered: (time, node).
    let mut ok_on: Vec<(u64, u64)> = Vec::new();
    let (mut first_client, mut last_client): (Option<u64>, Option<u64>) = (None, None);
    let (mut first_send, mut last_send): (Option<u64>, Option<u64>) = (None, None);
    // Open fault periods: (fault, detail, start time).
    let mut open: Vec<(&str, &str, u64)> = Vec::new();
    let mut periods: Vec<(&str, &str, u64, Option<u64>)> = Vec::new();

    for (pos, op) in f.ops.iter().enumerate() {
        let t = op.time;
        if let Call::Nemesis { action, fault, detail } = &op.call {
            s.nemesis_ops += 1;
            // The harness logs faults as single ok ops; an invoke/complete
            // pair starts at the invocation and stops at the completion.
            if !matches!(op.kind, OpType::Ok | OpType::Info) {
                continue;
            }
            match action {
                NemesisAction::Start => {
                    let start = f.inv_of[pos].map_or(t, |i| f.ops[i].time.min(t));
                    open.push((fault, detail, start));
                }
                NemesisAction::Stop => {
                    // A stop heals the oldest open period of its fault; one
                    // naming no open fault heals them all.
                    if let Some(i) = open.iter().position(|o| o.0 == fault.as_str()) {
                        let (fa, de, st) = open.remove(i);
                        periods.push((fa, de, st, Some(t)));
                    } else {
                        periods.extend(open.drain(..).map(|(fa, de, st)| (fa, de, st, Some(t))));
                    }
                }
            }
            continue;
        }
        // The workload's window leaves out what the harness does itself.
        if !matches!(op.call, Call::Drain { .. } | Call::Settle {} | Call::TxnCheck { .. }) {
            first_client = Some(first_client.map_or(t, |x| x.min(t)));
            last_client = Some(last_client.map_or(t, |x| x.max(t)));
        }
        let is_send = matches!(op.call, Call::Send { .. });
        if is_send {
            last_send = Some(last_send.map_or(t, |x| x.max(t)));
        }
        if op.is_invoke() {
            if is_send {
                first_send = Some(first_send.map_or(t, |x| x.min(t)));
            }
            if f.done_of[pos].is_none() {
                s.pending += 1;
            }
            continue;
        }
        let inv = f.inv_of[pos];
        if inv.is_none() {
            s.orphans += 1;
        }
        let latency = inv.map(|i| t.saturating_sub(f.ops[i].time));
        let (ok, failed, info) = match &op.call {
            Call::Send { .. } => (&mut s.sends_ok, &mut s.sends_failed, &mut s.sends_info),
            Call::Poll { .. } => (&mut s.polls_ok, &mut s.polls_failed, &mut s.polls_info),
            Call::Assign { .. } => (&mut s.assigns_ok, &mut s.assigns_failed, &mut s.assigns_info),
            Call::Commit { .. } => (&mut s.commits_ok, &mut s.commits_failed, &mut s.commits_info),
            Call::Drain { .. } => (&mut s.drains_ok, &mut s.drains_failed, &mut s.drains_info),
            // Counted by the held-messages check.
            Call::TimedSend { .. }
            | Call::TxnSend { .. }
            | Call::TxnEnd { .. }
            | Call::TxnCheck { .. }
            | Call::Settle {}
            | Call::Nemesis { .. } => continue,
        };
        match op.kind {
            OpType::Ok => *ok += 1,
            OpType::Fail => *failed += 1,
            OpType::Info => *info += 1,
            OpType::Invoke => {}
        }
        if op.kind != OpType::Ok {
            continue;
        }
        if let Some(node) = op.node
            && matches!(
                op.call,
                Call::Send { .. } | Call::Poll { .. } | Call::Assign { .. } | Call::Commit { .. }
            )
        {
            ok_on.push((t, node));
        }
        match &op.call {
            Call::Send { .. } => {
                ok_sends.push(t);
                send_lat.extend(latency);
            }
            Call::Poll { msgs, .. } => {
                s.msgs_polled += msgs.len() as u64;
                poll_lat.extend(latency);
            }
            _ => {}
        }
    }
    periods.extend(open.into_iter().map(|(fa, de, st)| (fa, de, st, None)));
    periods.sort_by_key(|p| p.2);

    if let (Some(a), Some(b)) = (first_client, last_client)
        && b > a
    {
        s.send_rate_per_s = s.sends_ok as f64 / ((b - a) as f64 / 1e9);
    }
    s.send_latency = latency(send_lat);
    s.poll_latency = latency(poll_lat);

    ok_sends.sort_unstable();
    let gaps = Gaps::new(ok_sends);
    let send_end = last_send.unwrap_or(0);
    if let Some(start) = first_send {
        s.longest_gap_overall_ms = ms(gaps.longest(start, send_end));
    }
    s.faults = periods
        .into_iter()
        .map(|(fault, detail, start, stop)| {
            let end = stop.map_or(u64::MAX, |x| x.saturating_add(FAULT_TAIL_NS)).min(send_end);
            FaultStat {
                fault: fault.to_string(),
                detail: detail.to_string(),
                start_ms: ms(start),
                stop_ms: stop.map(ms),
                longest_gap_ms: ms(gaps.longest(start, end)),
                restarted_answer_ms: stop.zip(restarted_node(fault, detail)).and_then(|(stop, node)| {
                    ok_on
                        .iter()
                        .find(|&&(t, n)| t >= stop && n == node)
                        .map(|&(t, _)| ms(t - stop))
                }),
            }
        })
        .collect();
    let slowest_restart = s
        .faults
        .iter()
        .filter_map(|x| x.restarted_answer_ms)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));

    let worst = s.faults.iter().map(|x| x.longest_gap_ms).fold(0.0, f64::max);
    let description = format!(
        "Reported, not judged. Sends: {} ok ({:.1}/s), {} failed, {} unknown; latency p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms. Polls: {} ok ({} messages), {} failed, {} unknown; latency p50 {:.1} ms, p99 {:.1} ms. \
         Longest stretch without an ok send: {:.0} ms overall; {} fault periods, the longest stretch in one \
         {:.0} ms.{}",
        s.sends_ok,
        s.send_rate_per_s,
        s.sends_failed,
        s.sends_info,
        s.send_latency.p50_ms,
        s.send_latency.p99_ms,
        s.send_latency.max_ms,
        s.polls_ok,
        s.msgs_polled,
        s.polls_failed,
        s.polls_info,
        s.poll_latency.p50_ms,
        s.poll_latency.p99_ms,
        s.longest_gap_overall_ms,
        s.faults.len(),
        worst,
        slowest_restart.map_or(String::new(), |ms| format!(
            " A restarted node answered its first operation at most {ms:.0} ms after its restart."
        ))
    );
    let result = CheckResult {
        name: "availability".to_string(),
        description,
        passed: true,
        judged: false,
        anomalies: Vec::new(),
        counts: BTreeMap::new(),
    };
    (result, s)
}

/// The node a fault restarts when it is healed (`kill`, `power`,
/// `corrupt`, a `membership` removal), from the nemesis's detail
/// ("... node 3 ...").
fn restarted_node(fault: &str, detail: &str) -> Option<u64> {
    let restarts = match fault {
        "kill" | "power" | "corrupt" => true,
        // A leadership transfer restarts nothing; a removal does.
        "membership" => detail.contains("removed"),
        _ => false,
    };
    if !restarts {
        return None;
    }
    let rest = &detail[detail.find("node ")? + 5..];
    rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())]
        .parse()
        .ok()
}

fn latency(mut ns: Vec<u64>) -> Latency {
    if ns.is_empty() {
        return Latency::default();
    }
    ns.sort_unstable();
    let n = ns.len();
    let at = |p: f64| {
        let rank = (p * n as f64).ceil() as usize;
        ms(ns[rank.saturating_sub(1).min(n - 1)])
    };
    Latency {
        count: n as u64,
        p50_ms: at(0.50),
        p90_ms: at(0.90),
        p99_ms: at(0.99),
        max_ms: ms(ns[n - 1]),
    }
}

/// The longest stretch without a point in a window, over sorted times: a
/// sparse table of the differences between consecutive points answers each
/// window in O(1), so many faults over a long history stay O(n log n).
struct Gaps {
    times: Vec<u64>,
    /// levels[k][i] = max of diffs[i .. i + 2^k].
    levels: Vec<Vec<u64>>,
}

impl Gaps {
    fn new(times: Vec<u64>) -> Gaps {
        let diffs: Vec<u64> = times.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
        let mut levels = vec![diffs];
        let mut width = 1usize;
        loop {
            let prev = &levels[levels.len() - 1];
            if prev.len() <= width {
                break;
            }
            let next: Vec<u64> = (0..prev.len() - width).map(|i| prev[i].max(prev[i + width])).collect();
            levels.push(next);
            width *= 2;
        }
        Gaps { times, levels }
    }

    /// Max of diffs[lo..hi], 0 when empty.
    fn range_max(&self, lo: usize, hi: usize) -> u64 {
        if hi <= lo {
            return 0;
        }
        let k = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let level = &self.levels[k];
        level[lo].max(level[hi - (1 << k)])
    }

    /// The longest stretch in [start, end] with no point inside, counting
    /// from `start` to the first point and from the last point to `end`.
    fn longest(&self, start: u64, end: u64) -> u64 {
        if end <= start {
            return 0;
        }
        let a = self.times.partition_point(|&t| t < start);
        let b = self.times.partition_point(|&t| t <= end);
        if a >= b {
            return end - start;
        }
        let (first, last) = (self.times[a], self.times[b - 1]);
        (first - start).max(end - last).max(self.range_max(a, b - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::summary;
    use crate::checker::test_support::*;

    #[test]
    fn availability_reports_counts_latencies_and_gaps() {
        let mut h = H::default();
        // Sends complete 1 ms after their invocation, 2 ms apart.
        h.ok_send(1, "k", 0, 0); // t=1,2
        h.ok_send(1, "k", 1, 1); // t=3,4
        h.nemesis(NemesisAction::Start, "partition"); // t=5
        h.invoke(2, send("k", 2, None)); // t=6
        h.wait(100);
        h.done(2, OpType::Info, send("k", 2, None)); // t=107
        h.ok_send(1, "k", 3, 2); // t=108,109
        h.nemesis(NemesisAction::Stop, "partition"); // t=110
        h.send(1, "k", 4, OpType::Fail, None); // t=111,112
        h.assign(5, "k", "g", OpType::Ok, None);
        h.poll(5, "k", "g", 0, &[(0, 0), (1, 1)]);
        drain_all(&mut h, "k", &[(0, 0), (1, 1), (2, 3)]);
        let r = h.check();
        assert!(r.valid, "{}", summary(&r));
        let s = &r.stats;
        assert_eq!((s.sends_ok, s.sends_failed, s.sends_info), (3, 1, 1));
        assert_eq!((s.polls_ok, s.assigns_ok, s.drains_ok, s.msgs_polled), (1, 1, 3, 2));
        assert_eq!((s.nemesis_ops, s.pending, s.orphans), (2, 0, 0));
        assert_eq!(s.send_latency.count, 3);
        assert_eq!(s.send_latency.p50_ms, 1.0);
        assert_eq!(s.send_latency.max_ms, 1.0);
        assert_eq!(s.poll_latency.count, 1);
        // First client op at 1 ms, last non-drain one at 116 ms.
        assert!((s.send_rate_per_s - 3.0 / 0.115).abs() < 1e-9, "{}", s.send_rate_per_s);
        assert_eq!(s.faults.len(), 1);
        let f = &s.faults[0];
        assert_eq!(
            (f.fault.as_str(), f.start_ms, f.stop_ms),
            ("partition", 5.0, Some(110.0))
        );
        // From the fault's start (5) to the next ok send (109).
        assert_eq!(f.longest_gap_ms, 104.0);
        // Up to the last send op (112): 4..109 is the longest.
        assert_eq!(s.longest_gap_overall_ms, 105.0);
        let a = result(&r, "availability");
        assert!(a.passed && !a.judged && a.anomalies.is_empty());
        assert!(a.description.contains("Sends: 3 ok"), "{}", a.description);
    }

    #[test]
    fn a_restarted_node_is_timed_to_its_first_ok_operation() {
        let mut h = H::default();
        h.nemesis(NemesisAction::Start, "kill"); // t=1, "kill node 1"
        h.wait(10);
        h.nemesis(NemesisAction::Stop, "kill"); // t=12
        // Node 2 answers first, then node 1, 20 ms after the restart.
        let a = h.ok_send(1, "k", 0, 0); // t=13,14
        h.ops[a as usize].node = Some(2);
        h.wait(17);
        let b = h.ok_send(1, "k", 1, 1); // t=32,33
        h.ops[b as usize].node = Some(1);
        h.nemesis(NemesisAction::Start, "partition"); // t=34
        h.nemesis(NemesisAction::Stop, "partition"); // t=35
        let (_, s) = availability(&Facts::new(&h.ops));
        assert_eq!(s.faults[0].restarted_answer_ms, Some(21.0));
        assert_eq!(s.faults[1].restarted_answer_ms, None, "a partition restarts no node");
        assert_eq!(restarted_node("power", "node 3 (leader) lost power"), Some(3));
        assert_eq!(restarted_node("membership", "node 12 removed"), Some(12));
        assert_eq!(restarted_node("membership", "leadership from node 1 to node 2"), None);
        assert_eq!(restarted_node("kill", "no node named"), None);
    }

    #[test]
    fn gaps_answer_every_window() {
        let times = vec![10, 11, 15, 30, 31, 32, 60, 61, 100];
        let g = Gaps::new(times.clone());
        // Against a direct computation, over many windows.
        for start in 0..110 {
            for end in start..110 {
                let mut pts = vec![start];
                pts.extend(times.iter().copied().filter(|&t| t >= start && t <= end));
                pts.push(end);
                let want = pts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
                assert_eq!(g.longest(start, end), want, "[{start}, {end}]");
            }
        }
        assert_eq!(Gaps::new(Vec::new()).longest(3, 8), 5);
        assert_eq!(Gaps::new(vec![5]).longest(8, 3), 0);
    }
}
