//! `/cluster`: every broker group with its nodes, as each node answers now
//! (role, term, commit and applied index, store size, disk use) beside what
//! the NameServer last heard from it. The tables refresh by themselves, so
//! a killed leader is seen replaced within a refresh or two.

use std::time::Duration;

use axum::extract::Query;
use maud::{Markup, html};

use super::caller::{Caller, refusal};
use super::page::{self, Flash, Nav};
use crate::proto::pb;

/// How long a node has to answer before it shows as unreachable.
const STATUS_TIMEOUT: Duration = Duration::from_millis(800);

/// One node: the NameServer's record and the node's own answer.
struct Node {
    info: pb::NodeInfo,
    live: Result<pb::StatusResponse, String>,
}

impl Node {
    fn role(&self) -> &str {
        match &self.live {
            Ok(s) => &s.role,
            Err(_) => "unreachable",
        }
    }
}

async fn status(caller: &Caller, addr: &str) -> Result<pb::StatusResponse, String> {
    let mut c = caller.broker(addr).map_err(|e| e.to_string())?;
    match tokio::time::timeout(STATUS_TIMEOUT, c.status(pb::StatusRequest { with_digest: false })).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(refusal(&s)),
        Err(_) => Err("no answer".into()),
    }
}

pub async fn page(caller: Caller, Query(flash): Query<Flash>) -> Markup {
    let body = match caller.cluster().await {
        Ok(info) => {
            let live = futures::future::join_all(info.nodes.iter().map(|n| status(&caller, &n.client_addr))).await;
            let mut nodes: Vec<Node> = info
                .nodes
                .into_iter()
                .zip(live)
                .map(|(info, live)| Node { info, live })
                .collect();
            nodes.sort_by(|a, b| (&a.info.group, a.info.node_id).cmp(&(&b.info.group, b.info.node_id)));
            view(&nodes)
        }
        Err(e) => page::error_box(&e.to_string()),
    };
    page::shell("Cluster", Nav::Cluster, &caller, &flash, body)
}

fn view(nodes: &[Node]) -> Markup {
    let mut groups: Vec<&str> = nodes.iter().map(|n| n.info.group.as_str()).collect();
    groups.dedup();
    // A group's live leader: a node that says so now, the highest term first.
    let leader_of = |g: &str| {
        nodes
            .iter()
            .filter(|n| n.info.group == g && n.role() == "leader")
            .max_by_key(|n| n.live.as_ref().map_or(0, |s| s.term))
    };
    let leaders = groups.iter().filter(|g| leader_of(g).is_some()).count();
    let reachable = nodes.iter().filter(|n| n.live.is_ok()).count();
    let stored: u64 = groups
        .iter()
        .filter_map(|g| leader_of(g))
        .filter_map(|n| n.live.as_ref().ok())
        .map(|s| s.store_bytes)
        .sum();
    let refused = nodes.iter().find_map(|n| {
        n.live
            .as_ref()
            .err()
            .filter(|e| e.contains("log in") || e.contains("not allowed"))
    });
    html! {
        h1 { "Cluster" }
        @if let Some(e) = refused { (page::error_box(e)) }
        div #cluster-live data-live {
            div.cards {
                div.card { div.k { "broker groups" } div.v #groups-count { (groups.len()) } }
                div.card { div.k { "with a leader" } div.v #leaders-count { (leaders) " / " (groups.len()) } }
                div.card { div.k { "nodes answering" } div.v { (reachable) " / " (nodes.len()) } }
                div.card { div.k { "CommitLog kept (leaders)" } div.v { (page::bytes(stored)) } }
            }
            @if nodes.is_empty() {
                p.hint { "No broker has registered with the NameServer." }
            }
            @for g in &groups {
                @let leader = leader_of(g);
                section.group {
                    h2 {
                        "Broker group " (g) " "
                        @match leader {
                            Some(l) => small { "leader " b.leader-id data-group=(g) { "node " (l.info.node_id) } ", term " (l.live.as_ref().map_or(0, |s| s.term))
                                @if l.live.as_ref().is_ok_and(|s| !s.writable) { " · " span.badge.bad { "write permission wiped" } } }
                            None => span.badge.bad { "no leader answering" }
                        }
                    }
                    table {
                        thead { tr {
                            th { "node" } th { "role" } th.num { "term" } th.num { "commit" } th.num { "applied" }
                            th { "client" } th { "raft" } th.num { "store" } th { "disk used" } th { "last heartbeat" } th.num { "pid" }
                        } }
                        tbody {
                            @for n in nodes.iter().filter(|n| n.info.group == *g) {
                                @let s = n.live.as_ref().ok();
                                tr data-group=(n.info.group) data-node=(n.info.node_id) data-role=(n.role()) {
                                    td { (n.info.node_id) }
                                    td { span class={"badge " (n.role())} { (n.role()) }
                                        @if let Err(e) = &n.live { " " span.hint title=(e) { "(last said " (n.info.role) ")" } } }
                                    td.num { (s.map_or(n.info.term, |s| s.term)) }
                                    td.num { (s.map_or(n.info.commit_index, |s| s.commit_index)) }
                                    td.num { (s.map_or(n.info.applied_index, |s| s.applied_index)) }
                                    td { (n.info.client_addr) }
                                    td { (n.info.raft_addr) }
                                    td.num { (s.map_or("-".into(), |s| page::bytes(s.store_bytes))) }
                                    td { @match s.filter(|s| s.disk_used_ratio > 0.0) {
                                        Some(s) => { div class=[if s.disk_used_ratio >= 0.75 { Some("bar hot") } else { Some("bar") }] title={(format!("{:.1} %", s.disk_used_ratio * 100.0))} {
                                            span style={"width:" (format!("{:.1}", s.disk_used_ratio * 100.0)) "%"} {} } }
                                        None => "-"
                                    }
                                    @if s.is_some_and(|s| s.disk_full) { " " span.hint title="past store.retention.disk_refuse_ratio" { "full: refusing sends" } } }
                                    td { (crate::cli::display::age(n.info.last_heartbeat_ms)) " ago" }
                                    td.num { (n.info.pid) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
