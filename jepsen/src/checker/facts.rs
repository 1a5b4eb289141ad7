//! What the checks share: the history indexed once ([`Facts`]), every
//! node's drains ([`Drains`], for the lost-write and held-message checks),
//! collecting anomalies under their caps ([`Sink`]), and the limits.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::report::{Anomaly, CheckResult, MAX_ANOMALIES_PER_KIND};
use crate::history::{Call, Op, OpType, Resolution, pairs};

/// Longest detail string kept (longer ones end in "...").
pub(super) const MAX_DETAIL_CHARS: usize = 400;
/// Drains of one (key, node) an anomaly names.
pub(super) const MAX_DRAINS_NAMED: usize = 4;
/// Most history indexes listed in one anomaly.
pub(super) const MAX_OPS_PER_ANOMALY: usize = 16;
/// Distinct values (or positions) remembered per offset (or value): enough
/// to describe an anomaly, bounded so adversarial histories stay linear.
pub(super) const MAX_REMEMBERED: usize = 16;
/// How long after a fault stops its window for availability gaps extends.
pub(super) const FAULT_TAIL_NS: u64 = 10_000_000_000;
/// Kinds that are reported but do not fail their check.
pub(super) const NOT_JUDGED_KINDS: &[&str] = &["commit-index-regressed-after-power-loss", "timed-visible-early"];

pub(super) const NO_ID: usize = usize::MAX;

/// Strings (keys, groups) as small integers, borrowed from the history.
#[derive(Default)]
pub(super) struct Interner<'a> {
    pub(super) ids: HashMap<&'a str, usize>,
    pub(super) names: Vec<&'a str>,
}

impl<'a> Interner<'a> {
    pub(super) fn id(&mut self, s: &'a str) -> usize {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.names.len();
        self.ids.insert(s, id);
        self.names.push(s);
        id
    }

    pub(super) fn name(&self, id: usize) -> &'a str {
        self.names.get(id).copied().unwrap_or("?")
    }
}

/// One attempt to send a value.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempt {
    pub(super) key: usize,
    /// Position of the invocation; None for a completion without one.
    pub(super) inv: Option<usize>,
    /// Position of the completion; None when it never completed.
    pub(super) done: Option<usize>,
    /// The completion's type; None when it never completed.
    pub(super) outcome: Option<OpType>,
}

impl Attempt {
    pub(super) fn unknown(&self) -> bool {
        matches!(self.outcome, None | Some(OpType::Info | OpType::Invoke))
    }
}

/// What a held value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldKind {
    /// Due at this time of the history's clock.
    Timed {
        due: u64,
    },
    Txn,
}

/// A timed or transactional value: what it is and where it was sent (its
/// first send's key).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) kind: HeldKind,
    pub(super) key: usize,
}

/// One attempt to end a transaction: its producer's `txn-end`, or an
/// answer to a check-back.
#[derive(Debug, Clone, Copy)]
pub(super) struct End {
    pub(super) attempt: Attempt,
    pub(super) resolution: Resolution,
    pub(super) check_back: bool,
}

pub(super) struct Facts<'a> {
    pub(super) ops: &'a [Op],
    pub(super) keys: Interner<'a>,
    /// Per position: the key id, or NO_ID.
    pub(super) key: Vec<usize>,
    /// Per position: the group id (poll, assign, commit), or NO_ID.
    pub(super) group: Vec<usize>,
    /// Per completion position: its invocation's position.
    pub(super) inv_of: Vec<Option<usize>>,
    /// Per invocation position: its completion's position.
    pub(super) done_of: Vec<Option<usize>>,
    /// Every send attempt (plain, timed or transactional), by value.
    pub(super) sends: HashMap<u64, Vec<Attempt>>,
    /// Timed and transactional values, and the order they were first sent.
    pub(super) held: HashMap<u64, Held>,
    pub(super) held_order: Vec<u64>,
    /// Attempts to end each transaction, by value.
    pub(super) ends: HashMap<u64, Vec<End>>,
}

impl<'a> Facts<'a> {
    pub(super) fn new(ops: &'a [Op]) -> Facts<'a> {
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

    pub(super) fn key_name(&self, id: usize) -> &'a str {
        self.keys.name(id)
    }

    /// Every (key, offset, value) an ok operation vouches for, in history
    /// order: `visit(position, drain node if a drain, is a send, key,
    /// offset, value)`.
    pub(super) fn each_position(&self, mut visit: impl FnMut(usize, Source, usize, u64, u64)) {
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
pub(super) enum Source {
    Send,
    Poll,
    Drain(u64),
}

// ---------------------------------------------------------------------------
// Drains: every node's ok drains, shared by no-lost-writes and held-messages.

/// Every node's ok drains, indexed once for the checks that hold sends
/// against them.
pub(super) struct Drains {
    /// (key, node, offset) -> the first value a drain of the node found there.
    pub(super) at: HashMap<(usize, u64, u64), u64>,
    /// (key, node, offset, value): other values other drains of the same
    /// node found there.
    pub(super) extra: HashSet<(usize, u64, u64, u64)>,
    /// (key, node, value): every value anywhere in a node's drains of a key.
    pub(super) values: HashSet<(usize, u64, u64)>,
    /// (key, node) -> the offsets drained.
    pub(super) len: HashMap<(usize, u64), u64>,
    /// (key, node) -> its ok drains (the first few), ordered for a
    /// deterministic report.
    pub(super) drained: BTreeMap<(usize, u64), Vec<usize>>,
    /// Every node that was drained at all (ok or not): each key with an
    /// acknowledged send must have an ok drain from each of them.
    pub(super) nodes: BTreeSet<u64>,
}

impl Drains {
    pub(super) fn new(f: &Facts) -> Drains {
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
    pub(super) fn nodes_of(&self) -> BTreeMap<usize, Vec<(u64, &[usize])>> {
        let mut nodes_of: BTreeMap<usize, Vec<(u64, &[usize])>> = BTreeMap::new();
        for (&(key, node), drains) in &self.drained {
            nodes_of.entry(key).or_default().push((node, drains));
        }
        nodes_of
    }

    /// Reports each key of `keys` (key -> an operation to name) that some
    /// drained node has no ok drain of, as `kind`: its writes there are
    /// unverified.
    pub(super) fn undrained(&self, f: &Facts, sink: &mut Sink, kind: &str, keys: &BTreeMap<usize, usize>) {
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
pub(super) fn send_positions(f: &Facts, value: u64) -> Vec<usize> {
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

pub(super) struct Sink<'a> {
    pub(super) ops: &'a [Op],
    pub(super) anomalies: Vec<Anomaly>,
    pub(super) counts: BTreeMap<String, u64>,
}

impl<'a> Sink<'a> {
    pub(super) fn new(ops: &'a [Op]) -> Sink<'a> {
        Sink {
            ops,
            anomalies: Vec::new(),
            counts: BTreeMap::new(),
        }
    }

    /// Counts one anomaly; `make` (detail, positions of the ops involved)
    /// runs only when it is kept.
    pub(super) fn add(&mut self, kind: &str, make: impl FnOnce() -> (String, Vec<usize>)) {
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

    pub(super) fn count(&self, kind: &str) -> u64 {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    pub(super) fn finish(self, name: &str, description: String) -> CheckResult {
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

pub(super) fn clip(mut s: String) -> String {
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

pub(super) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
