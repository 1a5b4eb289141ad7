//! `raftmq cluster get-config | update-config` (mqadmin getBrokerConfig and
//! updateBrokerConfig), `raftmq cluster wipe-write-perm | add-write-perm`
//! (mqadmin wipeWritePerm and addWritePerm) and `raftmq cluster dedup`
//! (the group's deduplication window of sends).
//!
//! A config change is per node (see `crate::broker::runtime_config`): the
//! command changes every node of the group, or the one `--node` names, and
//! says for each what it was and what it is. The write permission is the
//! group's, through Raft: one call to any node (followers forward).

use anyhow::bail;
use serde::Serialize;

use crate::cli::connect::ask;
use crate::proto::pb;

#[derive(Debug, clap::Args)]
pub struct GetConfigArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// The broker group.
    #[arg(long)]
    pub broker: String,
    /// Only this node (default: every node of the group).
    #[arg(long)]
    pub node: Option<u64>,
    /// Only the keys that can change while the nodes run.
    #[arg(long)]
    pub runtime: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct UpdateConfigArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// The broker group.
    #[arg(long)]
    pub broker: String,
    /// Only this node (default: every node of the group, one after the other).
    #[arg(long)]
    pub node: Option<u64>,
    /// The key as deploy/CONFIG.md names it, tables joined with '.'
    /// (`store.retention.file_reserved_hours`); `get-config --runtime`
    /// lists the ones that can change.
    #[arg(long)]
    pub key: String,
    /// The new value, in TOML (`48`, `0.8`, `true`).
    #[arg(long)]
    pub value: String,
}

#[derive(Debug, clap::Args)]
pub struct WritePermArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// The broker group.
    #[arg(long)]
    pub broker: String,
}

#[derive(Debug, clap::Args)]
pub struct DedupArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// The broker group.
    #[arg(long)]
    pub broker: String,
    /// Forget ids stored longer ago than this, in milliseconds (0: no
    /// deduplication).
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Keep at most this many ids (the oldest go first).
    #[arg(long)]
    pub max_ids: Option<u64>,
}

/// The group's nodes as the NameServer knows them: (node id, client
/// address), only `only` when given.
async fn nodes(namesrv: &str, broker: &str, only: Option<u64>) -> anyhow::Result<Vec<(u64, String)>> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let mut nodes: Vec<(u64, String)> = info
        .nodes
        .into_iter()
        .filter(|n| n.group == broker && only.is_none_or(|id| id == n.node_id))
        .map(|n| (n.node_id, n.client_addr))
        .collect();
    nodes.sort();
    nodes.dedup_by_key(|n| n.0);
    if nodes.is_empty() {
        match only {
            Some(id) => bail!("broker group {broker} has no node {id} registered with the NameServer"),
            None => bail!("no broker group named {broker} is registered with the NameServer"),
        }
    }
    Ok(nodes)
}

#[derive(Serialize)]
struct NodeConfig {
    node_id: u64,
    /// key -> value (TOML), sorted.
    config: std::collections::BTreeMap<String, String>,
    /// The keys `update-config` may change.
    runtime_keys: Vec<String>,
}

pub async fn get(a: GetConfigArgs) -> anyhow::Result<()> {
    let mut out = Vec::new();
    for (id, addr) in nodes(&a.namesrv, &a.broker, a.node).await? {
        let r = crate::cli::connect::broker(&addr)?
            .get_broker_config(pb::GetBrokerConfigRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("node {id} ({addr}): {}", s.message()))?
            .into_inner();
        let entries: Vec<pb::ConfigEntry> = r.entries.into_iter().filter(|e| !a.runtime || e.runtime).collect();
        out.push(NodeConfig {
            node_id: id,
            runtime_keys: entries.iter().filter(|e| e.runtime).map(|e| e.key.clone()).collect(),
            config: entries.into_iter().map(|e| (e.key, e.value)).collect(),
        });
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": out }))?
        );
        return Ok(());
    }
    for n in out {
        println!(
            "# broker group {}, node {} (* changes at run time: update-config)",
            a.broker, n.node_id
        );
        for (k, v) in &n.config {
            let mark = if n.runtime_keys.contains(k) { "*" } else { " " };
            println!("{mark} {k} = {v}");
        }
    }
    Ok(())
}

pub async fn update(a: UpdateConfigArgs) -> anyhow::Result<()> {
    let targets = nodes(&a.namesrv, &a.broker, a.node).await?;
    for (id, addr) in &targets {
        let r = crate::cli::connect::broker(addr)?
            .update_broker_config(pb::UpdateBrokerConfigRequest {
                key: a.key.clone(),
                value: a.value.clone(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("node {id} ({addr}): {}", s.message()))?
            .into_inner();
        println!(
            "broker group {}, node {id}: {} = {} (was {})",
            a.broker, a.key, r.new_value, r.old_value
        );
    }
    println!("in force until a node restarts: put it in the node's config file to keep it");
    Ok(())
}

pub async fn set_writable(a: WritePermArgs, writable: bool) -> anyhow::Result<()> {
    let r = super::connect::broker_client(&a.namesrv, &a.broker)
        .await?
        .set_writable(pb::SetWritableRequest { writable })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let now = match writable {
        true => "takes sends again",
        false => "takes no sends (routes show its queues read-only; consumers go on)",
    };
    let was = if r.was_writable == writable { " (no change)" } else { "" };
    println!("broker group {} {now}{was}", a.broker);
    Ok(())
}

pub async fn dedup(a: DedupArgs) -> anyhow::Result<()> {
    let r = super::connect::broker_client(&a.namesrv, &a.broker)
        .await?
        .set_dedup(pb::SetDedupRequest {
            window_ms: a.window_ms,
            max_ids: a.max_ids,
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    match r.window_ms {
        0 => println!("broker group {}: no deduplication of sends", a.broker),
        ms => println!(
            "broker group {}: a send is stored once per message id within {ms} ms and {} ids (holds {} now)",
            a.broker, r.max_ids, r.ids
        ),
    }
    Ok(())
}
