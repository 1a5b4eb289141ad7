//! A node's identity from its host name, so that one config file serves
//! every pod of a StatefulSet (and every group: see deploy/kubernetes).
//!
//! With an `[identity]` table, the host name `<stem>-<ordinal>` (a
//! StatefulSet pod's, e.g. `broker-a-1`) decides what a per-node config
//! would otherwise spell out:
//!
//! | key            | derived value                                         |
//! |----------------|-------------------------------------------------------|
//! | `broker`       | `<stem>`, unless the file names the group             |
//! | `node_id`      | `<ordinal> + 1`                                       |
//! | `[peers]`      | ordinals `0..replicas`, at `peer_host` (`{group}` and `{ordinal}` replaced) with `client_port` and `raft_port` |
//! | `advertise_*`  | this node's own `peer_host`                           |
//! | `bootstrap`    | ordinal 0 only, and only if no peer answers as a member of a group that already exists ([`group_exists`]) |
//!
//! ```toml
//! [identity]
//! replicas = 3
//! peer_host = "{group}-{ordinal}.{group}"   # the headless Service's DNS names
//! client_port = 8081
//! raft_port = 9091
//! ```
//!
//! The host name is `RAFTMQ_HOSTNAME` when set (a test, or a host whose name
//! is not the pod's), else the kernel's. When [`crate::hosts`] lists this
//! node's own peer name, the node listens on that address instead of the
//! listen addresses' host (several "hosts" on one machine).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// The `[identity]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// The group's initial voters: ordinals `0..replicas`.
    pub replicas: u64,
    /// Each member's host name, `{group}` and `{ordinal}` replaced.
    #[serde(default = "default_peer_host")]
    pub peer_host: String,
    #[serde(default = "default_client_port")]
    pub client_port: u16,
    #[serde(default = "default_raft_port")]
    pub raft_port: u16,
}

fn default_peer_host() -> String {
    "{group}-{ordinal}.{group}".into()
}
fn default_client_port() -> u16 {
    8081
}
fn default_raft_port() -> u16 {
    9091
}

/// Most members a group starts with (a Raft group of more than 7 voters
/// only slows its commits).
const MAX_REPLICAS: u64 = 7;

/// This machine's host name: `RAFTMQ_HOSTNAME`, else the kernel's.
pub fn host_name() -> Result<String, ConfigError> {
    if let Ok(h) = std::env::var("RAFTMQ_HOSTNAME") {
        return Ok(h);
    }
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it or truncates.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(ConfigError::Invalid(format!(
            "cannot read the host name: {}",
            std::io::Error::last_os_error()
        )));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// `<stem>-<ordinal>` split; the first label only (`broker-a-1.example` is
/// `broker-a`, 1).
fn split_host(host: &str) -> Option<(&str, u64)> {
    let label = host.split('.').next()?;
    let (stem, ordinal) = label.rsplit_once('-')?;
    let ordinal = ordinal
        .parse()
        .ok()
        .filter(|_| ordinal.bytes().all(|b| b.is_ascii_digit()))?;
    (!stem.is_empty()).then_some((stem, ordinal))
}

/// Fills in the keys `[identity]` derives (see the module doc) for the host
/// `host`, in a config read as a TOML table. Keys the file sets that the
/// identity would decide are refused rather than silently overridden.
pub fn apply(table: &mut toml::Table, host: &str) -> Result<(), ConfigError> {
    let bad = |m: String| Err(ConfigError::Invalid(m));
    let Some(identity) = table.get("identity") else {
        return Ok(());
    };
    let id: IdentityConfig = identity
        .clone()
        .try_into()
        .map_err(|e| ConfigError::Invalid(format!("[identity]: {e}")))?;
    for key in [
        "node_id",
        "peers",
        "advertise_client_addr",
        "advertise_raft_addr",
        "bootstrap",
    ] {
        if table.contains_key(key) {
            return bad(format!(
                "{key} comes from the host name when [identity] is set; remove it from the file"
            ));
        }
    }
    if id.replicas == 0 || id.replicas > MAX_REPLICAS {
        return bad(format!("[identity] replicas must be 1 to {MAX_REPLICAS}"));
    }
    let Some((stem, ordinal)) = split_host(host) else {
        return bad(format!(
            "[identity] needs a host name like <name>-<ordinal> (a StatefulSet pod's); this one is {host:?}"
        ));
    };
    if ordinal >= id.replicas {
        return bad(format!(
            "host {host:?} is ordinal {ordinal}, past [identity] replicas = {}: a node beyond the initial \
             members joins with `raftmq cluster add-node` and a config of its own",
            id.replicas
        ));
    }
    let group = match table.get("broker").or(table.get("group")) {
        Some(toml::Value::String(g)) => g.clone(),
        Some(_) => return bad("broker must be a string".into()),
        None => stem.to_string(),
    };
    let name = |o: u64| {
        id.peer_host
            .replace("{group}", &group)
            .replace("{ordinal}", &o.to_string())
    };
    let mut peers = toml::Table::new();
    for o in 0..id.replicas {
        let mut p = toml::Table::new();
        p.insert("raft_addr".into(), format!("{}:{}", name(o), id.raft_port).into());
        p.insert("client_addr".into(), format!("{}:{}", name(o), id.client_port).into());
        peers.insert((o + 1).to_string(), p.into());
    }
    let own = name(ordinal);
    if !table.contains_key("group") {
        table.insert("broker".into(), group.clone().into());
    }
    table.insert("node_id".into(), toml::Value::Integer((ordinal + 1) as i64));
    table.insert("peers".into(), peers.into());
    table.insert(
        "advertise_client_addr".into(),
        format!("{own}:{}", id.client_port).into(),
    );
    table.insert("advertise_raft_addr".into(), format!("{own}:{}", id.raft_port).into());
    table.insert("bootstrap".into(), (ordinal == 0).into());
    // Several hosts on one machine: listen on this host's own address.
    if let Some(ip) = crate::hosts::lookup(&own) {
        for key in ["client_listen", "raft_listen", "metrics_listen"] {
            if let Some(toml::Value::String(addr)) = table.get(key)
                && let Some((_, port)) = addr.rsplit_once(':')
            {
                let at = std::net::SocketAddr::new(ip, port.parse().unwrap_or(0)).to_string();
                table.insert(key.into(), at.into());
            }
        }
    }
    Ok(())
}

/// Whether a peer answers as a member of a group that has elected a leader
/// at least once (a term above 0): then this node's empty store is a lost
/// disk, not a new group, and it must wait to be sent the log instead of
/// bootstrapping a second history. Unreachable peers say nothing.
pub async fn group_exists(peers: &[String], dialer: &raftmq_raft::tls::Dialer) -> bool {
    for addr in peers {
        let Ok(ep) = crate::client::channel::endpoint(addr, Duration::from_millis(500)) else {
            continue;
        };
        let call = async {
            let channel = crate::client::channel::lazy(ep.timeout(Duration::from_secs(1)), addr, dialer);
            crate::proto::pb::broker_client::BrokerClient::new(channel)
                .status(crate::proto::pb::StatusRequest { with_digest: false })
                .await
                .ok()
        };
        if let Ok(Some(s)) = tokio::time::timeout(Duration::from_secs(2), call).await
            && s.get_ref().term > 0
        {
            tracing::info!(peer = %addr, term = s.get_ref().term, "the group exists already: not bootstrapping");
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derive(text: &str, host: &str) -> Result<toml::Table, ConfigError> {
        let mut t: toml::Table = toml::from_str(text).unwrap();
        apply(&mut t, host)?;
        Ok(t)
    }

    #[test]
    fn the_host_name_decides_id_group_peers_and_bootstrap() {
        let t = derive("[identity]\nreplicas = 3\n", "broker-a-1").unwrap();
        assert_eq!(t["broker"].as_str(), Some("broker-a"));
        assert_eq!(t["node_id"].as_integer(), Some(2));
        assert_eq!(t["bootstrap"].as_bool(), Some(false));
        assert_eq!(t["advertise_client_addr"].as_str(), Some("broker-a-1.broker-a:8081"));
        let peers = t["peers"].as_table().unwrap();
        assert_eq!(peers.len(), 3);
        assert_eq!(peers["1"]["raft_addr"].as_str(), Some("broker-a-0.broker-a:9091"));
        let t = derive(
            "broker = \"g\"\n[identity]\nreplicas = 1\npeer_host = \"n{ordinal}.{group}.svc\"\n",
            "x-0.y",
        )
        .unwrap();
        assert_eq!(t["broker"].as_str(), Some("g"));
        assert_eq!(t["bootstrap"].as_bool(), Some(true));
        assert_eq!(t["peers"]["1"]["client_addr"].as_str(), Some("n0.g.svc:8081"));
    }

    #[test]
    fn conflicts_and_bad_host_names_are_explained() {
        let e = |text: &str, host: &str| derive(text, host).unwrap_err().to_string();
        assert!(e("node_id = 1\n[identity]\nreplicas = 3\n", "b-0").contains("node_id comes from the host name"));
        assert!(e("[identity]\nreplicas = 3\n", "laptop").contains("<name>-<ordinal>"));
        assert!(e("[identity]\nreplicas = 3\n", "b-3").contains("past [identity] replicas"));
        assert!(e("[identity]\nreplicas = 0\n", "b-0").contains("replicas must be"));
        assert!(e("[identity]\nreplicas = 3\nextra = 1\n", "b-0").contains("[identity]"));
        // Without [identity] nothing changes.
        assert_eq!(
            derive("node_id = 4\n", "whatever").unwrap()["node_id"].as_integer(),
            Some(4)
        );
    }
}
