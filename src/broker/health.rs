//! What `/readyz` on the metrics port answers for a broker node
//! ([`crate::metrics_http`]), for orchestrators and load balancers.
//!
//! A node is ready when it leads its group, or when it follows a leader it
//! knows and has applied what it last heard is committed, give or take
//! [`READY_LAG`] entries. The allowance keeps a follower under steady load
//! (always a few entries behind the leader's commit) from flapping, while a
//! node that restarted and is replaying or fetching the log stays out of
//! rotation until it has caught up. `/healthz` only says the process
//! answers.

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use raftmq_raft::RaftNode;

/// Committed entries a ready follower may still have to apply.
pub const READY_LAG: u64 = 1000;

/// `Ok(detail)` when ready, `Err(reason)` when not.
pub fn readiness(node: &RaftNode) -> Result<String, String> {
    let m = node.raft.metrics().borrow_watched().clone();
    if let Err(e) = &m.running_state {
        return Err(format!("Raft stopped: {e}"));
    }
    let applied = m.last_applied.map_or(0, |l| l.index);
    let committed = m.cluster_committed.map_or(0, |l| l.index).max(applied);
    match (m.state, m.current_leader) {
        (ServerState::Leader, _) => Ok(format!("leader (term {}), applied {applied}", m.current_term)),
        (ServerState::Shutdown, _) => Err("shutting down".into()),
        (_, None) => Err(format!("no known leader (term {})", m.current_term)),
        (_, Some(_)) if committed - applied > READY_LAG => {
            Err(format!("catching up: applied {applied} of {committed} committed"))
        }
        (state, Some(leader)) => Ok(format!(
            "{} of leader {leader} (term {}), applied {applied} of {committed} committed",
            if state == ServerState::Learner {
                "learner"
            } else {
                "follower"
            },
            m.current_term
        )),
    }
}
