//! Each consumer group's backlog per topic, read at each scrape from this
//! node's applied state (so every node of a group reports the same), with
//! RocketMQ 5's names and definitions, summed over the topic's queues:
//!
//! | metric                              | per queue                                   |
//! |-------------------------------------|---------------------------------------------|
//! | `rocketmq_consumer_lag_messages`    | queue end − consumed offset                 |
//! | `rocketmq_consumer_ready_messages`  | queue end − first offset never delivered    |
//! | `rocketmq_consumer_inflight_messages` | lag − ready: delivered, not yet done      |
//! | `rocketmq_consumer_lag_latency`     | ms since the first unconsumed message was stored (oldest queue) |
//! | `rocketmq_consumer_queueing_latency`| ms since the first undelivered message was stored (oldest queue) |

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::DescriptorEncoder;
use raftmq_raft::RaftNode;
use raftmq_raft::message::MessageView;

use super::gauges::gauges;
use super::labels::ConsumeLabels;
use crate::clock::now_ms;

#[derive(Default)]
struct Backlog {
    lag: u64,
    ready: u64,
    /// Store time of the oldest unconsumed / undelivered message.
    oldest_unconsumed_ms: Option<u64>,
    oldest_undelivered_ms: Option<u64>,
}

pub(super) struct ConsumerCollector {
    pub(super) node: Arc<RaftNode>,
}

impl fmt::Debug for ConsumerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConsumerCollector(node {})", self.node.id)
    }
}

/// When the message at `offset` of a queue was stored (the queue's oldest
/// kept one if retention took it).
fn stored_ms(node: &RaftNode, topic: &str, queue: u32, offset: u64) -> Option<u64> {
    let first = node.store.queue(topic, queue)?.min_offset();
    let (_, bytes) = node.store.message(topic, queue, offset.max(first)).ok()?;
    MessageView::parse(&bytes).ok().map(|(v, _)| v.store_timestamp_ms)
}

fn older(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl prometheus_client::collector::Collector for ConsumerCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let node = &*self.node;
        let mut backlog: BTreeMap<(String, String), Backlog> = BTreeMap::new();
        for p in crate::broker::progress::progress(node, None) {
            let lag = p.lag();
            let ready = p.broker_offset.saturating_sub(p.pulled_offset).min(lag);
            let unconsumed = (lag > 0)
                .then(|| stored_ms(node, &p.topic, p.queue, p.consumer_offset))
                .flatten();
            let undelivered = (ready > 0)
                .then(|| stored_ms(node, &p.topic, p.queue, p.pulled_offset))
                .flatten();
            let b = backlog.entry((p.topic, p.group)).or_default();
            b.lag += lag;
            b.ready += ready;
            b.oldest_unconsumed_ms = older(b.oldest_unconsumed_ms, unconsumed);
            b.oldest_undelivered_ms = older(b.oldest_undelivered_ms, undelivered);
        }
        let now = now_ms();
        let labels = |(topic, group): &(String, String)| ConsumeLabels {
            topic: topic.clone(),
            consumer_group: group.clone(),
        };
        let age = |t: Option<u64>| t.map_or(0, |t| now.saturating_sub(t));
        gauges(
            &mut e,
            "consumer_lag_messages",
            "Messages a consumer group has yet to consume",
            backlog.iter().map(|(k, b)| (labels(k), b.lag)),
        )?;
        gauges(
            &mut e,
            "consumer_ready_messages",
            "Messages ready for a consumer group: never delivered to it",
            backlog.iter().map(|(k, b)| (labels(k), b.ready)),
        )?;
        gauges(
            &mut e,
            "consumer_inflight_messages",
            "Messages delivered to a consumer group and not yet acknowledged",
            backlog.iter().map(|(k, b)| (labels(k), b.lag - b.ready)),
        )?;
        gauges(
            &mut e,
            "consumer_lag_latency",
            "Milliseconds since the oldest message a consumer group has yet to consume was stored",
            backlog.iter().map(|(k, b)| (labels(k), age(b.oldest_unconsumed_ms))),
        )?;
        gauges(
            &mut e,
            "consumer_queueing_latency",
            "Milliseconds since the oldest message not yet delivered to a consumer group was stored",
            backlog.iter().map(|(k, b)| (labels(k), age(b.oldest_undelivered_ms))),
        )
    }
}
