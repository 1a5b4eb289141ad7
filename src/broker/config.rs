//! The broker's configuration: a typed TOML file with defaults, checked by
//! [`BrokerConfig::validate`]. Unknown keys are rejected with their name.
//!
//! ```toml
//! broker = "g1"               # the broker group
//! node_id = 1
//! data_dir = "data/n1"
//! client_listen = "127.0.0.1:8081"
//! raft_listen = "127.0.0.1:9081"
//! bootstrap = true            # only on one node of a new group
//!
//! [peers.1]
//! raft_addr = "127.0.0.1:9081"
//! client_addr = "127.0.0.1:8081"
//! # [peers.2], [peers.3] ...
//!
//! [store]
//! flush_mode = "async"        # or "sync"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use raftmq_raft::tls::TlsConfig;
use raftmq_raft::{NodeAddr, NodeConfig};
use raftmq_store::StoreConfig;
use serde::{Deserialize, Serialize};

pub use crate::broker::identity::IdentityConfig;
pub use crate::broker::limits::LimitsConfig;
use crate::config::{ConfigError, parse_toml, read_text};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Name of the broker group (one Raft group): `broker` in the file, as
    /// the CLI's `--broker` (`group`, its earlier name, is still read).
    #[serde(rename = "broker", alias = "group")]
    pub group: String,
    pub node_id: u64,
    pub data_dir: PathBuf,
    /// Where the client services (raftmq's broker service, later the
    /// RocketMQ protocol) listen.
    pub client_listen: String,
    /// Where the Raft transport listens.
    pub raft_listen: String,
    /// Addresses other nodes and clients use for this node (default: the
    /// listen addresses).
    #[serde(default)]
    pub advertise_client_addr: Option<String>,
    #[serde(default)]
    pub advertise_raft_addr: Option<String>,
    /// The group's initial members, this node included.
    #[serde(default)]
    pub peers: BTreeMap<u64, PeerConfig>,
    /// Initialize the group if it never was. Exactly one node of a new group.
    #[serde(default)]
    pub bootstrap: bool,
    #[serde(default = "defaults::election_min")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "defaults::election_max")]
    pub election_timeout_max_ms: u64,
    #[serde(default = "defaults::heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// Build a Raft snapshot (metadata only) every this many entries.
    #[serde(default = "defaults::snapshot_every")]
    pub snapshot_every: u64,
    /// Leadership returns to this node whenever it is caught up.
    #[serde(default)]
    pub preferred_leader: Option<u64>,
    /// Largest message body accepted.
    #[serde(default = "defaults::max_body")]
    pub max_body_bytes: usize,
    /// The cluster this group belongs to (as RocketMQ's brokerClusterName).
    #[serde(default = "defaults::cluster")]
    pub cluster: String,
    /// NameServers to register with (host:port); none means no registration.
    #[serde(default)]
    pub namesrv_addrs: Vec<String>,
    /// Heartbeat period to every NameServer (RocketMQ: 30 s). A change of
    /// role, term or topics is sent at once.
    #[serde(default = "defaults::namesrv_heartbeat")]
    pub namesrv_heartbeat_interval_ms: u64,
    /// How often retention (store.retention) runs.
    #[serde(default = "defaults::retention_check")]
    pub retention_check_interval_ms: u64,
    /// Where Prometheus scrapes `/metrics` (host:port); none: no endpoint.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Create a consumer group the first time a client uses it.
    #[serde(default = "defaults::yes")]
    pub auto_create_groups: bool,
    /// Create a topic (with `auto_create_topic_queues` queues) the first time
    /// a client asks for its route. Off by default: `raftmq topic create`.
    #[serde(default)]
    pub auto_create_topics: bool,
    #[serde(default = "defaults::auto_create_topic_queues")]
    pub auto_create_topic_queues: u32,
    /// Deliveries before a message goes to the dead-letter topic, for groups
    /// created automatically (RocketMQ: 16).
    #[serde(default = "defaults::max_delivery_attempts")]
    pub max_delivery_attempts: u32,
    /// Invisible time of a delivery whose receive names none (push
    /// consumers; RocketMQ: 60 s).
    #[serde(default = "defaults::invisible")]
    pub default_invisible_ms: u64,
    /// Shortest invisible time a receive may ask for (RocketMQ's proxy:
    /// 10 s); shorter ones would let a message reach a second consumer
    /// while the first still works on it.
    #[serde(default = "defaults::min_invisible")]
    pub min_invisible_ms: u64,
    /// Long-polling time given to consumers in their settings.
    #[serde(default = "defaults::long_polling")]
    pub long_polling_timeout_ms: u64,
    /// A deliberate bug, for the jepsen harness's self-test only: the
    /// leader acknowledges a send before its entry is committed (with the
    /// offset it expects), so faults lose acknowledged messages.
    #[serde(default)]
    pub unsafe_ack_before_commit: bool,
    /// Fault injection only: a file holding a signed number of milliseconds
    /// added to this broker's wall clock, followed while it runs (see
    /// `clock`). Unset: the host's clock.
    #[serde(default)]
    pub clock_offset_file: Option<PathBuf>,
    /// Timed and delay messages (`[timer]`).
    #[serde(default)]
    pub timer: TimerConfig,
    /// Transactional messages (`[transaction]`).
    #[serde(default)]
    pub transaction: TransactionConfig,
    /// What one caller may take from this node (`[limits]`).
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub store: StoreConfig,
    /// Identity from the host name (see [`crate::broker::identity`]); the
    /// keys it derives are filled in by [`BrokerConfig::load`].
    #[serde(default)]
    pub identity: Option<IdentityConfig>,
    /// TLS on every port of this node (`[tls]`, see
    /// [`raftmq_raft::tls::TlsConfig`]); the Raft port and the NameServer
    /// path are then mutual. None: plaintext.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Authentication and authorization of clients (`[acl]`).
    #[serde(default)]
    pub acl: AclConfig,
}

/// `[acl]`: RocketMQ 5's ACL 2.0 for the client port (see
/// [`crate::broker::auth`]). Users and policies are replicated state,
/// managed with `raftmq user` and `raftmq acl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AclConfig {
    /// Every client call must be signed by a known, enabled user, and is
    /// refused unless that user's policy allows it (Super users pass).
    pub enabled: bool,
    /// The cluster's first Super user, created when the group has no user
    /// at all; needed on the node that bootstraps a group with ACL on.
    /// `RAFTMQ_ACL_INIT_ACCESS_KEY` / `_SECRET_KEY` override these.
    pub init_access_key: Option<String>,
    pub init_secret_key: Option<String>,
    /// A signed date-time further than this from the node's clock is
    /// refused (0: never). The default, 15 h, covers the clients that
    /// write local time marked as UTC in every time zone, while a captured
    /// header stops working within a day.
    pub max_clock_skew_ms: u64,
}

impl Default for AclConfig {
    fn default() -> Self {
        AclConfig {
            enabled: false,
            init_access_key: None,
            init_secret_key: None,
            max_clock_skew_ms: 15 * 3_600_000,
        }
    }
}

impl AclConfig {
    /// The initial Super user, from the environment or the file.
    pub fn init_user(&self) -> Result<Option<raftmq_raft::acl::User>, String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let key = env("RAFTMQ_ACL_INIT_ACCESS_KEY").or_else(|| self.init_access_key.clone());
        let secret = env("RAFTMQ_ACL_INIT_SECRET_KEY").or_else(|| self.init_secret_key.clone());
        match (key, secret) {
            (None, None) => Ok(None),
            (Some(name), Some(password)) => {
                let u = raftmq_raft::acl::User {
                    name,
                    password,
                    user_type: raftmq_raft::acl::UserType::Super,
                    status: raftmq_raft::acl::UserStatus::Enable,
                };
                u.check().map(|()| Some(u))
            }
            _ => Err("[acl] init_access_key and init_secret_key go together".into()),
        }
    }
}

/// Timed and delay messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimerConfig {
    /// Latest delivery time a producer may ask for, counted from now.
    pub max_delay_ms: u64,
    /// The delay of each level, from level 1 (RocketMQ's
    /// `messageDelayLevel`): numbers with a unit of s, m, h or d.
    pub delay_levels: String,
    /// A pending timed message stored longer ago than this is stored again
    /// (and its old copy let go), so that retention is never held back by
    /// more than about this long (RocketMQ's timer rolls its log alike).
    pub roll_after_ms: u64,
}

impl Default for TimerConfig {
    fn default() -> Self {
        TimerConfig {
            max_delay_ms: 40 * 24 * 3600 * 1000,
            delay_levels: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".into(),
            roll_after_ms: 12 * 3600 * 1000,
        }
    }
}

impl TimerConfig {
    /// The levels' delays in milliseconds (level 1 first).
    pub fn levels_ms(&self) -> Result<Vec<u64>, ConfigError> {
        self.delay_levels
            .split_whitespace()
            .map(|l| {
                let (n, unit) = l.split_at(l.find(|c: char| !c.is_ascii_digit()).unwrap_or(l.len()));
                let scale = match unit {
                    "s" => 1_000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    "d" => 86_400_000,
                    _ => 0,
                };
                n.parse::<u64>()
                    .ok()
                    .filter(|_| scale > 0)
                    .map(|n| n.saturating_mul(scale))
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!("timer.delay_levels: {l:?} is not a number with s, m, h or d"))
                    })
            })
            .collect()
    }
}

/// Transactional messages: when an unresolved half message is checked back
/// with a producer, and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransactionConfig {
    /// A half message is first checked this long after it was stored
    /// (RocketMQ's `transactionTimeOut`: 6 s).
    pub check_immunity_ms: u64,
    /// Then again every this long (RocketMQ's `transactionCheckInterval`:
    /// 60 s).
    pub check_interval_ms: u64,
    /// After this many checks it is discarded (RocketMQ's
    /// `transactionCheckMax`: 15).
    pub max_checks: u32,
}

impl Default for TransactionConfig {
    fn default() -> Self {
        TransactionConfig {
            check_immunity_ms: 6_000,
            check_interval_ms: 60_000,
            max_checks: 15,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub raft_addr: String,
    pub client_addr: String,
}

mod defaults {
    pub fn election_min() -> u64 {
        150
    }
    pub fn election_max() -> u64 {
        300
    }
    pub fn heartbeat() -> u64 {
        50
    }
    pub fn snapshot_every() -> u64 {
        10_000
    }
    pub fn max_body() -> usize {
        4 << 20
    }
    pub fn retention_check() -> u64 {
        10_000
    }
    pub fn cluster() -> String {
        "DefaultCluster".into()
    }
    pub fn namesrv_heartbeat() -> u64 {
        30_000
    }
    pub fn yes() -> bool {
        true
    }
    pub fn auto_create_topic_queues() -> u32 {
        8
    }
    pub fn max_delivery_attempts() -> u32 {
        raftmq_raft::consumption::DEFAULT_MAX_DELIVERY_ATTEMPTS
    }
    pub fn invisible() -> u64 {
        60_000
    }
    pub fn min_invisible() -> u64 {
        10_000
    }
    pub fn long_polling() -> u64 {
        20_000
    }
}

impl BrokerConfig {
    pub fn load(path: &Path) -> Result<BrokerConfig, ConfigError> {
        let text = read_text(path)?;
        let mut table: toml::Table = parse_toml(path, &text)?;
        let cfg: BrokerConfig = if table.contains_key("identity") {
            crate::hosts::load().map_err(ConfigError::Invalid)?;
            crate::broker::identity::apply(&mut table, &crate::broker::identity::host_name()?)?;
            // Through text again: `[peers]` keys become ids only when parsed.
            let derived = toml::to_string(&table).map_err(|e| ConfigError::Invalid(e.to_string()))?;
            toml::from_str(&derived).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: format!("{e} (in the config as [identity] completed it)"),
            })?
        } else {
            // Parsed from the text itself: errors keep their line numbers.
            parse_toml(path, &text)?
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        // NameServers may be DNS names (a Kubernetes Service, a compose
        // service); listen addresses must be this host's IPs.
        if self.group.is_empty() {
            return bad("broker (the broker group's name) must not be empty".into());
        }
        if let Err(e) = self.acl.init_user() {
            return bad(format!("[acl]: {e}"));
        }
        // Certificates name the group in a URI (tls::identity).
        if self.tls.is_some()
            && !self
                .group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return bad(format!(
                "with [tls], broker {:?} must be letters, digits, '-', '_' and '.' only (certificates name it)",
                self.group
            ));
        }
        for (what, addr) in [
            ("client_listen", &self.client_listen),
            ("raft_listen", &self.raft_listen),
        ] {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return bad(format!("{what} {addr:?} is not an ip:port address"));
            }
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return bad("election_timeout_min_ms must be below election_timeout_max_ms".into());
        }
        if self.heartbeat_interval_ms >= self.election_timeout_min_ms {
            return bad("heartbeat_interval_ms must be below election_timeout_min_ms".into());
        }
        if self.bootstrap && !self.peers.is_empty() && !self.peers.contains_key(&self.node_id) {
            return bad(format!("the bootstrap node {} must be one of [peers]", self.node_id));
        }
        for a in &self.namesrv_addrs {
            if !crate::client::channel::is_host_port(a) {
                return bad(format!("namesrv_addrs entry {a:?} is not a host:port address"));
            }
        }
        if self.namesrv_heartbeat_interval_ms == 0 {
            return bad("namesrv_heartbeat_interval_ms must be positive".into());
        }
        if self.max_delivery_attempts == 0 || self.auto_create_topic_queues == 0 || self.auto_create_topic_queues > 1024
        {
            return bad("max_delivery_attempts and auto_create_topic_queues (at most 1024) must be positive".into());
        }
        let levels = self.timer.levels_ms()?;
        if levels.is_empty() || levels.contains(&0) || self.timer.max_delay_ms == 0 {
            return bad(
                "timer.delay_levels needs at least one positive delay, timer.max_delay_ms must be positive".into(),
            );
        }
        if self.transaction.check_interval_ms == 0 || self.transaction.max_checks == 0 {
            return bad("transaction.check_interval_ms and transaction.max_checks must be positive".into());
        }
        if self.default_invisible_ms == 0 || self.long_polling_timeout_ms == 0 || self.min_invisible_ms == 0 {
            return bad("default_invisible_ms, min_invisible_ms and long_polling_timeout_ms must be positive".into());
        }
        if self.default_invisible_ms < self.min_invisible_ms {
            return bad("default_invisible_ms must not be below min_invisible_ms".into());
        }
        if self.max_body_bytes == 0 || self.max_body_bytes as u64 + 4096 > self.store.max_record_size {
            return bad(format!(
                "max_body_bytes {} must be positive and fit, with headers, in store.max_record_size {}",
                self.max_body_bytes, self.store.max_record_size
            ));
        }
        self.limits.validate()?;
        self.store
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("[store]: {e}")))
    }

    pub fn client_addr(&self) -> String {
        self.advertise_client_addr
            .clone()
            .unwrap_or_else(|| self.client_listen.clone())
    }

    pub fn raft_addr(&self) -> String {
        self.advertise_raft_addr
            .clone()
            .unwrap_or_else(|| self.raft_listen.clone())
    }

    /// The Raft node's configuration.
    pub fn node_config(&self) -> NodeConfig {
        let advertise = NodeAddr {
            raft_addr: self.raft_addr(),
            client_addr: self.client_addr(),
        };
        let mut n = NodeConfig::new(&self.group, self.node_id, self.data_dir.clone(), advertise);
        n.raft_listen = self.raft_listen.clone();
        n.initial_members = self
            .peers
            .iter()
            .map(|(&id, p)| {
                (
                    id,
                    NodeAddr {
                        raft_addr: p.raft_addr.clone(),
                        client_addr: p.client_addr.clone(),
                    },
                )
            })
            .collect();
        n.bootstrap = self.bootstrap;
        if self.acl.enabled && !matches!(self.acl.init_user(), Ok(Some(_))) {
            n.bootstrap_refusal = Some(
                "[acl] is enabled and no initial Super user is named, so no one could ever call a new group: \
                 set [acl] init_access_key and init_secret_key (or RAFTMQ_ACL_INIT_ACCESS_KEY and \
                 RAFTMQ_ACL_INIT_SECRET_KEY). If the group exists and only this node's disk was emptied, \
                 set bootstrap = false instead and add it back with raftmq cluster add-node"
                    .into(),
            );
        }
        // Peers whose names RAFTMQ_HOSTS pins are dialled there.
        n.dial_overrides = self
            .peers
            .iter()
            .filter_map(|(&id, p)| {
                let at = crate::hosts::rewrite(&p.raft_addr);
                (at != p.raft_addr).then_some((id, at))
            })
            .collect();
        n.election_timeout_min_ms = self.election_timeout_min_ms;
        n.election_timeout_max_ms = self.election_timeout_max_ms;
        n.heartbeat_interval_ms = self.heartbeat_interval_ms;
        n.snapshot_every = self.snapshot_every;
        n.preferred_leader = self.preferred_leader;
        n.retention_interval = std::time::Duration::from_millis(self.retention_check_interval_ms.max(100));
        n.store = self.store.clone();
        n.wall_clock_ms = crate::clock::now_ms;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        group = "g"
        node_id = 1
        data_dir = "d"
        client_listen = "127.0.0.1:8081"
        raft_listen = "127.0.0.1:9081"
    "#;

    #[test]
    fn minimal_config_gets_defaults() {
        let cfg: BrokerConfig = toml::from_str(MINIMAL).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.election_timeout_min_ms, 150);
        assert_eq!(cfg.store, StoreConfig::default());
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = toml::from_str::<BrokerConfig>(&format!("{MINIMAL}\nelection_timeout = 5\n")).unwrap_err();
        assert!(err.to_string().contains("election_timeout"), "{err}");
        let err = toml::from_str::<BrokerConfig>(&format!("{MINIMAL}\n[store]\nsegmentsize = 5\n")).unwrap_err();
        assert!(err.to_string().contains("segmentsize"), "{err}");
    }

    #[test]
    fn bad_values_are_explained() {
        let mut cfg: BrokerConfig = toml::from_str(MINIMAL).unwrap();
        cfg.heartbeat_interval_ms = 500;
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("heartbeat_interval_ms")
        );
        let mut cfg: BrokerConfig = toml::from_str(MINIMAL).unwrap();
        cfg.client_listen = "localhost".into();
        assert!(cfg.validate().unwrap_err().to_string().contains("client_listen"));
        // NameServers by IP or by name; nothing else.
        let mut cfg: BrokerConfig = toml::from_str(MINIMAL).unwrap();
        cfg.namesrv_addrs = vec![
            "10.0.0.1:9876".into(),
            "namesrv.raftmq.svc:9876".into(),
            "[::1]:9876".into(),
        ];
        cfg.validate().unwrap();
        for bad in ["namesrv", "namesrv:port", ":9876", "http://namesrv:9876", "a b:9876"] {
            cfg.namesrv_addrs = vec![bad.into()];
            assert!(cfg.validate().is_err(), "{bad:?} accepted");
        }
    }
}
