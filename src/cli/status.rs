//! `raftmq cluster status`: every broker node the NameServers know, with
//! what each node says of itself now (role, term, commit and applied index,
//! asked of the node at once) beside when the NameServer last heard from
//! it, and each group's live leader named.

use serde::Serialize;

use super::connect::{ask, node_status};
use super::display::{age, local_time};
use crate::proto::pb;

#[derive(Serialize)]
struct NodeJson {
    cluster: String,
    group: String,
    node_id: u64,
    client_addr: String,
    raft_addr: String,
    pid: u32,
    /// Whether the node answered just now.
    reachable: bool,
    /// What the node says now; "unreachable" when it did not answer.
    role: String,
    /// Term, commit and applied index: the node's answer just now, or
    /// (unreachable) what its last heartbeat said.
    term: u64,
    commit_index: u64,
    applied_index: u64,
    /// The role its last heartbeat to the NameServer claimed.
    reported_role: String,
    /// When the NameServer last heard from it (epoch ms), and how long ago.
    last_heartbeat_at_ms: u64,
    last_heartbeat_age_ms: u64,
    /// This node is its group's leader: it says so now, with the highest
    /// term of those that do.
    is_group_leader: bool,
    /// Producers may send to the group, as the node answers now (false:
    /// `cluster wipe-write-perm`); unreachable nodes count as writable.
    writable: bool,
}

pub async fn run(namesrv: &str, json: bool) -> anyhow::Result<()> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let now = crate::clock::now_ms();
    let live = futures::future::join_all(info.nodes.iter().map(|n| node_status(&n.client_addr))).await;
    let mut nodes: Vec<NodeJson> = info
        .nodes
        .into_iter()
        .zip(live)
        .map(|(n, s)| NodeJson {
            reachable: s.is_some(),
            writable: s.as_ref().is_none_or(|s| s.writable),
            role: s.as_ref().map_or("unreachable".to_string(), |s| s.role.clone()),
            term: s.as_ref().map_or(n.term, |s| s.term),
            commit_index: s.as_ref().map_or(n.commit_index, |s| s.commit_index),
            applied_index: s.as_ref().map_or(n.applied_index, |s| s.applied_index),
            reported_role: n.role,
            last_heartbeat_at_ms: now.saturating_sub(n.last_heartbeat_ms),
            last_heartbeat_age_ms: n.last_heartbeat_ms,
            is_group_leader: false,
            cluster: n.cluster,
            group: n.group,
            node_id: n.node_id,
            client_addr: n.client_addr,
            raft_addr: n.raft_addr,
            pid: n.pid,
        })
        .collect();
    nodes.sort_by(|a, b| (&a.cluster, &a.group, a.node_id).cmp(&(&b.cluster, &b.group, b.node_id)));
    // The live leader of each group: says so now, highest term first.
    let mut groups: Vec<(String, String)> = nodes.iter().map(|n| (n.cluster.clone(), n.group.clone())).collect();
    groups.dedup();
    for (cluster, group) in &groups {
        let leader = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| &n.cluster == cluster && &n.group == group && n.role == "leader")
            .max_by_key(|(_, n)| n.term)
            .map(|(i, _)| i);
        if let Some(i) = leader {
            nodes[i].is_group_leader = true;
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))?
        );
        return Ok(());
    }
    if nodes.is_empty() {
        println!("no broker has registered with the NameServer");
        return Ok(());
    }
    println!("role, term, commit and applied: as each node answers now (unreachable: its last heartbeat's)");
    println!("last heartbeat: when the NameServer last heard from the node");
    for (cluster, group) in &groups {
        let members: Vec<&NodeJson> = nodes
            .iter()
            .filter(|n| &n.cluster == cluster && &n.group == group)
            .collect();
        println!();
        match members.iter().find(|n| n.is_group_leader) {
            Some(l) => println!(
                "broker group {group} (cluster {cluster}): leader node {} (term {}), {} nodes{}",
                l.node_id,
                l.term,
                members.len(),
                if l.writable {
                    ""
                } else {
                    ", WRITE PERMISSION WIPED (no sends; cluster add-write-perm restores it)"
                }
            ),
            None => println!(
                "broker group {group} (cluster {cluster}): NO LEADER answering, {} nodes",
                members.len()
            ),
        }
        println!(
            "  {:>4}  {:<11} {:>5} {:>9} {:>9}  {:<21} {:<21} {:>8}  last heartbeat",
            "node", "role", "term", "commit", "applied", "client", "raft", "pid"
        );
        for n in members {
            let role = if n.reachable {
                n.role.clone()
            } else {
                format!("unreachable (last said {})", n.reported_role)
            };
            println!(
                "  {:>4}  {:<11} {:>5} {:>9} {:>9}  {:<21} {:<21} {:>8}  {} ({} ago)",
                n.node_id,
                role,
                n.term,
                n.commit_index,
                n.applied_index,
                n.client_addr,
                n.raft_addr,
                n.pid,
                local_time(n.last_heartbeat_at_ms),
                age(n.last_heartbeat_age_ms)
            );
        }
    }
    Ok(())
}
