//! The clients a node knows: who they are (client id, type, group), when
//! they last spoke, and their Telemetry stream, on which the broker can
//! send them commands (transaction check-backs).
//!
//! Soft state, per node: a client heartbeats every node it talks to, so each
//! node knows the clients that use it. Entries silent for [`CLIENT_TTL`]
//! are dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::proto::rocketmq::v2;

/// A client silent this long is forgotten (RocketMQ: 120 s).
pub const CLIENT_TTL: Duration = Duration::from_secs(120);

/// Sends server commands down a client's Telemetry stream.
pub type TelemetrySender = mpsc::Sender<Result<v2::TelemetryCommand, tonic::Status>>;

#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub client_type: v2::ClientType,
    /// Consumer group, or producer group where the client names one.
    pub group: Option<String>,
    pub language: String,
    pub last_seen: Instant,
    /// The client's current Telemetry stream (its id, its sender).
    pub telemetry: Option<(u64, TelemetrySender)>,
    /// Topics a producer said it publishes to (its settings).
    pub topics: Vec<String>,
}

#[derive(Default)]
pub struct Clients {
    inner: Mutex<HashMap<String, ClientInfo>>,
}

impl Clients {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, ClientInfo>) -> R) -> R {
        let mut m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        m.retain(|_, c| now.duration_since(c.last_seen) < CLIENT_TTL);
        f(&mut m)
    }

    /// Records that a client spoke (heartbeat or settings).
    pub fn seen(&self, id: &str, client_type: v2::ClientType, group: Option<String>, language: &str) {
        if id.is_empty() {
            return;
        }
        self.with(|m| {
            let e = m.entry(id.to_string()).or_insert_with(|| ClientInfo {
                client_type,
                group: None,
                language: language.to_string(),
                last_seen: Instant::now(),
                telemetry: None,
                topics: Vec::new(),
            });
            e.last_seen = Instant::now();
            if client_type != v2::ClientType::Unspecified {
                e.client_type = client_type;
            }
            if group.as_deref().is_some_and(|g| !g.is_empty()) {
                e.group = group;
            }
        });
    }

    /// Keeps a client's Telemetry stream for server commands.
    pub fn attach(&self, id: &str, stream: u64, tx: TelemetrySender) {
        self.with(|m| {
            if let Some(c) = m.get_mut(id) {
                c.telemetry = Some((stream, tx));
            }
        });
    }

    /// Records the topics a producer publishes to.
    pub fn publishes(&self, id: &str, topics: Vec<String>) {
        self.with(|m| {
            if let Some(c) = m.get_mut(id) {
                c.topics = topics;
            }
        });
    }

    /// Telemetry streams of live producers of `topic`: (client id, sender).
    pub fn producers_of(&self, topic: &str) -> Vec<(String, TelemetrySender)> {
        self.with(|m| {
            m.iter()
                .filter(|(_, c)| c.client_type == v2::ClientType::Producer && c.topics.iter().any(|t| t == topic))
                .filter_map(|(id, c)| c.telemetry.as_ref().map(|(_, tx)| (id.clone(), tx.clone())))
                .collect()
        })
    }

    /// A client's Telemetry stream ended (unless a newer one replaced it).
    pub fn detach(&self, id: &str, stream: u64) {
        self.with(|m| {
            if let Some(c) = m.get_mut(id)
                && c.telemetry.as_ref().is_some_and(|(s, _)| *s == stream)
            {
                c.telemetry = None;
            }
        });
    }

    /// A client that said goodbye.
    pub fn remove(&self, id: &str) {
        self.with(|m| m.remove(id));
    }

    /// Live clients of a group: (client id, info).
    pub fn of_group(&self, group: &str) -> Vec<(String, ClientInfo)> {
        self.with(|m| {
            m.iter()
                .filter(|(_, c)| c.group.as_deref() == Some(group))
                .map(|(k, c)| (k.clone(), c.clone()))
                .collect()
        })
    }

    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_groups_and_goodbyes() {
        let c = Clients::default();
        c.seen("a", v2::ClientType::SimpleConsumer, Some("G".into()), "PYTHON");
        c.seen("b", v2::ClientType::Producer, None, "RUST");
        c.seen("", v2::ClientType::Producer, None, "RUST");
        // A later heartbeat without a type or group keeps what was known.
        c.seen("a", v2::ClientType::Unspecified, None, "PYTHON");
        let g = c.of_group("G");
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1.client_type, v2::ClientType::SimpleConsumer);
        assert_eq!(c.len(), 2);
        c.remove("a");
        assert!(c.of_group("G").is_empty());
        // Producers are found by topic, once they have a stream.
        c.publishes("b", vec!["T".into()]);
        assert!(c.producers_of("T").is_empty());
        let (tx, _rx) = mpsc::channel(1);
        c.attach("b", 1, tx);
        assert_eq!(c.producers_of("T").len(), 1);
        assert!(c.producers_of("U").is_empty());
    }
}
