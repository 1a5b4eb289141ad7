//! The history: every operation of a test as an invocation and a completion.
//!
//! `history.jsonl` holds one [`Op`] per line, in the order the harness saw
//! them (`index` counts from 0). An invocation (`"type": "invoke"`) is
//! followed, later, by exactly one completion of the same process: `ok`
//! (it happened), `fail` (it certainly did not happen) or `info` (unknown,
//! such as a timeout; the process is then retired and never used again).
//! `time` is nanoseconds on a monotonic clock since the test started.
//!
//! The operations (`"f"`), their fields, and what a completion adds:
//!
//! | `f` | invocation | `ok` completion adds |
//! |---|---|---|
//! | `send` | `key`, `value` | `offset`: where the value landed |
//! | `poll` | `key`, `group`, `from` (queue offset asked for) | `msgs`: `[[offset, value], ...]` |
//! | `assign` | `key`, `group`: a consumer takes a key and starts at the group's committed offset | `offset` (absent: none committed, start at 0) |
//! | `commit` | `key`, `group`, `offset`: the group's next offset to read | nothing |
//! | `drain` | `key`, `node`: after healing, read the whole queue from one node | `msgs` |
//! | `timed-send` | `key`, `value`, `due`: visible from `due` on (the history's clock, ns) | nothing (no queue offset yet) |
//! | `txn-send` | `key`, `value`: a transactional (half) message | `transaction_id` |
//! | `txn-end` | `key`, `value`, `resolution` (`commit` or `rollback`), `transaction_id`: the producer ends it | nothing |
//! | `txn-check` | the same: the harness's answer to a broker's check-back | nothing |
//! | `settle` | after healing, wait until no node holds a timed or half message | nothing |
//! | `nemesis` | `action` (`start` or `stop`), `fault`, `detail` | nothing |
//!
//! A key is a topic with one queue, so a send's key is known without the
//! queue the broker picks. Values are unique integers across the test, held
//! (timed and transactional) ones included. A `txn-send` not followed by a
//! `txn-end` of its process was left for the broker's check-back, which the
//! harness answers by [`check_back_answer`].
//!
//! Nemesis operations have the process `"nemesis"`; clients have numbers:
//! worker slots count from 0, the harness's own processes are numbered
//! from [`DRAIN_PROCESS`], [`CHECK_PROCESS`] and [`SETTLE_PROCESS`].

use std::io::{self, BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Who performed an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Process {
    Client(u64),
    Nemesis(NemesisTag),
}

/// The one non-client process; serialized as the string `"nemesis"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NemesisTag {
    Nemesis,
}

pub const NEMESIS: Process = Process::Nemesis(NemesisTag::Nemesis);
/// The final drains: one process per node, from here.
pub const DRAIN_PROCESS: u64 = 1_000_000;
/// Check-back answers: one process per node's producer session, from here
/// (a session whose answer had an unknown outcome goes on as `+ nodes`).
pub const CHECK_PROCESS: u64 = 2_000_000;
/// The wait for held messages before the drain.
pub const SETTLE_PROCESS: u64 = 3_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// How a transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    Commit,
    Rollback,
}

/// The harness's answer to a check-back of the transaction of `value`:
/// fixed by the value, so the checker knows how every transaction left to
/// the check-back must end.
pub fn check_back_answer(value: u64) -> Resolution {
    if value % 2 == 1 {
        Resolution::Commit
    } else {
        Resolution::Rollback
    }
}

/// What was done, with the fields the invocation and the completion carry
/// (see the table in the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "kebab-case")]
pub enum Call {
    Send {
        key: String,
        value: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    Poll {
        key: String,
        group: String,
        from: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        msgs: Vec<(u64, u64)>,
    },
    Assign {
        key: String,
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    Commit {
        key: String,
        group: String,
        offset: u64,
    },
    Drain {
        key: String,
        /// The node drained; named apart from [`Op::node`], which shares
        /// the same JSON object (a duplicate field would not read back).
        #[serde(rename = "drain_node")]
        node: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        msgs: Vec<(u64, u64)>,
    },
    TimedSend {
        key: String,
        value: u64,
        due: u64,
    },
    TxnSend {
        key: String,
        value: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        transaction_id: Option<String>,
    },
    TxnEnd {
        key: String,
        value: u64,
        resolution: Resolution,
        transaction_id: String,
    },
    TxnCheck {
        key: String,
        value: u64,
        resolution: Resolution,
        transaction_id: String,
    },
    Settle {},
    Nemesis {
        action: NemesisAction,
        fault: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NemesisAction {
    Start,
    Stop,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub index: u64,
    /// Nanoseconds since the test started (monotonic).
    pub time: u64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: OpType,
    #[serde(flatten)]
    pub call: Call,
    /// The node a client operation was sent to (1-based), when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// Why an operation failed or is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    pub fn is_invoke(&self) -> bool {
        self.kind == OpType::Invoke
    }

    /// The key of a client operation.
    pub fn key(&self) -> Option<&str> {
        match &self.call {
            Call::Send { key, .. }
            | Call::Poll { key, .. }
            | Call::Assign { key, .. }
            | Call::Commit { key, .. }
            | Call::Drain { key, .. }
            | Call::TimedSend { key, .. }
            | Call::TxnSend { key, .. }
            | Call::TxnEnd { key, .. }
            | Call::TxnCheck { key, .. } => Some(key),
            Call::Settle {} | Call::Nemesis { .. } => None,
        }
    }

    /// The name of the operation (`send`, `poll`, ...).
    pub fn f(&self) -> &'static str {
        match &self.call {
            Call::Send { .. } => "send",
            Call::Poll { .. } => "poll",
            Call::Assign { .. } => "assign",
            Call::Commit { .. } => "commit",
            Call::Drain { .. } => "drain",
            Call::TimedSend { .. } => "timed-send",
            Call::TxnSend { .. } => "txn-send",
            Call::TxnEnd { .. } => "txn-end",
            Call::TxnCheck { .. } => "txn-check",
            Call::Settle {} => "settle",
            Call::Nemesis { .. } => "nemesis",
        }
    }
}

/// Pairs each completion with its invocation: `(invoke index, completion
/// index)` in completion order. An invocation without a completion (the
/// test ended first) is paired with nothing and left out.
pub fn pairs(ops: &[Op]) -> Vec<(usize, usize)> {
    let mut open: std::collections::HashMap<Process, usize> = Default::default();
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if op.is_invoke() {
            open.insert(op.process, i);
        } else if let Some(inv) = open.remove(&op.process) {
            out.push((inv, i));
        }
    }
    out
}

/// Writes the history as JSON lines.
pub fn write_jsonl(path: &Path, ops: &[Op]) -> io::Result<()> {
    let mut w = io::BufWriter::new(std::fs::File::create(path)?);
    for op in ops {
        serde_json::to_writer(&mut w, op)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

/// Reads a history written by [`write_jsonl`]; a bad line is an error that
/// names its line number.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Op>> {
    let f = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
    let mut ops = Vec::new();
    for (n, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let op: Op =
            serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), n + 1))?;
        ops.push(op);
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_through_json() {
        let ops = vec![
            Op {
                index: 0,
                time: 5,
                process: Process::Client(3),
                kind: OpType::Invoke,
                call: Call::Send {
                    key: "k0".into(),
                    value: 17,
                    offset: None,
                },
                node: Some(2),
                error: None,
            },
            Op {
                index: 1,
                time: 9,
                process: NEMESIS,
                kind: OpType::Ok,
                call: Call::Nemesis {
                    action: NemesisAction::Start,
                    fault: "kill".into(),
                    detail: "node 1".into(),
                },
                node: None,
                error: None,
            },
            Op {
                index: 2,
                time: 11,
                process: Process::Client(3),
                kind: OpType::Ok,
                call: Call::Poll {
                    key: "k0".into(),
                    group: "g0".into(),
                    from: 4,
                    msgs: vec![(4, 17), (5, 18)],
                },
                node: Some(1),
                error: None,
            },
        ];
        let mut ops = ops;
        // A drain names its node, and the op the node it was sent to.
        ops.push(Op {
            index: 3,
            time: 12,
            process: Process::Client(DRAIN_PROCESS),
            kind: OpType::Ok,
            call: Call::Drain {
                key: "k0".into(),
                node: 2,
                msgs: vec![(0, 1)],
            },
            node: Some(2),
            error: None,
        });
        let held = [
            Call::TimedSend {
                key: "h0".into(),
                value: 18,
                due: 2_000_000_000,
            },
            Call::TxnSend {
                key: "h0".into(),
                value: 19,
                transaction_id: Some("x1.7.0".into()),
            },
            Call::TxnEnd {
                key: "h0".into(),
                value: 19,
                resolution: Resolution::Rollback,
                transaction_id: "x1.7.0".into(),
            },
            Call::TxnCheck {
                key: "h0".into(),
                value: 21,
                resolution: check_back_answer(21),
                transaction_id: "x1.9.0".into(),
            },
            Call::Settle {},
        ];
        for call in held {
            ops.push(Op {
                index: ops.len() as u64,
                time: 20,
                process: Process::Client(CHECK_PROCESS),
                kind: OpType::Ok,
                call,
                node: None,
                error: None,
            });
        }
        let dir = std::env::temp_dir().join(format!("raftmq-jepsen-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        write_jsonl(&path, &ops).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""process":"nemesis""#), "{text}");
        assert!(text.contains(r#""f":"poll""#), "{text}");
        assert!(text.contains(r#""f":"timed-send""#), "{text}");
        assert!(text.contains(r#""resolution":"commit""#), "{text}");
        assert!(
            text.contains(r#"{"index":8,"time":20,"process":2000000,"type":"ok","f":"settle"}"#),
            "{text}"
        );
        assert_eq!(read_jsonl(&path).unwrap(), ops);
        std::fs::write(&path, "{\"index\": 0}\n").unwrap();
        let err = read_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_pair_with_their_invocations() {
        let op = |index, process, kind| Op {
            index,
            time: index,
            process: Process::Client(process),
            kind,
            call: Call::Commit {
                key: "k".into(),
                group: "g".into(),
                offset: 1,
            },
            node: None,
            error: None,
        };
        let ops = vec![
            op(0, 1, OpType::Invoke),
            op(1, 2, OpType::Invoke),
            op(2, 2, OpType::Ok),
            op(3, 1, OpType::Info),
            op(4, 3, OpType::Invoke),
        ];
        assert_eq!(pairs(&ops), vec![(1, 2), (0, 3)]);
    }
}
