//! Which node a certificate belongs to.
//!
//! A member's certificate carries one URI subject alternative name,
//! `raftmq://group/<group>/node/<node id>`, beside the DNS names and IP
//! addresses it is dialled at. The CA vouches for the whole certificate, so
//! a caller whose chain verified and whose URI names group `g` node `n`
//! *is* that node: the Raft port admits only members of its own group, and
//! the NameServer takes a heartbeat for a group and node only from that
//! node.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

/// The prefix of a member's URI name.
const PREFIX: &str = "raftmq://group/";

/// A member node as its certificate names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub group: String,
    pub node: u64,
}

impl std::fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {} node {}", self.group, self.node)
    }
}

/// The URI name a member's certificate carries.
pub fn node_uri(group: &str, node: u64) -> String {
    format!("{PREFIX}{group}/node/{node}")
}

fn parse_uri(uri: &str) -> Option<NodeIdentity> {
    let rest = uri.strip_prefix(PREFIX)?;
    let (group, node) = rest.rsplit_once("/node/")?;
    if group.is_empty() || group.contains('/') {
        return None;
    }
    Some(NodeIdentity {
        group: group.to_string(),
        node: node.parse().ok()?,
    })
}

/// The member a certificate names, if any. A certificate naming two is
/// refused: which one it is would be a guess.
pub fn of_cert(cert: &CertificateDer<'_>) -> Result<Option<NodeIdentity>, String> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert).map_err(|e| format!("the peer's certificate does not parse: {e}"))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| format!("the peer's certificate has a bad subject alternative name: {e}"))?;
    let mut found: Option<NodeIdentity> = None;
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        if let GeneralName::URI(uri) = name
            && uri.starts_with(PREFIX)
        {
            let id = parse_uri(uri)
                .ok_or_else(|| format!("the peer's certificate names {uri:?}, which is not a member's name"))?;
            if found.as_ref().is_some_and(|f| *f != id) {
                return Err("the peer's certificate names two members".into());
            }
            found = Some(id);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_strangers_do_not_parse() {
        let id = parse_uri(&node_uri("broker-a", 3)).unwrap();
        assert_eq!(
            id,
            NodeIdentity {
                group: "broker-a".into(),
                node: 3
            }
        );
        assert_eq!(parse_uri("raftmq://group//node/3"), None);
        assert_eq!(parse_uri("raftmq://group/a/b/node/3"), None);
        assert_eq!(parse_uri("raftmq://group/a/node/x"), None);
        assert_eq!(parse_uri("https://group/a/node/3"), None);
    }
}
