//! Routes in the client protocol: a topic's queues across every broker
//! group, each naming its group as the broker (id 0, the one clients write
//! to) with the client addresses of **every node** of the group, the
//! leader's first. Clients open one channel over all of them and use the
//! first that answers (the leader: no forwarding), so when a node dies the
//! channel moves to another, which forwards to the new leader: no route
//! refresh needed.
//!
//! Clients built on grpc-js (the Node.js client) cannot open one channel
//! over several addresses the same way: they join a group's `host:port`s
//! with `,` into a single gRPC target, which grpc-js would resolve as one
//! DNS name. For them ([`EndpointStyle::GrpcJsTarget`], told by grpc-js's
//! `user-agent: grpc-node-js/..`, or `x-mq-language: NODE_JS`; the Node.js
//! client 1.0.8 sends `HTTP` there) the first host carries gRPC's `ipv4:` (or
//! `ipv6:`) scheme, so the joined target is `ipv4:leader:p,node2:p,node3:p`:
//! a list grpc-js connects to in order, moving on when a node dies, which is
//! the failover the other clients get. Groups advertising DNS names get the
//! leader's address alone (a `dns:` target names one host).
//!
//! This node's own group comes from its replicated state (always current);
//! other groups from the NameServers, when configured. A topic that does
//! not exist yet is created on first use when `auto_create_topics` is on.

use std::net::IpAddr;
use std::time::Duration;

use raftmq_raft::TopicConfig;
use raftmq_raft::command::{MAX_QUEUES, PERM_READ, PERM_WRITE, TopicMessageType};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::service::*;
use crate::broker::{Broker, FORWARD_WAIT};
use crate::client::route_cache::{RouteCache, RouteError};
use crate::error::BrokerError;
use crate::proto::pb;
use crate::proto::rocketmq::v2;
use crate::proto::v2_message::{accepted_types, ok};

/// One group's share of a topic.
#[derive(Debug, Clone)]
pub struct GroupQueues {
    pub group: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: u32,
    pub message_type: TopicMessageType,
    /// Client addresses of the group's nodes.
    pub endpoints: Vec<String>,
}

/// The topic's queues in every group that has it; empty when none has it.
pub async fn groups_of(
    broker: &Broker,
    routes: Option<&RouteCache>,
    topic: &str,
) -> Result<Vec<GroupQueues>, BrokerError> {
    let mut groups = Vec::new();
    if let Some(t) = broker.node.sm.topic(topic) {
        groups.push(local(broker, &t));
    }
    if let Some(routes) = routes {
        match routes.route(topic).await {
            Ok(r) => groups.extend(
                r.groups
                    .into_iter()
                    .filter(|g| g.group != broker.cfg.group)
                    .filter_map(remote),
            ),
            Err(RouteError::NotFound(_)) => {}
            // The local group still serves; other groups are missing from
            // this answer until a NameServer answers again.
            Err(e) => tracing::warn!(topic, "route lookup failed: {e}"),
        }
    }
    Ok(groups)
}

fn local(broker: &Broker, t: &TopicConfig) -> GroupQueues {
    GroupQueues {
        group: broker.cfg.group.clone(),
        read_queues: t.read_queues,
        write_queues: t.write_queues,
        perm: t.perm & broker.route_perm_mask(),
        message_type: t.message_type,
        endpoints: broker.group_client_addrs(),
    }
}

fn remote(g: pb::GroupRoute) -> Option<GroupQueues> {
    let q = g.queues?;
    Some(GroupQueues {
        group: g.group,
        read_queues: q.read_queues,
        write_queues: q.write_queues,
        perm: q.perm,
        message_type: TopicMessageType::parse(&q.message_type).unwrap_or_default(),
        // The leader first, as for this node's own group.
        endpoints: {
            let mut nodes = g.nodes;
            nodes.sort_by_key(|n| !n.leader);
            nodes.into_iter().map(|n| n.client_addr).collect()
        },
    })
}

/// `host:port` addresses as v2 endpoints (IPv4, IPv6 or domain names, as
/// the first address is).
pub fn endpoints(addrs: &[String]) -> v2::Endpoints {
    let mut scheme = v2::AddressScheme::DomainName;
    let addresses = addrs
        .iter()
        .filter_map(|a| {
            let (host, port) = a.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(v2::Address {
                host: host.to_string(),
                port: port.parse().ok()?,
            })
        })
        .collect::<Vec<_>>();
    if let Some(first) = addresses.first() {
        scheme = match first.host.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => v2::AddressScheme::IPv4,
            Ok(IpAddr::V6(_)) => v2::AddressScheme::IPv6,
            Err(_) => v2::AddressScheme::DomainName,
        };
    }
    v2::Endpoints {
        scheme: scheme as i32,
        addresses,
    }
}

/// How a client turns a group's endpoints into a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointStyle {
    /// One channel over every address (the Java, Python, Go, Rust clients).
    AllNodes,
    /// The addresses joined with `,` into one grpc-js target.
    GrpcJsTarget,
    /// One address per queue, the group's nodes in turn (the leader
    /// first): over TLS, a client checks the server's certificate against
    /// its channel's target, and a multi-address target (`ipv4:a:p,b:p`)
    /// names no host a certificate can carry. A dead node then costs its
    /// queues until the next route refresh; producers retry on the next
    /// queue, which another node serves.
    OnePerQueue,
}

impl EndpointStyle {
    /// The style the calling client needs: what its gRPC library is.
    pub fn of(metadata: &tonic::metadata::MetadataMap, tls: bool) -> EndpointStyle {
        if tls {
            return EndpointStyle::OnePerQueue;
        }
        let grpc_js = crate::grpc::header(metadata, "user-agent").contains("grpc-node-js/");
        if grpc_js || crate::grpc::header(metadata, super::service::LANGUAGE).eq_ignore_ascii_case("NODE_JS") {
            EndpointStyle::GrpcJsTarget
        } else {
            EndpointStyle::AllNodes
        }
    }
}

/// [`endpoints`] shaped for `style` (see the module doc).
pub fn styled_endpoints(addrs: &[String], style: EndpointStyle) -> v2::Endpoints {
    let mut e = endpoints(addrs);
    if style != EndpointStyle::GrpcJsTarget || e.addresses.len() < 2 {
        return e;
    }
    let ips: Option<Vec<IpAddr>> = e.addresses.iter().map(|a| a.host.parse().ok()).collect();
    match ips.as_deref() {
        Some(ips) if ips.iter().all(IpAddr::is_ipv4) => e.addresses[0].host.insert_str(0, "ipv4:"),
        Some(ips) if ips.iter().all(IpAddr::is_ipv6) => {
            for a in &mut e.addresses {
                a.host = format!("[{}]", a.host);
            }
            e.addresses[0].host.insert_str(0, "ipv6:");
        }
        // A `dns:` target names one host: the leader's.
        _ => e.addresses.truncate(1),
    }
    e
}

/// Most queues one route answer names, over all its groups (64 groups of
/// 256 queues): the groups come from the NameServers, and without `[tls]`
/// anyone can announce a group there, so a flood of made-up groups must
/// not make an answer of millions of queues. This node's group comes
/// first, so its queues are always named.
pub const MAX_ROUTE_QUEUES: usize = 16 * 1024;

/// Every queue of every group as v2 message queues, at most
/// [`MAX_ROUTE_QUEUES`].
pub fn message_queues(topic: &v2::Resource, groups: &[GroupQueues], style: EndpointStyle) -> Vec<v2::MessageQueue> {
    let mut out = Vec::new();
    for g in groups {
        if out.len() >= MAX_ROUTE_QUEUES {
            // Said now and then, not on every route query of a flood.
            static CUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = CUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    topic = topic.name,
                    groups = groups.len(),
                    cut = n + 1,
                    "a route of more than {MAX_ROUTE_QUEUES} queues: the rest are left out"
                );
            }
            break;
        }
        let all = styled_endpoints(&g.endpoints, style);
        // The official clients refuse a domain-name endpoint of more than
        // one address ("Multiple addresses not allowed in domain schema").
        let by_name = all.scheme == v2::AddressScheme::DomainName as i32 && all.addresses.len() > 1;
        let per_queue = style == EndpointStyle::OnePerQueue || by_name;
        let broker_for = |queue: u32| v2::Broker {
            name: g.group.clone(),
            id: 0,
            endpoints: Some(if per_queue && !g.endpoints.is_empty() {
                endpoints(std::slice::from_ref(&g.endpoints[queue as usize % g.endpoints.len()]))
            } else {
                all.clone()
            }),
        };
        let accept: Vec<i32> = accepted_types(g.message_type).into_iter().map(|t| t as i32).collect();
        // Counts from other groups come from the NameServers: held to the
        // limit here too, whatever a NameServer let through.
        let room = (MAX_ROUTE_QUEUES - out.len()) as u32;
        for id in 0..g.read_queues.max(g.write_queues).min(MAX_QUEUES).min(room) {
            let read = id < g.read_queues && g.perm & PERM_READ != 0;
            let write = id < g.write_queues && g.perm & PERM_WRITE != 0;
            let permission = match (read, write) {
                (true, true) => v2::Permission::ReadWrite,
                (true, false) => v2::Permission::Read,
                (false, true) => v2::Permission::Write,
                (false, false) => v2::Permission::None,
            };
            out.push(v2::MessageQueue {
                topic: Some(topic.clone()),
                id: id as i32,
                permission: permission as i32,
                broker: Some(broker_for(id)),
                accept_message_types: accept.clone(),
            });
        }
    }
    out
}

// The RPCs: QueryRoute and QueryAssignment.

pub(super) async fn query_route(
    svc: &MessagingService,
    request: Request<v2::QueryRouteRequest>,
) -> Result<Response<v2::QueryRouteResponse>, Status> {
    let style = EndpointStyle::of(request.metadata(), svc.broker.cfg.tls.is_some());
    let req = request.into_inner();
    let out = async {
        let name = topic_name(req.topic.as_ref())?;
        let groups = route_groups(svc, &name).await?;
        let topic = req.topic.clone().unwrap_or_default();
        Ok::<_, BrokerError>(message_queues(&topic, &groups, style))
    }
    .await;
    Ok(Response::new(match out {
        Ok(message_queues) => v2::QueryRouteResponse {
            status: Some(ok()),
            message_queues,
        },
        Err(e) => v2::QueryRouteResponse {
            status: Some(e.v2_status()),
            message_queues: vec![],
        },
    }))
}

pub(super) async fn query_assignment(
    svc: &MessagingService,
    request: Request<v2::QueryAssignmentRequest>,
) -> Result<Response<v2::QueryAssignmentResponse>, Status> {
    let style = EndpointStyle::of(request.metadata(), svc.broker.cfg.tls.is_some());
    let req = request.into_inner();
    let out = async {
        group_name(req.group.as_ref())?;
        let name = topic_name(req.topic.as_ref())?;
        let groups = route_groups(svc, &name).await?;
        let topic = req.topic.clone().unwrap_or_default();
        Ok::<_, BrokerError>(
            message_queues(&topic, &groups, style)
                .into_iter()
                .filter(|q| {
                    q.permission == v2::Permission::Read as i32 || q.permission == v2::Permission::ReadWrite as i32
                })
                .map(|q| v2::Assignment { message_queue: Some(q) })
                .collect(),
        )
    }
    .await;
    Ok(Response::new(match out {
        Ok(assignments) => v2::QueryAssignmentResponse {
            status: Some(ok()),
            assignments,
        },
        Err(e) => v2::QueryAssignmentResponse {
            status: Some(e.v2_status()),
            assignments: vec![],
        },
    }))
}

async fn route_groups(svc: &MessagingService, topic: &str) -> Result<Vec<GroupQueues>, BrokerError> {
    let groups = groups_of(&svc.broker, svc.routes.as_ref(), topic).await?;
    if !groups.is_empty() {
        return Ok(groups);
    }
    if !svc.broker.live().auto_create_topics {
        return Err(BrokerError::TopicNotFound(topic.to_string()));
    }
    auto_create_topic(svc, topic).await?;
    groups_of(&svc.broker, svc.routes.as_ref(), topic).await
}

/// Creates a topic on first use (when `auto_create_topics` is on), on the
/// leader of this node's group.
async fn auto_create_topic(svc: &MessagingService, topic: &str) -> Result<(), BrokerError> {
    let queues = svc.broker.live().auto_create_topic_queues;
    match svc.broker.leader_client().await? {
        None => {
            svc.broker
                .put_topic_local(raftmq_raft::TopicConfig {
                    name: topic.to_string(),
                    read_queues: queues,
                    write_queues: queues,
                    perm: 6,
                    message_type: raftmq_raft::command::TopicMessageType::Mixed,
                })
                .await?
        }
        Some(mut c) => {
            c.put_topic(crate::proto::pb::PutTopicRequest {
                name: topic.to_string(),
                read_queues: queues,
                write_queues: queues,
                perm: 6,
                message_type: "MIXED".into(),
            })
            .await
            .map_err(BrokerError::from)?;
        }
    }
    tracing::info!(topic, queues, "created topic on first use");
    // Wait until this node has applied it.
    let deadline = Instant::now() + FORWARD_WAIT;
    let mut applied = svc.broker.node.sm.applied_watch();
    while svc.broker.node.sm.topic(topic).is_none() && Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(100), applied.changed()).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_and_endpoints() {
        let g = GroupQueues {
            group: "g1".into(),
            read_queues: 2,
            write_queues: 3,
            perm: 6,
            message_type: TopicMessageType::Fifo,
            endpoints: vec!["127.0.0.1:8081".into(), "127.0.0.1:8082".into()],
        };
        let topic = v2::Resource {
            resource_namespace: String::new(),
            name: "T".into(),
        };
        let q = message_queues(&topic, std::slice::from_ref(&g), EndpointStyle::AllNodes);
        assert_eq!(q.len(), 3);
        assert_eq!(q[0].permission, v2::Permission::ReadWrite as i32);
        assert_eq!(q[2].permission, v2::Permission::Write as i32);
        let b = q[0].broker.as_ref().unwrap();
        assert_eq!(b.id, 0);
        let e = b.endpoints.as_ref().unwrap();
        assert_eq!((e.scheme, e.addresses.len()), (v2::AddressScheme::IPv4 as i32, 2));
        assert_eq!(q[0].accept_message_types, vec![v2::MessageType::Fifo as i32]);
        assert_eq!(endpoints(&["[::1]:80".into()]).scheme, v2::AddressScheme::IPv6 as i32);
        assert_eq!(
            endpoints(&["broker-1:80".into()]).scheme,
            v2::AddressScheme::DomainName as i32
        );
        // grpc-js joins host:port with ',': the first host names the scheme.
        let js = |addrs: &[&str]| {
            let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            let e = styled_endpoints(&addrs, EndpointStyle::GrpcJsTarget);
            e.addresses
                .iter()
                .map(|a| format!("{}:{}", a.host, a.port))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(
            js(&["127.0.0.1:8081", "127.0.0.1:8082"]),
            "ipv4:127.0.0.1:8081,127.0.0.1:8082"
        );
        assert_eq!(js(&["[::1]:80", "[::2]:80"]), "ipv6:[::1]:80,[::2]:80");
        assert_eq!(js(&["127.0.0.1:8081"]), "127.0.0.1:8081");
        assert_eq!(js(&["b-0.b:8081", "b-1.b:8081"]), "b-0.b:8081");
        let q = message_queues(&topic, &[g], EndpointStyle::GrpcJsTarget);
        assert!(
            q[0].broker.as_ref().unwrap().endpoints.as_ref().unwrap().addresses[0]
                .host
                .starts_with("ipv4:")
        );
    }

    #[test]
    fn a_flood_of_announced_groups_makes_a_bounded_route_led_by_this_group() {
        let group = |i: usize| GroupQueues {
            group: format!("g{i}"),
            read_queues: u32::MAX,
            write_queues: u32::MAX,
            perm: 6,
            message_type: TopicMessageType::Normal,
            endpoints: vec![format!("10.0.0.{}:8081", i % 250)],
        };
        let groups: Vec<GroupQueues> = (0..100).map(group).collect();
        let topic = v2::Resource {
            resource_namespace: String::new(),
            name: "T".into(),
        };
        let q = message_queues(&topic, &groups, EndpointStyle::AllNodes);
        assert_eq!(q.len(), MAX_ROUTE_QUEUES);
        assert_eq!(
            q[0].broker.as_ref().unwrap().name,
            "g0",
            "the first group (this node's) leads"
        );
        assert_eq!(
            q.last().unwrap().broker.as_ref().unwrap().name,
            format!("g{}", MAX_ROUTE_QUEUES / MAX_QUEUES as usize - 1)
        );
    }

    #[test]
    fn one_address_per_queue_over_tls_and_for_domain_names() {
        let topic = v2::Resource {
            resource_namespace: String::new(),
            name: "T".into(),
        };
        let only = |q: &v2::MessageQueue| {
            let e = q.broker.as_ref().unwrap().endpoints.as_ref().unwrap();
            assert_eq!(e.addresses.len(), 1, "{e:?}");
            format!("{}:{}", e.addresses[0].host, e.addresses[0].port)
        };
        for (addrs, style) in [
            (
                ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
                EndpointStyle::OnePerQueue,
            ),
            (["b-0.b:1", "b-1.b:2", "b-2.b:3"], EndpointStyle::AllNodes),
        ] {
            let g = GroupQueues {
                group: "g1".into(),
                read_queues: 4,
                write_queues: 4,
                perm: 6,
                message_type: TopicMessageType::Normal,
                endpoints: addrs.iter().map(|a| a.to_string()).collect(),
            };
            let q = message_queues(&topic, &[g], style);
            let got: Vec<String> = q.iter().map(only).collect();
            assert_eq!(got, [addrs[0], addrs[1], addrs[2], addrs[0]]);
        }
    }
}
