//! The openraft type configuration of a raftmq broker group.
//!
//! One leader per term (`leader_id_std`): a committed log id is then just
//! (term, index), which is exactly what a CommitLog record header holds.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Response};

/// Where a node can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeAddr {
    /// `host:port` of the Raft transport.
    pub raft_addr: String,
    /// `host:port` of the client services.
    pub client_addr: String,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft {} / client {}", self.raft_addr, self.client_addr)
    }
}

openraft::declare_raft_types!(
    /// raftmq's Raft types.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = NodeAddr,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
);

pub type NodeId = u64;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type EntryPayload = openraft::type_config::alias::EntryPayloadOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, NodeAddr>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot as openraft moves it: metadata and the encoded state.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, Vec<u8>>;

/// A log id from its parts.
pub fn log_id(term: u64, index: u64) -> LogId {
    openraft::LogId {
        leader_id: term.into(),
        index,
    }
}

/// The term of a log id.
pub fn term_of(id: &LogId) -> u64 {
    id.leader_id.term
}
