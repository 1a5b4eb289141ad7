//! A node that lost committed entries to damage on disk (its log ends
//! before the index it had committed, see `LogStore::lost_up_to`) must not
//! vote or campaign until it has those entries again: with a majority of
//! three made of it and a node that never had them, a vote could elect a
//! leader without entries the group acknowledged. The Raft service refuses
//! its votes and `RaftNode` keeps elections off until it has applied up to
//! the lost index (or at once when it is its group's only voter: no one
//! has the entries, and waiting would keep the group down for good).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether this node is catching up with committed entries it lost to
/// damage, and up to which index: until then it refuses to vote
/// ([`crate::service::RaftService`]) and does not campaign.
#[derive(Clone)]
pub struct CatchingUp(Arc<AtomicU64>);

impl CatchingUp {
    const NONE: u64 = u64::MAX;

    pub fn new(target: Option<u64>) -> CatchingUp {
        CatchingUp(Arc::new(AtomicU64::new(target.unwrap_or(Self::NONE))))
    }

    pub fn target(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Acquire)).filter(|&t| t != Self::NONE)
    }

    pub fn done(&self) {
        self.0.store(Self::NONE, Ordering::Release);
    }
}
