//! `raftmq group connections`, `raftmq group status` and `raftmq topic
//! producers`: the RocketMQ clients connected to the cluster, as mqadmin's
//! `consumerConnection`, `consumerStatus` and `producerConnection` show
//! them.
//!
//! A client speaks to the nodes it has channels to, and each node knows
//! only those (`raftmq.v1.Broker/ListClients`), so every node the
//! NameServers list is asked, and one line is printed per client and node.
//! A node that does not answer is named on stderr; the others still count.

use std::time::Duration;

use super::connect::ask;
use crate::filter::Filter;
use crate::proto::pb;

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
    /// (topic, "TAG" or "SQL", expression), as its settings say.
    subscriptions: Vec<(String, String, String)>,
    /// Messages delivered to it and acknowledged by it through this node.
    received: u64,
    acked: u64,
    last_receive_ms_ago: Option<u64>,
    /// Its receives waiting on this node now.
    waiting_receives: u32,
}

/// Asks every node for its clients matching `filter`.
async fn gather(namesrv: &str, filter: pb::ListClientsRequest) -> anyhow::Result<Vec<Connection>> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let mut out = Vec::new();
    for n in info.nodes {
        let mut node = crate::cli::connect::broker(&n.client_addr)?;
        match tokio::time::timeout(Duration::from_secs(5), node.list_clients(filter.clone())).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                if r.truncated {
                    eprintln!(
                        "{} node {} ({}): more clients than one answer holds; some are not shown",
                        n.group, n.node_id, n.client_addr
                    );
                }
                out.extend(r.clients.into_iter().map(|c| {
                    Connection {
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
                        subscriptions: c
                            .subscriptions
                            .into_iter()
                            .map(|s| (s.topic, s.expression_type, s.expression))
                            .collect(),
                        received: c.received,
                        acked: c.acked,
                        last_receive_ms_ago: c.last_receive_ms_ago,
                        waiting_receives: c.waiting_receives,
                    }
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

/// A subscription as `group status` compares it: its topic and its filter
/// in canonical form, or the expression as written when it does not parse.
type Filtered = (String, Result<Filter, (String, String)>);

/// A client's subscriptions (topic, type, expression), in an order and
/// form two clients that subscribe alike share, however they wrote it
/// (`b || a` and `a||b`) and whichever node listed them.
fn filtered(subs: &[(String, String, String)]) -> Vec<Filtered> {
    let mut v: Vec<(String, String, String)> = subs.to_vec();
    v.sort();
    v.dedup();
    let mut out: Vec<Filtered> = Vec::with_capacity(v.len());
    for (topic, kind, expr) in v {
        let f = Filter::canonical(&kind, &expr).ok_or((kind, expr));
        if !out.iter().any(|(t, g)| *t == topic && *g == f) {
            out.push((topic, f));
        }
    }
    out
}

/// `raftmq group status` (mqadmin consumerStatus): each client of a
/// consumer group with what it subscribes to and what it consumed through
/// each node, and whether the group's clients agree on their
/// subscriptions (a receive moves the whole group past what its filter
/// refuses, so clients that subscribe differently miss messages).
pub async fn consumer_status(namesrv: &str, group: &str, json: bool) -> anyhow::Result<()> {
    crate::broker::pop::validate_group(group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
    let filter = pb::ListClientsRequest {
        group: group.to_string(),
        topic: String::new(),
    };
    let conns = gather(namesrv, filter).await?;
    let filters: Vec<Vec<Filtered>> = conns
        .iter()
        .filter(|c| !c.subscriptions.is_empty())
        .map(|c| filtered(&c.subscriptions))
        .collect();
    let consistent = filters.windows(2).all(|w| w[0] == w[1]);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "group": group,
                "subscriptions_consistent": consistent,
                "clients": conns,
            }))?
        );
        return Ok(());
    }
    if conns.is_empty() {
        println!("no client of consumer group {group} is connected");
        return Ok(());
    }
    println!(
        "{:<40} {:<16} {:<10} {:<12} {:>4} {:>9} {:>9} {:>7}  last received",
        "client id", "type", "language", "broker", "node", "received", "acked", "waiting"
    );
    for c in &conns {
        println!(
            "{:<40} {:<16} {:<10} {:<12} {:>4} {:>9} {:>9} {:>7}  {}",
            c.client_id,
            c.client_type,
            c.language,
            c.broker,
            c.node_id,
            c.received,
            c.acked,
            c.waiting_receives,
            c.last_receive_ms_ago.map_or("never".to_string(), |ms| format!(
                "{} ago",
                crate::cli::display::age(ms)
            )),
        );
        for (topic, kind, expr) in &c.subscriptions {
            println!("    subscribes to {topic} ({kind} {expr})");
        }
    }
    if consistent {
        println!("every client of {group} subscribes alike");
    } else {
        println!(
            "SUBSCRIPTIONS DIFFER between the clients of {group}: a receive moves the whole group past the \
             messages its own filter refuses, so the other clients never see them; give every client of a \
             group the same subscriptions"
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::filtered;

    fn subs(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        list.iter()
            .map(|(t, k, e)| (t.to_string(), k.to_string(), e.to_string()))
            .collect()
    }

    #[test]
    fn clients_that_subscribe_alike_agree_however_they_wrote_it() {
        let a = subs(&[("T", "TAG", "b || a"), ("U", "SQL", "x > 1")]);
        let b = subs(&[("U", "SQL", "x>1"), ("T", "TAG", "a||b"), ("T", "TAG", "b||a")]);
        assert_eq!(filtered(&a), filtered(&b));
        let c = subs(&[("T", "TAG", "a"), ("U", "SQL", "x > 1")]);
        assert_ne!(filtered(&a), filtered(&c));
        // An expression that does not parse is compared as written.
        let bad = subs(&[("T", "SQL", "x LIKE")]);
        assert_eq!(filtered(&bad), filtered(&bad));
        assert_ne!(filtered(&bad), filtered(&subs(&[("T", "SQL", "x  LIKE")])));
    }
}
