//! history.edn: the history in the shapes of Jepsen's Kafka workload
//! (`jepsen.tests.kafka`), one operation map per line, so that Jepsen's own
//! checker (`jepsen.tests.kafka/checker`) can re-check a raftmq run.
//!
//! Every line is a map starting `{:index i, :time ns, :type t, :process p,
//! :f f, :value v` (`:type` is `:invoke`, `:ok`, `:fail` or `:info`; a client
//! `:process` is its number), followed by fields Jepsen ignores but that keep
//! what our history knows (`:node`, `:error`, ...). The mapping:
//!
//! | ours | Jepsen |
//! |---|---|
//! | `send` | `:f :send`, `:value [[:send "k" v]]`; an ok completion `[[:send "k" [offset v]]]` (`[nil v]` if no offset came back) |
//! | `poll` | `:f :poll`, `:value [[:poll]]`; an ok completion `[[:poll {"k" [[offset v] ...]}]]`, or `[[:poll {}]]` when nothing was read (a Kafka poll lists only partitions that returned records); plus `:key`, `:group`, `:from` |
//! | `assign` | `:f :assign`, `:value ["k"]`; plus `:group`, and `:committed` (the offset it starts at) when one was |
//! | `commit` | `:f :commit`, `:value {"k" offset}`, plus `:group` (Jepsen commits inside its polls and ignores this `:f`) |
//! | `drain` | `:f :poll` like a poll, plus `:drain true`, `:key` and `:client` (our process); see below |
//! | `timed-send` | `:f :send` like a send (never with an offset), plus `:due` (ns, the history's clock) |
//! | `txn-send`, `txn-end`, `txn-check` | `:f :txn-send` ..., `:value {:key "k", :value v}` plus `:resolution` and `:transaction-id` where known |
//! | `settle` | `:f :settle`, `:value nil` |
//! | `nemesis` | `{:type :info, :process :nemesis, :f :start-<fault>, :value "detail"}` (`:stop-<fault>`); Jepsen logs nemesis operations as `:info`, so any other outcome is kept in `:outcome` |
//!
//! A drain reads a whole queue from offset 0, after a test's faults healed:
//! Jepsen's final polls, which crash their client first so that a fresh
//! process polls from the beginning. Each drain therefore gets a fresh
//! process number (above every client's), so that Jepsen's per-process
//! checks (`:nonmonotonic-poll`, `:poll-skip`) don't see it go back to
//! offset 0 after the same process's earlier polls. The process number in
//! our history stays in `:client`.
//!
//! Three differences remain. Jepsen's Kafka transactions commit or abort
//! in one operation; ours end in a second one, or through the broker's
//! check-back, so their operations keep their own `:f`, which Jepsen's
//! checker does not analyse: to it a committed transactional value is one
//! it never saw sent (our checker's `held-messages` check judges them).
//! Jepsen calls keys integers; ours are strings,
//! which its analysis handles as opaque map keys. And our `assign` restarts
//! a consumer at its group's committed offset, where Jepsen expects a
//! re-assigned key to keep its position; a process that re-assigns a key and
//! re-reads from the committed offset may be flagged `:nonmonotonic-poll` by
//! Jepsen, although raftmq promises only at-least-once delivery there.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use crate::history::{Call, NemesisAction, Op, OpType, Process, Resolution};

/// Writes `ops` to `path` as EDN, one operation map per line.
pub fn write_edn(path: &Path, ops: &[Op]) -> io::Result<()> {
    let mut w = io::BufWriter::new(std::fs::File::create(path)?);
    for line in edn_lines(ops) {
        w.write_all(line.as_bytes())?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

/// The EDN maps of `ops`, one per operation.
fn edn_lines(ops: &[Op]) -> Vec<String> {
    // Drains get process numbers no client has: one per drain, shared by its
    // invocation and completion.
    let mut next_fresh = ops
        .iter()
        .filter_map(|op| match op.process {
            Process::Client(p) => Some(p),
            Process::Nemesis(_) => None,
        })
        .max()
        .map_or(0, |p| p.saturating_add(1));
    let mut open_drains: HashMap<Process, u64> = HashMap::new();
    ops.iter()
        .map(|op| {
            let process = match (&op.call, op.process) {
                (Call::Drain { .. }, Process::Client(_)) => {
                    let fresh = if op.is_invoke() {
                        None
                    } else {
                        open_drains.remove(&op.process)
                    };
                    let fresh = fresh.unwrap_or_else(|| {
                        let p = next_fresh;
                        next_fresh = next_fresh.saturating_add(1);
                        p
                    });
                    if op.is_invoke() {
                        open_drains.insert(op.process, fresh);
                    }
                    Some(fresh)
                }
                _ => None,
            };
            op_edn(op, process)
        })
        .collect()
}

/// One operation as an EDN map; `process` overrides the process number
/// (for drains).
fn op_edn(op: &Op, process: Option<u64>) -> String {
    let mut s = String::with_capacity(128);
    let is_nemesis = matches!(op.call, Call::Nemesis { .. });
    // Jepsen records every nemesis operation as :info.
    let kind = if is_nemesis { "info" } else { kind_name(op.kind) };
    let proc_text = match (process, op.process) {
        (Some(p), _) | (None, Process::Client(p)) => p.to_string(),
        (None, Process::Nemesis(_)) => ":nemesis".to_string(),
    };
    let _ = write!(
        s,
        "{{:index {}, :time {}, :type :{kind}, :process {proc_text}",
        op.index, op.time
    );
    let ok = op.kind == OpType::Ok;
    match &op.call {
        Call::Send { key, value, offset } => push_send(&mut s, key, *value, *offset, ok),
        Call::TimedSend { key, value, due } => {
            push_send(&mut s, key, *value, None, ok);
            let _ = write!(s, ", :due {due}");
        }
        Call::TxnSend {
            key,
            value,
            transaction_id,
        } => {
            push_held(&mut s, "txn-send", key, *value);
            if let Some(t) = transaction_id {
                s.push_str(", :transaction-id ");
                push_str(&mut s, t);
            }
        }
        Call::TxnEnd {
            key,
            value,
            resolution,
            transaction_id,
        }
        | Call::TxnCheck {
            key,
            value,
            resolution,
            transaction_id,
        } => {
            push_held(&mut s, op.f(), key, *value);
            let r = match resolution {
                Resolution::Commit => "commit",
                Resolution::Rollback => "rollback",
            };
            let _ = write!(s, ", :resolution :{r}, :transaction-id ");
            push_str(&mut s, transaction_id);
        }
        Call::Settle {} => s.push_str(", :f :settle, :value nil"),
        Call::Poll { key, group, from, msgs } => {
            s.push_str(", :f :poll, :value ");
            push_poll_value(&mut s, key, msgs, ok);
            s.push_str(", :key ");
            push_str(&mut s, key);
            s.push_str(", :group ");
            push_str(&mut s, group);
            let _ = write!(s, ", :from {from}");
        }
        Call::Assign { key, group, offset } => {
            s.push_str(", :f :assign, :value [");
            push_str(&mut s, key);
            s.push_str("], :group ");
            push_str(&mut s, group);
            if let Some(o) = offset {
                let _ = write!(s, ", :committed {o}");
            }
        }
        Call::Commit { key, group, offset } => {
            s.push_str(", :f :commit, :value {");
            push_str(&mut s, key);
            let _ = write!(s, " {offset}}}, :group ");
            push_str(&mut s, group);
        }
        Call::Drain { key, node: _, msgs } => {
            s.push_str(", :f :poll, :value ");
            push_poll_value(&mut s, key, msgs, ok);
            s.push_str(", :drain true, :key ");
            push_str(&mut s, key);
            if let (Some(_), Process::Client(p)) = (process, op.process) {
                let _ = write!(s, ", :client {p}");
            }
        }
        Call::Nemesis { action, fault, detail } => {
            let verb = match action {
                NemesisAction::Start => "start",
                NemesisAction::Stop => "stop",
            };
            let _ = write!(s, ", :f :{verb}");
            let name = keyword_name(fault);
            if !name.is_empty() {
                let _ = write!(s, "-{name}");
            }
            s.push_str(", :value ");
            if detail.is_empty() {
                s.push_str("nil");
            } else {
                push_str(&mut s, detail);
            }
            // Keep the outcome Jepsen's :info hides.
            if op.kind != OpType::Info {
                let _ = write!(s, ", :outcome :{}", kind_name(op.kind));
            }
        }
    }
    // A drain names its node in its call; other operations in `node`.
    let node = match &op.call {
        Call::Drain { node, .. } => Some(*node),
        _ => op.node,
    };
    if let Some(n) = node {
        let _ = write!(s, ", :node {n}");
    }
    if let Some(e) = &op.error {
        s.push_str(", :error ");
        push_str(&mut s, e);
    }
    s.push('}');
    s
}

/// A send's `:f` and `:value`: `[[:send "k" v]]`, or once acknowledged
/// `[[:send "k" [offset v]]]` (`nil` for an offset that did not come back).
fn push_send(s: &mut String, key: &str, value: u64, offset: Option<u64>, ok: bool) {
    s.push_str(", :f :send, :value [[:send ");
    push_str(s, key);
    match (offset, ok) {
        (Some(o), _) => {
            let _ = write!(s, " [{o} {value}]]]");
        }
        (None, true) => {
            let _ = write!(s, " [nil {value}]]]");
        }
        (None, false) => {
            let _ = write!(s, " {value}]]");
        }
    }
}

/// A transactional operation's `:f` and `:value`.
fn push_held(s: &mut String, f: &str, key: &str, value: u64) {
    let _ = write!(s, ", :f :{f}, :value {{:key ");
    push_str(s, key);
    let _ = write!(s, ", :value {value}}}");
}

fn kind_name(kind: OpType) -> &'static str {
    match kind {
        OpType::Invoke => "invoke",
        OpType::Ok => "ok",
        OpType::Fail => "fail",
        OpType::Info => "info",
    }
}

/// A poll's `:value`: `[[:poll]]` unless it completed ok.
fn push_poll_value(s: &mut String, key: &str, msgs: &[(u64, u64)], ok: bool) {
    if !ok {
        s.push_str("[[:poll]]");
        return;
    }
    if msgs.is_empty() {
        s.push_str("[[:poll {}]]");
        return;
    }
    s.push_str("[[:poll {");
    push_str(s, key);
    s.push_str(" [");
    for (i, (o, v)) in msgs.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "[{o} {v}]");
    }
    s.push_str("]}]]");
}

/// Appends `text` as an EDN string literal.
fn push_str(s: &mut String, text: &str) {
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if c.is_control() => {
                // Other control characters as \uXXXX, which EDN readers
                // (Clojure's included) accept; one or two UTF-16 units.
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(s, "\\u{unit:04x}");
                }
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

/// A fault name as the tail of a keyword: characters a keyword can't hold
/// become `-`.
fn keyword_name(fault: &str) -> String {
    fault
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "*+!-_?.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::NEMESIS;

    fn op(index: u64, process: Process, kind: OpType, call: Call) -> Op {
        Op {
            index,
            time: index * 10,
            process,
            kind,
            call,
            node: None,
            error: None,
        }
    }

    #[test]
    fn edn_has_jepsen_kafka_shapes() {
        let c = Process::Client;
        let send = |offset| Call::Send {
            key: "k0".into(),
            value: 17,
            offset,
        };
        let poll = |msgs| Call::Poll {
            key: "k0".into(),
            group: "g0".into(),
            from: 4,
            msgs,
        };
        let drain = |msgs| Call::Drain {
            key: "k0".into(),
            node: 2,
            msgs,
        };
        let nemesis = |action| Call::Nemesis {
            action,
            fault: "partition".into(),
            detail: "n1 | n2 \"n3\"".into(),
        };
        let mut ops = vec![
            op(0, c(3), OpType::Invoke, send(None)),
            op(1, NEMESIS, OpType::Ok, nemesis(NemesisAction::Start)),
            op(2, c(3), OpType::Ok, send(Some(5))),
            op(3, c(1), OpType::Invoke, poll(vec![])),
            op(4, c(1), OpType::Ok, poll(vec![(4, 17), (5, 18)])),
            op(5, c(1), OpType::Invoke, poll(vec![])),
            op(6, c(1), OpType::Ok, poll(vec![])),
            op(7, c(2), OpType::Invoke, send(None)),
            op(8, c(2), OpType::Info, send(None)),
            op(
                9,
                c(4),
                OpType::Invoke,
                Call::Assign {
                    key: "k0".into(),
                    group: "g0".into(),
                    offset: None,
                },
            ),
            op(
                10,
                c(4),
                OpType::Ok,
                Call::Assign {
                    key: "k0".into(),
                    group: "g0".into(),
                    offset: Some(12),
                },
            ),
            op(
                11,
                c(4),
                OpType::Invoke,
                Call::Commit {
                    key: "k0".into(),
                    group: "g0".into(),
                    offset: 12,
                },
            ),
            op(12, NEMESIS, OpType::Info, nemesis(NemesisAction::Stop)),
            op(13, c(1), OpType::Invoke, drain(vec![])),
            op(14, c(1), OpType::Ok, drain(vec![(0, 16), (1, 17)])),
        ];
        ops[2].node = Some(2);
        ops[8].error = Some("timed out\n<after 5s>".into());
        let dir = std::env::temp_dir().join(format!("raftmq-jepsen-edn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.edn");
        write_edn(&path, &ops).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let want = [
            r#"{:index 0, :time 0, :type :invoke, :process 3, :f :send, :value [[:send "k0" 17]]}"#,
            r#"{:index 1, :time 10, :type :info, :process :nemesis, :f :start-partition, :value "n1 | n2 \"n3\"", :outcome :ok}"#,
            r#"{:index 2, :time 20, :type :ok, :process 3, :f :send, :value [[:send "k0" [5 17]]], :node 2}"#,
            r#"{:index 3, :time 30, :type :invoke, :process 1, :f :poll, :value [[:poll]], :key "k0", :group "g0", :from 4}"#,
            r#"{:index 4, :time 40, :type :ok, :process 1, :f :poll, :value [[:poll {"k0" [[4 17] [5 18]]}]], :key "k0", :group "g0", :from 4}"#,
            r#"{:index 5, :time 50, :type :invoke, :process 1, :f :poll, :value [[:poll]], :key "k0", :group "g0", :from 4}"#,
            r#"{:index 6, :time 60, :type :ok, :process 1, :f :poll, :value [[:poll {}]], :key "k0", :group "g0", :from 4}"#,
            r#"{:index 7, :time 70, :type :invoke, :process 2, :f :send, :value [[:send "k0" 17]]}"#,
            r#"{:index 8, :time 80, :type :info, :process 2, :f :send, :value [[:send "k0" 17]], :error "timed out\n<after 5s>"}"#,
            r#"{:index 9, :time 90, :type :invoke, :process 4, :f :assign, :value ["k0"], :group "g0"}"#,
            r#"{:index 10, :time 100, :type :ok, :process 4, :f :assign, :value ["k0"], :group "g0", :committed 12}"#,
            r#"{:index 11, :time 110, :type :invoke, :process 4, :f :commit, :value {"k0" 12}, :group "g0"}"#,
            r#"{:index 12, :time 120, :type :info, :process :nemesis, :f :stop-partition, :value "n1 | n2 \"n3\""}"#,
            r#"{:index 13, :time 130, :type :invoke, :process 5, :f :poll, :value [[:poll]], :drain true, :key "k0", :client 1, :node 2}"#,
            r#"{:index 14, :time 140, :type :ok, :process 5, :f :poll, :value [[:poll {"k0" [[0 16] [1 17]]}]], :drain true, :key "k0", :client 1, :node 2}"#,
        ];
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got, want);
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn held_operations_keep_their_own_shapes() {
        let c = Process::Client;
        let timed = Call::TimedSend {
            key: "h".into(),
            value: 7,
            due: 900,
        };
        let txn = |transaction_id| Call::TxnSend {
            key: "h".into(),
            value: 8,
            transaction_id,
        };
        let ops = vec![
            op(0, c(1), OpType::Invoke, timed.clone()),
            op(1, c(1), OpType::Ok, timed),
            op(2, c(1), OpType::Invoke, txn(None)),
            op(3, c(1), OpType::Ok, txn(Some("x1.4.0".into()))),
            op(
                4,
                c(1),
                OpType::Invoke,
                Call::TxnEnd {
                    key: "h".into(),
                    value: 8,
                    resolution: Resolution::Rollback,
                    transaction_id: "x1.4.0".into(),
                },
            ),
            op(
                5,
                c(2_000_000),
                OpType::Fail,
                Call::TxnCheck {
                    key: "h".into(),
                    value: 8,
                    resolution: Resolution::Rollback,
                    transaction_id: "x1.4.0".into(),
                },
            ),
            op(6, c(3_000_000), OpType::Ok, Call::Settle {}),
        ];
        let want = [
            r#"{:index 0, :time 0, :type :invoke, :process 1, :f :send, :value [[:send "h" 7]], :due 900}"#,
            r#"{:index 1, :time 10, :type :ok, :process 1, :f :send, :value [[:send "h" [nil 7]]], :due 900}"#,
            r#"{:index 2, :time 20, :type :invoke, :process 1, :f :txn-send, :value {:key "h", :value 8}}"#,
            r#"{:index 3, :time 30, :type :ok, :process 1, :f :txn-send, :value {:key "h", :value 8}, :transaction-id "x1.4.0"}"#,
            r#"{:index 4, :time 40, :type :invoke, :process 1, :f :txn-end, :value {:key "h", :value 8}, :resolution :rollback, :transaction-id "x1.4.0"}"#,
            r#"{:index 5, :time 50, :type :fail, :process 2000000, :f :txn-check, :value {:key "h", :value 8}, :resolution :rollback, :transaction-id "x1.4.0"}"#,
            r#"{:index 6, :time 60, :type :ok, :process 3000000, :f :settle, :value nil}"#,
        ];
        assert_eq!(edn_lines(&ops), want);
    }

    #[test]
    fn strings_and_fault_names_are_escaped() {
        let mut s = String::new();
        push_str(&mut s, "a\"b\\c\u{1}é");
        assert_eq!(s, r#""a\"b\\c\u0001é""#);
        assert_eq!(keyword_name("clock skew/2"), "clock-skew-2");
    }

    #[test]
    fn each_drain_gets_its_own_process() {
        let drain = || Call::Drain {
            key: "k".into(),
            node: 1,
            msgs: vec![],
        };
        let ops = vec![
            op(0, Process::Client(0), OpType::Invoke, drain()),
            op(1, Process::Client(1), OpType::Invoke, drain()),
            op(2, Process::Client(0), OpType::Ok, drain()),
            op(3, Process::Client(1), OpType::Fail, drain()),
            op(4, Process::Client(0), OpType::Invoke, drain()),
        ];
        let procs: Vec<String> = edn_lines(&ops)
            .iter()
            .map(|l| l.split(", ").nth(3).unwrap().to_string())
            .collect();
        assert_eq!(
            procs,
            [":process 2", ":process 3", ":process 2", ":process 3", ":process 4"]
        );
    }
}
