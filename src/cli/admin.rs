//! `raftmq cluster status` and `raftmq topic ...`: administration through
//! the NameServers (which know every group and its leader) and the groups'
//! broker services.

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use raftmq_raft::command::TopicMessageType;

use super::connect::{ask, broker_client, group_endpoints};
use crate::proto::pb;

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
    /// Make another node of a broker group its leader.
    TransferLeader {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The broker group.
        #[arg(long)]
        broker: String,
        /// The node to lead.
        #[arg(long)]
        to: u64,
    },
    /// Add a node to a broker group (start it first, without bootstrap).
    AddNode {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The broker group.
        #[arg(long)]
        broker: String,
        /// The node id within the broker group.
        #[arg(long)]
        node_id: u64,
        /// The new node's Raft address (host:port).
        #[arg(long)]
        raft_addr: String,
        /// The new node's client address (host:port).
        #[arg(long)]
        client_addr: String,
    },
    /// Restart every node of a broker group, one at a time: followers
    /// first, each back and caught up before the next, then the leader
    /// after leadership moved away.
    RollingRestart(super::rolling::RollingArgs),
    /// Show a broker group's config in force, node by node (mqadmin
    /// getBrokerConfig); `*` marks the keys update-config can change.
    GetConfig(super::broker_config::GetConfigArgs),
    /// Change a key at run time on every node of a broker group (or one),
    /// until they restart (mqadmin updateBrokerConfig).
    UpdateConfig(super::broker_config::UpdateConfigArgs),
    /// Take a broker group out of producers' sends for maintenance: routes
    /// show its queues read-only, consumers go on (mqadmin wipeWritePerm).
    WipeWritePerm(super::broker_config::WritePermArgs),
    /// Let producers send to a broker group again (mqadmin addWritePerm).
    AddWritePerm(super::broker_config::WritePermArgs),
    /// Show or change a broker group's deduplication window: how long and
    /// how many message ids it keeps so that a producer's retry is stored
    /// once.
    Dedup(super::broker_config::DedupArgs),
    /// Remove a node from a broker group.
    RemoveNode {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The broker group.
        #[arg(long)]
        broker: String,
        /// The node id within the broker group.
        #[arg(long)]
        node_id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic in every broker group (or one, with --broker); refused
    /// where it exists already.
    Create(TopicArgs),
    /// Change a topic's queue count, permission or message type: only what
    /// is given changes.
    Update(TopicUpdateArgs),
    /// Delete a topic and its queues.
    Delete {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Only this broker group.
        #[arg(long)]
        broker: Option<String>,
    },
    /// List the topics the NameServer knows.
    List {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
    },
    /// The producers publishing to a topic, on every node they speak to.
    Producers {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Each queue of a topic in every broker group: first and end offset,
    /// and when its last message was stored (mqadmin topicStatus).
    Status {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Show a topic's route: groups, queues, nodes and leaders.
    Route {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
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
    /// Only this broker group.
    #[arg(long)]
    broker: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct TopicUpdateArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// The topic to change.
    #[arg(long)]
    topic: String,
    /// New read and write queue count (unchanged if not given).
    #[arg(long)]
    queues: Option<u32>,
    /// New permission: 2 = write, 4 = read, 6 = both (unchanged if not given).
    #[arg(long)]
    perm: Option<u32>,
    /// New message type: NORMAL, FIFO, DELAY, TRANSACTION or MIXED
    /// (unchanged if not given).
    #[arg(long)]
    message_type: Option<String>,
    /// Only this broker group.
    #[arg(long)]
    broker: Option<String>,
}

fn check_message_type(t: &str) -> anyhow::Result<()> {
    if TopicMessageType::parse(t).is_none() {
        bail!("--message-type {t}: expected NORMAL, FIFO, DELAY, TRANSACTION or MIXED");
    }
    Ok(())
}

/// The topic's config in a group, read from its leader; `None` if it has
/// no such topic.
async fn current_topic(addr: &str, topic: &str) -> anyhow::Result<Option<pb::TopicData>> {
    match crate::cli::connect::broker(addr)?
        .get_topic(pb::GetTopicRequest {
            name: topic.to_string(),
        })
        .await
    {
        Ok(t) => Ok(Some(t.into_inner())),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(anyhow::anyhow!("{}", s.message())),
    }
}

/// Creates or replaces a topic's config in one broker group.
async fn put_topic(group: &str, addr: &str, t: &pb::TopicData) -> anyhow::Result<()> {
    crate::cli::connect::broker(addr)?
        .put_topic(pb::PutTopicRequest {
            name: t.name.clone(),
            read_queues: t.read_queues,
            write_queues: t.write_queues,
            perm: t.perm,
            message_type: t.message_type.clone(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("group {group}: {}", s.message()))?;
    Ok(())
}

fn describe_topic(t: &pb::TopicData) -> String {
    format!(
        "{} queues, perm {}, {} messages",
        t.write_queues.max(t.read_queues),
        t.perm,
        t.message_type
    )
}

pub async fn run_cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    let (namesrv, json) = match cmd {
        ClusterCommand::Status { namesrv, json } => (namesrv, json),
        ClusterCommand::TransferLeader { namesrv, broker, to } => {
            // Checked before anything moves: a refused transfer changes nothing.
            let info = ask(&namesrv, |mut c| async move {
                c.get_cluster_info(pb::ClusterInfoRequest {}).await
            })
            .await?;
            let addr = info
                .nodes
                .iter()
                .find(|n| n.group == broker && n.node_id == to)
                .map(|n| n.client_addr.clone())
                .ok_or_else(|| anyhow::anyhow!("broker group {broker} has no node {to}"))?;
            broker_client(&namesrv, &broker)
                .await?
                .transfer_leader(pb::TransferLeaderToRequest { node_id: to })
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            // The call starts the transfer; wait for the node to take over.
            let mut node = crate::cli::connect::broker(&addr)?;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(s) = node.status(pb::StatusRequest { with_digest: false }).await
                    && s.get_ref().role == "leader"
                {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    bail!("node {to} did not become the leader within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            println!("broker group {broker}: node {to} is the leader");
            return Ok(());
        }
        ClusterCommand::AddNode {
            namesrv,
            broker,
            node_id,
            raft_addr,
            client_addr,
        } => {
            broker_client(&namesrv, &broker)
                .await?
                .add_node(pb::AddNodeRequest {
                    node_id,
                    raft_addr,
                    client_addr,
                })
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            println!("broker group {broker}: node {node_id} added as a voter");
            return Ok(());
        }
        ClusterCommand::RollingRestart(a) => return super::rolling::run(a).await,
        ClusterCommand::GetConfig(a) => return super::broker_config::get(a).await,
        ClusterCommand::UpdateConfig(a) => return super::broker_config::update(a).await,
        ClusterCommand::WipeWritePerm(a) => return super::broker_config::set_writable(a, false).await,
        ClusterCommand::AddWritePerm(a) => return super::broker_config::set_writable(a, true).await,
        ClusterCommand::Dedup(a) => return super::broker_config::dedup(a).await,
        ClusterCommand::RemoveNode {
            namesrv,
            broker,
            node_id,
        } => {
            broker_client(&namesrv, &broker)
                .await?
                .remove_node(pb::RemoveNodeRequest { node_id })
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            println!("broker group {broker}: node {node_id} removed");
            return Ok(());
        }
    };
    super::status::run(&namesrv, json).await
}

pub async fn run_topic(cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Create(a) => {
            raftmq_store::queue_table::validate_topic(&a.topic)?;
            check_message_type(&a.message_type)?;
            let groups = group_endpoints(&a.namesrv, a.broker.as_deref()).await?;
            // Refused before anything changes, in every group.
            for (group, addr) in &groups {
                if let Some(t) = current_topic(addr, &a.topic)
                    .await
                    .map_err(|e| anyhow::anyhow!("group {group}: {e}"))?
                {
                    bail!(
                        "topic {} exists in group {group} ({}); change it with `raftmq topic update`",
                        a.topic,
                        describe_topic(&t)
                    );
                }
            }
            let t = pb::TopicData {
                name: a.topic.clone(),
                read_queues: a.queues,
                write_queues: a.queues,
                perm: a.perm,
                message_type: a.message_type.clone(),
            };
            for (group, addr) in groups {
                put_topic(&group, &addr, &t).await?;
                println!(
                    "topic {} in group {group}: {} queues, perm {}, {} messages",
                    a.topic,
                    a.queues,
                    a.perm,
                    a.message_type.to_ascii_uppercase()
                );
            }
        }
        TopicCommand::Update(a) => {
            raftmq_store::queue_table::validate_topic(&a.topic)?;
            if let Some(t) = &a.message_type {
                check_message_type(t)?;
            }
            if a.queues.is_none() && a.perm.is_none() && a.message_type.is_none() {
                bail!("nothing to change: give --queues, --perm or --message-type");
            }
            let groups = group_endpoints(&a.namesrv, a.broker.as_deref()).await?;
            let mut current = Vec::new();
            for (group, addr) in groups {
                let t = current_topic(&addr, &a.topic)
                    .await
                    .map_err(|e| anyhow::anyhow!("group {group}: {e}"))?
                    .ok_or_else(|| anyhow::anyhow!("no such topic: {} in group {group}", a.topic))?;
                current.push((group, addr, t));
            }
            for (group, addr, old) in current {
                let mut new = old.clone();
                if let Some(q) = a.queues {
                    (new.read_queues, new.write_queues) = (q, q);
                }
                if let Some(p) = a.perm {
                    new.perm = p;
                }
                if let Some(t) = &a.message_type {
                    new.message_type = t.to_ascii_uppercase();
                }
                put_topic(&group, &addr, &new).await?;
                println!("topic {} in group {group}: {}", a.topic, topic_changes(&old, &new));
            }
        }
        TopicCommand::Delete { namesrv, topic, broker } => {
            raftmq_store::queue_table::validate_topic(&topic)?;
            for (g, addr) in group_endpoints(&namesrv, broker.as_deref()).await? {
                crate::cli::connect::broker(&addr)?
                    .delete_topic(pb::DeleteTopicRequest { name: topic.clone() })
                    .await
                    .map_err(|s| anyhow::anyhow!("group {g}: {}", s.message()))?;
                println!("topic {topic} deleted in group {g}");
            }
        }
        TopicCommand::Producers { namesrv, topic, json } => {
            super::connections::producers(&namesrv, &topic, json).await?
        }
        TopicCommand::Status { namesrv, topic, json } => super::topic_status::run(&namesrv, &topic, json).await?,
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

/// What an update changed, and what it left: "perm 6 -> 4 (8 queues,
/// DELAY messages)".
fn topic_changes(old: &pb::TopicData, new: &pb::TopicData) -> String {
    let mut changed = Vec::new();
    let mut kept = Vec::new();
    let (oq, nq) = (
        old.write_queues.max(old.read_queues),
        new.write_queues.max(new.read_queues),
    );
    let fields = [
        ("queues", oq.to_string(), nq.to_string()),
        ("perm", old.perm.to_string(), new.perm.to_string()),
        ("message type", old.message_type.clone(), new.message_type.clone()),
    ];
    for (name, o, n) in fields {
        if o == n {
            kept.push(format!("{name} {n}"));
        } else {
            changed.push(format!("{name} {o} -> {n}"));
        }
    }
    match (changed.is_empty(), kept.is_empty()) {
        (true, _) => format!("unchanged ({})", kept.join(", ")),
        (false, true) => changed.join(", "),
        (false, false) => format!("{} (unchanged: {})", changed.join(", "), kept.join(", ")),
    }
}
