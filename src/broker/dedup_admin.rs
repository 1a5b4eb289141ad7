//! The group's deduplication window of producers' sends
//! ([`raftmq_raft::dedup`]), read and changed through the leader
//! (`raftmq cluster dedup`). Its configuration is replicated state, not a
//! node's config key: every replica must forget the same ids at the same
//! entry, or their queues would differ.

use raftmq_raft::command::{AdminCommand, Response};
use raftmq_raft::dedup::DedupConfig;

use crate::broker::Broker;
use crate::error::BrokerError;

impl Broker {
    /// Sets what is given of the window's configuration; answers the
    /// configuration in force after and the ids the window holds. Runs on
    /// the leader.
    pub async fn set_dedup_local(
        &self,
        window_ms: Option<u64>,
        max_ids: Option<u64>,
    ) -> Result<(DedupConfig, usize), BrokerError> {
        self.node.linearizable().await?;
        let (before, _) = self.node.sm.dedup();
        let next = DedupConfig {
            window_ms: window_ms.unwrap_or(before.window_ms),
            max_ids: max_ids.unwrap_or(before.max_ids),
        };
        if let Some(why) = next.refusal() {
            return Err(BrokerError::Invalid(why));
        }
        if next != before {
            let cmd = raftmq_raft::Command::admin(&AdminCommand::SetDedup(next));
            if let (_, Response::Rejected(why)) = self.node.write(cmd).await? {
                return Err(BrokerError::Invalid(why));
            }
            tracing::info!(
                window_ms = next.window_ms,
                max_ids = next.max_ids,
                "deduplication window changed"
            );
        }
        Ok(self.node.sm.dedup())
    }
}
