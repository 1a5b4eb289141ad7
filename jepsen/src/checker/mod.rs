//! The checker: seven checks over a history, in the manner of Jepsen's queue
//! and Kafka checkers, plus the replica logs and commit-index samples the
//! harness collected (see `observations`).
//!
//! Each check yields a [`CheckResult`] with anomalies of named kinds; the
//! run is valid iff every judged check passed. In the order they run:
//!
//! 1. `unique-offsets`: a queue offset names one message forever. No
//!    (key, offset) may hold two different values across ok send
//!    completions, ok polls and ok drains (`inconsistent-offset`).
//! 2. `no-lost-writes`: an acknowledged send survives every fault. Every ok
//!    send's value is at its (key, offset) in the drain of every node that
//!    drained that key (`lost-write`); an ok send without an offset must at
//!    least be somewhere in each node's drain. Every value read (poll or
//!    drain) was sent to that key (`phantom-read`: never sent; `wrong-key`:
//!    sent to another key), and not by a send that certainly failed
//!    (`failed-write-read`); timed and transactional sends count as sends
//!    here. After healing every replica serves the same
//!    queue: drains of one key from different nodes have the same length
//!    (`replica-divergence`; differing contents show as inconsistent offsets),
//!    and a key with acknowledged sends has an ok drain from every node that
//!    was drained at all (`undrained`: otherwise its writes go unverified).
//! 3. `duplicates`: a value of a plain send stored at two or more distinct
//!    (key, offset) positions, as read (held values: check 6). A `duplicate` fails the check; when the value's
//!    send had an unknown outcome (`info`, or never completed) it is a
//!    `duplicate-after-unknown`, reported but not judged: the harness never
//!    retries a send, but a broker that forwards a write to the leader may
//!    retry that forwarding after a timeout and store it twice, which an
//!    at-least-once queue permits when the client never heard back.
//! 4. `monotonic-consumers`: a consumer reads its queue in order. For each
//!    client process and key, between (re)assignments: an ok poll's messages
//!    start at its `from` and are consecutive, and its `from` is where the
//!    previous ok poll left off (the offset after its last message, which is
//!    `from + len` for a consecutive poll), or the assign's offset (0 when
//!    nothing was committed) for the first poll: `skip` (forward),
//!    `backwards`, `nonconsecutive` (a repeat or reorder inside one poll).
//!    Polls before any assign of their process set the baseline; failed or
//!    unknown polls are ignored; a failed or unknown assign forgets the
//!    position. Committed offsets never go backwards (`commit-regressed`):
//!    a (group, key)'s ok commits, in completion order, never decrease, and
//!    an ok assign invoked after an ok commit completed starts at or after
//!    the largest such commit (an absent offset counts as 0).
//! 5. `replicas`: the Raft logs agree. Each replica's record indexes
//!    increase by one (`log-gap`). Up to the smallest committed index over
//!    the replicas (a replica that did not persist one counts its last
//!    index), any index that two replicas both hold has the same term and
//!    CRC in each (`log-divergence`). Each node's sampled commit index never
//!    decreases over time, across restarts too (`commit-index-regressed`),
//!    except into an incarnation that began with a simulated power loss:
//!    the broker keeps its committed index without fsync, as Raft allows
//!    (`commit-index-regressed-after-power-loss`, reported, not judged).
//! 6. `held-messages`: timed and transactional messages. A held value is
//!    never at two positions, whatever its send's outcome (`timed-duplicate`,
//!    `txn-duplicate`: the broker releases each held message once, under a
//!    guard, and never retries a send). An ok timed send is, once due (by
//!    the history's clock, before the drain began), in the drain of every
//!    node that drained its key (`timed-lost`); one read before it was due
//!    is `timed-visible-early`, reported, not judged (a skewed leader clock
//!    releases early). A transaction ends once: by its producer's ok
//!    `txn-end`, or by an ok `txn-check` answer, or else by a check-back
//!    answered by [`check_back_answer`]. What each may have ended as:
//!    - an ok `txn-end` or `txn-check` is certain: its resolution, and
//!      nothing else; two ok ones are a `txn-resolved-twice` (the broker
//!      refuses to end a transaction that is no longer pending);
//!    - otherwise the check-back's answer; and also the resolution of any
//!      end or answer whose outcome is unknown; and also "not visible" when
//!      the send's outcome is unknown (never stored) or when the history has
//!      no ok `settle` (it may still be pending at the drain). A `txn-end`
//!      that failed changed nothing (refused, or the check-back came first).
//!
//!    A transaction that may only have committed is in the drain of every
//!    node that drained its key (`committed-lost`); one that cannot have
//!    committed is never read, by a poll or a drain (`rolled-back-visible`).
//!    Transactions whose sends all failed are left to `failed-write-read`.
//!    A held key with an ok held send must have an ok drain from every node
//!    drained at all (`held-undrained`).
//! 7. `availability`: reported, not judged (always passed). Counts, rates,
//!    latencies and the longest stretches without an ok send, overall and
//!    around each fault, in [`Stats`].
//!
//! Anomalies are capped at [`MAX_ANOMALIES_PER_KIND`] per kind in
//! `anomalies`; `counts` always counts every one found. An anomaly's `ops`
//! are the `index` fields of the history operations involved (invocations
//! and completions as relevant).
//!
//! Malformed histories never panic: a completion without an invocation (or
//! whose invocation is of another `f`) still counts for what it says, an
//! invocation without a completion is treated as an unknown outcome.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::history::{Call, NemesisAction, Op, OpType, Process, Resolution, check_back_answer, pairs};
use crate::observations::{CommitSample, ReplicaLog};

/// Anomalies kept per kind in [`CheckResult::anomalies`]; all are counted.
pub const MAX_ANOMALIES_PER_KIND: usize = 100;
/// Longest detail string kept (longer ones end in "...").
const MAX_DETAIL_CHARS: usize = 400;
/// Drains of one (key, node) an anomaly names.
const MAX_DRAINS_NAMED: usize = 4;
/// Most history indexes listed in one anomaly.
const MAX_OPS_PER_ANOMALY: usize = 16;
/// Distinct values (or positions) remembered per offset (or value): enough
/// to describe an anomaly, bounded so adversarial histories stay linear.
const MAX_REMEMBERED: usize = 16;
/// How long after a fault stops its window for availability gaps extends.
const FAULT_TAIL_NS: u64 = 10_000_000_000;
/// Kinds that are reported but do not fail their check.
const NOT_JUDGED_KINDS: &[&str] = &[
    "duplicate-after-unknown",
    "commit-index-regressed-after-power-loss",
    "timed-visible-early",
];

/// What the checker reads.
pub struct Inputs<'a> {
    pub ops: &'a [Op],
    pub replicas: &'a [ReplicaLog],
    pub commits: &'a [CommitSample],
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

/// Runs every check.
pub fn check(inputs: &Inputs) -> Results {
    let facts = Facts::new(inputs.ops);
    let drains = Drains::new(&facts);
    let (availability, mut stats) = availability(&facts);
    let (held, held_stats) = held_messages(&facts, &drains);
    stats.held = held_stats;
    let checks = vec![
        unique_offsets(&facts),
        no_lost_writes(&facts, &drains),
        duplicates(&facts),
        monotonic_consumers(&facts),
        replicas(inputs.replicas, inputs.commits),
        held,
        availability,
    ];
    let valid = checks.iter().all(|c| !c.judged || c.passed);
    Results { valid, checks, stats }
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

// ---------------------------------------------------------------------------
// Facts: the history indexed once, shared by the checks.

const NO_ID: usize = usize::MAX;

/// Strings (keys, groups) as small integers, borrowed from the history.
#[derive(Default)]
struct Interner<'a> {
    ids: HashMap<&'a str, usize>,
    names: Vec<&'a str>,
}

impl<'a> Interner<'a> {
    fn id(&mut self, s: &'a str) -> usize {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.names.len();
        self.ids.insert(s, id);
        self.names.push(s);
        id
    }

    fn name(&self, id: usize) -> &'a str {
        self.names.get(id).copied().unwrap_or("?")
    }
}

/// One attempt to send a value.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    key: usize,
    /// Position of the invocation; None for a completion without one.
    inv: Option<usize>,
    /// Position of the completion; None when it never completed.
    done: Option<usize>,
    /// The completion's type; None when it never completed.
    outcome: Option<OpType>,
}

impl Attempt {
    fn unknown(&self) -> bool {
        matches!(self.outcome, None | Some(OpType::Info | OpType::Invoke))
    }
}

/// What a held value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldKind {
    /// Due at this time of the history's clock.
    Timed {
        due: u64,
    },
    Txn,
}

/// A timed or transactional value: what it is and where it was sent (its
/// first send's key).
#[derive(Debug, Clone, Copy)]
struct Held {
    kind: HeldKind,
    key: usize,
}

/// One attempt to end a transaction: its producer's `txn-end`, or an
/// answer to a check-back.
#[derive(Debug, Clone, Copy)]
struct End {
    attempt: Attempt,
    resolution: Resolution,
    check_back: bool,
}

struct Facts<'a> {
    ops: &'a [Op],
    keys: Interner<'a>,
    /// Per position: the key id, or NO_ID.
    key: Vec<usize>,
    /// Per position: the group id (poll, assign, commit), or NO_ID.
    group: Vec<usize>,
    /// Per completion position: its invocation's position.
    inv_of: Vec<Option<usize>>,
    /// Per invocation position: its completion's position.
    done_of: Vec<Option<usize>>,
    /// Every send attempt (plain, timed or transactional), by value.
    sends: HashMap<u64, Vec<Attempt>>,
    /// Timed and transactional values, and the order they were first sent.
    held: HashMap<u64, Held>,
    held_order: Vec<u64>,
    /// Attempts to end each transaction, by value.
    ends: HashMap<u64, Vec<End>>,
}

impl<'a> Facts<'a> {
    fn new(ops: &'a [Op]) -> Facts<'a> {
        let n = ops.len();
        let mut keys = Interner::default();
        let mut groups = Interner::default();
        let mut key = Vec::with_capacity(n);
        let mut group = Vec::with_capacity(n);
        for op in ops {
            key.push(op.key().map_or(NO_ID, |k| keys.id(k)));
            group.push(match &op.call {
                Call::Poll { group, .. } | Call::Assign { group, .. } | Call::Commit { group, .. } => groups.id(group),
                _ => NO_ID,
            });
        }
        let mut inv_of = vec![None; n];
        let mut done_of = vec![None; n];
        for (i, c) in pairs(ops) {
            let (Some(inv), Some(done)) = (ops.get(i), ops.get(c)) else {
                continue;
            };
            // A completion of another operation than the one invoked is
            // malformed: keep both, unpaired.
            if inv.f() != done.f() {
                continue;
            }
            if let (Some(a), Some(b)) = (inv_of.get_mut(c), done_of.get_mut(i)) {
                *a = Some(i);
                *b = Some(c);
            }
        }
        // An operation with effects as one attempt: at its invocation, or
        // at a completion that has none.
        let attempt = |pos: usize| {
            if ops[pos].is_invoke() {
                Some(Attempt {
                    key: key[pos],
                    inv: Some(pos),
                    done: done_of[pos],
                    outcome: done_of[pos].map(|c| ops[c].kind),
                })
            } else if inv_of[pos].is_none() {
                Some(Attempt {
                    key: key[pos],
                    inv: None,
                    done: Some(pos),
                    outcome: Some(ops[pos].kind),
                })
            } else {
                None
            }
        };
        let mut sends: HashMap<u64, Vec<Attempt>> = HashMap::new();
        let mut held: HashMap<u64, Held> = HashMap::new();
        let mut held_order = Vec::new();
        let mut ends: HashMap<u64, Vec<End>> = HashMap::new();
        for (pos, op) in ops.iter().enumerate() {
            let (value, kind) = match &op.call {
                Call::Send { value, .. } => (*value, None),
                Call::TimedSend { value, due, .. } => (*value, Some(HeldKind::Timed { due: *due })),
                Call::TxnSend { value, .. } => (*value, Some(HeldKind::Txn)),
                Call::TxnEnd { value, resolution, .. } | Call::TxnCheck { value, resolution, .. } => {
                    if let Some(attempt) = attempt(pos) {
                        ends.entry(*value).or_default().push(End {
                            attempt,
                            resolution: *resolution,
                            check_back: matches!(op.call, Call::TxnCheck { .. }),
                        });
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(attempt) = attempt(pos) else { continue };
            sends.entry(value).or_default().push(attempt);
            if let Some(kind) = kind
                && let Entry::Vacant(e) = held.entry(value)
            {
                e.insert(Held { kind, key: key[pos] });
                held_order.push(value);
            }
        }
        Facts {
            ops,
            keys,
            key,
            group,
            inv_of,
            done_of,
            sends,
            held,
            held_order,
            ends,
        }
    }

    fn key_name(&self, id: usize) -> &'a str {
        self.keys.name(id)
    }

    /// Every (key, offset, value) an ok operation vouches for, in history
    /// order: `visit(position, drain node if a drain, is a send, key,
    /// offset, value)`.
    fn each_position(&self, mut visit: impl FnMut(usize, Source, usize, u64, u64)) {
        for (pos, op) in self.ops.iter().enumerate() {
            if op.kind != OpType::Ok {
                continue;
            }
            let key = self.key[pos];
            match &op.call {
                Call::Send {
                    value, offset: Some(o), ..
                } => visit(pos, Source::Send, key, *o, *value),
                Call::Poll { msgs, .. } => msgs.iter().for_each(|&(o, v)| visit(pos, Source::Poll, key, o, v)),
                Call::Drain { msgs, node, .. } => msgs
                    .iter()
                    .for_each(|&(o, v)| visit(pos, Source::Drain(*node), key, o, v)),
                _ => {}
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Send,
    Poll,
    Drain(u64),
}

// ---------------------------------------------------------------------------
// Collecting anomalies.

struct Sink<'a> {
    ops: &'a [Op],
    anomalies: Vec<Anomaly>,
    counts: BTreeMap<String, u64>,
}

impl<'a> Sink<'a> {
    fn new(ops: &'a [Op]) -> Sink<'a> {
        Sink {
            ops,
            anomalies: Vec::new(),
            counts: BTreeMap::new(),
        }
    }

    /// Counts one anomaly; `make` (detail, positions of the ops involved)
    /// runs only when it is kept.
    fn add(&mut self, kind: &str, make: impl FnOnce() -> (String, Vec<usize>)) {
        let n = match self.counts.get_mut(kind) {
            Some(n) => {
                *n += 1;
                *n
            }
            None => {
                self.counts.insert(kind.to_string(), 1);
                1
            }
        };
        if n as usize > MAX_ANOMALIES_PER_KIND {
            return;
        }
        let (detail, positions) = make();
        let mut ops: Vec<u64> = Vec::new();
        for p in positions {
            if let Some(op) = self.ops.get(p)
                && !ops.contains(&op.index)
                && ops.len() < MAX_OPS_PER_ANOMALY
            {
                ops.push(op.index);
            }
        }
        self.anomalies.push(Anomaly {
            kind: kind.to_string(),
            detail: clip(detail),
            ops,
        });
    }

    fn count(&self, kind: &str) -> u64 {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    fn finish(self, name: &str, description: String) -> CheckResult {
        let passed = self.counts.keys().all(|k| NOT_JUDGED_KINDS.contains(&k.as_str()));
        CheckResult {
            name: name.to_string(),
            description,
            passed,
            judged: true,
            anomalies: self.anomalies,
            counts: self.counts,
        }
    }
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_DETAIL_CHARS {
        let mut cut = MAX_DETAIL_CHARS;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

// ---------------------------------------------------------------------------
// 1. unique-offsets

fn unique_offsets(f: &Facts) -> CheckResult {
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

// ---------------------------------------------------------------------------
// 2. no-lost-writes

/// Every node's ok drains, indexed once for the checks that hold sends
/// against them.
struct Drains {
    /// (key, node, offset) -> the first value a drain of the node found there.
    at: HashMap<(usize, u64, u64), u64>,
    /// (key, node, offset, value): other values other drains of the same
    /// node found there.
    extra: HashSet<(usize, u64, u64, u64)>,
    /// (key, node, value): every value anywhere in a node's drains of a key.
    values: HashSet<(usize, u64, u64)>,
    /// (key, node) -> the offsets drained.
    len: HashMap<(usize, u64), u64>,
    /// (key, node) -> its ok drains (the first few), ordered for a
    /// deterministic report.
    drained: BTreeMap<(usize, u64), Vec<usize>>,
    /// Every node that was drained at all (ok or not): each key with an
    /// acknowledged send must have an ok drain from each of them.
    nodes: BTreeSet<u64>,
}

impl Drains {
    fn new(f: &Facts) -> Drains {
        let mut d = Drains {
            at: HashMap::new(),
            extra: HashSet::new(),
            values: HashSet::new(),
            len: HashMap::new(),
            drained: BTreeMap::new(),
            nodes: BTreeSet::new(),
        };
        for (pos, op) in f.ops.iter().enumerate() {
            let Call::Drain { node, msgs, .. } = &op.call else {
                continue;
            };
            d.nodes.insert(*node);
            if op.kind != OpType::Ok {
                continue;
            }
            let key = f.key[pos];
            let drains = d.drained.entry((key, *node)).or_default();
            if drains.len() < MAX_DRAINS_NAMED {
                drains.push(pos);
            }
            let len = d.len.entry((key, *node)).or_insert(0);
            for &(o, v) in msgs {
                d.values.insert((key, *node, v));
                match d.at.entry((key, *node, o)) {
                    Entry::Vacant(e) => {
                        e.insert(v);
                        *len += 1;
                    }
                    Entry::Occupied(e) => {
                        if *e.get() != v {
                            d.extra.insert((key, *node, o, v));
                        }
                    }
                }
            }
        }
        d
    }

    /// key -> its drained nodes in order, each with its ok drains.
    fn nodes_of(&self) -> BTreeMap<usize, Vec<(u64, &[usize])>> {
        let mut nodes_of: BTreeMap<usize, Vec<(u64, &[usize])>> = BTreeMap::new();
        for (&(key, node), drains) in &self.drained {
            nodes_of.entry(key).or_default().push((node, drains));
        }
        nodes_of
    }

    /// Reports each key of `keys` (key -> an operation to name) that some
    /// drained node has no ok drain of, as `kind`: its writes there are
    /// unverified.
    fn undrained(&self, f: &Facts, sink: &mut Sink, kind: &str, keys: &BTreeMap<usize, usize>) {
        for (&key, &pos) in keys {
            for node in &self.nodes {
                if self.drained.contains_key(&(key, *node)) {
                    continue;
                }
                sink.add(kind, || {
                    (
                        format!(
                            "key {} has acknowledged sends but no ok drain from node {node}: its writes there are \
                             unverified",
                            f.key_name(key)
                        ),
                        vec![pos],
                    )
                });
            }
        }
    }
}

fn no_lost_writes(f: &Facts, d: &Drains) -> CheckResult {
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

/// Positions of the send invocations and completions of a value.
fn send_positions(f: &Facts, value: u64) -> Vec<usize> {
    f.sends
        .get(&value)
        .into_iter()
        .flatten()
        .flat_map(|a| a.inv.into_iter().chain(a.done))
        .take(MAX_OPS_PER_ANOMALY / 2)
        .collect()
}

// ---------------------------------------------------------------------------
// 3. duplicates

fn duplicates(f: &Facts) -> CheckResult {
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

// ---------------------------------------------------------------------------
// 4. monotonic-consumers

fn monotonic_consumers(f: &Facts) -> CheckResult {
    let mut sink = Sink::new(f.ops);
    // (process, key) -> (next offset expected, position that set it).
    let mut next: HashMap<(Process, usize), (u64, usize)> = HashMap::new();
    // (group, key) -> (offset, position) of the last and the largest ok commit.
    let mut last_commit: HashMap<(usize, usize), (u64, usize)> = HashMap::new();
    let mut best_commit: HashMap<(usize, usize), (u64, usize)> = HashMap::new();
    // Assign invocation position -> the largest ok commit completed before.
    let mut at_invoke: HashMap<usize, (u64, usize)> = HashMap::new();
    let mut polls = 0u64;
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
                if let Some((c, cpos)) = at_invoke.remove(&inv)
                    && start < c
                {
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
            (Call::Commit { offset, .. }, OpType::Ok) => {
                let gk = (group, key);
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
         never go backwards: {polls} ok polls, {} (group, key) pairs committed.",
        last_commit.len()
    );
    sink.finish("monotonic-consumers", description)
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

// ---------------------------------------------------------------------------
// 5. replicas

fn replicas(replicas: &[ReplicaLog], commits: &[CommitSample]) -> CheckResult {
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

// ---------------------------------------------------------------------------
// 6. held-messages

fn held_messages(f: &Facts, d: &Drains) -> (CheckResult, HeldStats) {
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
/// visible), by the rules in the module documentation. `unsent`: no send
/// of it was acknowledged (its outcome is unknown).
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

// ---------------------------------------------------------------------------
// 7. availability

fn availability(f: &Facts) -> (CheckResult, Stats) {
    let mut s = Stats::default();
    let mut send_lat: Vec<u64> = Vec::new();
    let mut poll_lat: Vec<u64> = Vec::new();
    let mut ok_sends: Vec<u64> = Vec::new();
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
            }
        })
        .collect();

    let worst = s.faults.iter().map(|x| x.longest_gap_ms).fold(0.0, f64::max);
    let description = format!(
        "Reported, not judged. Sends: {} ok ({:.1}/s), {} failed, {} unknown; latency p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms. Polls: {} ok ({} messages), {} failed, {} unknown; latency p50 {:.1} ms, p99 {:.1} ms. \
         Longest stretch without an ok send: {:.0} ms overall; {} fault periods, the longest stretch in one \
         {:.0} ms.",
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
        worst
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
    use crate::history::{CHECK_PROCESS, NEMESIS, SETTLE_PROCESS};
    use crate::observations::LogRecord;

    const MS: u64 = 1_000_000;

    /// Builds histories one operation at a time, 1 ms apart.
    #[derive(Default)]
    struct H {
        ops: Vec<Op>,
        time: u64,
    }

    impl H {
        fn push(&mut self, process: Process, kind: OpType, call: Call) -> u64 {
            let index = self.ops.len() as u64;
            self.time += MS;
            self.ops.push(Op {
                index,
                time: self.time,
                process,
                kind,
                call,
                node: None,
                error: None,
            });
            index
        }

        fn wait(&mut self, ms: u64) {
            self.time += ms * MS;
        }

        fn invoke(&mut self, p: u64, call: Call) -> u64 {
            self.push(Process::Client(p), OpType::Invoke, call)
        }

        fn done(&mut self, p: u64, kind: OpType, call: Call) -> u64 {
            self.push(Process::Client(p), kind, call)
        }

        /// A send and its completion; `offset` only on ok.
        fn send(&mut self, p: u64, key: &str, value: u64, kind: OpType, offset: Option<u64>) -> (u64, u64) {
            let i = self.invoke(p, send(key, value, None));
            let c = self.done(
                p,
                kind,
                send(key, value, if kind == OpType::Ok { offset } else { None }),
            );
            (i, c)
        }

        fn ok_send(&mut self, p: u64, key: &str, value: u64, offset: u64) -> u64 {
            self.send(p, key, value, OpType::Ok, Some(offset)).1
        }

        fn assign(&mut self, p: u64, key: &str, group: &str, kind: OpType, offset: Option<u64>) -> (u64, u64) {
            let i = self.invoke(p, assign(key, group, None));
            let c = self.done(p, kind, assign(key, group, offset));
            (i, c)
        }

        fn poll(&mut self, p: u64, key: &str, group: &str, from: u64, msgs: &[(u64, u64)]) -> u64 {
            self.invoke(p, poll(key, group, from, &[]));
            self.done(p, OpType::Ok, poll(key, group, from, msgs))
        }

        fn commit(&mut self, p: u64, key: &str, group: &str, offset: u64, kind: OpType) -> u64 {
            let c = Call::Commit {
                key: key.into(),
                group: group.into(),
                offset,
            };
            self.invoke(p, c.clone());
            self.done(p, kind, c)
        }

        fn drain(&mut self, p: u64, key: &str, node: u64, msgs: &[(u64, u64)]) -> u64 {
            self.invoke(p, drain(key, node, &[]));
            self.done(p, OpType::Ok, drain(key, node, msgs))
        }

        /// A timed send due `due_ms` into the history, and its completion.
        fn timed(&mut self, p: u64, key: &str, value: u64, due_ms: u64, kind: OpType) -> u64 {
            let call = Call::TimedSend {
                key: key.into(),
                value,
                due: due_ms * MS,
            };
            self.invoke(p, call.clone());
            self.done(p, kind, call)
        }

        /// A transactional send and its completion.
        fn txn(&mut self, p: u64, key: &str, value: u64, kind: OpType) -> u64 {
            let call = |transaction_id| Call::TxnSend {
                key: key.into(),
                value,
                transaction_id,
            };
            self.invoke(p, call(None));
            let id = (kind == OpType::Ok).then(|| format!("x1.{value}.0"));
            self.done(p, kind, call(id))
        }

        /// The producer's end of a transaction (or, from a process at or
        /// above CHECK_PROCESS, a check-back answer) and its completion.
        fn end(&mut self, p: u64, key: &str, value: u64, resolution: Resolution, kind: OpType) -> u64 {
            let transaction_id = format!("x1.{value}.0");
            let call = if p >= CHECK_PROCESS {
                Call::TxnCheck {
                    key: key.into(),
                    value,
                    resolution,
                    transaction_id,
                }
            } else {
                Call::TxnEnd {
                    key: key.into(),
                    value,
                    resolution,
                    transaction_id,
                }
            };
            self.invoke(p, call.clone());
            self.done(p, kind, call)
        }

        fn settle(&mut self, kind: OpType) -> u64 {
            self.invoke(SETTLE_PROCESS, Call::Settle {});
            self.done(SETTLE_PROCESS, kind, Call::Settle {})
        }

        fn nemesis(&mut self, action: NemesisAction, fault: &str) -> u64 {
            let call = Call::Nemesis {
                action,
                fault: fault.into(),
                detail: format!("{fault} node 1"),
            };
            self.push(NEMESIS, OpType::Ok, call)
        }

        fn check(&self) -> Results {
            check(&Inputs {
                ops: &self.ops,
                replicas: &[],
                commits: &[],
            })
        }
    }

    fn send(key: &str, value: u64, offset: Option<u64>) -> Call {
        Call::Send {
            key: key.into(),
            value,
            offset,
        }
    }

    fn assign(key: &str, group: &str, offset: Option<u64>) -> Call {
        Call::Assign {
            key: key.into(),
            group: group.into(),
            offset,
        }
    }

    fn poll(key: &str, group: &str, from: u64, msgs: &[(u64, u64)]) -> Call {
        Call::Poll {
            key: key.into(),
            group: group.into(),
            from,
            msgs: msgs.to_vec(),
        }
    }

    fn drain(key: &str, node: u64, msgs: &[(u64, u64)]) -> Call {
        Call::Drain {
            key: key.into(),
            node,
            msgs: msgs.to_vec(),
        }
    }

    /// Drains `msgs` of `key` from nodes 1 to 3.
    fn drain_all(h: &mut H, key: &str, msgs: &[(u64, u64)]) {
        for node in 1..=3 {
            h.drain(100 + node, key, node, msgs);
        }
    }

    fn result<'r>(r: &'r Results, name: &str) -> &'r CheckResult {
        r.checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}"))
    }

    fn count(r: &Results, name: &str, kind: &str) -> u64 {
        result(r, name).counts.get(kind).copied().unwrap_or(0)
    }

    fn anomaly<'r>(r: &'r Results, name: &str, kind: &str) -> &'r Anomaly {
        result(r, name)
            .anomalies
            .iter()
            .find(|a| a.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} in {name}: {:#?}", result(r, name)))
    }

    /// Asserts that exactly the named check failed, and only with `kind`.
    fn only_failure(r: &Results, name: &str, kind: &str) {
        assert!(!r.valid, "{}", summary(r));
        for c in &r.checks {
            if c.name == name {
                assert!(!c.passed, "{}", summary(r));
                assert!(c.counts.get(kind).copied().unwrap_or(0) > 0, "{}", summary(r));
                assert_eq!(c.counts.len(), 1, "{}", summary(r));
            } else {
                assert!(c.passed, "{} should pass:\n{}", c.name, summary(r));
            }
        }
        assert_eq!(r.failed(), 1);
    }

    fn replica(node: u64, committed: Option<u64>, records: &[(u64, u64, u32)]) -> ReplicaLog {
        ReplicaLog {
            node,
            committed,
            records: records
                .iter()
                .map(|&(index, term, crc)| LogRecord { index, term, crc })
                .collect(),
        }
    }

    fn sample(time_ms: u64, node: u64, incarnation: u32, commit_index: u64) -> CommitSample {
        CommitSample {
            time: time_ms * MS,
            node,
            incarnation,
            commit_index,
            after_power_loss: false,
        }
    }

    /// Two keys, a consumer that assigns, polls and commits, a fault, and
    /// a drain that agrees everywhere.
    fn clean() -> H {
        let mut h = H::default();
        h.ok_send(1, "k0", 10, 0);
        h.ok_send(2, "k1", 20, 0);
        h.nemesis(NemesisAction::Start, "kill");
        h.ok_send(1, "k0", 11, 1);
        h.send(2, "k1", 21, OpType::Fail, None);
        h.send(2, "k1", 22, OpType::Info, None);
        h.nemesis(NemesisAction::Stop, "kill");
        h.ok_send(3, "k1", 23, 1);
        h.assign(5, "k0", "g0", OpType::Ok, None);
        h.poll(5, "k0", "g0", 0, &[(0, 10)]);
        h.poll(5, "k0", "g0", 1, &[(1, 11)]);
        h.poll(5, "k0", "g0", 2, &[]);
        h.commit(5, "k0", "g0", 2, OpType::Ok);
        h.assign(6, "k1", "g1", OpType::Ok, None);
        h.poll(6, "k1", "g1", 0, &[(0, 20), (1, 23)]);
        h.commit(6, "k1", "g1", 2, OpType::Ok);
        // Another consumer of g0 takes over k0 where the group left off.
        h.assign(7, "k0", "g0", OpType::Ok, Some(2));
        h.poll(7, "k0", "g0", 2, &[]);
        drain_all(&mut h, "k0", &[(0, 10), (1, 11)]);
        drain_all(&mut h, "k1", &[(0, 20), (1, 23)]);
        h
    }

    #[test]
    fn a_clean_history_passes_every_check() {
        let h = clean();
        let replicas = [
            replica(1, Some(3), &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc)]),
            replica(2, Some(3), &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc)]),
            // Uncommitted and different beyond the smallest committed index.
            replica(3, None, &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc), (4, 3, 0xd)]),
        ];
        let commits = [
            sample(1, 1, 0, 1),
            sample(2, 1, 0, 2),
            sample(3, 1, 1, 2),
            sample(1, 2, 0, 3),
        ];
        let r = check(&Inputs {
            ops: &h.ops,
            replicas: &replicas,
            commits: &commits,
        });
        let names: Vec<&str> = r.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "unique-offsets",
                "no-lost-writes",
                "duplicates",
                "monotonic-consumers",
                "replicas",
                "held-messages",
                "availability"
            ]
        );
        assert!(r.valid, "{}", summary(&r));
        assert!(
            r.checks
                .iter()
                .all(|c| c.passed && c.anomalies.is_empty() && c.counts.is_empty())
        );
        assert!(!result(&r, "availability").judged);
        assert_eq!((r.passed(), r.failed()), (6, 0));
        let s = summary(&r);
        assert!(s.ends_with("\n6 passed, 0 failed"), "{s}");
        assert!(s.contains("PASS unique-offsets"), "{s}");
        assert!(s.contains("INFO availability"), "{s}");
        assert!(!result(&r, "replicas").description.contains("no replica logs"));
    }

    #[test]
    fn an_empty_history_passes_with_notes() {
        let r = H::default().check();
        assert!(r.valid, "{}", summary(&r));
        assert_eq!((r.passed(), r.failed()), (6, 0));
        let d = &result(&r, "replicas").description;
        assert!(d.contains("no replica logs were collected"), "{d}");
        assert!(d.contains("no commit-index samples were collected"), "{d}");
        assert_eq!(r.stats, Stats::default());
    }

    #[test]
    fn malformed_histories_do_not_panic() {
        let mut h = H::default();
        // Completions without invocations, of every kind.
        h.done(1, OpType::Ok, send("k", 1, Some(0)));
        h.done(2, OpType::Ok, poll("k", "g", 0, &[(0, 1), (0, 1), (u64::MAX, 9)]));
        h.done(3, OpType::Ok, assign("k", "g", Some(u64::MAX)));
        h.done(3, OpType::Info, drain("k", 1, &[]));
        h.push(NEMESIS, OpType::Ok, send("k", 2, None));
        // A stop with no start, a start never stopped, a nemesis invoke.
        h.nemesis(NemesisAction::Stop, "pause");
        h.push(
            NEMESIS,
            OpType::Invoke,
            Call::Nemesis {
                action: NemesisAction::Start,
                fault: "kill".into(),
                detail: String::new(),
            },
        );
        h.nemesis(NemesisAction::Start, "kill");
        // A completion of another f than its invocation, and invocations
        // never completed.
        h.invoke(4, send("k", 3, None));
        h.done(4, OpType::Ok, poll("k", "g", u64::MAX, &[(u64::MAX, 3)]));
        h.invoke(5, assign("k", "g", None));
        h.invoke(6, send("k", 4, None));
        // Duplicate indexes and times going backwards.
        let mut ops = h.ops.clone();
        for op in &mut ops {
            op.index = 7;
        }
        ops[3].time = 0;
        let weird = [
            replica(1, Some(0), &[]),
            replica(2, None, &[(5, 1, 1), (5, 2, 2), (u64::MAX, 1, 1)]),
        ];
        let commits = [sample(5, 1, 3, 9), sample(5, 1, 0, 2), sample(0, 9, u32::MAX, u64::MAX)];
        for (ops, replicas, commits) in [
            (&h.ops[..], &weird[..], &commits[..]),
            (&ops[..], &weird[..], &commits[..]),
            (&ops[..], &[][..], &[][..]),
        ] {
            let r = check(&Inputs { ops, replicas, commits });
            let s = summary(&r);
            assert!(s.lines().last().is_some_and(|l| l.ends_with(" failed")), "{s}");
            assert_eq!(r.stats.orphans, 6, "{s}");
            assert_eq!(r.stats.pending, 3, "{s}");
            assert_eq!(r.stats.faults.len(), 1, "{s}");
            assert!(r.stats.faults[0].stop_ms.is_none());
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Results>(&json).unwrap().checks, r.checks);
        }
    }

    #[test]
    fn a_lone_ok_send_completion_still_counts() {
        let mut h = H::default();
        h.done(1, OpType::Ok, send("k", 1, Some(0)));
        drain_all(&mut h, "k", &[(0, 2)]);
        let r = h.check();
        assert!(
            count(&r, "unique-offsets", "inconsistent-offset") == 1,
            "{}",
            summary(&r)
        );
        assert_eq!(count(&r, "no-lost-writes", "lost-write"), 3);
        assert_eq!(count(&r, "no-lost-writes", "phantom-read"), 1);
    }

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
            replicas: &[],
            commits: &commits,
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
        assert!(
            result(&r, "replicas")
                .description
                .contains("no replica logs were collected")
        );
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
            replicas: &[],
            commits: &commits,
        });
        assert!(r.valid, "{}", summary(&r));
        assert_eq!(count(&r, "replicas", "commit-index-regressed-after-power-loss"), 1);
        let commits = commits_of(true);
        let r = check(&Inputs {
            ops: &[],
            replicas: &[],
            commits: &commits,
        });
        assert_eq!(count(&r, "replicas", "commit-index-regressed"), 1, "{}", summary(&r));
    }

    // -----------------------------------------------------------------------
    // held-messages

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

    #[test]
    fn anomalies_are_capped_per_kind_but_all_counted() {
        let mut h = H::default();
        let n = MAX_ANOMALIES_PER_KIND as u64 + 50;
        for v in 0..n {
            h.ok_send(1, "k", v, v);
        }
        drain_all(&mut h, "k", &[]);
        let r = h.check();
        let c = result(&r, "no-lost-writes");
        assert_eq!(c.counts.get("lost-write"), Some(&(3 * n)));
        assert_eq!(c.anomalies.len(), MAX_ANOMALIES_PER_KIND);
        let s = summary(&r);
        assert!(s.contains(&format!("lost-write: {}", 3 * n)), "{s}");
        assert!(s.contains(&format!("... {} more", 3 * n - 3)), "{s}");
        assert!(s.ends_with("\n5 passed, 1 failed"), "{s}");
    }

    #[test]
    fn long_details_are_clipped() {
        let mut h = H::default();
        let key = "é".repeat(MAX_DETAIL_CHARS);
        h.ok_send(1, &key, 1, 0);
        drain_all(&mut h, &key, &[]);
        let r = h.check();
        let a = anomaly(&r, "no-lost-writes", "lost-write");
        assert!(a.detail.len() <= MAX_DETAIL_CHARS + 3 && a.detail.ends_with("..."));
    }

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

    #[test]
    fn a_large_clean_history_is_checked_in_linear_time() {
        // ~100k operations: 4 keys, interleaved sends, a consumer per key
        // polling in batches and committing, faults, drains from 3 nodes.
        let mut h = H::default();
        let keys = ["k0", "k1", "k2", "k3"];
        let mut queues: Vec<Vec<(u64, u64)>> = vec![Vec::new(); keys.len()];
        for (k, key) in keys.iter().enumerate() {
            h.assign(10 + k as u64, key, "g", OpType::Ok, None);
        }
        let mut read = vec![0u64; keys.len()];
        for v in 0..20_000u64 {
            let k = (v % 4) as usize;
            let offset = queues[k].len() as u64;
            h.ok_send(v % 8, keys[k], v, offset);
            queues[k].push((offset, v));
            if v % 1000 == 0 {
                let action = if v % 2000 == 0 {
                    NemesisAction::Start
                } else {
                    NemesisAction::Stop
                };
                h.nemesis(action, "partition");
            }
            if v % 16 == 15 {
                for (k, key) in keys.iter().enumerate() {
                    let from = read[k];
                    let msgs = &queues[k][from as usize..];
                    h.poll(10 + k as u64, key, "g", from, msgs);
                    read[k] = queues[k].len() as u64;
                    h.commit(10 + k as u64, key, "g", read[k], OpType::Ok);
                }
            }
        }
        for (k, key) in keys.iter().enumerate() {
            drain_all(&mut h, key, &queues[k]);
        }
        assert!(h.ops.len() > 50_000, "{}", h.ops.len());
        let records: Vec<(u64, u64, u32)> = (1..=20_000).map(|i| (i, 1 + i / 5000, i as u32)).collect();
        let replicas: Vec<ReplicaLog> = (1..=3).map(|n| replica(n, Some(20_000), &records)).collect();
        let commits: Vec<CommitSample> = (0..30_000).map(|i| sample(i, 1 + i % 3, 0, i)).collect();
        let started = std::time::Instant::now();
        let r = check(&Inputs {
            ops: &h.ops,
            replicas: &replicas,
            commits: &commits,
        });
        assert!(r.valid, "{}", summary(&r));
        assert_eq!(r.stats.sends_ok, 20_000);
        assert_eq!(r.stats.faults.len(), 10);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn results_round_trip_through_json() {
        let mut h = clean();
        h.ok_send(1, "k0", 12, 2);
        let r = h.check();
        let json = serde_json::to_string_pretty(&r).unwrap();
        assert!(json.contains("\"lost-write\""), "{json}");
        let back: Results = serde_json::from_str(&json).unwrap();
        // Floats may differ in the last digit (serde_json parses fast, not exact).
        assert_eq!(
            (back.valid, &back.checks, &back.stats.faults),
            (r.valid, &r.checks, &r.stats.faults)
        );
        assert_eq!(back.stats.sends_ok, r.stats.sends_ok);
        assert!((back.stats.send_rate_per_s - r.stats.send_rate_per_s).abs() < 1e-9);
        assert_eq!((back.passed(), back.failed()), (5, 1));
    }
}
