//! Taking a broker group out of writes for maintenance and back
//! (mqadmin's wipeWritePerm and addWritePerm).
//!
//! The flag is replicated state ([`AdminCommand::SetWritable`]): set
//! through the leader, kept in snapshots, so every node (and whichever
//! leads after a failover or restart) agrees. While it is set:
//! - routes show the group's queues without write permission, both the
//!   NameServer's (from the heartbeat, sent at once on the change) and a
//!   broker's own answer, so clients send to the other groups;
//! - a producer's send that reaches the group anyway is refused with
//!   `FORBIDDEN`, nothing stored: by the leader before it proposes, or by
//!   the state machine when the send was ordered after the change
//!   ([`raftmq_raft::state_machine::WRITES_WIPED`]);
//! - what is already stored goes on: receives, acks, retries, dead
//!   letters, due timers and transaction commits.

use raftmq_raft::command::{AdminCommand, PERM_READ, PERM_WRITE};

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

impl Broker {
    /// Sets whether producers may send to the group; answers whether they
    /// could before. Runs on the leader.
    pub async fn set_writable_local(&self, writable: bool) -> Result<bool, BrokerError> {
        self.node.linearizable().await?;
        let before = self.node.sm.writable();
        if before != writable {
            let cmd = AdminCommand::SetWritable { writable };
            self.node.write(raftmq_raft::Command::admin(&cmd)).await?;
        }
        Ok(before)
    }

    /// The permission bits a route may give this group's queues: a
    /// topic's own perm, masked, is what routes show (without write while
    /// the group is out of writes). One read of the flag for all topics.
    pub fn route_perm_mask(&self) -> u32 {
        match self.node.sm.writable() {
            true => PERM_READ | PERM_WRITE,
            false => PERM_READ,
        }
    }

    /// Refuses a producer's send while the group is out of writes.
    pub fn check_group_writable(&self) -> Result<(), BrokerError> {
        match self.node.sm.writable() {
            true => Ok(()),
            false => Err(self.wiped()),
        }
    }

    /// The error for a batch the state machine refused (`why`): a send
    /// ordered after the wipe gets the wipe's refusal, as one that came
    /// later does.
    pub fn batch_refused(&self, why: String) -> BrokerError {
        match why == raftmq_raft::state_machine::WRITES_WIPED {
            true => self.wiped(),
            false => BrokerError::Invalid(why),
        }
    }

    fn wiped(&self) -> BrokerError {
        BrokerError::Refused(
            Code::Forbidden,
            format!(
                "broker group {} takes no sends: its write permission is wiped for maintenance \
                 (raftmq cluster add-write-perm --broker {} restores it)",
                self.cfg.group, self.cfg.group
            ),
        )
    }
}
