//! The NameServer's soft state: the latest heartbeat of every broker node,
//! and what follows from it (each group's leader, topic routes).
//!
//! Pure data with the time passed in, so the rules are unit-tested without
//! clocks: a node not heard from for the expiry is dropped; a group's leader
//! is the node claiming leadership with the highest Raft term, so a stale
//! claim from a cut-off old leader (lower term) never displaces the current
//! one.
//!
//! A node's entry keeps the addresses it registered with while it lives: a
//! heartbeat naming the same group and node id from other addresses is
//! refused until the entry expires or the node unregisters (which only the
//! node's own host may do), so a stray or forged heartbeat cannot point
//! clients away from a live node. Groups and nodes per group are bounded.
//! (Proving who sends a heartbeat at all is mutual TLS's job.)

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::proto::pb;

/// The roles a heartbeat may carry.
pub const ROLES: [&str; 4] = ["leader", "follower", "candidate", "learner"];
/// Most topics one heartbeat may carry.
pub const MAX_TOPICS: usize = 100_000;
/// Longest cluster or group name.
pub const MAX_NAME_LEN: usize = 127;
/// Most broker groups one NameServer tracks.
pub const MAX_GROUPS: usize = 10_000;
/// Most nodes one group may register (a Raft group has 3 or 5, and a few
/// more while members are replaced).
pub const MAX_NODES_PER_GROUP: usize = 16;

struct NodeState {
    hb: pb::BrokerHeartbeat,
    last_seen: Instant,
    /// Where its last heartbeat came from: the node's host when it
    /// advertises a DNS name rather than an IP.
    from: Option<IpAddr>,
}

/// (cluster, group)
type GroupKey = (String, String);

#[derive(Default)]
pub struct Registry {
    groups: BTreeMap<GroupKey, BTreeMap<u64, NodeState>>,
}

/// Why a heartbeat was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid heartbeat: {0}")]
pub struct InvalidHeartbeat(pub String);

pub fn validate(hb: &pb::BrokerHeartbeat) -> Result<(), InvalidHeartbeat> {
    let bad = |m: String| Err(InvalidHeartbeat(m));
    if hb.cluster.is_empty() || hb.group.is_empty() {
        return bad("cluster and group must not be empty".into());
    }
    if hb.cluster.len() > MAX_NAME_LEN || hb.group.len() > MAX_NAME_LEN {
        return bad(format!("cluster and group names are at most {MAX_NAME_LEN} bytes"));
    }
    if hb.topics.len() > MAX_TOPICS {
        return bad(format!(
            "{} topics: at most {MAX_TOPICS} in one heartbeat",
            hb.topics.len()
        ));
    }
    if !ROLES.contains(&hb.role.as_str()) {
        return bad(format!("role {:?} is not one of {ROLES:?}", hb.role));
    }
    for (what, addr) in [("client_addr", &hb.client_addr), ("raft_addr", &hb.raft_addr)] {
        // Host names too: nodes in Kubernetes or compose advertise their
        // DNS names (their IPs change when they are rescheduled).
        if !crate::client::channel::is_host_port(addr) {
            return bad(format!("{what} {addr:?} is not a host:port address"));
        }
    }
    let max = raftmq_raft::command::MAX_QUEUES;
    for t in &hb.topics {
        if let Err(e) = raftmq_store::queue_table::validate_topic(&t.name) {
            return bad(e.to_string());
        }
        // A route is built queue by queue: a forged count of 2^32 would make
        // every broker that answers a route for the topic allocate billions.
        if t.read_queues > max || t.write_queues > max {
            return bad(format!(
                "topic {}: {} read / {} write queues, at most {max}",
                t.name, t.read_queues, t.write_queues
            ));
        }
        if t.perm & !(raftmq_raft::command::PERM_READ | raftmq_raft::command::PERM_WRITE) != 0 {
            return bad(format!("topic {}: perm {} is not 2, 4 or 6", t.name, t.perm));
        }
        if !t.message_type.is_empty() && raftmq_raft::command::TopicMessageType::parse(&t.message_type).is_none() {
            return bad(format!("topic {}: unknown message type {:?}", t.name, t.message_type));
        }
    }
    Ok(())
}

impl Registry {
    /// Records a (validated) heartbeat. Returns whether the group's leader
    /// or the node's role changed (worth logging).
    /// Refused: a live node's entry at other addresses, or past the bounds
    /// on groups and nodes.
    pub fn heartbeat(
        &mut self,
        hb: pb::BrokerHeartbeat,
        from: Option<IpAddr>,
        now: Instant,
    ) -> Result<bool, InvalidHeartbeat> {
        let key = (hb.cluster.clone(), hb.group.clone());
        match self.groups.get(&key) {
            None if self.groups.len() >= MAX_GROUPS => {
                return Err(InvalidHeartbeat(format!(
                    "this NameServer tracks {MAX_GROUPS} groups already"
                )));
            }
            Some(g) => match g.get(&hb.node_id) {
                Some(n) if n.hb.client_addr != hb.client_addr || n.hb.raft_addr != hb.raft_addr => {
                    return Err(InvalidHeartbeat(format!(
                        "node {} of group {} is registered at {} (raft {}); it moves once it unregisters or its entry expires",
                        hb.node_id, hb.group, n.hb.client_addr, n.hb.raft_addr
                    )));
                }
                None if g.len() >= MAX_NODES_PER_GROUP => {
                    return Err(InvalidHeartbeat(format!(
                        "group {} has {MAX_NODES_PER_GROUP} nodes registered already",
                        hb.group
                    )));
                }
                _ => {}
            },
            None => {}
        }
        let leader_before = self.leader(&key);
        let group = self.groups.entry(key.clone()).or_default();
        let role_changed = group
            .get(&hb.node_id)
            .is_none_or(|n| n.hb.role != hb.role || n.hb.term != hb.term);
        group.insert(
            hb.node_id,
            NodeState {
                hb,
                last_seen: now,
                from,
            },
        );
        Ok(role_changed || self.leader(&key) != leader_before)
    }

    /// Drops a node's entry, if `from` (the caller's address, when known)
    /// is one of the node's own hosts.
    pub fn unregister(
        &mut self,
        cluster: &str,
        group: &str,
        node_id: u64,
        from: Option<IpAddr>,
    ) -> Result<bool, InvalidHeartbeat> {
        let key = (cluster.to_string(), group.to_string());
        let Some(g) = self.groups.get_mut(&key) else {
            return Ok(false);
        };
        if let (Some(ip), Some(n)) = (from, g.get(&node_id)) {
            let host = |a: &str| a.parse::<SocketAddr>().ok().map(|a| a.ip());
            if host(&n.hb.client_addr) != Some(ip) && host(&n.hb.raft_addr) != Some(ip) && n.from != Some(ip) {
                return Err(InvalidHeartbeat(format!(
                    "node {node_id} of group {group} is registered at {}: only its host unregisters it",
                    n.hb.client_addr
                )));
            }
        }
        let removed = g.remove(&node_id).is_some();
        if g.is_empty() {
            self.groups.remove(&key);
        }
        Ok(removed)
    }

    /// Drops nodes not heard from for `max_age`; returns them.
    pub fn expire(&mut self, now: Instant, max_age: Duration) -> Vec<(String, String, u64)> {
        let mut gone = Vec::new();
        for ((cluster, group), nodes) in &mut self.groups {
            nodes.retain(|&id, n| {
                let keep = now.saturating_duration_since(n.last_seen) <= max_age;
                if !keep {
                    gone.push((cluster.clone(), group.clone(), id));
                }
                keep
            });
        }
        self.groups.retain(|_, nodes| !nodes.is_empty());
        gone
    }

    /// The group's leader: the leadership claim with the highest term.
    pub fn leader(&self, key: &GroupKey) -> Option<(u64, u64)> {
        self.groups
            .get(key)?
            .values()
            .filter(|n| n.hb.role == "leader")
            .map(|n| (n.hb.node_id, n.hb.term))
            .max_by_key(|&(id, term)| (term, std::cmp::Reverse(id)))
    }

    /// The topics a group reports, from its most up-to-date node.
    fn topics(nodes: &BTreeMap<u64, NodeState>) -> &[pb::TopicData] {
        nodes
            .values()
            .max_by_key(|n| (n.hb.term, n.hb.applied_index))
            .map_or(&[], |n| &n.hb.topics[..])
    }

    pub fn route(&self, topic: &str) -> Option<pb::RouteResponse> {
        let mut groups = Vec::new();
        for (key, nodes) in &self.groups {
            let Some(queues) = Self::topics(nodes).iter().find(|t| t.name == topic) else {
                continue;
            };
            let leader = self.leader(key);
            groups.push(pb::GroupRoute {
                cluster: key.0.clone(),
                group: key.1.clone(),
                queues: Some(queues.clone()),
                nodes: nodes
                    .values()
                    .map(|n| pb::NodeRoute {
                        node_id: n.hb.node_id,
                        client_addr: n.hb.client_addr.clone(),
                        raft_addr: n.hb.raft_addr.clone(),
                        leader: leader.map(|l| l.0) == Some(n.hb.node_id),
                    })
                    .collect(),
                leader_id: leader.map(|l| l.0),
                leader_term: leader.map_or(0, |l| l.1),
            });
        }
        (!groups.is_empty()).then(|| pb::RouteResponse {
            topic: topic.to_string(),
            groups,
        })
    }

    pub fn cluster_info(&self, now: Instant) -> pb::ClusterInfo {
        let mut nodes = Vec::new();
        for (key, group) in &self.groups {
            let leader = self.leader(key).map(|l| l.0);
            for n in group.values() {
                let hb = &n.hb;
                nodes.push(pb::NodeInfo {
                    cluster: hb.cluster.clone(),
                    group: hb.group.clone(),
                    node_id: hb.node_id,
                    role: hb.role.clone(),
                    term: hb.term,
                    client_addr: hb.client_addr.clone(),
                    raft_addr: hb.raft_addr.clone(),
                    commit_index: hb.commit_index,
                    applied_index: hb.applied_index,
                    pid: hb.pid,
                    last_heartbeat_ms: now.saturating_duration_since(n.last_seen).as_millis() as u64,
                    is_group_leader: leader == Some(hb.node_id),
                });
            }
        }
        pb::ClusterInfo { nodes }
    }

    pub fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .groups
            .values()
            .flat_map(|nodes| Self::topics(nodes).iter().map(|t| t.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(node: u64, role: &str, term: u64) -> pb::BrokerHeartbeat {
        pb::BrokerHeartbeat {
            cluster: "c".into(),
            group: "g".into(),
            node_id: node,
            role: role.into(),
            term,
            client_addr: format!("127.0.0.1:{}", 8080 + node),
            raft_addr: format!("127.0.0.1:{}", 9090 + node),
            topics: vec![pb::TopicData {
                name: "T".into(),
                read_queues: 4,
                write_queues: 4,
                perm: 6,
                message_type: String::new(),
            }],
            ..Default::default()
        }
    }

    fn key() -> GroupKey {
        ("c".into(), "g".into())
    }

    #[test]
    fn the_highest_term_claim_leads_and_a_stale_one_never_replaces_it() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        r.heartbeat(hb(1, "leader", 3), None, t0).unwrap();
        r.heartbeat(hb(2, "follower", 3), None, t0).unwrap();
        assert_eq!(r.leader(&key()), Some((1, 3)));
        // Node 3 wins term 4; node 1, cut off, still claims term 3.
        r.heartbeat(hb(3, "leader", 4), None, t0).unwrap();
        assert_eq!(r.leader(&key()), Some((3, 4)));
        r.heartbeat(hb(1, "leader", 3), None, t0 + Duration::from_secs(1))
            .unwrap();
        assert_eq!(r.leader(&key()), Some((3, 4)), "a lower-term claim must not win");
        let route = r.route("T").unwrap();
        assert_eq!(route.groups[0].leader_id, Some(3));
        assert_eq!(route.groups[0].nodes.iter().filter(|n| n.leader).count(), 1);
        assert!(r.route("Nope").is_none());
        assert_eq!(r.topic_names(), vec!["T".to_string()]);
    }

    #[test]
    fn silent_nodes_expire_and_unregister_is_immediate() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        r.heartbeat(hb(1, "leader", 1), None, t0).unwrap();
        r.heartbeat(hb(2, "follower", 1), None, t0 + Duration::from_secs(100))
            .unwrap();
        let gone = r.expire(t0 + Duration::from_secs(121), Duration::from_secs(120));
        assert_eq!(gone, vec![("c".into(), "g".into(), 1)]);
        assert_eq!(r.leader(&key()), None);
        // Only the node's own host unregisters it.
        assert!(r.unregister("c", "g", 2, Some(IpAddr::from([10, 0, 0, 9]))).is_err());
        assert!(r.unregister("c", "g", 2, Some(IpAddr::from([127, 0, 0, 1]))).unwrap());
        assert!(r.cluster_info(t0).nodes.is_empty());
    }

    #[test]
    fn a_node_advertising_a_dns_name_unregisters_from_where_it_heartbeats() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        let mut named = hb(1, "leader", 1);
        named.client_addr = "broker-a-0.broker-a:8081".into();
        named.raft_addr = "broker-a-0.broker-a:9091".into();
        assert!(validate(&named).is_ok());
        r.heartbeat(named, Some(IpAddr::from([10, 1, 2, 3])), t0).unwrap();
        assert!(r.unregister("c", "g", 1, Some(IpAddr::from([10, 9, 9, 9]))).is_err());
        assert!(r.unregister("c", "g", 1, Some(IpAddr::from([10, 1, 2, 3]))).unwrap());
    }

    #[test]
    fn a_live_node_keeps_its_addresses_and_groups_are_bounded() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        r.heartbeat(hb(1, "leader", 1), None, t0).unwrap();
        let mut moved = hb(1, "leader", 9);
        moved.client_addr = "10.9.9.9:8081".into();
        assert!(
            r.heartbeat(moved.clone(), None, t0)
                .unwrap_err()
                .to_string()
                .contains("registered at")
        );
        assert_eq!(r.leader(&key()), Some((1, 1)));
        // Once the old entry is gone, the node may come back elsewhere.
        r.expire(t0 + Duration::from_secs(200), Duration::from_secs(120));
        r.heartbeat(moved, None, t0 + Duration::from_secs(200)).unwrap();
        for n in 2..=MAX_NODES_PER_GROUP as u64 {
            r.heartbeat(hb(n, "follower", 9), None, t0).unwrap();
        }
        assert!(
            r.heartbeat(hb(99, "leader", 99), None, t0).is_err(),
            "past the nodes a group may have"
        );
    }

    #[test]
    fn malformed_heartbeats_are_refused_with_the_reason() {
        let mut h = hb(1, "boss", 1);
        assert!(validate(&h).unwrap_err().to_string().contains("role"));
        h.role = "leader".into();
        h.client_addr = "nowhere".into();
        assert!(validate(&h).unwrap_err().to_string().contains("client_addr"));
        let mut h = hb(1, "leader", 1);
        h.topics[0].name = "bad/name".into();
        assert!(validate(&h).is_err());
        assert!(validate(&hb(1, "leader", 1)).is_ok());
    }
}
