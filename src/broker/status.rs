//! A node's own view of its group: role, term, log indexes, members, and
//! optionally a digest of its applied log (to compare replicas).

use openraft::async_runtime::WatchReceiver;
use raftmq_raft::NodeAddr;
use raftmq_store::retention::DiskProbe;

use super::Broker;
use crate::error::BrokerError;

/// One member of the group.
#[derive(Debug, Clone)]
pub struct Member {
    pub node_id: u64,
    pub addr: NodeAddr,
    pub voter: bool,
}

/// What `Broker::status` reports.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub node_id: u64,
    pub group: String,
    /// "leader", "follower", "candidate", "learner" or "shutdown".
    pub role: &'static str,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub members: Vec<Member>,
    /// CRC32 over (term, index, record CRC) of every record up to the
    /// applied index (0 unless asked for).
    pub applied_log_digest: u32,
    pub log_start_index: u64,
    /// Producers may send to the group ([`crate::broker::write_perm`]).
    pub writable: bool,
    /// Bytes of CommitLog kept.
    pub store_bytes: u64,
    /// Used fraction of the data directory's filesystem (0: unknown).
    pub disk_used_ratio: f64,
    /// Messages stored and delivered by this node since it started.
    pub messages_in_total: u64,
    pub messages_out_total: u64,
    /// The disk is past the refuse watermark: as leader, this node refuses
    /// new sends (`CommitLog::disk_full`).
    pub disk_full: bool,
}

impl Broker {
    /// This node's status; `with_digest` reads every applied record.
    pub fn status(&self, with_digest: bool) -> Result<NodeStatus, BrokerError> {
        let m = self.node.raft.metrics().borrow_watched().clone();
        let role = self.node.role();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| Member {
                node_id: *id,
                addr: n.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let applied = m.last_applied.map_or(0, |l| l.index);
        let log = self.node.log.clone();
        let digest = if with_digest {
            applied_digest(&log, m.last_applied.map(|l| l.index))?
        } else {
            0
        };
        Ok(NodeStatus {
            node_id: self.node.id,
            group: self.cfg.group.clone(),
            role,
            term: m.current_term,
            leader_id: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: m.local_committed.map_or(0, |l| l.index),
            applied_index: applied,
            members,
            applied_log_digest: digest,
            log_start_index: log.bounds().0,
            writable: self.node.sm.writable(),
            store_bytes: {
                let log = self.node.store.commitlog();
                log.max_offset().saturating_sub(log.min_offset())
            },
            disk_used_ratio: raftmq_store::retention::StatvfsProbe
                .usage(self.node.store.root())
                .map_or(0.0, |u| u.ratio()),
            messages_in_total: self.metrics.totals().0,
            messages_out_total: self.metrics.totals().1,
            disk_full: self.node.store.commitlog().disk_full().is_some(),
        })
    }
}

/// CRC32 over (term, index, record CRC) of every record up to `applied`.
fn applied_digest(log: &raftmq_raft::LogStore, applied: Option<u64>) -> Result<u32, BrokerError> {
    let mut h = crc32fast::Hasher::new();
    let Some(applied) = applied else { return Ok(0) };
    let (first, _) = log.bounds();
    for i in first..=applied {
        let unit = log.locate(i).map_err(|e| BrokerError::Internal(e.to_string()))?;
        let record = log
            .store()
            .commitlog()
            .read(unit.phys)
            .map_err(|e| BrokerError::Internal(e.to_string()))?;
        h.update(&record.meta().term.to_le_bytes());
        h.update(&record.meta().index.to_le_bytes());
        h.update(&record.crc().to_le_bytes());
    }
    Ok(h.finalize())
}
