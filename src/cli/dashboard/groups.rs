//! `/groups` and `/group`: every consumer group with its lag, messages in
//! flight and consume rate; per queue its offsets; the clients connected;
//! create, delete, and reset offsets to a time (mqadmin's resetOffsetByTime)
//! or to the queues' ends (skipAccumulatedMessage).

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::{Query, State as AxumState};
use axum::response::Redirect;
use maud::{Markup, html};
use serde::Deserialize;

use raftmq_raft::acl::{Action, ResourceType};

use super::caller::{Caller, call, find};
use super::page::{self, Flash, Nav, link};
use super::state::State;
use crate::proto::pb;

/// A consumer group summed over every broker group.
#[derive(Default)]
struct Summary {
    config: Option<pb::ConsumerGroupInfo>,
    lag: u64,
    inflight: u64,
    queues: usize,
    topics: std::collections::BTreeSet<String>,
}

async fn summaries(caller: &Caller) -> Result<(BTreeMap<String, Summary>, Vec<String>), String> {
    let mut out: BTreeMap<String, Summary> = BTreeMap::new();
    let mut errors = Vec::new();
    for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        match call("list groups", c.list_consumer_groups(pb::ListConsumerGroupsRequest {})).await {
            Ok(list) => {
                for cg in list.groups {
                    let name = cg.name.clone();
                    out.entry(name).or_default().config = Some(cg);
                }
            }
            Err(e) => errors.push(format!("group {g}: {e}")),
        }
    }
    let (progress, failed) = caller.progress("").await;
    errors.extend(failed);
    for (_, q) in progress {
        let s = out.entry(q.group.clone()).or_default();
        s.lag += q.lag;
        s.inflight += u64::from(q.inflight);
        s.queues += 1;
        s.topics.insert(q.topic);
    }
    Ok((out, errors))
}

pub async fn list(AxumState(state): AxumState<State>, caller: Caller, Query(flash): Query<Flash>) -> Markup {
    let body = match summaries(&caller).await {
        Ok((groups, errors)) => {
            // Read with the dashboard's own keys: only for those logged in.
            let rates = if state.own.is_some() && caller.who.is_none() {
                Default::default()
            } else {
                state.charts.group_rates()
            };
            html! {
                h1 { "Consumer groups " small { (groups.len()) } }
                @for e in &errors { (page::error_box(e)) }
                @if caller.may.may_some(ResourceType::Group, Action::Create) {
                form.card #create-group method="post" action="/groups" {
                    label { "New consumer group" input #group-name name="name" required pattern="[A-Za-z0-9_%|-]{1,122}" placeholder="OrderConsumers"; }
                    label { "Deliveries before the DLQ (0: default 16)" input name="max_delivery_attempts" type="number" min="0" max="1000" value="0"; }
                    label { "Order" select name="fifo" { option value="false" { "concurrent" } option value="true" { "FIFO per queue" } } }
                    button type="submit" { "Create in every group" }
                }
                }
                div #groups-live data-live {
                    table #groups {
                        thead { tr { th { "consumer group" } th { "order" } th.num { "max deliveries" } th { "topics" } th.num { "lag" } th.num { "in flight" } th.num { "consumed/s" } } }
                        tbody {
                            @for (name, s) in &groups {
                                tr data-group=(name) {
                                    td { a href=(link("/group", &[("name", name)])) { (name) } }
                                    td { @match &s.config { Some(c) if c.fifo => "FIFO", Some(_) => "concurrent", None => span.hint { "no config" } } }
                                    td.num { @match &s.config { Some(c) if c.max_delivery_attempts > 0 => (c.max_delivery_attempts), _ => "16" } }
                                    td.wrap { @for t in &s.topics { span.badge { (t) } " " } }
                                    td.num.lag { (s.lag) }
                                    td.num { (s.inflight) }
                                    td.num { (format!("{:.1}", rates.get(name).copied().unwrap_or(0.0))) }
                                }
                            }
                        }
                    }
                }
            }
        }
        Err(e) => page::error_box(&e),
    };
    page::shell("Consumer groups", Nav::Groups, &caller, &flash, body)
}

#[derive(Deserialize)]
pub struct GroupForm {
    name: String,
    #[serde(default)]
    max_delivery_attempts: u32,
    #[serde(default)]
    fifo: bool,
}

/// Puts the group's config in every broker group (`only_existing`: in
/// those that have it); how many.
async fn put(caller: &Caller, f: &GroupForm, only_existing: bool) -> Result<usize, String> {
    crate::broker::pop::validate_group(&f.name).map_err(|e| e.to_string())?;
    let mut n = 0;
    for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        if only_existing {
            let req = pb::GetConsumerGroupRequest { name: f.name.clone() };
            if find("group", c.get_consumer_group(req))
                .await
                .map_err(|e| format!("group {g}: {e}"))?
                .is_none()
            {
                continue;
            }
        }
        call(
            "put group",
            c.put_consumer_group(pb::PutConsumerGroupRequest {
                name: f.name.clone(),
                fifo: f.fifo,
                max_delivery_attempts: f.max_delivery_attempts,
            }),
        )
        .await
        .map_err(|e| format!("group {g}: {e}"))?;
        n += 1;
    }
    Ok(n)
}

pub async fn create(caller: Caller, Form(f): Form<GroupForm>) -> Redirect {
    let outcome = put(&caller, &f, false)
        .await
        .map(|n| format!("consumer group {} created in {n} broker group(s)", f.name));
    page::back("/groups", outcome)
}

pub async fn update(caller: Caller, Form(f): Form<GroupForm>) -> Redirect {
    let outcome = match put(&caller, &f, true).await {
        Ok(0) => Err(format!("no broker group has a config for {}; create it", f.name)),
        Ok(n) => Ok(format!("consumer group {} updated in {n} broker group(s)", f.name)),
        Err(e) => Err(e),
    };
    page::back(&link("/group", &[("name", &f.name)]), outcome)
}

#[derive(Deserialize)]
pub struct DeleteForm {
    name: String,
    /// The "I mean it" box.
    #[serde(default)]
    sure: Option<String>,
}

pub async fn delete(caller: Caller, Form(f): Form<DeleteForm>) -> Redirect {
    let outcome = async {
        crate::broker::pop::validate_group(&f.name).map_err(|e| e.to_string())?;
        if f.sure.is_none() {
            return Err("tick \"I mean it\" to delete".to_string());
        }
        let mut n = 0;
        for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
            let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
            let req = pb::GetConsumerGroupRequest { name: f.name.clone() };
            if find("delete group", c.delete_consumer_group(req))
                .await
                .map_err(|e| format!("group {g}: {e}"))?
                .is_some()
            {
                n += 1;
            }
        }
        if n == 0 {
            return Err(format!("no broker group has a config for {}", f.name));
        }
        Ok(format!("consumer group {} deleted in {n} broker group(s)", f.name))
    }
    .await;
    match outcome {
        Ok(m) => page::back("/groups", Ok(m)),
        Err(e) => page::back(&link("/group", &[("name", &f.name)]), Err(e)),
    }
}

#[derive(Deserialize)]
pub struct ResetForm {
    name: String,
    topic: String,
    /// "time" (to `at`) or "end".
    to: String,
    /// A local date-time (`2026-12-04T21:30`), milliseconds since the
    /// epoch, or an age (`10m`).
    #[serde(default)]
    at: String,
}

pub async fn reset(caller: Caller, Form(f): Form<ResetForm>) -> Redirect {
    let here = link("/group", &[("name", &f.name)]);
    let outcome = async {
        crate::broker::pop::validate_group(&f.name).map_err(|e| e.to_string())?;
        raftmq_store::queue_table::validate_topic(&f.topic).map_err(|e| e.to_string())?;
        let to_end = f.to == "end";
        let timestamp_ms = if to_end { 0 } else { page::instant_of(&f.at)? };
        let mut moved = 0;
        let mut done: Vec<String> = Vec::new();
        for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
            let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
            let r = find(
                "reset offset",
                c.reset_offset(pb::ResetOffsetRequest {
                    group: f.name.clone(),
                    topic: f.topic.clone(),
                    timestamp_ms,
                    offsets: Vec::new(),
                    to_end,
                }),
            )
            .await
            .map_err(|e| match done.is_empty() {
                true => format!("group {g}: {e}"),
                false => format!("group {g}: {e} (already moved in {})", done.join(", ")),
            })?;
            moved += r.as_ref().map_or(0, |r| r.queues.len());
            if r.is_some() {
                done.push(g);
            }
        }
        if moved == 0 {
            return Err(format!("{} has no queue of {} to move", f.name, f.topic));
        }
        Ok(if to_end {
            format!("{} skipped to the end of {moved} queue(s) of {}", f.name, f.topic)
        } else {
            format!(
                "{} reset to {} on {moved} queue(s) of {}",
                f.name,
                page::time(timestamp_ms),
                f.topic
            )
        })
    }
    .await;
    page::back(&here, outcome)
}

pub async fn detail(caller: Caller, Query(flash): Query<Flash>, Query(q): Query<page::Named>) -> Markup {
    let body = page::or_error(detail_of(&caller, &q.name).await);
    page::shell(&q.name, Nav::Groups, &caller, &flash, body)
}

async fn detail_of(caller: &Caller, name: &str) -> Result<Markup, String> {
    crate::broker::pop::validate_group(name).map_err(|e| e.to_string())?;
    let mut config = None;
    let mut errors = Vec::new();
    for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        match find(
            "group",
            c.get_consumer_group(pb::GetConsumerGroupRequest { name: name.into() }),
        )
        .await
        {
            Ok(cfg) => config = config.or(cfg),
            Err(e) => errors.push(format!("group {g}: {e}")),
        }
    }
    let (queues, failed) = caller.progress(name).await;
    errors.extend(failed);
    let clients = connections(caller, name).await;
    let topics: std::collections::BTreeSet<&str> = queues.iter().map(|(_, q)| q.topic.as_str()).collect();
    let lag: u64 = queues.iter().map(|(_, q)| q.lag).sum();
    let inflight: u64 = queues.iter().map(|(_, q)| u64::from(q.inflight)).sum();
    let dlq = raftmq_raft::consumption::dlq_topic(name);
    let may = |a| caller.may.may(ResourceType::Group, name, a);
    Ok(html! {
        h1 { "Consumer group " (name) " "
            small { @match &config { Some(c) => { (if c.fifo { "FIFO" } else { "concurrent" }) " · up to " (if c.max_delivery_attempts > 0 { c.max_delivery_attempts } else { 16 }) " deliveries" }
                                     None => "no config (known from what it consumed)" } } }
        @for e in &errors { (page::error_box(e)) }
        div #group-live data-live {
            div.cards {
                div.card { div.k { "lag" } div.v #lag { (lag) } }
                div.card { div.k { "in flight" } div.v { (inflight) } }
                div.card { div.k { "clients connected" } div.v { (clients.as_ref().map_or(0, |c| c.len())) } }
            }
            h2 { "Queues" }
            table #progress {
                thead { tr { th { "group" } th { "topic" } th.num { "queue" } th.num { "broker offset" } th.num { "consumer offset" } th.num { "lag" } th.num { "in flight" } } }
                tbody { @for (g, q) in &queues {
                    tr { td { (g) } td { (q.topic) } td.num { (q.queue) } td.num { (q.broker_offset) } td.num { (q.consumer_offset) } td.num { (q.lag) } td.num { (q.inflight) } }
                } }
            }
            h2 { "Connections" }
            @match &clients {
                Ok(list) if list.is_empty() => p.hint { "No client of this group is connected." },
                Ok(list) => table #connections {
                    thead { tr { th { "client" } th { "node" } th { "type" } th { "language" } th { "address" } th { "subscriptions" } th.num { "received" } th.num { "acked" } th { "last heartbeat" } } }
                    tbody { @for (node, c) in list {
                        tr { td { (c.client_id) } td { (node) } td { (c.client_type) } td { (c.language) " " (c.version) } td { (c.address) }
                             td.wrap { @for s in &c.subscriptions { span.badge { (s.topic) " " (s.expression) } " " } }
                             td.num { (c.received) } td.num { (c.acked) } td { (crate::cli::display::age(c.last_heartbeat_ms_ago)) " ago" } }
                    } }
                },
                Err(e) => (page::error_box(e)),
            }
        }
        p { a href=(link("/messages", &[("topic", &dlq)])) { "Dead letters (" (dlq) ")" } }
        @if may(if config.is_some() { Action::Update } else { Action::Create }) {
        h2 { "Change" }
        form.card #update-group method="post" action=(if config.is_some() { "/group/update" } else { "/groups" }) {
            input type="hidden" name="name" value=(name);
            label { "Deliveries before the DLQ (0: default 16)" input name="max_delivery_attempts" type="number" min="0" max="1000"
                value=(config.as_ref().map_or(0, |c| c.max_delivery_attempts)); }
            label { "Order" select name="fifo" {
                option value="false" selected[config.as_ref().is_some_and(|c| !c.fifo)] { "concurrent" }
                option value="true" selected[config.as_ref().is_some_and(|c| c.fifo)] { "FIFO per queue" } } }
            button type="submit" { (if config.is_some() { "Update in every group" } else { "Create a config" }) }
        }
        }
        @if may(Action::Update) && !topics.is_empty() {
        h2 { "Reset offsets" }
        form.card #reset-form method="post" action="/group/reset" {
            input type="hidden" name="name" value=(name);
            label { "Topic" select name="topic" { @for t in &topics { option value=(t) { (t) } } } }
            label { "To" select name="to" { option value="time" { "a time" } option value="end" { "the end (skip the backlog)" } } }
            label { "Time (local, ms since the epoch, or an age like 10m)" input name="at" type="text" placeholder="2026-12-04T09:00 or 1h"; }
            button type="submit" { "Reset" }
        }
        }
        @if may(Action::Delete) {
        form.card method="post" action="/group/delete" {
            input type="hidden" name="name" value=(name);
            label { "Delete " (name) "'s config and progress" span { input type="checkbox" name="sure" required; " I mean it" } }
            button.danger type="submit" { "Delete" }
        }
        }
    })
}

/// The clients of `group`, with the node each is connected to, from every
/// node the NameServers know.
async fn connections(caller: &Caller, group: &str) -> Result<Vec<(String, pb::ClientEntry)>, String> {
    let info = caller.cluster().await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for n in info.nodes {
        let mut c = caller.broker(&n.client_addr).map_err(|e| e.to_string())?;
        let req = pb::ListClientsRequest {
            group: group.into(),
            topic: String::new(),
        };
        let node = format!("{} node {}", n.group, n.node_id);
        let list = call("clients", c.list_clients(req))
            .await
            .map_err(|e| format!("{node}: {e}"))?;
        out.extend(list.clients.into_iter().map(|c| (node.clone(), c)));
    }
    Ok(out)
}
