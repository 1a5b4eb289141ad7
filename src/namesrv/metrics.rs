//! The NameServer's Prometheus metrics: heartbeats received, and at each
//! scrape the registered nodes, groups and topics, and how long ago each
//! node was heard from.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    broker: String,
    node: u64,
}

pub struct NamesrvMetrics {
    registry: prometheus_client::registry::Registry,
    pub heartbeats: Counter,
}

impl NamesrvMetrics {
    pub fn new(state: Arc<Mutex<Registry>>) -> NamesrvMetrics {
        let mut registry = prometheus_client::registry::Registry::with_prefix("raftmq_namesrv");
        let heartbeats = Counter::default();
        registry.register("heartbeats", "Broker heartbeats received", heartbeats.clone());
        registry.register_collector(Box::new(StateCollector { state }));
        NamesrvMetrics { registry, heartbeats }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

struct StateCollector {
    state: Arc<Mutex<Registry>>,
}

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateCollector")
    }
}

impl prometheus_client::collector::Collector for StateCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (info, topics) = {
            let r = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            (r.cluster_info(Instant::now()), r.topic_names().len())
        };
        let groups: std::collections::BTreeSet<_> = info.nodes.iter().map(|n| (&n.cluster, &n.group)).collect();
        ConstGauge::new(info.nodes.len() as i64).encode(e.encode_descriptor(
            "nodes",
            "Broker nodes registered",
            None,
            MetricType::Gauge,
        )?)?;
        ConstGauge::new(groups.len() as i64).encode(e.encode_descriptor(
            "groups",
            "Broker groups registered",
            None,
            MetricType::Gauge,
        )?)?;
        ConstGauge::new(topics as i64).encode(e.encode_descriptor(
            "topics",
            "Topics known",
            None,
            MetricType::Gauge,
        )?)?;
        let mut f = e.encode_descriptor(
            "node_heartbeat_age_seconds",
            "Seconds since each node's last heartbeat",
            None,
            MetricType::Gauge,
        )?;
        for n in &info.nodes {
            let l = NodeLabels {
                broker: n.group.clone(),
                node: n.node_id,
            };
            ConstGauge::new(n.last_heartbeat_ms as f64 / 1000.0).encode(f.encode_family(&l)?)?;
        }
        Ok(())
    }
}
