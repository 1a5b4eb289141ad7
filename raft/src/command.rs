//! State-machine commands: the application data of a Raft entry.
//!
//! A [`Command`] holds its encoded bytes, which are exactly the payload of
//! the entry's CommitLog record: encoded once by the leader, written to
//! every node's log as-is, sent over the wire as-is.
//!
//! # Layout (little-endian)
//!
//! Byte 0 is the kind:
//!
//! * [`KIND_SEND`]: messages for one or more queues.
//!
//!   | size | field                                    |
//!   |-----:|------------------------------------------|
//!   |    4 | batch count                              |
//!   |      | per batch:                               |
//!   |  2+n | topic (u16 length, UTF-8)                |
//!   |    4 | queue id                                 |
//!   |    4 | message count                            |
//!   |    … | messages, each in [`crate::message`]'s layout |
//!
//! * [`KIND_ADMIN`]: an [`AdminCommand`] as JSON (small, and its shape
//!   grows with features).
//!
//! * [`KIND_GUARDED_SEND`]: an admin command, then a send that is applied
//!   only if the admin command succeeded (a dead-letter move: the ack of
//!   the original delivery and the copy into the dead-letter topic are one
//!   entry, so they happen together or not at all).
//!
//!   | size | field                                  |
//!   |-----:|----------------------------------------|
//!   |    4 | admin JSON length                      |
//!   |    n | the [`AdminCommand`] as JSON           |
//!   |    … | a [`KIND_SEND`] payload without its kind byte |
//!
//! Decoding validates every length against the payload, so a damaged or
//! hostile payload is an error, never a panic.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::consumption::{GroupConfig, PopPlan, Popped, Receipt};
use crate::held::{HeldId, TimerKey};
use crate::message::{MalformedMessage, Message, MessageView};
use crate::secret::GroupSecret;

pub const KIND_SEND: u8 = 1;
pub const KIND_ADMIN: u8 = 2;
pub const KIND_GUARDED_SEND: u8 = 3;

/// Topic permission bits, as RocketMQ: 2 = write, 4 = read, 6 = both.
pub const PERM_WRITE: u32 = 2;
pub const PERM_READ: u32 = 4;
/// Most read or write queues a topic has in one broker group. Every count
/// from the network (topic changes, NameServer heartbeats and routes) is
/// held to it: a route is built queue by queue.
pub const MAX_QUEUES: u32 = 1024;

/// An encoded command.
#[derive(Clone, PartialEq, Eq)]
pub struct Command(Bytes);

/// Messages for one queue, as a producer sends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendBatch {
    pub topic: String,
    pub queue_id: u32,
    pub messages: Vec<Message>,
}

/// A topic's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    /// [`PERM_WRITE`] | [`PERM_READ`].
    pub perm: u32,
    /// Which messages the topic accepts (RocketMQ 5's `message.type`).
    #[serde(default)]
    pub message_type: TopicMessageType,
}

/// What a topic accepts, as RocketMQ 5's topic attribute `message.type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopicMessageType {
    #[default]
    Normal,
    Fifo,
    Delay,
    Transaction,
    /// Every type (dead-letter topics, and topics made for mixed traffic).
    Mixed,
}

impl TopicMessageType {
    pub fn as_str(self) -> &'static str {
        match self {
            TopicMessageType::Normal => "NORMAL",
            TopicMessageType::Fifo => "FIFO",
            TopicMessageType::Delay => "DELAY",
            TopicMessageType::Transaction => "TRANSACTION",
            TopicMessageType::Mixed => "MIXED",
        }
    }

    /// Parses the names [`TopicMessageType::as_str`] gives (any case); the
    /// empty string is the default.
    pub fn parse(s: &str) -> Option<TopicMessageType> {
        Some(match s.to_ascii_uppercase().as_str() {
            "" | "NORMAL" => TopicMessageType::Normal,
            "FIFO" => TopicMessageType::Fifo,
            "DELAY" => TopicMessageType::Delay,
            "TRANSACTION" => TopicMessageType::Transaction,
            "MIXED" => TopicMessageType::Mixed,
            _ => return None,
        })
    }
}

impl TopicConfig {
    pub fn writable(&self) -> bool {
        self.perm & PERM_WRITE != 0
    }
    pub fn readable(&self) -> bool {
        self.perm & PERM_READ != 0
    }
}

/// Metadata changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminCommand {
    /// Creates a topic, or updates it if it exists.
    PutTopic(TopicConfig),
    DeleteTopic {
        name: String,
    },
    /// A consumer group's offset in a queue. `bound`: the most offsets
    /// the broker group keeps (`limits.max_consumer_positions`); a commit
    /// that would add one past it is rejected, while one that moves a kept
    /// offset always applies. It travels in the command so that every
    /// replica applies the same bound (entries written before it existed
    /// have none).
    CommitOffset {
        group: String,
        topic: String,
        queue_id: u32,
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bound: Option<u64>,
    },
    /// Creates or updates a consumer group.
    PutGroup(GroupConfig),
    DeleteGroup {
        name: String,
    },
    /// A receive, planned by the leader ([`crate::consumption`]): one plan
    /// per queue it takes from.
    Pop(Vec<PopPlan>),
    Ack {
        group: String,
        topic: String,
        receipts: Vec<Receipt>,
    },
    ChangeInvisible {
        group: String,
        topic: String,
        receipt: Receipt,
        visible_at_ms: u64,
    },
    /// Drops a group's in-flight deliveries in a queue and continues at
    /// `offset` (offset resets).
    ResetConsumption {
        group: String,
        topic: String,
        queue_id: u32,
        offset: u64,
    },
    /// Timed messages leave the timer set ([`crate::held`]): all of them, or
    /// none if one is no longer pending. As the guard of a send it delivers
    /// them; alone it drops them (a recall, or a topic that is gone).
    ReleaseTimers {
        keys: Vec<TimerKey>,
    },
    /// A half message is resolved: committed (as the guard of the send
    /// that makes it visible), rolled back, or given up after its checks.
    EndTransaction {
        id: HeldId,
    },
    /// Check-backs were sent for these half messages at `at_ms`.
    TransactionsChecked {
        ids: Vec<HeldId>,
        at_ms: u64,
    },
    /// The group's secret ([`crate::secret`]), if it has none yet: the
    /// first one committed stays, later ones are ignored.
    InitSecret {
        secret: GroupSecret,
    },
    /// Takes the group out of new sends (`writable: false`, mqadmin's
    /// wipeWritePerm) or back in (addWritePerm): routes then show its
    /// queues read-only and producers' sends are refused, while consumers,
    /// retries, timers and transactions already stored go on.
    SetWritable {
        writable: bool,
    },
    /// A change to users or access policies ([`crate::acl`]).
    Acl(crate::acl::AclCommand),
    /// How long and how many message ids the deduplication window keeps
    /// ([`crate::dedup`]).
    SetDedup(crate::dedup::DedupConfig),
}

/// What applying a command produced, returned to the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Response {
    /// Applied (admin commands, blank and membership entries).
    #[default]
    Done,
    /// One outcome per batch of a send, in order.
    Sent(Vec<BatchOutcome>),
    /// The command was valid Raft data but the state machine refused it (for
    /// example a topic deleted after the leader checked it).
    Rejected(String),
    /// What a [`AdminCommand::Pop`] delivered, per plan.
    Popped(Vec<Popped>),
    /// One result per receipt of an [`AdminCommand::Ack`] (false: stale).
    Acked(Vec<bool>),
    /// The new handle of a [`AdminCommand::ChangeInvisible`] (none: stale).
    Changed(Option<u64>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOutcome {
    /// The batch's messages stored anew got queue offsets `first..first +
    /// count`, in order; `duplicates` (in batch order) were stored before
    /// and are not stored again ([`crate::dedup`]).
    Appended {
        first_queue_offset: u64,
        count: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        duplicates: Vec<Duplicate>,
    },
    Rejected(String),
}

/// A message of a send whose (topic, message id) the deduplication window
/// held: where its first copy is. For a held message (a batch to
/// [`crate::held::TIMER_TOPIC`] or [`crate::held::HALF_TOPIC`], one queue
/// whose offsets no client sees) the two fields name the first copy's
/// [`crate::held::HeldId`] instead, which its answer is made from (a
/// recall handle, a transaction id): see [`Duplicate::held_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicate {
    /// Its position in the batch.
    pub index: u32,
    /// The first copy's queue; for a held message, its ordinal.
    pub queue_id: u32,
    /// The first copy's queue offset; for a held message, its entry's index.
    pub queue_offset: u64,
}

impl Duplicate {
    /// The first copy's id, when this is a held message's duplicate.
    pub fn held_id(&self) -> crate::held::HeldId {
        crate::held::HeldId {
            index: self.queue_offset,
            ordinal: self.queue_id,
        }
    }
}

/// Where each message of an appended batch sent to `queue_id` is: the
/// `k`th message's (queue id, queue offset). `duplicates` must be in batch
/// order, as [`BatchOutcome::Appended`] holds them.
pub fn position(first_queue_offset: u64, queue_id: u32, duplicates: &[Duplicate], k: u32) -> (u32, u64) {
    let before = duplicates.partition_point(|d| d.index < k);
    match duplicates.get(before) {
        Some(d) if d.index == k => (d.queue_id, d.queue_offset),
        _ => (queue_id, first_queue_offset + u64::from(k) - before as u64),
    }
}

/// The batch's `k`th message's entry in `duplicates` (in batch order, as
/// [`BatchOutcome::Appended`] holds them), if it was not stored again.
pub fn duplicate(duplicates: &[Duplicate], k: u32) -> Option<&Duplicate> {
    duplicates
        .binary_search_by_key(&k, |d| d.index)
        .ok()
        .map(|i| &duplicates[i])
}

/// Why a payload is not a valid command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed command: {0}")]
pub struct MalformedCommand(pub String);

impl From<MalformedMessage> for MalformedCommand {
    fn from(e: MalformedMessage) -> Self {
        MalformedCommand(e.0)
    }
}

/// A decoded command borrowing the payload.
#[derive(Debug)]
pub enum Decoded<'a> {
    Send(Vec<BatchView<'a>>),
    Admin(AdminCommand),
    /// Apply the admin command; apply the send only if it succeeded.
    GuardedSend(AdminCommand, Vec<BatchView<'a>>),
}

/// One batch of a send, with each message's position in the payload.
#[derive(Debug)]
pub struct BatchView<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    /// (offset of the message within the payload, its length, the message).
    pub messages: Vec<(usize, usize, MessageView<'a>)>,
}

impl Command {
    /// Encodes a send. Every message must pass [`Message::validate`].
    pub fn send(batches: &[SendBatch], store_timestamp_ms: u64) -> Result<Command, MalformedCommand> {
        let mut out = Vec::with_capacity(16 + send_len(batches));
        out.push(KIND_SEND);
        encode_send(batches, store_timestamp_ms, &mut out)?;
        Ok(Command(Bytes::from(out)))
    }

    /// Encodes a send applied only if `guard` succeeds.
    pub fn guarded_send(
        guard: &AdminCommand,
        batches: &[SendBatch],
        store_timestamp_ms: u64,
    ) -> Result<Command, MalformedCommand> {
        let admin = serde_json::to_vec(guard).unwrap_or_default();
        let mut out = Vec::with_capacity(16 + admin.len() + send_len(batches));
        out.push(KIND_GUARDED_SEND);
        out.extend_from_slice(&(admin.len() as u32).to_le_bytes());
        out.extend_from_slice(&admin);
        encode_send(batches, store_timestamp_ms, &mut out)?;
        Ok(Command(Bytes::from(out)))
    }

    pub fn admin(cmd: &AdminCommand) -> Command {
        let mut out = vec![KIND_ADMIN];
        // Serializing these plain enums cannot fail.
        out.extend(serde_json::to_vec(cmd).unwrap_or_default());
        Command(Bytes::from(out))
    }

    /// Wraps bytes received from the log or the network; [`Command::decode`]
    /// validates them.
    pub fn from_bytes(bytes: Bytes) -> Command {
        Command(bytes)
    }

    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    pub fn decode(&self) -> Result<Decoded<'_>, MalformedCommand> {
        let p = &self.0[..];
        match p.first() {
            Some(&KIND_SEND) => decode_send(p, 1).map(Decoded::Send),
            Some(&KIND_ADMIN) => decode_admin(&p[1..]).map(Decoded::Admin),
            Some(&KIND_GUARDED_SEND) => {
                let len = p
                    .get(1..5)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or_else(|| MalformedCommand("guarded send truncated".into()))?;
                let json = p
                    .get(5..5usize.saturating_add(len))
                    .ok_or_else(|| MalformedCommand("guarded send truncated".into()))?;
                Ok(Decoded::GuardedSend(decode_admin(json)?, decode_send(p, 5 + len)?))
            }
            Some(k) => Err(MalformedCommand(format!("unknown command kind {k}"))),
            None => Err(MalformedCommand("empty payload".into())),
        }
    }
}

fn send_len(batches: &[SendBatch]) -> usize {
    batches
        .iter()
        .map(|b| 10 + b.topic.len() + b.messages.iter().map(Message::encoded_len).sum::<usize>())
        .sum()
}

fn encode_send(batches: &[SendBatch], store_timestamp_ms: u64, out: &mut Vec<u8>) -> Result<(), MalformedCommand> {
    out.extend_from_slice(&(batches.len() as u32).to_le_bytes());
    for b in batches {
        if b.topic.len() > u16::MAX as usize {
            return Err(MalformedCommand("topic name too long".into()));
        }
        out.extend_from_slice(&(b.topic.len() as u16).to_le_bytes());
        out.extend_from_slice(b.topic.as_bytes());
        out.extend_from_slice(&b.queue_id.to_le_bytes());
        out.extend_from_slice(&(b.messages.len() as u32).to_le_bytes());
        for m in &b.messages {
            m.validate()?;
            m.encode(store_timestamp_ms, out);
        }
    }
    Ok(())
}

fn decode_admin(json: &[u8]) -> Result<AdminCommand, MalformedCommand> {
    serde_json::from_slice(json).map_err(|e| MalformedCommand(format!("admin command: {e}")))
}

/// Decodes the send payload starting at `at` (after the kind byte and any
/// header); it must run to the end of `p`.
fn decode_send(p: &[u8], mut at: usize) -> Result<Vec<BatchView<'_>>, MalformedCommand> {
    let take = |at: &mut usize, n: usize| -> Result<&[u8], MalformedCommand> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= p.len())
            .ok_or_else(|| MalformedCommand("send payload truncated".into()))?;
        let s = &p[*at..end];
        *at = end;
        Ok(s)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let count = u32_of(take(&mut at, 4)?) as usize;
    // Each batch takes at least 10 bytes: bounds the allocation.
    let mut batches = Vec::with_capacity(count.min(p.len() / 10));
    for _ in 0..count {
        let tl = take(&mut at, 2)?;
        let tl = u16::from_le_bytes([tl[0], tl[1]]) as usize;
        let topic =
            std::str::from_utf8(take(&mut at, tl)?).map_err(|_| MalformedCommand("topic is not UTF-8".into()))?;
        let queue_id = u32_of(take(&mut at, 4)?);
        let n = u32_of(take(&mut at, 4)?) as usize;
        let mut messages = Vec::with_capacity(n.min(p.len() / crate::message::FIXED_LEN));
        for _ in 0..n {
            let (view, len) = MessageView::parse(&p[at..])?;
            messages.push((at, len, view));
            at += len;
        }
        batches.push(BatchView {
            topic,
            queue_id,
            messages,
        });
    }
    if at != p.len() {
        return Err(MalformedCommand(format!("{} trailing bytes", p.len() - at)));
    }
    Ok(batches)
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decode() {
            Ok(Decoded::Send(b)) => {
                let n: usize = b.iter().map(|b| b.messages.len()).sum();
                write!(f, "send({} batches, {n} messages, {} bytes)", b.len(), self.0.len())
            }
            Ok(Decoded::Admin(a)) => write!(f, "{a:?}"),
            Ok(Decoded::GuardedSend(a, b)) => write!(f, "{a:?} then send({} batches)", b.len()),
            Err(e) => write!(f, "<{e}>"),
        }
    }
}

// openraft wants its application data serde-capable; raftmq's own transport
// and log never use this (they carry the encoded bytes).
impl Serialize for Command {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Command(Bytes::from(Vec::<u8>::deserialize(d)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(i: u8) -> Message {
        Message {
            message_id: format!("id{i}"),
            tag: "t".into(),
            keys: vec![format!("k{i}")],
            properties: vec![],
            body: Bytes::from(vec![i; 10]),
            born_timestamp_ms: 5,
        }
    }

    #[test]
    fn send_round_trip_with_positions() {
        let batches = vec![
            SendBatch {
                topic: "A".into(),
                queue_id: 3,
                messages: vec![msg(1), msg(2)],
            },
            SendBatch {
                topic: "B".into(),
                queue_id: 0,
                messages: vec![msg(3)],
            },
        ];
        let cmd = Command::send(&batches, 77).unwrap();
        let Decoded::Send(views) = cmd.decode().unwrap() else {
            panic!()
        };
        assert_eq!(views.len(), 2);
        assert_eq!(
            (views[0].topic, views[0].queue_id, views[0].messages.len()),
            ("A", 3, 2)
        );
        for (at, len, view) in views.iter().flat_map(|b| &b.messages) {
            let (again, l) = MessageView::parse(&cmd.bytes()[*at..]).unwrap();
            assert_eq!((l, again.message_id), (*len, view.message_id));
            assert_eq!(view.store_timestamp_ms, 77);
        }
        for cut in 0..cmd.bytes().len() {
            assert!(
                Command::from_bytes(cmd.bytes().slice(..cut)).decode().is_err(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn guarded_send_round_trip() {
        let guard = AdminCommand::Ack {
            group: "G".into(),
            topic: "T".into(),
            receipts: vec![Receipt {
                queue_id: 1,
                offset: 2,
                handle: 3,
            }],
        };
        let batches = vec![SendBatch {
            topic: "%DLQ%G".into(),
            queue_id: 0,
            messages: vec![msg(1)],
        }];
        let cmd = Command::guarded_send(&guard, &batches, 9).unwrap();
        let Decoded::GuardedSend(g, views) = cmd.decode().unwrap() else {
            panic!()
        };
        assert_eq!(g, guard);
        assert_eq!((views[0].topic, views[0].messages.len()), ("%DLQ%G", 1));
        let (at, len, _) = views[0].messages[0];
        assert_eq!(MessageView::parse(&cmd.bytes()[at..]).unwrap().1, len);
        for cut in 0..cmd.bytes().len() {
            assert!(
                Command::from_bytes(cmd.bytes().slice(..cut)).decode().is_err(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn admin_round_trip_and_garbage() {
        let a = AdminCommand::DeleteTopic { name: "T".into() };
        assert!(matches!(Command::admin(&a).decode().unwrap(), Decoded::Admin(x) if x == a));
        assert!(Command::from_bytes(Bytes::from_static(&[9, 1, 2])).decode().is_err());
        assert!(Command::from_bytes(Bytes::new()).decode().is_err());
        // A huge batch count with no data behind it does not allocate.
        let mut p = vec![KIND_SEND];
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Command::from_bytes(Bytes::from(p)).decode().is_err());
    }
}
