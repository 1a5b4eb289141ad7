//! `/messages` and `/message`: messages looked up by id or key (the key
//! index) or by store time (the ConsumeQueues) in every broker group that
//! has the topic; one message's properties and body (text, or hex when it
//! is not UTF-8); a dead letter resent to the topic it came from.

use axum::Form;
use axum::extract::Query;
use axum::response::Redirect;
use maud::{Markup, html};
use serde::Deserialize;

use raftmq_raft::acl::{Action, ResourceType};

use super::caller::{Caller, call};
use super::page::{self, Flash, Nav, link};
use super::permissions::Permissions;
use crate::proto::pb;

/// Messages one lookup returns per broker group (with their bodies: an
/// answer is bounded by the client's 64 MiB message limit as well).
const MAX_RESULTS: u32 = 32;
/// Body bytes shown of one message (the rest is counted, not shown).
const MAX_SHOWN_BODY: usize = 64 << 10;
/// The property a dead letter carries: where it came from,
/// `topic/queue/offset` (`Popper::dead_letter`).
const DLQ_ORIGIN: &str = "__rmq.dlq_origin";
/// The property a resent dead letter carries: the id it had.
const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";

#[derive(Deserialize, Default)]
pub struct SearchQuery {
    #[serde(default)]
    topic: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    key: String,
    /// Times: see [`page::instant_of`]; `begin` alone looks up to now.
    #[serde(default)]
    begin: String,
    #[serde(default)]
    end: String,
    #[serde(default)]
    queue: String,
}

/// A message found, with the broker group and queue it is in (the queue is
/// known for time lookups only).
struct Found {
    group: String,
    queue: Option<u32>,
    m: pb::Message,
}

/// Asks every broker group that answers for `by`.
async fn query(caller: &Caller, topic: &str, by: pb::query_messages_request::By) -> Result<Vec<Found>, String> {
    raftmq_store::queue_table::validate_topic(topic).map_err(|e| e.to_string())?;
    let time = matches!(by, pb::query_messages_request::By::TimeRange(_));
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (g, addr) in caller.groups().await.map_err(|e| e.to_string())? {
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        let req = pb::QueryMessagesRequest {
            topic: topic.into(),
            by: Some(by.clone()),
            max: MAX_RESULTS,
        };
        match tokio::time::timeout(super::caller::CALL_TIMEOUT, c.query_messages(req)).await {
            Err(_) => errors.push(format!("group {g}: no answer")),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                out.extend(r.messages.into_iter().enumerate().map(|(i, m)| Found {
                    group: g.clone(),
                    queue: if time { r.queue_ids.get(i).copied() } else { None },
                    m,
                }));
            }
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {}
            Ok(Err(s)) => errors.push(format!("group {g}: {}", super::caller::refusal(&s))),
        }
    }
    if out.is_empty() && !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    Ok(out)
}

fn by_of(q: &SearchQuery) -> Result<Option<pb::query_messages_request::By>, String> {
    use pb::query_messages_request::By;
    if !q.id.trim().is_empty() {
        return Ok(Some(By::MessageId(q.id.trim().into())));
    }
    if !q.key.trim().is_empty() {
        return Ok(Some(By::Key(q.key.trim().into())));
    }
    if !q.begin.trim().is_empty() {
        let begin_ms = page::instant_of(&q.begin)?;
        let end_ms = if q.end.trim().is_empty() {
            crate::clock::now_ms() + 1
        } else {
            page::instant_of(&q.end)?
        };
        let queue_id = match q.queue.trim() {
            "" => None,
            s => Some(s.parse::<u32>().map_err(|_| format!("queue: {s} is not a number"))?),
        };
        return Ok(Some(By::TimeRange(pb::TimeRange {
            queue_id,
            begin_ms,
            end_ms,
        })));
    }
    Ok(None)
}

fn is_dlq(topic: &str) -> bool {
    topic.starts_with(raftmq_raft::consumption::DLQ_PREFIX)
}

pub async fn search(caller: Caller, Query(flash): Query<Flash>, Query(q): Query<SearchQuery>) -> Markup {
    let topics = caller.topic_names().await.unwrap_or_default();
    let results = match by_of(&q) {
        Ok(Some(by)) if !q.topic.is_empty() => Some(query(&caller, &q.topic, by).await),
        Ok(Some(_)) => Some(Err("choose a topic".to_string())),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    };
    let body = html! {
        h1 { "Messages" }
        form.card #search method="get" action="/messages" {
            label { "Topic" input #search-topic name="topic" list="topic-names" value=(q.topic) required; }
            datalist #topic-names { @for t in &topics { option value=(t) {} } }
            label { "Message id" input #search-id name="id" value=(q.id); }
            label { "or key" input #search-key name="key" value=(q.key); }
            label { "or stored from" input name="begin" value=(q.begin) placeholder="10m, or 2026-12-04T09:00"; }
            label { "until" input name="end" value=(q.end) placeholder="now"; }
            label { "queue" input name="queue" value=(q.queue) size="4" placeholder="all"; }
            button #search-submit type="submit" { "Look up" }
        }
        @match &results {
            None => p.hint { "Look a message up by its id, by a key (newest first), or by when it was stored (per queue, oldest first). Dead-letter topics are named %DLQ%<group>." },
            Some(Err(e)) => (page::error_box(e)),
            Some(Ok(found)) if found.is_empty() => p.hint #no-results { "Nothing found." },
            Some(Ok(found)) => (results_table(&q.topic, found, &caller.may)),
        }
    };
    page::shell("Messages", Nav::Messages, &caller, &flash, body)
}

fn results_table(topic: &str, found: &[Found], may: &Permissions) -> Markup {
    html! {
        table #results {
            thead { tr { th { "message id" } th { "group" } th.num { "queue" } th.num { "offset" } th { "tag" } th { "keys" } th { "stored" } th.num { "body" } @if is_dlq(topic) { th {} } } }
            tbody { @for f in found {
                tr data-id=(f.m.message_id) {
                    td { a href=(link("/message", &[("topic", topic), ("id", &f.m.message_id)])) { (f.m.message_id) } }
                    td { (f.group) }
                    td.num { (f.queue.map_or("-".into(), |q| q.to_string())) }
                    td.num { @if f.queue.is_some() { (f.m.queue_offset) } @else { "-" } }
                    td { (f.m.tag) }
                    td { (f.m.keys.join(" ")) }
                    td { (page::time(f.m.store_timestamp_ms)) }
                    td.num { (page::bytes(f.m.body.len() as u64)) }
                    @if is_dlq(topic) { td { (resend_button(topic, &f.m, may)) } }
                }
            } }
        }
    }
}

fn origin_topic(m: &pb::Message) -> Option<&str> {
    m.properties.get(DLQ_ORIGIN).and_then(|o| o.split('/').next())
}

fn resend_button(topic: &str, m: &pb::Message, may: &Permissions) -> Markup {
    html! {
        @if let Some(origin) = origin_topic(m).filter(|o| may.may(ResourceType::Topic, o, Action::Pub)) {
            form.inline method="post" action="/message/resend" {
                input type="hidden" name="topic" value=(topic);
                input type="hidden" name="id" value=(m.message_id);
                button.resend type="submit" title={"Every consumer group subscribed to " (origin) " receives it again"} { "Resend to " (origin) }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct ViewQuery {
    topic: String,
    id: String,
}

pub async fn view(caller: Caller, Query(flash): Query<Flash>, Query(q): Query<ViewQuery>) -> Markup {
    let found = query(
        &caller,
        &q.topic,
        pb::query_messages_request::By::MessageId(q.id.clone()),
    )
    .await;
    let body = match found {
        Err(e) => page::error_box(&e),
        Ok(found) if found.is_empty() => page::error_box(&format!("no message {} in {}", q.id, q.topic)),
        Ok(found) => {
            let f = &found[0];
            let shown = &f.m.body[..f.m.body.len().min(MAX_SHOWN_BODY)];
            let text = std::str::from_utf8(shown).ok();
            html! {
                h1 { "Message " small { (f.m.message_id) } }
                @if is_dlq(&q.topic) { p { (resend_button(&q.topic, &f.m, &caller.may)) } }
                table #message {
                    tbody {
                        tr { th { "topic" } td { a href=(link("/topic", &[("name", &q.topic)])) { (q.topic) } } }
                        tr { th { "broker group" } td { (f.group) } }
                        tr { th { "tag" } td { (f.m.tag) } }
                        tr { th { "keys" } td { (f.m.keys.join(" ")) } }
                        tr { th { "born" } td { (page::time(f.m.born_timestamp_ms)) } }
                        tr { th { "stored" } td { (page::time(f.m.store_timestamp_ms)) } }
                        @for (k, v) in &f.m.properties { tr { th { (k) } td.wrap { (v) } } }
                    }
                }
                h2 { "Body " small { (page::bytes(f.m.body.len() as u64)) @if text.is_none() { ", not UTF-8: hex" } @if shown.len() < f.m.body.len() { ", first " (page::bytes(shown.len() as u64)) " shown" } } }
                pre #body { @match text { Some(t) => (t), None => (hex_dump(shown)) } }
                @if found.len() > 1 { p.hint { (found.len() - 1) " more message(s) carry this id (a producer's retry)." } }
            }
        }
    };
    page::shell("Message", Nav::Messages, &caller, &flash, body)
}

/// 16 bytes a line: offset, hex, and the printable ASCII.
fn hex_dump(b: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in b.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|x| format!("{x:02x}")).collect();
        let ascii: String = line
            .iter()
            .map(|&x| {
                if x.is_ascii_graphic() || x == b' ' {
                    x as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {:<47}  {ascii}\n", i * 16, hex.join(" ")));
    }
    out
}

#[derive(Deserialize)]
pub struct ResendForm {
    topic: String,
    id: String,
}

/// Sends a copy of a dead letter to the topic and queue it came from, in
/// the broker group that holds it, under a new message id (the old one in
/// `ORIGIN_MESSAGE_ID`); the broker's own properties are left behind.
pub async fn resend(caller: Caller, Form(f): Form<ResendForm>) -> Redirect {
    let here = link("/messages", &[("topic", &f.topic), ("id", &f.id)]);
    let outcome = async {
        if !is_dlq(&f.topic) {
            return Err(format!("{} is not a dead-letter topic", f.topic));
        }
        let found = query(
            &caller,
            &f.topic,
            pb::query_messages_request::By::MessageId(f.id.clone()),
        )
        .await?;
        let d = found
            .first()
            .ok_or_else(|| format!("no message {} in {}", f.id, f.topic))?;
        let origin =
            d.m.properties
                .get(DLQ_ORIGIN)
                .ok_or("this dead letter does not say where it came from")?;
        let mut parts = origin.split('/');
        let (Some(topic), Some(queue)) = (parts.next(), parts.next().and_then(|q| q.parse::<u32>().ok())) else {
            return Err(format!("unreadable origin {origin:?}"));
        };
        let addr = caller
            .groups()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|(g, _)| *g == d.group)
            .map(|(_, a)| a)
            .ok_or_else(|| format!("broker group {} is gone", d.group))?;
        let mut properties: std::collections::HashMap<String, String> =
            d.m.properties
                .iter()
                .filter(|(k, _)| !k.starts_with("__rmq."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        properties.insert(ORIGIN_MESSAGE_ID.into(), d.m.message_id.clone());
        let id = crate::client::new_message_id();
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        let r = call(
            "resend",
            c.send(pb::SendRequest {
                topic: topic.to_string(),
                queue_id: queue,
                messages: vec![pb::Message {
                    message_id: id.clone(),
                    tag: d.m.tag.clone(),
                    keys: d.m.keys.clone(),
                    properties,
                    body: d.m.body.clone(),
                    born_timestamp_ms: crate::clock::now_ms(),
                    store_timestamp_ms: 0,
                    queue_offset: 0,
                }],
            }),
        )
        .await?;
        Ok(format!(
            "resent {} to {topic} queue {queue} (offset {}) as {id}",
            f.id, r.first_queue_offset
        ))
    }
    .await;
    page::back(&here, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_dumps_show_offsets_and_ascii() {
        let d = hex_dump(b"\x00\x01AB");
        assert_eq!(d, format!("00000000  {:<47}  ..AB\n", "00 01 41 42"));
    }
}
