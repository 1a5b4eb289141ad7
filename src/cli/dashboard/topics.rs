//! `/topics` and `/topic`: every topic with its queues, message type and
//! permission; per queue its oldest and next offset and last store time;
//! create, update and delete (in every broker group, as `raftmq topic`
//! does); send a test message.

use axum::Form;
use axum::extract::Query;
use axum::response::Redirect;
use futures::StreamExt;
use maud::{Markup, html};
use serde::Deserialize;

use raftmq_raft::acl::{Action, ResourceType};

use super::caller::{Caller, call, find};
use super::page::{self, Flash, Nav, link};
use super::permissions::Permissions;
use crate::proto::pb;

/// Topics listed on one page at most (a filter narrows them).
const MAX_LISTED: usize = 500;
/// Calls in flight at once while a page gathers topics.
const FAN_OUT: usize = 16;

const MESSAGE_TYPES: [&str; 5] = ["NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"];

/// A permission as RocketMQ writes it.
fn perm(p: u32) -> &'static str {
    match p & 6 {
        6 => "read, write",
        4 => "read only",
        2 => "write only",
        _ => "none",
    }
}

/// What a topic name says it is for.
fn kind(name: &str) -> Option<&'static str> {
    if name.starts_with(raftmq_raft::consumption::DLQ_PREFIX) {
        Some("dead letters")
    } else if name.starts_with("%RETRY%") {
        Some("retries")
    } else if name.starts_with("rmq_sys") || name.starts_with("RMQ_SYS") {
        Some("system")
    } else {
        None
    }
}

/// The topic as group `addr` keeps it (`None`: not there).
async fn topic_in(caller: &Caller, addr: &str, name: &str) -> Result<Option<pb::TopicData>, String> {
    let mut c = caller.broker(addr).map_err(|e| e.to_string())?;
    find("get topic", c.get_topic(pb::GetTopicRequest { name: name.into() })).await
}

#[derive(Deserialize, Default)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
}

pub async fn list(caller: Caller, Query(flash): Query<Flash>, Query(lq): Query<ListQuery>) -> Markup {
    let body = page::or_error(
        gather(&caller, &lq.q)
            .await
            .map(|rows| list_view(&rows, &lq.q, &caller.may)),
    );
    page::shell("Topics", Nav::Topics, &caller, &flash, body)
}

/// One topic: its config in each group that has it.
struct Row {
    name: String,
    groups: Vec<(String, pb::TopicData)>,
    error: Option<String>,
}

async fn gather(caller: &Caller, filter: &str) -> Result<Vec<Row>, String> {
    let groups = caller.groups().await.map_err(|e| e.to_string())?;
    let filter: String = filter.chars().take(128).collect::<String>().to_lowercase();
    let names: Vec<String> = caller
        .topic_names()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|t| t.to_lowercase().contains(&filter))
        .take(MAX_LISTED)
        .collect();
    let rows = futures::stream::iter(names)
        .map(|name| {
            let groups = &groups;
            async move {
                let mut row = Row {
                    name: name.clone(),
                    groups: Vec::new(),
                    error: None,
                };
                for (g, addr) in groups {
                    match topic_in(caller, addr, &name).await {
                        Ok(Some(t)) => row.groups.push((g.clone(), t)),
                        Ok(None) => {}
                        Err(e) => row.error = Some(format!("group {g}: {e}")),
                    }
                }
                row
            }
        })
        .buffered(FAN_OUT)
        .collect()
        .await;
    Ok(rows)
}

fn type_select(selected: &str) -> Markup {
    html! {
        select name="message_type" {
            @for t in MESSAGE_TYPES {
                option value=(t) selected[t == selected] { (t) }
            }
        }
    }
}

fn perm_select(selected: u32) -> Markup {
    html! {
        select name="perm" {
            @for p in [6u32, 4, 2] {
                option value=(p) selected[p == selected] { (perm(p)) }
            }
        }
    }
}

fn list_view(rows: &[Row], filter: &str, may: &Permissions) -> Markup {
    html! {
        h1 { "Topics " small { (rows.len()) " shown" } }
        @if may.may_some(ResourceType::Topic, Action::Create) {
        form.card #create-topic method="post" action="/topics" {
            label { "New topic" input #topic-name name="name" required pattern="[A-Za-z0-9_%|-]{1,127}" placeholder="OrderTopic"; }
            label { "Queues" input name="queues" type="number" min="1" max="1024" value="8"; }
            label { "Message type" (type_select("NORMAL")) }
            label { "Permission" (perm_select(6)) }
            button #create-topic-submit type="submit" { "Create in every group" }
        }
        }
        form.card method="get" action="/topics" {
            label { "Filter" input name="q" value=(filter) placeholder="part of a name"; }
            button type="submit" { "Filter" }
        }
        table #topics {
            thead { tr { th { "topic" } th { "groups" } th.num { "read / write queues" } th { "message type" } th { "permission" } } }
            tbody {
                @for r in rows {
                    tr data-topic=(r.name) {
                        td { a href=(link("/topic", &[("name", &r.name)])) { (r.name) }
                            @if let Some(k) = kind(&r.name) { " " span.badge { (k) } } }
                        td { @for (g, _) in &r.groups { span.badge { (g) } " " }
                            @if let Some(e) = &r.error { span.badge.bad title=(e) { "error" } } }
                        @match r.groups.first() {
                            Some((_, t)) => {
                                td.num { (t.read_queues) " / " (t.write_queues) }
                                td { (if t.message_type.is_empty() { "NORMAL" } else { &t.message_type }) }
                                td { (perm(t.perm)) }
                            }
                            None => { td.num { "-" } td { "-" } td { "-" } }
                        }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct TopicForm {
    name: String,
    queues: u32,
    message_type: String,
    perm: u32,
}

fn check(f: &TopicForm) -> Result<(), String> {
    raftmq_store::queue_table::validate_topic(&f.name).map_err(|e| e.to_string())?;
    if !MESSAGE_TYPES.contains(&f.message_type.as_str()) {
        return Err(format!("unknown message type {}", f.message_type));
    }
    if !(1..=1024).contains(&f.queues) {
        return Err("queues: 1 to 1024".into());
    }
    if ![2, 4, 6].contains(&f.perm) {
        return Err("permission: 2, 4 or 6".into());
    }
    Ok(())
}

async fn put(caller: &Caller, addr: &str, f: &TopicForm) -> Result<(), String> {
    let mut c = caller.broker(addr).map_err(|e| e.to_string())?;
    call(
        "put topic",
        c.put_topic(pb::PutTopicRequest {
            name: f.name.clone(),
            read_queues: f.queues,
            write_queues: f.queues,
            perm: f.perm,
            message_type: f.message_type.clone(),
        }),
    )
    .await
    .map(|_| ())
}

/// Creates the topic in every group that lacks it (so a create cut short,
/// or a group added since, is finished by creating again); groups that
/// have it keep theirs. Refused when every group has it.
pub async fn create(caller: Caller, Form(f): Form<TopicForm>) -> Redirect {
    let outcome = async {
        check(&f)?;
        let groups = caller.groups().await.map_err(|e| e.to_string())?;
        if groups.is_empty() {
            return Err("no broker group is registered with the NameServer".to_string());
        }
        let (mut made, mut had) = (Vec::new(), Vec::new());
        for (g, addr) in &groups {
            if topic_in(&caller, addr, &f.name).await?.is_some() {
                had.push(g.as_str());
                continue;
            }
            put(&caller, addr, &f).await.map_err(|e| match made.is_empty() {
                true => format!("group {g}: {e}"),
                false => format!(
                    "group {g}: {e} (created in {}; create again to finish)",
                    made.join(", ")
                ),
            })?;
            made.push(g.as_str());
        }
        if made.is_empty() {
            return Err(format!("topic {} exists in every group: change it on its page", f.name));
        }
        caller.await_listed(&f.name, true).await;
        let kept = match had.is_empty() {
            true => String::new(),
            false => format!("; {} had it already and kept theirs", had.join(", ")),
        };
        Ok(format!(
            "topic {} created in {}: {} queues, {}{kept}",
            f.name,
            made.join(", "),
            f.queues,
            f.message_type
        ))
    }
    .await;
    page::back("/topics", outcome)
}

/// Changes the topic in every group that has it.
pub async fn update(caller: Caller, Form(f): Form<TopicForm>) -> Redirect {
    let here = link("/topic", &[("name", &f.name)]);
    let outcome = async {
        check(&f)?;
        let mut n = 0;
        for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
            if topic_in(&caller, &addr, &f.name).await?.is_some() {
                put(&caller, &addr, &f).await.map_err(|e| format!("group {g}: {e}"))?;
                n += 1;
            }
        }
        if n == 0 {
            return Err(format!("no such topic: {}", f.name));
        }
        Ok(format!("topic {} updated in {n} group(s)", f.name))
    }
    .await;
    page::back(&here, outcome)
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
        raftmq_store::queue_table::validate_topic(&f.name).map_err(|e| e.to_string())?;
        if f.sure.is_none() {
            return Err("tick \"I mean it\" to delete".to_string());
        }
        let mut n = 0;
        for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
            if topic_in(&caller, &addr, &f.name).await?.is_some() {
                let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
                call(
                    "delete topic",
                    c.delete_topic(pb::DeleteTopicRequest { name: f.name.clone() }),
                )
                .await
                .map_err(|e| format!("group {g}: {e}"))?;
                n += 1;
            }
        }
        if n == 0 {
            return Err(format!("no such topic: {}", f.name));
        }
        caller.await_listed(&f.name, false).await;
        Ok(format!("topic {} deleted in {n} group(s)", f.name))
    }
    .await;
    match outcome {
        Ok(m) => page::back("/topics", Ok(m)),
        Err(e) => page::back(&link("/topic", &[("name", &f.name)]), Err(e)),
    }
}

pub async fn detail(caller: Caller, Query(flash): Query<Flash>, Query(q): Query<page::Named>) -> Markup {
    let body = page::or_error(detail_of(&caller, &q.name).await);
    page::shell(&q.name, Nav::Topics, &caller, &flash, body)
}

async fn detail_of(caller: &Caller, name: &str) -> Result<Markup, String> {
    raftmq_store::queue_table::validate_topic(name).map_err(|e| e.to_string())?;
    let mut config = None;
    let mut queues = Vec::new();
    for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
        let Some(t) = topic_in(caller, &addr, name).await? else {
            continue;
        };
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        let status = call(
            "topic status",
            c.topic_status(pb::GetTopicRequest { name: name.into() }),
        )
        .await
        .map_err(|e| format!("group {g}: {e}"))?;
        queues.extend(status.queues.into_iter().map(|q| (g.clone(), q)));
        config.get_or_insert(t);
    }
    let Some(t) = config else {
        return Err(format!("no such topic: {name}"));
    };
    let kept: u64 = queues
        .iter()
        .map(|(_, q)| q.max_offset.saturating_sub(q.min_offset))
        .sum();
    let message_type = if t.message_type.is_empty() {
        "NORMAL"
    } else {
        t.message_type.as_str()
    };
    let may = |a| caller.may.may(ResourceType::Topic, name, a);
    Ok(html! {
        h1 { "Topic " (name) " " small { (t.read_queues) " queues · " (message_type) " · " (perm(t.perm)) } }
        @if may(Action::Pub) {
        h2 { "Send a test message" }
        form.card #send-form method="post" action="/topic/send" {
            input type="hidden" name="topic" value=(name);
            label { "Tag" input #send-tag name="tag" placeholder="TagA"; }
            label { "Keys (space-separated)" input #send-keys name="keys" placeholder="order-42"; }
            label { "Body" textarea #send-body name="body" { "hello from the dashboard" } }
            button #send-submit type="submit" { "Send" }
        }
        }
        h2 { "Queues" }
        div #queues-live data-live {
            div.cards {
                div.card { div.k { "messages kept" } div.v #kept { (kept) } }
                div.card { div.k { "queues (all groups)" } div.v { (queues.len()) } }
            }
            table #queues {
                thead { tr { th { "group" } th.num { "queue" } th.num { "min offset" } th.num { "max offset" } th.num { "messages" } th { "last stored" } } }
                tbody {
                    @for (g, q) in &queues {
                        tr { td { (g) } td.num { (q.queue) } td.num { (q.min_offset) } td.num { (q.max_offset) }
                             td.num { (q.max_offset.saturating_sub(q.min_offset)) } td { (page::time(q.last_store_ms)) } }
                    }
                }
            }
        }
        p { a href=(link("/messages", &[("topic", name)])) { "Look up messages in " (name) } }
        @if may(Action::Update) || may(Action::Delete) { h2 { "Change" } }
        @if may(Action::Update) {
        form.card method="post" action="/topic/update" {
            input type="hidden" name="name" value=(name);
            label { "Queues" input name="queues" type="number" min="1" max="1024" value=(t.read_queues); }
            label { "Message type" (type_select(message_type)) }
            label { "Permission" (perm_select(t.perm)) }
            button type="submit" { "Update in every group" }
        }
        }
        @if may(Action::Delete) {
        form.card method="post" action="/topic/delete" {
            input type="hidden" name="name" value=(name);
            label { "Delete " (name) " and its messages" span { input type="checkbox" name="sure" required; " I mean it" } }
            button.danger #delete-topic type="submit" { "Delete" }
        }
        }
    })
}

#[derive(Deserialize)]
pub struct SendForm {
    topic: String,
    #[serde(default)]
    tag: String,
    #[serde(default)]
    keys: String,
    #[serde(default)]
    body: String,
}

/// Sends one message to a random writable queue of a group that has the
/// topic, through `raftmq.v1.Broker/Send` (followers forward to the leader).
pub async fn send(caller: Caller, Form(f): Form<SendForm>) -> Redirect {
    let here = link("/topic", &[("name", &f.topic)]);
    let outcome = async {
        raftmq_store::queue_table::validate_topic(&f.topic).map_err(|e| e.to_string())?;
        let mut with_topic = Vec::new();
        for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
            if let Some(t) = topic_in(&caller, &addr, &f.topic).await? {
                with_topic.push((g, addr, t));
            }
        }
        let (g, addr, t) = with_topic
            .get(rand::random_range(0..with_topic.len().max(1)))
            .ok_or_else(|| format!("no such topic: {}", f.topic))?;
        let queue = rand::random_range(0..t.write_queues.max(1));
        let id = crate::client::new_message_id();
        let keys: Vec<String> = f
            .keys
            .split([' ', ','])
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        let mut c = caller.broker(addr).map_err(|e| e.to_string())?;
        let r = call(
            "send",
            c.send(pb::SendRequest {
                topic: f.topic.clone(),
                queue_id: queue,
                messages: vec![pb::Message {
                    message_id: id.clone(),
                    tag: f.tag.trim().to_string(),
                    keys,
                    properties: Default::default(),
                    body: f.body.clone().into_bytes().into(),
                    born_timestamp_ms: crate::clock::now_ms(),
                    store_timestamp_ms: 0,
                    queue_offset: 0,
                }],
            }),
        )
        .await?;
        Ok(format!(
            "sent {id} to group {g}, queue {queue}, offset {}",
            r.first_queue_offset
        ))
    }
    .await;
    page::back(&here, outcome)
}
