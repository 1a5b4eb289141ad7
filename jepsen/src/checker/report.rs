//! What the checker reads and what it reports: the inputs, each check's
//! result with its anomalies, the availability and held-message statistics,
//! and the human-readable summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::history::Op;
use crate::observations::{CommitSample, MemberView, ReplicaLog};

/// Anomalies kept per kind in [`CheckResult::anomalies`]; all are counted.
pub const MAX_ANOMALIES_PER_KIND: usize = 100;

/// What the checker reads.
#[derive(Default)]
pub struct Inputs<'a> {
    pub ops: &'a [Op],
    pub replicas: &'a [ReplicaLog],
    pub commits: &'a [CommitSample],
    pub members: &'a [MemberView],
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// True iff every judged check passed.
    pub valid: bool,
    pub checks: Vec<CheckResult>,
    pub stats: Stats,
}

impl Results {
    /// Judged checks that passed.
    pub fn passed(&self) -> usize {
        self.checks.iter().filter(|c| c.judged && c.passed).count()
    }

    /// Judged checks that failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| c.judged && !c.passed).count()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    /// What the check means and what it found.
    pub description: String,
    pub passed: bool,
    /// False for checks that only report (`availability`).
    pub judged: bool,
    /// At most [`MAX_ANOMALIES_PER_KIND`] of each kind, in the order found.
    pub anomalies: Vec<Anomaly>,
    /// Every anomaly found, per kind, including those not kept.
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    pub kind: String,
    pub detail: String,
    /// `index` of each history operation involved.
    pub ops: Vec<u64>,
}

/// Latencies of ok operations, invocation to completion, in milliseconds
/// (nearest-rank percentiles).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// One fault period, from its nemesis start to its stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultStat {
    pub fault: String,
    pub detail: String,
    pub start_ms: f64,
    /// None when the fault was never stopped.
    pub stop_ms: Option<f64>,
    /// The longest stretch without an ok send completion in the window from
    /// the fault's start to 10 s after its stop (or to the end of the send
    /// workload, whichever is first): from the start to the first ok send,
    /// between consecutive ok sends, and from the last one to the window's
    /// end. 0 when no send ran in the window.
    pub longest_gap_ms: f64,
    /// For a fault healed by starting a node again (kill, power, corrupt,
    /// membership): from the stop to the first ok workload operation that
    /// node answered. None for other faults, or when it answered none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_answer_ms: Option<f64>,
}

/// What the `availability` check reports. Counts are of completions by
/// `f` and type; times are milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub sends_ok: u64,
    pub sends_failed: u64,
    pub sends_info: u64,
    pub polls_ok: u64,
    pub polls_failed: u64,
    pub polls_info: u64,
    pub assigns_ok: u64,
    pub assigns_failed: u64,
    pub assigns_info: u64,
    pub commits_ok: u64,
    pub commits_failed: u64,
    pub commits_info: u64,
    pub drains_ok: u64,
    pub drains_failed: u64,
    pub drains_info: u64,
    /// Messages returned by ok polls.
    pub msgs_polled: u64,
    pub nemesis_ops: u64,
    /// Invocations that never completed (the test ended first).
    pub pending: u64,
    /// Completions without a matching invocation (a malformed history).
    pub orphans: u64,
    /// Ok sends per second over the workload: from the first to the last
    /// client operation that is not a drain (drains run after it).
    pub send_rate_per_s: f64,
    pub send_latency: Latency,
    pub poll_latency: Latency,
    pub faults: Vec<FaultStat>,
    /// The longest stretch without an ok send completion, from the first
    /// send invocation to the last send operation.
    pub longest_gap_overall_ms: f64,
    pub held: HeldStats,
}

/// What the `held-messages` check counts: completions of timed and
/// transactional operations by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeldStats {
    pub timed_sends_ok: u64,
    pub timed_sends_failed: u64,
    pub timed_sends_info: u64,
    /// Timed values read before they were due (by the history's clock).
    pub timed_visible_early: u64,
    pub txn_sends_ok: u64,
    pub txn_sends_failed: u64,
    pub txn_sends_info: u64,
    /// Producers' ends, by outcome and resolution.
    pub commits_ok: u64,
    pub rollbacks_ok: u64,
    pub ends_failed: u64,
    pub ends_info: u64,
    /// Ok transactional sends whose process invoked no end.
    pub left_to_check_back: u64,
    /// Answers to the broker's check-backs, by outcome and resolution.
    pub checks_commit_ok: u64,
    pub checks_rollback_ok: u64,
    pub checks_failed: u64,
    pub checks_info: u64,
    /// No node held a timed or half message before the drain (an ok `settle`).
    pub settled: bool,
}

/// A human-readable summary; its last line is `N passed, N failed`.
pub fn summary(results: &Results) -> String {
    const SHOWN: usize = 3;
    let mut out = String::new();
    let _ = writeln!(out, "checker: {}", if results.valid { "valid" } else { "INVALID" });
    for c in &results.checks {
        let verdict = match (c.judged, c.passed) {
            (false, _) => "INFO",
            (true, true) => "PASS",
            (true, false) => "FAIL",
        };
        let _ = writeln!(out, "{verdict} {}: {}", c.name, c.description);
        for (kind, n) in &c.counts {
            let _ = writeln!(out, "    {kind}: {n}");
            for a in c.anomalies.iter().filter(|a| &a.kind == kind).take(SHOWN) {
                let _ = writeln!(out, "      - {} (ops {:?})", a.detail, a.ops);
            }
            if *n as usize > SHOWN {
                let _ = writeln!(out, "      - ... {} more", *n as usize - SHOWN);
            }
        }
    }
    let _ = write!(out, "{} passed, {} failed", results.passed(), results.failed());
    out
}
