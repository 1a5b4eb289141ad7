//! Prometheus metrics of a broker node, in the text format on
//! `metrics_listen` `/metrics` ([`crate::metrics_http`]).
//!
//! Counted as they happen: sends and bytes per topic, send and receive
//! latency, leader changes. Read at each scrape from the node's state: Raft
//! term, role, commit/applied/last log index, store size, disk use, msync
//! latency, and each consumer group's lag and in-flight count per queue
//! (rocketmq-exporter's `rocketmq_group_diff`), from this node's applied
//! state, so any node of a group reports them.
//!
//! Every metric carries the labels `broker` (the group's name) and `node`.

use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use raftmq_raft::RaftNode;
use raftmq_store::retention::DiskProbe;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    group: String,
    topic: String,
    queue: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

pub struct BrokerMetrics {
    registry: Registry,
    pub sent_messages: Family<TopicLabels, Counter>,
    pub sent_bytes: Family<TopicLabels, Counter>,
    /// Seconds from a send's arrival at the leader to its commit.
    pub send_latency: Histogram,
    /// Seconds a receive that delivered messages took (long polling included).
    pub receive_latency: Histogram,
    pub leader_changes: Counter,
    /// Timed messages this node released into their topics as leader.
    pub timers_released: Counter,
    /// Timed messages this node stored again as leader (their copies were
    /// old: `timer.roll_after_ms`).
    pub timers_rolled: Counter,
    /// Transactions this node ended as leader: commit, rollback, discarded.
    pub transactions: Family<OutcomeLabels, Counter>,
    /// Transaction check-backs this node sent to producers.
    pub transaction_checks: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

impl BrokerMetrics {
    pub fn new(node: Arc<RaftNode>, broker_group: &str) -> BrokerMetrics {
        let mut registry = Registry::with_prefix_and_labels(
            "raftmq",
            [
                ("broker".into(), broker_group.to_string().into()),
                ("node".into(), node.id.to_string().into()),
            ]
            .into_iter(),
        );
        let m = BrokerMetrics {
            sent_messages: Family::default(),
            sent_bytes: Family::default(),
            send_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            receive_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            leader_changes: Counter::default(),
            timers_released: Counter::default(),
            timers_rolled: Counter::default(),
            transactions: Family::default(),
            transaction_checks: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("messages_sent", "Messages stored, per topic", m.sent_messages.clone());
        registry.register("bytes_sent", "Message bytes stored, per topic", m.sent_bytes.clone());
        registry.register(
            "send_latency_seconds",
            "Send latency at the leader",
            m.send_latency.clone(),
        );
        registry.register(
            "receive_latency_seconds",
            "Latency of receives that delivered messages",
            m.receive_latency.clone(),
        );
        registry.register(
            "leader_changes",
            "Times this node saw the group's leader change",
            m.leader_changes.clone(),
        );
        registry.register(
            "timers_released",
            "Timed messages released into their topics by this node as leader",
            m.timers_released.clone(),
        );
        registry.register(
            "timers_rolled",
            "Timed messages stored again by this node as leader because their copies were old",
            m.timers_rolled.clone(),
        );
        registry.register(
            "transactions_ended",
            "Transactions ended by this node as leader, per outcome",
            m.transactions.clone(),
        );
        registry.register(
            "transaction_checks",
            "Transaction check-backs sent to producers by this node",
            m.transaction_checks.clone(),
        );
        registry.register_collector(Box::new(NodeCollector { node }));
        BrokerMetrics { registry, ..m }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Counts leader changes until the node shuts down.
    pub fn watch_leader(self: &Arc<Self>, node: &RaftNode) -> tokio::task::JoinHandle<()> {
        let mut rx = node.raft.metrics();
        let me = self.clone();
        tokio::spawn(async move {
            let mut last = rx.borrow_watched().current_leader;
            while rx.changed().await.is_ok() {
                let now = rx.borrow_watched().current_leader;
                if now.is_some() && now != last {
                    me.leader_changes.inc();
                }
                last = now;
            }
        })
    }
}

/// Scrape-time values read from the node.
struct NodeCollector {
    node: Arc<RaftNode>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeCollector(node {})", self.node.id)
    }
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl prometheus_client::collector::Collector for NodeCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let node = &*self.node;
        let m = node.raft.metrics().borrow_watched().clone();
        gauge(&mut e, "raft_term", "Current Raft term", m.current_term as i64)?;
        let role = node.role();
        {
            let mut f = e.encode_descriptor(
                "raft_role",
                "This node's Raft role (1 for the current one)",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(1i64).encode(f.encode_family(&RoleLabels { role })?)?;
        }
        gauge(
            &mut e,
            "raft_last_log_index",
            "Index of the last log entry",
            m.last_log_index.unwrap_or(0) as i64,
        )?;
        gauge(
            &mut e,
            "raft_commit_index",
            "Highest index known committed",
            m.local_committed.map_or(0, |l| l.index) as i64,
        )?;
        gauge(
            &mut e,
            "raft_applied_index",
            "Highest index applied",
            m.last_applied.map_or(0, |l| l.index) as i64,
        )?;
        let (timers, halves) = node.sm.with_metadata(|m| (m.held.timers.len(), m.held.halves.len()));
        gauge(
            &mut e,
            "timers_pending",
            "Timed messages stored and not yet due (or not yet released)",
            timers as i64,
        )?;
        gauge(
            &mut e,
            "transactions_pending",
            "Half messages neither committed nor rolled back",
            halves as i64,
        )?;
        let log = node.store.commitlog();
        gauge(
            &mut e,
            "store_bytes",
            "Bytes of CommitLog kept (last offset minus first)",
            log.max_offset().saturating_sub(log.min_offset()) as i64,
        )?;
        if let Ok(u) = raftmq_store::retention::StatvfsProbe.usage(node.store.root()) {
            gauge(
                &mut e,
                "disk_used_ratio",
                "Used fraction of the data directory's disk",
                u.ratio(),
            )?;
        }
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
        )?;

        // Consumer lag per group and queue, from this node's applied state.
        let mut lag = Vec::new();
        let mut inflight = Vec::new();
        for p in crate::broker::progress::progress(node, None) {
            let l = QueueLabels {
                group: p.group.clone(),
                topic: p.topic.clone(),
                queue: p.queue,
            };
            lag.push((l.clone(), p.lag()));
            inflight.push((l, u64::from(p.inflight)));
        }
        {
            let mut f = e.encode_descriptor(
                "consumer_lag",
                "Messages a consumer group has yet to consume, per queue",
                None,
                MetricType::Gauge,
            )?;
            for (l, v) in &lag {
                ConstGauge::new(*v as i64).encode(f.encode_family(l)?)?;
            }
        }
        let mut f = e.encode_descriptor(
            "consumer_inflight",
            "Messages delivered to a consumer group and not yet acknowledged, per queue",
            None,
            MetricType::Gauge,
        )?;
        for (l, v) in &inflight {
            ConstGauge::new(*v as i64).encode(f.encode_family(l)?)?;
        }
        Ok(())
    }
}
