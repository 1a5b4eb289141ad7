//! `raftmq cluster status` and `raftmq topic ...`: administration through
//! the NameServers (which know every group and its leader) and the groups'
//! broker services.

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use raftmq_raft::command::TopicMessageType;
use serde::Serialize;
use tonic::transport::Channel;

use crate::pb;
use crate::pb::broker_client::BrokerClient;
use crate::pb::name_server_client::NameServerClient;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Every group and node as the NameServer sees them.
    Status {
        /// NameServer addresses, comma separated.
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// Print JSON ({"nodes": [...]}) for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic in every group (or one, with --group).
    Create(TopicArgs),
    /// Change a topic's queue count or permission.
    Update(TopicArgs),
    /// Delete a topic and its queues.
    Delete {
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        group: Option<String>,
    },
    /// List the topics the NameServer knows.
    List {
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
    },
    /// Show a topic's route: groups, queues, nodes and leaders.
    Route {
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConsumerGroupCommand {
    /// Create a consumer group in every broker group (or one, with --group).
    Create(ConsumerGroupArgs),
    /// Change a consumer group's settings.
    Update(ConsumerGroupArgs),
}

#[derive(Debug, clap::Args)]
pub struct ConsumerGroupArgs {
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// Consumer group name: letters, digits, '%', '|', '_' and '-'.
    #[arg(long = "name")]
    name: String,
    /// Deliver each queue in order: a queue's next message only after the
    /// previous one is acknowledged (FIFO consumption).
    #[arg(long)]
    fifo: bool,
    /// Deliveries before a message moves to %DLQ%<name> (default: the
    /// broker's max_delivery_attempts, 16).
    #[arg(long, default_value_t = 0)]
    max_attempts: u32,
    /// Only this broker group.
    #[arg(long)]
    group: Option<String>,
}

pub async fn run_consumer_group(cmd: ConsumerGroupCommand) -> anyhow::Result<()> {
    let (ConsumerGroupCommand::Create(a) | ConsumerGroupCommand::Update(a)) = cmd;
    raftmq_store::queue_table::validate_topic(&a.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    for (group, addr) in group_endpoints(&a.namesrv, a.group.as_deref()).await? {
        BrokerClient::new(channel(&addr)?)
            .put_consumer_group(pb::PutConsumerGroupRequest {
                name: a.name.clone(),
                fifo: a.fifo,
                max_delivery_attempts: a.max_attempts,
            })
            .await
            .map_err(|s| anyhow::anyhow!("group {group}: {}", s.message()))?;
        println!(
            "consumer group {} in broker group {group}: {}{}",
            a.name,
            if a.fifo { "FIFO" } else { "concurrent" },
            if a.max_attempts > 0 {
                format!(", at most {} deliveries", a.max_attempts)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// Topic name: letters, digits, '%', '|', '_' and '-', at most 127 characters.
    #[arg(long)]
    topic: String,
    /// Read and write queue count.
    #[arg(long, default_value_t = 8)]
    queues: u32,
    /// 2 = write, 4 = read, 6 = both.
    #[arg(long, default_value_t = 6)]
    perm: u32,
    /// What the topic accepts: NORMAL, FIFO, DELAY, TRANSACTION or MIXED.
    #[arg(long, default_value = "NORMAL")]
    message_type: String,
    /// Only this group.
    #[arg(long)]
    group: Option<String>,
}

fn channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(crate::channel::endpoint(addr, Duration::from_secs(3))
        .map_err(anyhow::Error::msg)?
        .timeout(Duration::from_secs(10))
        .connect_lazy())
}

/// Calls the first NameServer of the list that answers.
async fn ask<T, F, Fut>(namesrv: &str, call: F) -> anyhow::Result<T>
where
    F: Fn(NameServerClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut last = None;
    for addr in namesrv.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match call(NameServerClient::new(channel(addr)?)).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if matches!(s.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument) => {
                bail!("{}", s.message())
            }
            Err(s) => last = Some(format!("{addr}: {}", s.message())),
        }
    }
    bail!(
        "no NameServer answered ({}); is one running and is --namesrv right?",
        last.unwrap_or_else(|| "none given".into())
    )
}

#[derive(Serialize)]
struct NodeJson {
    cluster: String,
    group: String,
    node_id: u64,
    role: String,
    term: u64,
    client_addr: String,
    raft_addr: String,
    commit_index: u64,
    applied_index: u64,
    pid: u32,
    last_heartbeat_ms: u64,
    /// The group's leader by the NameServer's judgement (highest term claim).
    is_group_leader: bool,
}

pub async fn run_cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Status { namesrv, json } = cmd;
    let info = ask(&namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    if json {
        let nodes: Vec<NodeJson> = info
            .nodes
            .into_iter()
            .map(|n| NodeJson {
                cluster: n.cluster,
                group: n.group,
                node_id: n.node_id,
                role: n.role,
                term: n.term,
                client_addr: n.client_addr,
                raft_addr: n.raft_addr,
                commit_index: n.commit_index,
                applied_index: n.applied_index,
                pid: n.pid,
                is_group_leader: n.is_group_leader,
                last_heartbeat_ms: n.last_heartbeat_ms,
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))?
        );
        return Ok(());
    }
    if info.nodes.is_empty() {
        println!("no broker has registered");
    }
    println!(
        "{:<14} {:<10} {:>4} {:<9} {:>5} {:<21} {:<21} {:>9} {:>9} {:>8} {:>8}",
        "cluster", "group", "node", "role", "term", "client", "raft", "commit", "applied", "pid", "hb age"
    );
    for n in info.nodes {
        println!(
            "{:<14} {:<10} {:>4} {:<9} {:>5} {:<21} {:<21} {:>9} {:>9} {:>8} {:>7.1}s",
            n.cluster,
            n.group,
            n.node_id,
            // A dead or cut-off old leader keeps its claim until it expires;
            // the NameServer routes to the highest-term claim only.
            if n.role == "leader" && !n.is_group_leader {
                "stale-ldr".to_string()
            } else {
                n.role.clone()
            },
            n.term,
            n.client_addr,
            n.raft_addr,
            n.commit_index,
            n.applied_index,
            n.pid,
            n.last_heartbeat_ms as f64 / 1000.0
        );
    }
    Ok(())
}

/// The client address of each group's leader (or any node: followers
/// forward), optionally only `only`.
async fn group_endpoints(namesrv: &str, only: Option<&str>) -> anyhow::Result<Vec<(String, String)>> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let mut groups: std::collections::BTreeMap<String, String> = Default::default();
    for n in info.nodes {
        if only.is_some_and(|g| g != n.group) {
            continue;
        }
        if n.is_group_leader || !groups.contains_key(&n.group) {
            groups.insert(n.group.clone(), n.client_addr.clone());
        }
    }
    if groups.is_empty() {
        bail!(
            "no broker group{} is registered with the NameServer",
            only.map(|g| format!(" named {g}")).unwrap_or_default()
        );
    }
    Ok(groups.into_iter().collect())
}

pub async fn run_topic(cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Create(a) | TopicCommand::Update(a) => {
            raftmq_store::queue_table::validate_topic(&a.topic)?;
            if TopicMessageType::parse(&a.message_type).is_none() {
                anyhow::bail!(
                    "--message-type {}: expected NORMAL, FIFO, DELAY, TRANSACTION or MIXED",
                    a.message_type
                );
            }
            for (group, addr) in group_endpoints(&a.namesrv, a.group.as_deref()).await? {
                BrokerClient::new(channel(&addr)?)
                    .put_topic(pb::PutTopicRequest {
                        name: a.topic.clone(),
                        read_queues: a.queues,
                        write_queues: a.queues,
                        perm: a.perm,
                        message_type: a.message_type.clone(),
                    })
                    .await
                    .map_err(|s| anyhow::anyhow!("group {group}: {}", s.message()))?;
                println!(
                    "topic {} in group {group}: {} queues, perm {}, {} messages",
                    a.topic,
                    a.queues,
                    a.perm,
                    a.message_type.to_ascii_uppercase()
                );
            }
        }
        TopicCommand::Delete { namesrv, topic, group } => {
            raftmq_store::queue_table::validate_topic(&topic)?;
            for (g, addr) in group_endpoints(&namesrv, group.as_deref()).await? {
                BrokerClient::new(channel(&addr)?)
                    .delete_topic(pb::DeleteTopicRequest { name: topic.clone() })
                    .await
                    .map_err(|s| anyhow::anyhow!("group {g}: {}", s.message()))?;
                println!("topic {topic} deleted in group {g}");
            }
        }
        TopicCommand::List { namesrv } => {
            let list = ask(&namesrv, |mut c| async move {
                c.list_topics(pb::ListTopicsRequest {}).await
            })
            .await?;
            for t in list.topics {
                println!("{t}");
            }
        }
        TopicCommand::Route { namesrv, topic, json } => {
            raftmq_store::queue_table::validate_topic(&topic)?;
            let t = topic.clone();
            let route = ask(&namesrv, move |mut c| {
                let topic = t.clone();
                async move { c.get_route(pb::RouteRequest { topic }).await }
            })
            .await?;
            if json {
                let groups: Vec<_> = route
                    .groups
                    .iter()
                    .map(|g| {
                        let q = g.queues.clone().unwrap_or_default();
                        serde_json::json!({
                            "cluster": g.cluster, "group": g.group,
                            "read_queues": q.read_queues, "write_queues": q.write_queues, "perm": q.perm,
                            "leader_id": g.leader_id, "leader_term": g.leader_term,
                            "nodes": g.nodes.iter().map(|n| serde_json::json!({
                                "node_id": n.node_id, "client_addr": n.client_addr,
                                "raft_addr": n.raft_addr, "leader": n.leader})).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "topic": topic, "groups": groups }))?
                );
            } else {
                for g in route.groups {
                    let q = g.queues.unwrap_or_default();
                    println!(
                        "{}/{}: {} read / {} write queues, perm {}, leader {}",
                        g.cluster,
                        g.group,
                        q.read_queues,
                        q.write_queues,
                        q.perm,
                        g.leader_id
                            .map_or("none".into(), |l| format!("node {l} (term {})", g.leader_term))
                    );
                    for n in g.nodes {
                        println!(
                            "  node {}  {}{}",
                            n.node_id,
                            n.client_addr,
                            if n.leader { "  leader" } else { "" }
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
