//! Messages in the client protocol (`apache.rocketmq.v2.Message`) and as
//! raftmq stores them ([`raftmq_raft::Message`]): validation of what a
//! producer sends, and the delivered form with its system properties.
//!
//! System properties that have no field of their own in the stored layout
//! are kept as properties with reserved names ([`RESERVED_PREFIX`]), which
//! producers may not use.

use std::time::Duration;

use bytes::Bytes;
use md5::{Digest as _, Md5};
use raftmq_raft::command::TopicMessageType;
use raftmq_raft::message::MessageView;
use raftmq_raft::{Message, TopicConfig};

use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;

/// Property names starting with this are the broker's.
pub const RESERVED_PREFIX: &str = "__rmq.";
/// A FIFO message's message group (the official clients' `messageGroup`).
pub const P_GROUP: &str = "__rmq.group";
const P_TYPE: &str = "__rmq.type";
const P_BORN_HOST: &str = "__rmq.born_host";
const P_TRACE: &str = "__rmq.trace";

/// Longest message id, tag, key and message group (RocketMQ's proxy
/// bounds message groups at 64 characters; ids are 34).
const MAX_ID_LEN: usize = 128;
const MAX_TAG_LEN: usize = 1024;
const MAX_KEY_LEN: usize = 1024;
const MAX_GROUP_LEN: usize = 64;
/// Largest total of user property names and values (RocketMQ: 16 KiB).
const MAX_PROPERTIES_BYTES: usize = 16 * 1024;

/// A refusal with its v2 status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    pub fn status(&self) -> v2::Status {
        status(self.code, &self.message)
    }
}

pub fn status(code: Code, message: &str) -> v2::Status {
    v2::Status {
        code: code as i32,
        message: message.to_string(),
    }
}

pub fn ok() -> v2::Status {
    status(Code::Ok, "OK")
}

/// User property naming a delay level (RocketMQ's `DELAY`), for producers
/// that use levels rather than a delivery time.
pub const P_DELAY_LEVEL: &str = "DELAY";

/// A validated message to send: where it goes and what is stored.
#[derive(Debug)]
pub struct Outgoing {
    pub topic: String,
    pub queue_id: u32,
    pub message: Message,
    pub hold: Hold,
}

/// Whether a message is held back from its consumers ([`raftmq_raft::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Visible at once.
    None,
    /// A timed message, due at this time (ms since the epoch).
    Until(u64),
    /// A transaction's half message: visible once committed.
    Transaction,
}

/// What a send is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits<'a> {
    pub max_body: usize,
    /// The leader's clock.
    pub now_ms: u64,
    /// Latest delivery time, from now.
    pub max_delay_ms: u64,
    /// Delay of each level, level 1 first.
    pub delay_levels_ms: &'a [u64],
}

fn bad(code: Code, m: impl Into<String>) -> Refusal {
    Refusal::new(code, m)
}

fn is_clean(s: &str) -> bool {
    !s.trim().is_empty() && !s.chars().any(char::is_control)
}

/// Validates a producer's message against its topic and the body limit.
pub fn incoming(m: v2::Message, topic: &TopicConfig, limits: &Limits<'_>) -> Result<Outgoing, Refusal> {
    let max_body = limits.max_body;
    let sp = m.system_properties.unwrap_or_default();
    let name = m.topic.map(|t| t.name).unwrap_or_default();
    if sp.message_id.is_empty() || sp.message_id.len() > MAX_ID_LEN || !is_clean(&sp.message_id) {
        return Err(bad(Code::IllegalMessageId, "the message id is missing or malformed"));
    }
    let tag = sp.tag.unwrap_or_default();
    if !tag.is_empty() && (!is_clean(&tag) || tag.contains('|') || tag.len() > MAX_TAG_LEN) {
        return Err(bad(
            Code::IllegalMessageTag,
            format!("tag {tag:?} is blank, too long or contains '|'"),
        ));
    }
    for k in &sp.keys {
        if !is_clean(k) || k.chars().any(char::is_whitespace) || k.len() > MAX_KEY_LEN {
            return Err(bad(
                Code::IllegalMessageKey,
                format!("key {k:?} is blank, too long or contains whitespace"),
            ));
        }
    }
    if m.body.is_empty() {
        return Err(bad(Code::MessageBodyEmpty, "the message body is empty"));
    }
    if m.body.len() > max_body {
        return Err(bad(
            Code::MessageBodyTooLarge,
            format!("message body of {} bytes exceeds the limit of {max_body}", m.body.len()),
        ));
    }
    let mut props_bytes = 0usize;
    for (k, v) in &m.user_properties {
        if !is_clean(k) || k.starts_with(RESERVED_PREFIX) || k.len() > u16::MAX as usize {
            return Err(bad(
                Code::IllegalMessagePropertyKey,
                format!("property name {k:?} is not allowed"),
            ));
        }
        props_bytes += k.len() + v.len();
    }
    if props_bytes > MAX_PROPERTIES_BYTES {
        return Err(bad(
            Code::MessagePropertiesTooLarge,
            format!("properties of {props_bytes} bytes exceed the limit of {MAX_PROPERTIES_BYTES}"),
        ));
    }
    let group = sp.message_group.unwrap_or_default();
    if !group.is_empty() && (!is_clean(&group) || group.len() > MAX_GROUP_LEN) {
        return Err(bad(
            Code::IllegalMessageGroup,
            format!("message group is blank or longer than {MAX_GROUP_LEN} characters"),
        ));
    }
    let kind = v2::MessageType::try_from(sp.message_type).unwrap_or(v2::MessageType::Unspecified);
    let kind = match kind {
        v2::MessageType::Unspecified if !group.is_empty() => v2::MessageType::Fifo,
        v2::MessageType::Unspecified => v2::MessageType::Normal,
        k => k,
    };
    match kind {
        v2::MessageType::Normal if !group.is_empty() => {
            return Err(bad(
                Code::MessagePropertyConflictWithType,
                "a NORMAL message has no message group",
            ));
        }
        v2::MessageType::Fifo if group.is_empty() => {
            return Err(bad(
                Code::MessagePropertyConflictWithType,
                "a FIFO message needs a message group",
            ));
        }
        v2::MessageType::Normal | v2::MessageType::Fifo => {}
        v2::MessageType::Delay if sp.delivery_timestamp.is_none() => {
            return Err(bad(
                Code::MessagePropertyConflictWithType,
                "a DELAY message needs a delivery timestamp",
            ));
        }
        v2::MessageType::Delay | v2::MessageType::Transaction if !group.is_empty() => {
            return Err(bad(
                Code::MessagePropertyConflictWithType,
                format!("a {} message has no message group", kind.as_str_name()),
            ));
        }
        v2::MessageType::Delay | v2::MessageType::Transaction => {}
        other => {
            return Err(bad(
                Code::Unsupported,
                format!("{} messages are not supported", other.as_str_name()),
            ));
        }
    }
    let hold = hold_of(sp.delivery_timestamp, kind, &m.user_properties, limits)?;
    let accepted = accepted_types(topic.message_type);
    if !accepted.contains(&kind) {
        return Err(bad(
            Code::MessagePropertyConflictWithType,
            format!(
                "topic {name} accepts {} messages, not {}",
                topic.message_type.as_str(),
                kind.as_str_name()
            ),
        ));
    }
    let queue_id = u32::try_from(sp.queue_id).map_err(|_| bad(Code::BadRequest, "negative queue id"))?;
    let mut properties: Vec<(String, String)> = m.user_properties.into_iter().collect();
    properties.sort();
    if !group.is_empty() {
        properties.push((P_GROUP.into(), group));
    }
    properties.push((P_TYPE.into(), kind.as_str_name().into()));
    if !sp.born_host.is_empty() {
        properties.push((P_BORN_HOST.into(), sp.born_host.chars().take(256).collect()));
    }
    if let Some(t) = sp.trace_context.filter(|t| !t.is_empty()) {
        properties.push((P_TRACE.into(), t.chars().take(4096).collect()));
    }
    let born = sp.born_timestamp.map_or(0, |t| millis_of(&t));
    let message = Message {
        message_id: sp.message_id,
        tag,
        keys: sp.keys,
        properties,
        body: m.body,
        born_timestamp_ms: born,
    };
    message.validate().map_err(|e| bad(Code::BadRequest, e.to_string()))?;
    Ok(Outgoing {
        topic: name,
        queue_id,
        message,
        hold,
    })
}

/// When a message becomes visible: a delivery time (due now or earlier:
/// released at once), a delay level, or a transaction's commit.
fn hold_of(
    delivery: Option<prost_types::Timestamp>,
    kind: v2::MessageType,
    user: &std::collections::HashMap<String, String>,
    limits: &Limits<'_>,
) -> Result<Hold, Refusal> {
    if kind == v2::MessageType::Transaction {
        if delivery.is_some() {
            return Err(bad(
                Code::MessagePropertyConflictWithType,
                "a TRANSACTION message has no delivery timestamp",
            ));
        }
        return Ok(Hold::Transaction);
    }
    let due = match (&delivery, user.get(P_DELAY_LEVEL)) {
        (Some(t), _) => {
            if t.seconds < 0 || !(0..1_000_000_000).contains(&t.nanos) {
                return Err(bad(Code::IllegalDeliveryTime, "the delivery timestamp is out of range"));
            }
            millis_of(t)
        }
        (None, Some(level)) => {
            let level: usize = level.trim().parse().map_err(|_| {
                bad(
                    Code::IllegalMessagePropertyKey,
                    format!("delay level {level:?} is not a number"),
                )
            })?;
            if level == 0 {
                return Ok(Hold::None);
            }
            let levels = limits.delay_levels_ms;
            // RocketMQ clamps a level past the last one to the last one.
            let delay = level
                .min(levels.len())
                .checked_sub(1)
                .and_then(|i| levels.get(i))
                .copied()
                .unwrap_or(0);
            limits.now_ms.saturating_add(delay)
        }
        (None, None) => return Ok(Hold::None),
    };
    if kind == v2::MessageType::Fifo {
        // Holding one message back would reorder its message group.
        return Err(bad(
            Code::MessagePropertyConflictWithType,
            "a FIFO message cannot be delayed",
        ));
    }
    if due > limits.now_ms.saturating_add(limits.max_delay_ms) {
        return Err(bad(
            Code::IllegalDeliveryTime,
            format!(
                "the delivery time is more than {} s away (the broker's timer.max_delay_ms)",
                limits.max_delay_ms / 1000
            ),
        ));
    }
    // Due already, it is still held (and released at once): a retry of a
    // send that was held must meet its first copy in the deduplication
    // window, which knows it under the timer topic; stored straight into
    // its topic, the retry would be a second copy.
    Ok(Hold::Until(due))
}

/// The v2 message types a topic accepts.
pub fn accepted_types(t: TopicMessageType) -> Vec<v2::MessageType> {
    use v2::MessageType as M;
    match t {
        TopicMessageType::Normal => vec![M::Normal],
        TopicMessageType::Fifo => vec![M::Fifo],
        TopicMessageType::Delay => vec![M::Delay],
        TopicMessageType::Transaction => vec![M::Transaction],
        TopicMessageType::Mixed => vec![M::Normal, M::Fifo, M::Delay, M::Transaction],
    }
}

/// How one delivery of a stored message is described to a consumer.
pub struct Delivery<'a> {
    pub topic: &'a str,
    pub namespace: &'a str,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub store_host: &'a str,
    /// Pop deliveries only.
    pub receipt_handle: Option<String>,
    pub attempt: Option<u32>,
    pub invisible: Option<Duration>,
    /// The stored bytes the message was parsed from, when the caller holds
    /// them as [`Bytes`]: the body then shares them instead of being
    /// copied again.
    pub stored: Option<&'a Bytes>,
}

/// The delivered form of a stored message.
pub fn outgoing(v: &MessageView<'_>, d: &Delivery<'_>) -> v2::Message {
    let mut sp = v2::SystemProperties {
        tag: (!v.tag.is_empty()).then(|| v.tag.to_string()),
        keys: v.keys().map(str::to_string).collect(),
        message_id: v.message_id.to_string(),
        body_digest: Some(v2::Digest {
            r#type: v2::DigestType::Md5 as i32,
            checksum: md5_hex(v.body),
        }),
        body_encoding: v2::Encoding::Identity as i32,
        message_type: v2::MessageType::Normal as i32,
        born_timestamp: Some(timestamp(v.born_timestamp_ms)),
        store_timestamp: Some(timestamp(v.store_timestamp_ms)),
        store_host: d.store_host.to_string(),
        receipt_handle: d.receipt_handle.clone(),
        queue_id: d.queue_id as i32,
        queue_offset: Some(d.queue_offset as i64),
        invisible_duration: d.invisible.map(duration),
        delivery_attempt: d.attempt.map(|a| a as i32),
        ..Default::default()
    };
    let mut user = std::collections::HashMap::new();
    for (k, val) in v.properties() {
        match k {
            P_GROUP => sp.message_group = Some(val.to_string()),
            P_TYPE => {
                sp.message_type = v2::MessageType::from_str_name(val).unwrap_or(v2::MessageType::Normal) as i32;
            }
            P_BORN_HOST => sp.born_host = val.to_string(),
            P_TRACE => sp.trace_context = Some(val.to_string()),
            raftmq_raft::held::P_DELIVER_AT => sp.delivery_timestamp = val.parse().ok().map(timestamp),
            k if k.starts_with(RESERVED_PREFIX) => {}
            k => {
                user.insert(k.to_string(), val.to_string());
            }
        }
    }
    v2::Message {
        topic: Some(v2::Resource {
            resource_namespace: d.namespace.to_string(),
            name: d.topic.to_string(),
        }),
        user_properties: user,
        system_properties: Some(sp),
        body: shared_body(v.body, d.stored),
    }
}

/// `body` as [`Bytes`]: a view of `stored` when it lies inside it, else a
/// copy.
fn shared_body(body: &[u8], stored: Option<&Bytes>) -> Bytes {
    match stored {
        Some(s)
            if s.as_ptr_range().start <= body.as_ptr_range().start
                && body.as_ptr_range().end <= s.as_ptr_range().end =>
        {
            s.slice_ref(body)
        }
        _ => Bytes::copy_from_slice(body),
    }
}

/// MD5 of a body as uppercase hex, as the clients check it.
pub fn md5_hex(body: &[u8]) -> String {
    let d = Md5::digest(body);
    d.iter().map(|b| format!("{b:02X}")).collect()
}

pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

pub fn millis_of(t: &prost_types::Timestamp) -> u64 {
    let ms = t
        .seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000);
    u64::try_from(ms).unwrap_or(0)
}

pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A protocol duration as a `Duration`; `None` if negative or malformed.
pub fn from_duration(d: &prost_types::Duration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return None;
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(t: TopicMessageType) -> TopicConfig {
        TopicConfig {
            name: "T".into(),
            read_queues: 4,
            write_queues: 4,
            perm: 6,
            message_type: t,
        }
    }

    const LEVELS: [u64; 3] = [1_000, 5_000, 10_000];

    fn limits(max_body: usize) -> Limits<'static> {
        Limits {
            max_body,
            now_ms: 1_000_000,
            max_delay_ms: 40 * 86_400_000,
            delay_levels_ms: &LEVELS,
        }
    }

    fn msg(group: Option<&str>) -> v2::Message {
        v2::Message {
            topic: Some(v2::Resource {
                resource_namespace: String::new(),
                name: "T".into(),
            }),
            user_properties: [("a".to_string(), "1".to_string())].into(),
            system_properties: Some(v2::SystemProperties {
                tag: Some("TagA".into()),
                keys: vec!["k1".into()],
                message_id: "01ABC".into(),
                message_group: group.map(str::to_string),
                queue_id: 2,
                born_timestamp: Some(timestamp(1234)),
                ..Default::default()
            }),
            body: Bytes::from_static(b"hello"),
        }
    }

    #[test]
    fn round_trip_keeps_system_properties_apart() {
        let out = incoming(msg(Some("g1")), &topic(TopicMessageType::Fifo), &limits(100)).unwrap();
        assert_eq!((out.topic.as_str(), out.queue_id), ("T", 2));
        let mut bytes = Vec::new();
        out.message.encode(99, &mut bytes);
        let bytes = Bytes::from(bytes);
        let (view, _) = MessageView::parse(&bytes).unwrap();
        let d = Delivery {
            topic: "T",
            namespace: "",
            queue_id: 2,
            queue_offset: 5,
            store_host: "h",
            receipt_handle: Some("r".into()),
            attempt: Some(1),
            invisible: None,
            stored: Some(&bytes),
        };
        let m = outgoing(&view, &d);
        // The body is a view of the stored bytes, not a copy.
        assert!(bytes.as_ptr_range().contains(&m.body.as_ptr()));
        assert_eq!(m.body, view.body);
        // Bytes the view does not lie in are copied.
        let elsewhere = Bytes::from_static(b"unrelated");
        assert_eq!(shared_body(view.body, Some(&elsewhere)), view.body);
        let sp = m.system_properties.unwrap();
        assert_eq!(m.user_properties.len(), 1);
        assert_eq!(sp.message_group.as_deref(), Some("g1"));
        assert_eq!(sp.message_type, v2::MessageType::Fifo as i32);
        assert_eq!(sp.body_digest.unwrap().checksum, "5D41402ABC4B2A76B9719D911017C592");
        assert_eq!(millis_of(&sp.born_timestamp.unwrap()), 1234);
    }

    #[test]
    fn each_refusal_has_its_code() {
        let t = topic(TopicMessageType::Normal);
        let code = |m: v2::Message, max: usize| incoming(m, &t, &limits(max)).unwrap_err().code;
        assert_eq!(code(msg(Some("g")), 100), Code::MessagePropertyConflictWithType);
        assert_eq!(code(msg(None), 3), Code::MessageBodyTooLarge);
        let mut m = msg(None);
        m.body = Bytes::new();
        assert_eq!(code(m, 100), Code::MessageBodyEmpty);
        let mut m = msg(None);
        m.system_properties.as_mut().unwrap().tag = Some("a||b".into());
        assert_eq!(code(m, 100), Code::IllegalMessageTag);
        let mut m = msg(None);
        m.system_properties.as_mut().unwrap().keys = vec!["a b".into()];
        assert_eq!(code(m, 100), Code::IllegalMessageKey);
        let mut m = msg(None);
        m.system_properties.as_mut().unwrap().message_id.clear();
        assert_eq!(code(m, 100), Code::IllegalMessageId);
        let mut m = msg(None);
        m.user_properties.insert("__rmq.group".into(), "x".into());
        assert_eq!(code(m, 100), Code::IllegalMessagePropertyKey);
        let mut m = msg(None);
        m.system_properties.as_mut().unwrap().message_type = v2::MessageType::Delay as i32;
        assert_eq!(code(m, 100), Code::MessagePropertyConflictWithType);
        let mut m = msg(None);
        let sp = m.system_properties.as_mut().unwrap();
        sp.message_type = v2::MessageType::Delay as i32;
        sp.delivery_timestamp = Some(timestamp(1_000_000 + 41 * 86_400_000));
        let delay = topic(TopicMessageType::Delay);
        assert_eq!(
            incoming(m, &delay, &limits(100)).unwrap_err().code,
            Code::IllegalDeliveryTime
        );
    }

    #[test]
    fn delivery_times_and_levels_hold_a_message() {
        let delay = topic(TopicMessageType::Delay);
        let timed = |ms: u64| {
            let mut m = msg(None);
            let sp = m.system_properties.as_mut().unwrap();
            sp.message_type = v2::MessageType::Delay as i32;
            sp.delivery_timestamp = Some(timestamp(ms));
            incoming(m, &delay, &limits(100)).unwrap().hold
        };
        assert_eq!(timed(1_002_500), Hold::Until(1_002_500));
        // Due already: held all the same, and released at once.
        assert_eq!(timed(999_000), Hold::Until(999_000));
        let level = |l: &str| {
            let mut m = msg(None);
            m.user_properties.insert(P_DELAY_LEVEL.into(), l.into());
            incoming(m, &topic(TopicMessageType::Normal), &limits(100)).map(|o| o.hold)
        };
        assert_eq!(level("2"), Ok(Hold::Until(1_005_000)));
        // Past the last level: the last level, as RocketMQ.
        assert_eq!(level("99"), Ok(Hold::Until(1_010_000)));
        assert_eq!(level("0"), Ok(Hold::None));
        assert_eq!(level("x").unwrap_err().code, Code::IllegalMessagePropertyKey);
        let mut fifo = msg(Some("g"));
        fifo.user_properties.insert(P_DELAY_LEVEL.into(), "1".into());
        assert_eq!(
            incoming(fifo, &topic(TopicMessageType::Fifo), &limits(100))
                .unwrap_err()
                .code,
            Code::MessagePropertyConflictWithType
        );
        let mut m = msg(None);
        m.system_properties.as_mut().unwrap().message_type = v2::MessageType::Transaction as i32;
        let txn = topic(TopicMessageType::Transaction);
        assert_eq!(incoming(m, &txn, &limits(100)).unwrap().hold, Hold::Transaction);
    }
}
