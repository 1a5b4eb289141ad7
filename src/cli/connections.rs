//! `raftmq group connections` and `raftmq topic producers`: the RocketMQ
//! clients connected to the cluster, as mqadmin's `consumerConnection` and
//! `producerConnection` show them.
//!
//! A client speaks to the nodes it has channels to, and each node knows
//! only those (`raftmq.v1.Broker/ListClients`), so every node the
//! NameServers list is asked, and one line is printed per client and node.
//! A node that does not answer is named on stderr; the others still count.

use std::time::Duration;

use super::connect::{ask, channel};
use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;

/// A client as one node sees it.
#[derive(Debug, serde::Serialize)]
struct Connection {
    broker: String,
    node_id: u64,
    client_id: String,
    client_type: String,
    group: String,
    language: String,
    version: String,
    address: String,
    last_heartbeat_ms_ago: u64,
    topics: Vec<String>,
    telemetry: bool,
}

/// Asks every node for its clients matching `filter`.
async fn gather(namesrv: &str, filter: pb::ListClientsRequest) -> anyhow::Result<Vec<Connection>> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let mut out = Vec::new();
    for n in info.nodes {
        let mut node = BrokerClient::new(channel(&n.client_addr)?);
        match tokio::time::timeout(Duration::from_secs(5), node.list_clients(filter.clone())).await {
            Ok(Ok(r)) => {
                out.extend(r.into_inner().clients.into_iter().map(|c| Connection {
                    broker: n.group.clone(),
                    node_id: n.node_id,
                    client_id: c.client_id,
                    client_type: c.client_type,
                    group: c.group,
                    language: c.language,
                    version: c.version,
                    address: c.address,
                    last_heartbeat_ms_ago: c.last_heartbeat_ms_ago,
                    topics: c.topics,
                    telemetry: c.telemetry,
                }));
            }
            Ok(Err(s)) => eprintln!("{} node {} ({}): {}", n.group, n.node_id, n.client_addr, s.message()),
            Err(_) => eprintln!(
                "{} node {} ({}): no answer within 5 s",
                n.group, n.node_id, n.client_addr
            ),
        }
    }
    out.sort_by(|a, b| (&a.client_id, &a.broker, a.node_id).cmp(&(&b.client_id, &b.broker, b.node_id)));
    Ok(out)
}

fn print(conns: &[Connection], json: bool, none: &str) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "connections": conns }))?
        );
        return Ok(());
    }
    if conns.is_empty() {
        println!("{none}");
        return Ok(());
    }
    println!(
        "{:<40} {:<16} {:<10} {:<10} {:<16} {:<12} {:>6}  last heartbeat",
        "client id", "type", "language", "version", "address", "broker", "node"
    );
    for c in conns {
        println!(
            "{:<40} {:<16} {:<10} {:<10} {:<16} {:<12} {:>6}  {}",
            c.client_id,
            c.client_type,
            c.language,
            c.version,
            c.address,
            c.broker,
            c.node_id,
            crate::cli::display::age(c.last_heartbeat_ms_ago)
        );
    }
    Ok(())
}

/// `raftmq group connections`: the clients of a consumer group.
pub async fn consumers(namesrv: &str, group: &str, json: bool) -> anyhow::Result<()> {
    crate::broker::pop::validate_group(group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
    let filter = pb::ListClientsRequest {
        group: group.to_string(),
        topic: String::new(),
    };
    let conns = gather(namesrv, filter).await?;
    print(
        &conns,
        json,
        &format!("no client of consumer group {group} is connected"),
    )
}

/// `raftmq topic producers`: the producers that publish to a topic.
pub async fn producers(namesrv: &str, topic: &str, json: bool) -> anyhow::Result<()> {
    raftmq_store::queue_table::validate_topic(topic)?;
    let filter = pb::ListClientsRequest {
        group: String::new(),
        topic: topic.to_string(),
    };
    let conns = gather(namesrv, filter).await?;
    print(&conns, json, &format!("no producer of topic {topic} is connected"))
}
