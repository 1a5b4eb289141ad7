//! What the harness observes besides client operations, for the checker:
//! each replica's log after the test, each node's commit index sampled
//! while it ran, and each node's view of the group's members after healing.
//!
//! `replicas.json` holds a list of [`ReplicaLog`]; `commits.jsonl` one
//! [`CommitSample`] per line; `membership.json` a list of [`MemberView`].

use serde::{Deserialize, Serialize};

/// One record of a replica's CommitLog (the Raft log), as `raftmq store
/// dump` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    pub index: u64,
    pub term: u64,
    /// The record's CRC32 (over its header and payload, as stored).
    pub crc: u32,
}

/// A replica's whole log, read from its data directory after the nodes
/// stopped cleanly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaLog {
    pub node: u64,
    /// The last committed log index the node persisted, if any.
    pub committed: Option<u64>,
    pub records: Vec<LogRecord>,
}

/// A node's commit index, read from its `/metrics` while the test ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitSample {
    /// Nanoseconds since the test started (the history's clock).
    pub time: u64,
    pub node: u64,
    /// Counts the node's starts: 0 for the first, 1 after one restart...
    pub incarnation: u32,
    /// This incarnation began after a simulated power loss (the `power`
    /// nemesis dropped the node's un-fsynced writes).
    #[serde(default)]
    pub after_power_loss: bool,
    pub commit_index: u64,
}

/// One node's view of the group's configuration after the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub node: u64,
    /// `None` when the node did not answer.
    pub voters: Option<Vec<u64>>,
    #[serde(default)]
    pub learners: Vec<u64>,
}
