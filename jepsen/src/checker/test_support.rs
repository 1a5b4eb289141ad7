//! History builders and assertions shared by the checks' tests.

use super::check;
use super::report::{Anomaly, CheckResult, Inputs, Results, summary};
use crate::history::{CHECK_PROCESS, Call, NEMESIS, NemesisAction, Op, OpType, Process, Resolution, SETTLE_PROCESS};
use crate::observations::{CommitSample, LogRecord, ReplicaLog};

pub(super) const MS: u64 = 1_000_000;

/// Builds histories one operation at a time, 1 ms apart.
#[derive(Default)]
pub(super) struct H {
    pub(super) ops: Vec<Op>,
    time: u64,
}

impl H {
    pub(super) fn push(&mut self, process: Process, kind: OpType, call: Call) -> u64 {
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

    pub(super) fn wait(&mut self, ms: u64) {
        self.time += ms * MS;
    }

    pub(super) fn invoke(&mut self, p: u64, call: Call) -> u64 {
        self.push(Process::Client(p), OpType::Invoke, call)
    }

    pub(super) fn done(&mut self, p: u64, kind: OpType, call: Call) -> u64 {
        self.push(Process::Client(p), kind, call)
    }

    /// A send and its completion; `offset` only on ok.
    pub(super) fn send(&mut self, p: u64, key: &str, value: u64, kind: OpType, offset: Option<u64>) -> (u64, u64) {
        let i = self.invoke(p, send(key, value, None));
        let c = self.done(
            p,
            kind,
            send(key, value, if kind == OpType::Ok { offset } else { None }),
        );
        (i, c)
    }

    pub(super) fn ok_send(&mut self, p: u64, key: &str, value: u64, offset: u64) -> u64 {
        self.send(p, key, value, OpType::Ok, Some(offset)).1
    }

    pub(super) fn assign(&mut self, p: u64, key: &str, group: &str, kind: OpType, offset: Option<u64>) -> (u64, u64) {
        let i = self.invoke(p, assign(key, group, None));
        let c = self.done(p, kind, assign(key, group, offset));
        (i, c)
    }

    pub(super) fn poll(&mut self, p: u64, key: &str, group: &str, from: u64, msgs: &[(u64, u64)]) -> u64 {
        self.invoke(p, poll(key, group, from, &[]));
        self.done(p, OpType::Ok, poll(key, group, from, msgs))
    }

    pub(super) fn commit(&mut self, p: u64, key: &str, group: &str, offset: u64, kind: OpType) -> u64 {
        let c = Call::Commit {
            key: key.into(),
            group: group.into(),
            offset,
        };
        self.invoke(p, c.clone());
        self.done(p, kind, c)
    }

    pub(super) fn drain(&mut self, p: u64, key: &str, node: u64, msgs: &[(u64, u64)]) -> u64 {
        self.invoke(p, drain(key, node, &[]));
        self.done(p, OpType::Ok, drain(key, node, msgs))
    }

    /// A timed send due `due_ms` into the history, and its completion.
    pub(super) fn timed(&mut self, p: u64, key: &str, value: u64, due_ms: u64, kind: OpType) -> u64 {
        let call = Call::TimedSend {
            key: key.into(),
            value,
            due: due_ms * MS,
        };
        self.invoke(p, call.clone());
        self.done(p, kind, call)
    }

    /// A transactional send and its completion.
    pub(super) fn txn(&mut self, p: u64, key: &str, value: u64, kind: OpType) -> u64 {
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
    pub(super) fn end(&mut self, p: u64, key: &str, value: u64, resolution: Resolution, kind: OpType) -> u64 {
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

    pub(super) fn settle(&mut self, kind: OpType) -> u64 {
        self.invoke(SETTLE_PROCESS, Call::Settle {});
        self.done(SETTLE_PROCESS, kind, Call::Settle {})
    }

    pub(super) fn nemesis(&mut self, action: NemesisAction, fault: &str) -> u64 {
        let call = Call::Nemesis {
            action,
            fault: fault.into(),
            detail: format!("{fault} node 1"),
        };
        self.push(NEMESIS, OpType::Ok, call)
    }

    pub(super) fn check(&self) -> Results {
        check(&Inputs {
            ops: &self.ops,
            ..Default::default()
        })
    }
}

pub(super) fn send(key: &str, value: u64, offset: Option<u64>) -> Call {
    Call::Send {
        key: key.into(),
        value,
        offset,
    }
}

pub(super) fn assign(key: &str, group: &str, offset: Option<u64>) -> Call {
    Call::Assign {
        key: key.into(),
        group: group.into(),
        offset,
    }
}

pub(super) fn poll(key: &str, group: &str, from: u64, msgs: &[(u64, u64)]) -> Call {
    Call::Poll {
        key: key.into(),
        group: group.into(),
        from,
        msgs: msgs.to_vec(),
    }
}

pub(super) fn drain(key: &str, node: u64, msgs: &[(u64, u64)]) -> Call {
    Call::Drain {
        key: key.into(),
        node,
        msgs: msgs.to_vec(),
    }
}

/// Drains `msgs` of `key` from nodes 1 to 3.
pub(super) fn drain_all(h: &mut H, key: &str, msgs: &[(u64, u64)]) {
    for node in 1..=3 {
        h.drain(100 + node, key, node, msgs);
    }
}

pub(super) fn result<'r>(r: &'r Results, name: &str) -> &'r CheckResult {
    r.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

pub(super) fn count(r: &Results, name: &str, kind: &str) -> u64 {
    result(r, name).counts.get(kind).copied().unwrap_or(0)
}

pub(super) fn anomaly<'r>(r: &'r Results, name: &str, kind: &str) -> &'r Anomaly {
    result(r, name)
        .anomalies
        .iter()
        .find(|a| a.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in {name}: {:#?}", result(r, name)))
}

/// Asserts that exactly the named check failed, and only with `kind`.
pub(super) fn only_failure(r: &Results, name: &str, kind: &str) {
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

pub(super) fn replica(node: u64, committed: Option<u64>, records: &[(u64, u64, u32)]) -> ReplicaLog {
    ReplicaLog {
        node,
        committed,
        records: records
            .iter()
            .map(|&(index, term, crc)| LogRecord { index, term, crc })
            .collect(),
    }
}

pub(super) fn sample(time_ms: u64, node: u64, incarnation: u32, commit_index: u64) -> CommitSample {
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
pub(super) fn clean() -> H {
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
