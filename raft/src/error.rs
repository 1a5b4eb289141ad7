//! The Raft layer's error type. It keeps "try again, maybe elsewhere" (not
//! the leader, outcome unknown, unavailable) apart from errors that will not
//! go away by retrying.

use crate::types::{NodeAddr, NodeId};

#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// This node is not the leader; `leader` is who is, if known.
    #[error("this node is not the leader{}", match .leader_id { Some(id) => format!("; node {id} is"), None => String::new() })]
    NotLeader {
        leader_id: Option<NodeId>,
        leader: Option<NodeAddr>,
    },
    /// The request may or may not have been applied (leader changed while
    /// it was in flight). Retrying may duplicate it.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// No quorum, a peer unreachable, a timeout: retry later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request is malformed or refused by the state machine.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The node stopped (storage failure or shutdown).
    #[error("fatal: {0}")]
    Fatal(String),
    #[error(transparent)]
    Store(#[from] raftmq_store::StoreError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl RaftError {
    /// True when the same request may succeed if retried (perhaps on
    /// another node).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RaftError::NotLeader { .. } | RaftError::Unavailable(_) | RaftError::OutcomeUnknown(_)
        )
    }
}

/// A storage error as the `io::Error` openraft's storage traits return.
/// Asking for what is not there (an offset or index out of range) is
/// `NotFound`, so callers can tell it from a fault without looking inside.
pub(crate) fn io_err(e: raftmq_store::StoreError) -> std::io::Error {
    let kind = match e {
        raftmq_store::StoreError::OutOfRange { .. } => std::io::ErrorKind::NotFound,
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, e)
}
