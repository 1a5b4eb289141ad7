//! Where each consumer group is in each queue: the queue's end, the group's
//! consumed offset, its lag and what it has in flight. Computed from a
//! node's applied state, so every node of a group can answer. Used by
//! `raftmq group progress` and the consumer metrics.
//!
//! A pop consumer's offset is the first offset not yet done (acknowledged,
//! dead-lettered or filtered out); once it consumes a topic, every queue of
//! the topic counts (a queue it has not popped from yet starts at its oldest
//! message). An offset-based consumer's offset is the one it committed.

use std::collections::BTreeSet;

use raftmq_raft::RaftNode;

/// One queue's progress for one consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgress {
    pub group: String,
    pub topic: String,
    pub queue: u32,
    pub broker_offset: u64,
    pub consumer_offset: u64,
    /// The first offset never delivered to the group (RocketMQ's "pulled"
    /// offset); the consumed offset where the group commits offsets itself.
    pub pulled_offset: u64,
    pub inflight: u32,
}

impl QueueProgress {
    pub fn lag(&self) -> u64 {
        self.broker_offset.saturating_sub(self.consumer_offset)
    }
}

/// Progress of every group (or only `only`), sorted by group, topic, queue.
pub fn progress(node: &RaftNode, only: Option<&str>) -> Vec<QueueProgress> {
    let store = &node.store;
    let end = |topic: &str, q: u32| store.queue(topic, q).map_or(0, |cq| cq.max_offset());
    let start = |topic: &str, q: u32| store.queue(topic, q).map_or(0, |cq| cq.min_offset());
    node.sm.with_metadata(|md| {
        let mut out = Vec::new();
        let wanted = |g: &str| only.is_none_or(|o| o == g);
        for (group, topics) in md.consumption.iter().filter(|(g, _)| wanted(g)) {
            for (topic, queues) in topics {
                let count = md.topics.get(topic).map_or(0, |t| t.read_queues);
                let ids: BTreeSet<u32> = (0..count).chain(queues.keys().copied()).collect();
                for q in ids {
                    let (consumer_offset, pulled_offset, inflight) = match queues.get(&q) {
                        Some(st) => (st.done_below(), st.next, st.inflight.len() as u32),
                        None => (start(topic, q), start(topic, q), 0),
                    };
                    out.push(QueueProgress {
                        group: group.clone(),
                        topic: topic.clone(),
                        queue: q,
                        broker_offset: end(topic, q),
                        consumer_offset,
                        pulled_offset,
                        inflight,
                    });
                }
            }
        }
        for (group, topics) in md.offsets.iter().filter(|(g, _)| wanted(g)) {
            for (topic, queues) in topics {
                for (q, offset) in queues {
                    let popped = md
                        .consumption
                        .get(group)
                        .and_then(|t| t.get(topic))
                        .is_some_and(|qs| qs.contains_key(q));
                    if !popped {
                        out.push(QueueProgress {
                            group: group.clone(),
                            topic: topic.clone(),
                            queue: *q,
                            broker_offset: end(topic, *q),
                            consumer_offset: *offset,
                            pulled_offset: *offset,
                            inflight: 0,
                        });
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.group, &a.topic, a.queue).cmp(&(&b.group, &b.topic, b.queue)));
        out
    })
}
