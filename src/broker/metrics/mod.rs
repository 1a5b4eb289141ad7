//! Prometheus metrics of a broker node, in the text format on
//! `metrics_listen` `/metrics` ([`crate::metrics_http`]). Every metric is
//! listed with its labels and meaning in `deploy/METRICS.md`.
//!
//! Two families of names:
//! - `rocketmq_*`: RocketMQ 5's metric names, labels and units (message
//!   counts and bytes in and out, message sizes, RPC latency in ms, consumer
//!   lag, storage, connections, timers, transactions), so dashboards and
//!   alerts written for RocketMQ work unchanged;
//! - `raftmq_*`: what RocketMQ has no name for: Raft state and per-follower
//!   replication lag, send and receive latency in seconds, msync latency,
//!   disk use against the retention watermarks.
//!
//! Every metric carries RocketMQ's node labels `cluster`, `node_type`
//! (`broker`) and `node_id` (`<group>-<node>`), and raftmq's `broker` (the
//! group) and `node` (its Raft id).
//!
//! | module        | what                                                          |
//! |---------------|---------------------------------------------------------------|
//! | this file     | what is counted as it happens, and the registry               |
//! | [`node`]      | read at each scrape: Raft, storage, held messages, clients    |
//! | [`consumers`] | read at each scrape: each consumer group's backlog per topic  |
//! | [`labels`]    | the label sets of the counted families                        |
//! | [`gauges`]    | writing scrape-time gauges                                    |

mod consumers;
mod gauges;
mod labels;
mod node;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use openraft::async_runtime::WatchReceiver;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use raftmq_raft::RaftNode;

pub use labels::{ConsumeLabels, MessageLabels, RpcLabels, TopicLabels};

use crate::broker::clients::Clients;

/// RocketMQ's `message_type` label values.
pub const NORMAL: &str = "normal";
pub const FIFO: &str = "fifo";
pub const DELAY: &str = "delay";
pub const TRANSACTION: &str = "transaction";

/// RocketMQ 5's `rocketmq_message_size` buckets, in bytes.
const MESSAGE_SIZE_BUCKETS: [f64; 6] = [1024.0, 4096.0, 524_288.0, 1_048_576.0, 2_097_152.0, 4_194_304.0];
/// RocketMQ 5's `rocketmq_rpc_latency` buckets, in milliseconds.
const RPC_LATENCY_BUCKETS_MS: [f64; 7] = [1.0, 3.0, 5.0, 10.0, 100.0, 1000.0, 3000.0];
/// Half message to commit or rollback, in milliseconds: a transaction
/// usually ends within seconds, a check-back takes a minute or more.
const FINISH_LATENCY_BUCKETS_MS: [f64; 8] = [
    100.0,
    1_000.0,
    5_000.0,
    30_000.0,
    60_000.0,
    300_000.0,
    1_800_000.0,
    3_600_000.0,
];

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct BrokerMetrics {
    registry: Registry,
    messages_in: Family<MessageLabels, Counter>,
    throughput_in: Family<MessageLabels, Counter>,
    message_size: Histograms<MessageLabels>,
    messages_out: Family<ConsumeLabels, Counter>,
    throughput_out: Family<ConsumeLabels, Counter>,
    /// Messages moved to a group's dead-letter topic.
    pub send_to_dlq: Family<ConsumeLabels, Counter>,
    rpc_latency: Histograms<RpcLabels>,
    /// Timed messages stored, per real topic.
    pub timer_enqueue: Family<TopicLabels, Counter>,
    /// Timed messages released into their topics by this node as leader.
    pub timer_dequeue: Family<TopicLabels, Counter>,
    commits: Family<TopicLabels, Counter>,
    rollbacks: Family<TopicLabels, Counter>,
    finish_latency: Histograms<TopicLabels>,
    /// Seconds from a send's arrival at the leader to its commit.
    pub send_latency: Histogram,
    /// Seconds a receive that delivered messages took (long polling included).
    pub receive_latency: Histogram,
    pub leader_changes: Counter,
    /// Timed messages this node stored again as leader (their copies were
    /// old: `timer.roll_after_ms`).
    pub timers_rolled: Counter,
    /// Half messages given up on (never resolved, checks exhausted).
    pub transactions_discarded: Counter,
    /// Transaction check-backs this node sent to producers.
    pub transaction_checks: Counter,
    /// Messages of producers' sends this node as leader did not store again:
    /// the deduplication window held their ids (`raftmq_raft::dedup`).
    pub send_duplicates: Counter,
    /// `messages_in` and `messages_out` summed over their labels, for
    /// `Status` (a Family cannot be summed without encoding it).
    total_in: AtomicU64,
    total_out: AtomicU64,
}

/// What the node labels are made of.
pub struct NodeIdentity<'a> {
    pub cluster: &'a str,
    pub group: &'a str,
}

impl BrokerMetrics {
    pub fn new(node: Arc<RaftNode>, id: NodeIdentity<'_>, clients: Arc<Clients>) -> BrokerMetrics {
        let mut registry = Registry::with_labels(
            [
                ("cluster".into(), id.cluster.to_string().into()),
                ("node_type".into(), "broker".into()),
                ("node_id".into(), format!("{}-{}", id.group, node.id).into()),
                ("broker".into(), id.group.to_string().into()),
                ("node".into(), node.id.to_string().into()),
            ]
            .into_iter(),
        );
        let m = BrokerMetrics {
            messages_in: Family::default(),
            throughput_in: Family::default(),
            message_size: Family::new_with_constructor(|| Histogram::new(MESSAGE_SIZE_BUCKETS)),
            messages_out: Family::default(),
            throughput_out: Family::default(),
            send_to_dlq: Family::default(),
            rpc_latency: Family::new_with_constructor(|| Histogram::new(RPC_LATENCY_BUCKETS_MS)),
            timer_enqueue: Family::default(),
            timer_dequeue: Family::default(),
            commits: Family::default(),
            rollbacks: Family::default(),
            finish_latency: Family::new_with_constructor(|| Histogram::new(FINISH_LATENCY_BUCKETS_MS)),
            send_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            receive_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            leader_changes: Counter::default(),
            timers_rolled: Counter::default(),
            transactions_discarded: Counter::default(),
            transaction_checks: Counter::default(),
            send_duplicates: Counter::default(),
            total_in: AtomicU64::new(0),
            total_out: AtomicU64::new(0),
            registry: Registry::default(),
        };
        let r = registry.sub_registry_with_prefix("rocketmq");
        r.register(
            "messages_in",
            "Messages stored, per topic and message type",
            m.messages_in.clone(),
        );
        r.register("throughput_in", "Message body bytes stored", m.throughput_in.clone());
        r.register(
            "message_size",
            "Message body sizes stored, in bytes",
            m.message_size.clone(),
        );
        r.register(
            "messages_out",
            "Messages delivered to consumers, per topic and consumer group",
            m.messages_out.clone(),
        );
        r.register(
            "throughput_out",
            "Message body bytes delivered to consumers",
            m.throughput_out.clone(),
        );
        r.register(
            "send_to_dlq_messages",
            "Messages moved to a consumer group's dead-letter topic",
            m.send_to_dlq.clone(),
        );
        r.register(
            "rpc_latency",
            "Client RPC latency in milliseconds, per RPC and answer code",
            m.rpc_latency.clone(),
        );
        r.register(
            "timer_enqueue",
            "Timed messages stored, per topic",
            m.timer_enqueue.clone(),
        );
        r.register(
            "timer_dequeue",
            "Timed messages released into their topics by this node as leader",
            m.timer_dequeue.clone(),
        );
        r.register("commit_messages", "Transactional messages committed", m.commits.clone());
        r.register(
            "rollback_messages",
            "Transactional messages rolled back",
            m.rollbacks.clone(),
        );
        r.register(
            "finish_message_latency",
            "Milliseconds from a half message's store to its commit or rollback",
            m.finish_latency.clone(),
        );
        r.register_collector(Box::new(node::RocketmqCollector {
            node: node.clone(),
            clients,
        }));
        r.register_collector(Box::new(consumers::ConsumerCollector { node: node.clone() }));
        let r = registry.sub_registry_with_prefix("raftmq");
        r.register(
            "send_latency_seconds",
            "Send latency at the leader",
            m.send_latency.clone(),
        );
        r.register(
            "receive_latency_seconds",
            "Latency of receives that delivered messages",
            m.receive_latency.clone(),
        );
        r.register(
            "leader_changes",
            "Times this node saw the group's leader change",
            m.leader_changes.clone(),
        );
        r.register(
            "timers_rolled",
            "Timed messages stored again by this node as leader because their copies were old",
            m.timers_rolled.clone(),
        );
        r.register(
            "transactions_discarded",
            "Half messages discarded by this node as leader: never resolved, check-backs exhausted",
            m.transactions_discarded.clone(),
        );
        r.register(
            "transaction_checks",
            "Transaction check-backs sent to producers by this node",
            m.transaction_checks.clone(),
        );
        r.register(
            "send_duplicates",
            "Messages sent again (a retry with the same message id) and not stored again, by this node as leader",
            m.send_duplicates.clone(),
        );
        r.register_collector(Box::new(node::RaftCollector { node }));
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

    /// Messages stored in `topic`, of their body `sizes`: one label lookup
    /// for the lot (this runs on the send path).
    pub fn messages_in(&self, topic: &str, message_type: &'static str, sizes: impl IntoIterator<Item = usize>) {
        let mut sizes = sizes.into_iter().peekable();
        if sizes.peek().is_none() {
            return;
        }
        let l = MessageLabels {
            topic: topic.to_string(),
            message_type,
        };
        let (mut count, mut bytes) = (0u64, 0u64);
        {
            let histogram = self.message_size.get_or_create(&l);
            for size in sizes {
                histogram.observe(size as f64);
                count += 1;
                bytes += size as u64;
            }
        }
        self.messages_in.get_or_create(&l).inc_by(count);
        self.total_in.fetch_add(count, Ordering::Relaxed);
        self.throughput_in.get_or_create(&l).inc_by(bytes);
    }

    /// `count` messages (`bytes` of bodies) delivered to `group`.
    pub fn messages_out(&self, topic: &str, group: &str, count: usize, bytes: usize) {
        let l = ConsumeLabels {
            topic: topic.to_string(),
            consumer_group: group.to_string(),
        };
        self.messages_out.get_or_create(&l).inc_by(count as u64);
        self.total_out.fetch_add(count as u64, Ordering::Relaxed);
        self.throughput_out.get_or_create(&l).inc_by(bytes as u64);
    }

    /// Messages stored and delivered by this node since it started.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.total_in.load(Ordering::Relaxed),
            self.total_out.load(Ordering::Relaxed),
        )
    }

    /// A client RPC answered with `response_code`, `started` when it arrived.
    pub fn rpc(&self, request_code: &'static str, response_code: &'static str, started: Instant) {
        self.rpc_latency
            .get_or_create(&RpcLabels {
                protocol_type: "grpc",
                request_code,
                response_code,
            })
            .observe(started.elapsed().as_secs_f64() * 1000.0);
    }

    /// A transaction of `topic` ended (committed or not) `age_ms` after
    /// its half message was stored.
    pub fn transaction_ended(&self, topic: &str, committed: bool, age_ms: u64) {
        let l = TopicLabels {
            topic: topic.to_string(),
        };
        match committed {
            true => self.commits.get_or_create(&l).inc(),
            false => self.rollbacks.get_or_create(&l).inc(),
        };
        self.finish_latency.get_or_create(&l).observe(age_ms as f64);
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
