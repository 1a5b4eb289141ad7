//! The settings a node changes while it runs (mqadmin's getBrokerConfig
//! and updateBrokerConfig).
//!
//! Each change is **per node** and lasts until the node restarts: none of
//! these keys decides what the replicated log holds, so nodes of a group
//! may differ in them for a while without any disagreement about data
//! (`raftmq cluster update-config` changes every node of a group, one after
//! the other). To keep a change over restarts, put it in the node's config
//! file too; the answer says so.
//!
//! `Broker::cfg` stays the config the node started with. The keys in
//! [`RUNTIME_KEYS`] are read through `Broker::live` wherever they are
//! used, so a change reaches the next request; components that keep a
//! copy (the request-rate buckets, the store's retention) are told in
//! `Broker::update_config`.

use std::sync::{Arc, Mutex, RwLock};

use crate::broker::config::BrokerConfig;
use crate::error::BrokerError;

/// The keys `update_config` accepts, as `deploy/CONFIG.md` names them
/// (tables joined with `.`).
pub const RUNTIME_KEYS: &[&str] = &[
    "long_polling_timeout_ms",
    "default_invisible_ms",
    "min_invisible_ms",
    "max_body_bytes",
    "auto_create_topics",
    "auto_create_topic_queues",
    "limits.max_response_bytes",
    "limits.max_requests_per_client_per_s",
    "store.retention.file_reserved_hours",
    "store.retention.delete_when_hour",
    "store.retention.disk_warn_ratio",
    "store.retention.disk_force_ratio",
    "store.retention.disk_refuse_ratio",
];

/// The config in force at this node: the file's, with the run-time
/// changes made since the start.
pub struct LiveConfig {
    current: RwLock<Arc<BrokerConfig>>,
    /// Held for a whole update: two concurrent updates of different keys
    /// must not each start from the config before the other's.
    updating: Mutex<()>,
}

/// One key of the config in force.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    pub key: String,
    /// As TOML writes it (`"async"`, `200`, `0.9`, `true`).
    pub value: String,
    /// Whether `update` may change it.
    pub runtime: bool,
}

impl LiveConfig {
    pub fn new(cfg: BrokerConfig) -> LiveConfig {
        LiveConfig {
            current: RwLock::new(Arc::new(cfg)),
            updating: Mutex::new(()),
        }
    }

    pub fn get(&self) -> Arc<BrokerConfig> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Every key of the config in force, sorted.
    pub fn entries(&self) -> Result<Vec<ConfigEntry>, BrokerError> {
        entries(&self.get())
    }

    /// Sets `key` (one of [`RUNTIME_KEYS`]) to `value` (TOML: `200`,
    /// `0.8`, `true`; a bare word is a string), after checking it as a
    /// config file's value is checked. `apply` tells the components that
    /// keep a copy before the new config is in force. Answers the key's
    /// value before.
    pub fn update(&self, key: &str, value: &str, apply: impl FnOnce(&BrokerConfig)) -> Result<String, BrokerError> {
        if !RUNTIME_KEYS.contains(&key) {
            return Err(BrokerError::Invalid(format!(
                "{key} cannot be changed while the node runs (it can: {}); change it in the config file and restart",
                RUNTIME_KEYS.join(", ")
            )));
        }
        let _one_at_a_time = self.updating.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, before) = with_key(&self.get(), key, value)?;
        apply(&next);
        tracing::info!(key, value, before = %before, "config changed at run time");
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(next);
        Ok(before)
    }
}

/// `cfg` with `key` set to `value`, validated, and the key's old value.
///
/// Through JSON rather than TOML: `[peers]` has integer keys, which a
/// TOML table cannot be serialised from.
fn with_key(cfg: &BrokerConfig, key: &str, value: &str) -> Result<(BrokerConfig, String), BrokerError> {
    let invalid = |m: String| BrokerError::Invalid(m);
    let new_value = serde_json::to_value(parse_value(value)).map_err(|e| invalid(format!("{key} = {value}: {e}")))?;
    let mut root = serde_json::to_value(cfg).map_err(|e| invalid(format!("config: {e}")))?;
    let mut at = &mut root;
    for part in key.split('.') {
        at = at
            .get_mut(part)
            .ok_or_else(|| invalid(format!("{key}: no such key in the config")))?;
    }
    let before = toml_text(&std::mem::replace(at, new_value));
    let next: BrokerConfig = serde_json::from_value(root).map_err(|e| invalid(format!("{key} = {value}: {e}")))?;
    next.validate().map_err(|e| invalid(format!("{key} = {value}: {e}")))?;
    Ok((next, before))
}

/// A value as TOML reads it, or the text as a string when it is not TOML
/// (so `async` works as well as `"async"`).
fn parse_value(value: &str) -> toml::Value {
    format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()))
}

/// A config value as TOML writes it.
fn toml_text(v: &serde_json::Value) -> String {
    toml::Value::try_from(v).map_or_else(|_| v.to_string(), |t| t.to_string())
}

fn entries(cfg: &BrokerConfig) -> Result<Vec<ConfigEntry>, BrokerError> {
    let root = serde_json::to_value(cfg).map_err(|e| BrokerError::Invalid(format!("config: {e}")))?;
    let mut out = Vec::new();
    flatten("", &root, &mut out);
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Leaves of `v` under dotted keys; unset options (null) are left out,
/// as a config file leaves them out.
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<ConfigEntry>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Null => {}
        v => out.push(ConfigEntry {
            runtime: RUNTIME_KEYS.contains(&prefix),
            value: toml_text(v),
            key: prefix.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BrokerConfig {
        let text = "broker = \"g\"\nnode_id = 1\ndata_dir = \"/tmp/x\"\nclient_listen = \"127.0.0.1:1\"\n\
                    raft_listen = \"127.0.0.1:2\"\n[peers.1]\nraft_addr = \"127.0.0.1:2\"\nclient_addr = \"127.0.0.1:1\"\n";
        toml::from_str(text).unwrap()
    }

    #[test]
    fn every_runtime_key_is_a_key_of_the_config() {
        let all = entries(&config()).unwrap();
        for k in RUNTIME_KEYS {
            assert!(all.iter().any(|e| e.key == *k && e.runtime), "{k}");
        }
        assert!(all.iter().any(|e| e.key == "store.segment_size" && !e.runtime));
        assert!(all.iter().any(|e| e.key == "peers.1.raft_addr"));
    }

    #[test]
    fn a_change_is_typed_and_validated_as_the_file_is() {
        let cfg = config();
        let (next, before) = with_key(&cfg, "store.retention.disk_refuse_ratio", "0.95").unwrap();
        assert_eq!(next.store.retention.disk_refuse_ratio, 0.95);
        assert_eq!(before, "0.9");
        let (next, _) = with_key(&cfg, "long_polling_timeout_ms", "5000").unwrap();
        assert_eq!(next.long_polling_timeout_ms, 5000);
        let (next, _) = with_key(&cfg, "auto_create_topics", "true").unwrap();
        assert!(next.auto_create_topics);
        // The wrong type, and values the file would be refused for.
        for (k, v) in [
            ("long_polling_timeout_ms", "soon"),
            ("long_polling_timeout_ms", "0"),
            ("store.retention.disk_warn_ratio", "0.99"),
            ("max_body_bytes", "1000000000"),
            ("auto_create_topic_queues", "5000"),
            ("limits.max_response_bytes", "-1"),
        ] {
            assert!(with_key(&cfg, k, v).is_err(), "{k} = {v} was taken");
        }
    }
}
