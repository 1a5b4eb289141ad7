//! The group's secret: 32 random bytes, chosen by the group's first leader
//! that needs one and replicated like any other metadata, so every node that
//! may lead later has the same key.
//!
//! The broker keys the MACs of the tokens it hands to clients (receipt
//! handles, transaction ids, recall handles) with it: a token names log
//! indexes and offsets that anyone can guess, and the MAC is what makes it
//! impossible to forge one or to use it for another group or topic. It
//! lives in the metadata of snapshots (so a node seeded from a snapshot
//! knows it) and never leaves the Raft port.

use serde::{Deserialize, Serialize};

/// Length of the secret in bytes.
pub const SECRET_LEN: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSecret([u8; SECRET_LEN]);

impl GroupSecret {
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> GroupSecret {
        GroupSecret(bytes)
    }

    pub fn bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }
}

/// Never printed: metadata is logged in debug output.
impl std::fmt::Debug for GroupSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupSecret(..)")
    }
}
