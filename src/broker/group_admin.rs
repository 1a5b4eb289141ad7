//! Operators' changes to a consumer group, run on the leader through Raft:
//! moving it in a topic's queues (to a point in time, to given offsets, or
//! past its whole backlog) and deleting it.

use raftmq_raft::command::AdminCommand;

use super::Broker;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

/// Where a reset moves a group in each queue of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTarget {
    /// The first message stored at or after this time (ms since the epoch).
    Time(u64),
    /// Each queue's end: the backlog is skipped.
    End,
    /// These offsets, in these queues only: (queue, offset), each clamped
    /// to what the queue holds.
    Offsets(Vec<(u32, u64)>),
}

impl Broker {
    /// Moves `group` in `topic`'s queues to `target`, for pop and
    /// offset-based consumption alike (what is in flight is dropped).
    pub async fn reset_offset_local(&self, group: &str, topic: &str, target: &ResetTarget) -> Result<(), BrokerError> {
        crate::broker::pop::validate_group(group)?;
        let t = self.topic(topic)?;
        let store = &self.node.store;
        let bounds = |q: u32| {
            store
                .queue(topic, q)
                .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()))
        };
        let moves: Vec<(u32, u64)> = match target {
            ResetTarget::Time(ts) => (0..t.read_queues)
                .map(|q| Ok((q, self.offset_for_timestamp(topic, q, *ts)?)))
                .collect::<Result<_, BrokerError>>()?,
            ResetTarget::End => (0..t.read_queues).map(|q| (q, bounds(q).1)).collect(),
            ResetTarget::Offsets(offsets) => {
                let mut seen = std::collections::BTreeSet::new();
                for (q, _) in offsets {
                    if *q >= t.read_queues || !seen.insert(*q) {
                        return Err(BrokerError::Refused(
                            Code::BadRequest,
                            format!("queue {q} of {topic} is named twice or does not exist"),
                        ));
                    }
                }
                offsets
                    .iter()
                    .map(|(q, o)| {
                        let (min, max) = bounds(*q);
                        (*q, (*o).clamp(min, max))
                    })
                    .collect()
            }
        };
        for (q, offset) in moves {
            let reset = AdminCommand::ResetConsumption {
                group: group.to_string(),
                topic: topic.to_string(),
                queue_id: q,
                offset,
            };
            self.node.write(raftmq_raft::Command::admin(&reset)).await?;
            self.commit_offset_local(group, topic, q, offset, false).await?;
        }
        Ok(())
    }

    /// Deletes `group`: its config, offsets and in-flight deliveries.
    /// Its dead-letter topic stays (it holds messages).
    pub async fn delete_group_local(&self, group: &str) -> Result<(), BrokerError> {
        crate::broker::pop::validate_group(group)?;
        self.node.linearizable().await?;
        let known = self.node.sm.with_metadata(|m| {
            m.groups.contains_key(group) || m.offsets.contains_key(group) || m.consumption.contains_key(group)
        });
        if !known {
            return Err(BrokerError::Refused(
                Code::ConsumerGroupNotFound,
                format!("consumer group {group} does not exist"),
            ));
        }
        let cmd = AdminCommand::DeleteGroup {
            name: group.to_string(),
        };
        self.node.write(raftmq_raft::Command::admin(&cmd)).await?;
        Ok(())
    }
}
