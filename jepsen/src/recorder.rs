//! Records operations into the history as they happen, shared by every
//! client task, the check-back producers and the nemesis.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::client::Outcome;
use crate::history::{Call, Op, OpType, Process};

#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Nanoseconds since the test started: the history's clock.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn record(&self, process: Process, kind: OpType, call: Call, node: Option<u64>, error: Option<String>) {
        let mut ops = self.ops.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Taken under the lock, so times never decrease along the history.
        let time = self.now();
        let index = ops.len() as u64;
        ops.push(Op {
            index,
            time,
            process,
            kind,
            call,
            node,
            error,
        });
    }

    /// Records the completion of an operation with effects; true when its
    /// outcome is unknown (the process must retire).
    pub fn complete<T>(&self, p: Process, node: u64, out: Outcome<T>, ok: impl FnOnce(T) -> Call, plain: Call) -> bool {
        match out {
            Outcome::Ok(v) => {
                self.record(p, OpType::Ok, ok(v), Some(node), None);
                false
            }
            Outcome::Fail(e) => {
                self.record(p, OpType::Fail, plain, Some(node), Some(e));
                false
            }
            Outcome::Unknown(e) => {
                self.record(p, OpType::Info, plain, Some(node), Some(e));
                true
            }
        }
    }

    /// Records a read's completion: one that did not answer changed nothing.
    pub fn complete_read<T>(&self, p: Process, node: u64, out: Outcome<T>, ok: impl FnOnce(T) -> Call, plain: Call) {
        match out {
            Outcome::Ok(v) => self.record(p, OpType::Ok, ok(v), Some(node), None),
            Outcome::Fail(e) | Outcome::Unknown(e) => self.record(p, OpType::Fail, plain, Some(node), Some(e)),
        }
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
