//! Metrics read from the node at each scrape: its Raft state and each
//! follower's replication lag (`raftmq_*`), and RocketMQ's storage, held
//! message, connection and count gauges (`rocketmq_*`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use raftmq_raft::RaftNode;
use raftmq_store::retention::DiskProbe;

use super::gauges::{gauge, gauges};
use super::labels::TopicLabels;
use crate::broker::clients::Clients;
use crate::proto::rocketmq::v2::ClientType;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FollowerLabels {
    follower: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatermarkLabels {
    watermark: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ProducerLabels {
    language: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ConsumerLabels {
    consumer_group: String,
    language: String,
    version: String,
    consume_mode: &'static str,
}

/// `raftmq_*` at scrape time.
pub(super) struct RaftCollector {
    pub(super) node: Arc<RaftNode>,
}

impl fmt::Debug for RaftCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RaftCollector(node {})", self.node.id)
    }
}

impl prometheus_client::collector::Collector for RaftCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let node = &*self.node;
        let m = node.raft.metrics().borrow_watched().clone();
        gauge(&mut e, "raft_term", "Current Raft term", m.current_term)?;
        gauges(
            &mut e,
            "raft_role",
            "This node's Raft role (1 for the current one)",
            [(RoleLabels { role: node.role() }, 1i64)],
        )?;
        let last = m.last_log_index.unwrap_or(0);
        gauge(&mut e, "raft_last_log_index", "Index of the last log entry", last)?;
        gauge(
            &mut e,
            "raft_commit_index",
            "Highest index known committed",
            m.local_committed.map_or(0, |l| l.index),
        )?;
        gauge(
            &mut e,
            "raft_applied_index",
            "Highest index applied",
            m.last_applied.map_or(0, |l| l.index),
        )?;
        // Only the leader knows what its followers hold.
        let lag = m
            .replication
            .iter()
            .flatten()
            .filter(|(id, _)| **id != node.id)
            .map(|(id, matched)| {
                let matched = matched.as_ref().map_or(0, |l| l.index);
                (FollowerLabels { follower: *id }, last.saturating_sub(matched))
            });
        gauges(
            &mut e,
            "raft_replication_lag_entries",
            "On the leader: log entries a follower has yet to acknowledge",
            lag,
        )?;
        gauge(
            &mut e,
            "group_writable",
            "1 while producers may send to the group, 0 while its write permission is wiped for maintenance",
            if node.sm.writable() { 1.0 } else { 0.0 },
        )?;

        let log = node.store.commitlog();
        if let Ok(u) = raftmq_store::retention::StatvfsProbe.usage(node.store.root()) {
            gauge(
                &mut e,
                "disk_used_ratio",
                "Used fraction of the data directory's disk",
                u.ratio(),
            )?;
        }
        let r = &node.store.retention();
        gauges(
            &mut e,
            "disk_watermark_ratio",
            "Retention's disk-use watermarks: warn (expired segments go at any hour), force (the oldest go), refuse (writes fail)",
            [
                (WatermarkLabels { watermark: "warn" }, r.disk_warn_ratio),
                (WatermarkLabels { watermark: "force" }, r.disk_force_ratio),
                (WatermarkLabels { watermark: "refuse" }, r.disk_refuse_ratio),
            ],
        )?;
        let (buckets, sum_us) = log.flush_latency().snapshot();
        let count: u64 = buckets.iter().sum();
        let mut bounds: Vec<(f64, u64)> = raftmq_store::FLUSH_BUCKETS_US
            .iter()
            .zip(&buckets)
            .map(|(b, n)| (*b as f64 / 1e6, *n))
            .collect();
        bounds.push((f64::INFINITY, buckets.last().copied().unwrap_or(0)));
        e.encode_descriptor(
            "flush_latency_seconds",
            "CommitLog msync latency",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            sum_us as f64 / 1e6,
            count,
            &bounds,
            None,
        )
    }
}

/// `rocketmq_*` gauges of the node at scrape time.
pub(super) struct RocketmqCollector {
    pub(super) node: Arc<RaftNode>,
    pub(super) clients: Arc<Clients>,
}

impl fmt::Debug for RocketmqCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocketmqCollector(node {})", self.node.id)
    }
}

impl prometheus_client::collector::Collector for RocketmqCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let node = &*self.node;
        let log = node.store.commitlog();
        let end = log.max_offset();
        gauge(
            &mut e,
            "storage_size",
            "Bytes of CommitLog kept (its last offset minus its first)",
            end.saturating_sub(log.min_offset()),
        )?;
        gauge(
            &mut e,
            "storage_flush_behind_bytes",
            "CommitLog bytes written and not yet flushed to disk",
            end.saturating_sub(log.flushed_offset()),
        )?;
        gauge(
            &mut e,
            "storage_dispatch_behind_bytes",
            "CommitLog bytes not yet indexed into consume queues",
            end.saturating_sub(node.store.dispatched_offset()),
        )?;

        let (topics, groups, timers, halves) = node.sm.with_metadata(|m| {
            let mut halves: BTreeMap<&str, u64> = BTreeMap::new();
            for h in m.held.halves.values() {
                *halves.entry(h.topic.as_str()).or_default() += 1;
            }
            let halves: Vec<(TopicLabels, u64)> = halves
                .into_iter()
                .map(|(t, n)| (TopicLabels { topic: t.to_string() }, n))
                .collect();
            // Configured, or known from what they consumed.
            let groups: std::collections::BTreeSet<&String> = m
                .groups
                .keys()
                .chain(m.consumption.keys())
                .chain(m.offsets.keys())
                .collect();
            let groups = groups.len();
            (m.topics.len(), groups, m.held.timers.len(), halves)
        });
        gauge(&mut e, "topic_number", "Topics", topics as u64)?;
        gauge(&mut e, "consumer_group_number", "Consumer groups", groups as u64)?;
        gauge(
            &mut e,
            "timing_messages",
            "Timed messages stored and not yet released into their topics",
            timers as u64,
        )?;
        gauges(
            &mut e,
            "half_messages",
            "Half messages neither committed nor rolled back, per topic",
            halves,
        )?;

        // Clients of this node (each node counts the clients it serves).
        let mut producers: BTreeMap<ProducerLabels, u64> = BTreeMap::new();
        let mut consumers: BTreeMap<ConsumerLabels, u64> = BTreeMap::new();
        for (_, c) in self.clients.all() {
            let consume_mode = match c.client_type {
                ClientType::Producer => {
                    *producers
                        .entry(ProducerLabels {
                            language: c.language,
                            version: c.version,
                        })
                        .or_default() += 1;
                    continue;
                }
                ClientType::PushConsumer => "push",
                ClientType::SimpleConsumer => "pop",
                ClientType::PullConsumer => "pull",
                _ => continue,
            };
            *consumers
                .entry(ConsumerLabels {
                    consumer_group: c.group.unwrap_or_default(),
                    language: c.language,
                    version: c.version,
                    consume_mode,
                })
                .or_default() += 1;
        }
        gauges(
            &mut e,
            "producer_connections",
            "Producers connected to this node",
            producers,
        )?;
        gauges(
            &mut e,
            "consumer_connections",
            "Consumers connected to this node, per consumer group",
            consumers,
        )
    }
}
