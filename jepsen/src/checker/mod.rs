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
//!    answered by
//!    [`check_back_answer`](crate::history::check_back_answer). What each
//!    may have ended as:
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
//!
//! Module map: one file per check, named for it, and here what they share.
//!
//! - [`unique_offsets`](mod@unique_offsets): 1, `unique-offsets`.
//! - [`lost_writes`](mod@lost_writes): 2, `no-lost-writes`.
//! - [`duplicates`](mod@duplicates): 3, `duplicates`.
//! - [`monotonic`](mod@monotonic): 4, `monotonic-consumers`.
//! - [`replicas`](mod@replicas): 5, `replicas`.
//! - [`held`](mod@held): 6, `held-messages`.
//! - [`availability`](mod@availability): 7, `availability`, with its
//!   latency percentiles and gap windows.
//! - this module: the public types, [`check`], [`summary`], the limits,
//!   the history indexed once ([`Facts`]), every node's drains
//!   ([`Drains`], for checks 2 and 6) and collecting anomalies ([`Sink`]).
//! - `test_support` (tests only): the history builders and assertions the
//!   checks' tests share.

mod availability;
mod duplicates;
mod held;
mod lost_writes;
mod monotonic;
mod replicas;
#[cfg(test)]
mod test_support;
mod unique_offsets;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::history::{Call, Op, OpType, Resolution, pairs};
use crate::observations::{CommitSample, ReplicaLog};
use availability::availability;
use duplicates::duplicates;
use held::held_messages;
use lost_writes::no_lost_writes;
use monotonic::monotonic_consumers;
use replicas::replicas;
use unique_offsets::unique_offsets;

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
// Drains: every node's ok drains, shared by no-lost-writes and held-messages.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::test_support::*;
    use crate::history::{NEMESIS, NemesisAction};

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
