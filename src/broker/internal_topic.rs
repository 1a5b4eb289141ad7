//! Topics the broker creates for itself and writes to: a group's
//! dead-letter topic, and the system topics that hold timed and half
//! messages.

use raftmq_raft::RaftNode;
use raftmq_raft::command::{AdminCommand, TopicConfig};

use super::batcher::write_bounded;
use crate::error::BrokerError;

/// Creates a topic the broker itself writes to (a dead-letter or system
/// topic: one queue, any message type) unless it exists.
pub async fn ensure(node: &RaftNode, name: &str) -> Result<(), BrokerError> {
    if node.sm.topic(name).is_none() {
        let t = TopicConfig {
            name: name.to_string(),
            read_queues: 1,
            write_queues: 1,
            perm: 6,
            message_type: raftmq_raft::command::TopicMessageType::Mixed,
        };
        write_bounded(node, raftmq_raft::Command::admin(&AdminCommand::PutTopic(t))).await?;
    }
    Ok(())
}
