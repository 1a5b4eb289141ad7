//! The NameServer's configuration (TOML; unknown keys rejected by name).
//!
//! ```toml
//! listen = "127.0.0.1:9876"
//! scan_interval_ms = 10000     # how often silent brokers are looked for
//! expiry_ms = 120000           # a broker silent this long is dropped
//! metrics_listen = "127.0.0.1:9877"   # Prometheus /metrics (optional)
//!
//! [tls]                        # optional: TLS on both ports, brokers show
//! cert = "certs/namesrv.pem"   # certificates naming their group and node
//! key = "certs/namesrv.key"
//! ca_cert = "certs/ca.pem"
//! ```

use std::path::Path;

use raftmq_raft::tls::TlsConfig;
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, read_toml};

/// RocketMQ's NameServer port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9876";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NamesrvConfig {
    pub listen: String,
    pub scan_interval_ms: u64,
    pub expiry_ms: u64,
    /// Where Prometheus scrapes `/metrics`; none: no endpoint.
    pub metrics_listen: Option<String>,
    /// TLS on both ports (see [`raftmq_raft::tls::TlsConfig`]).
    pub tls: Option<TlsConfig>,
}

impl Default for NamesrvConfig {
    fn default() -> Self {
        NamesrvConfig {
            listen: DEFAULT_LISTEN.into(),
            scan_interval_ms: 10_000,
            expiry_ms: 120_000,
            metrics_listen: None,
            tls: None,
        }
    }
}

impl NamesrvConfig {
    pub fn load(path: &Path) -> Result<NamesrvConfig, ConfigError> {
        let cfg: NamesrvConfig = read_toml(path)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "listen {:?} is not an ip:port address",
                self.listen
            )));
        }
        if let Some(m) = &self.metrics_listen
            && m.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::Invalid(format!(
                "metrics_listen {m:?} is not an ip:port address"
            )));
        }
        if self.scan_interval_ms == 0 || self.expiry_ms == 0 {
            return Err(ConfigError::Invalid(
                "scan_interval_ms and expiry_ms must be positive".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let cfg: NamesrvConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, NamesrvConfig::default());
        let err = toml::from_str::<NamesrvConfig>("expiry = 5").unwrap_err();
        assert!(err.to_string().contains("expiry"), "{err}");
    }
}
