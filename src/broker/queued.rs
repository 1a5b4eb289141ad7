//! A queue's message as this node stores it, checked on the way out: the
//! ConsumeQueue unit must lead to a message of the unit's own size and tag.
//!
//! A unit that does not is damage on this node, never a message to pass
//! over: skipping it would hand the client a silent gap (a jepsen campaign
//! found one, when two flipped bits in a ConsumeQueue left a committed
//! message out of a drain). Damage is refused with `INTERNAL_ERROR`, so the
//! client reads from another node, and noted, so that the node's next start
//! sets its store aside to be sent it again by the group
//! ([`raftmq_raft::quarantine`]). Only a message retention deleted
//! meanwhile (or whose topic went) is passed over, never one whose unit
//! fails its block's seal.

use raftmq_raft::RaftNode;
use raftmq_raft::message::{MessageView, tag_hash};
use raftmq_store::{CqUnit, LogSlice};

use crate::error::BrokerError;

/// What a queue offset holds on this node.
pub enum Queued {
    /// The unit and the bytes it leads to (check them with [`parse`]).
    Found(CqUnit, LogSlice),
    /// Deleted by retention, or the queue is gone: nothing to serve, ever.
    Purged,
}

/// The message at offset `q` of `topic`'s queue `queue_id`.
pub fn queued(node: &RaftNode, topic: &str, queue_id: u32, q: u64) -> Result<Queued, BrokerError> {
    match node.store.message(topic, queue_id, q) {
        Ok((unit, bytes)) => Ok(Queued::Found(unit, bytes)),
        Err(_) if gone(node, topic, queue_id, q) => Ok(Queued::Purged),
        Err(e) => Err(damaged(node, topic, queue_id, q, &e.to_string())),
    }
}

/// The unit at offset `q`, without its message (`None`: purged).
pub fn unit(node: &RaftNode, topic: &str, queue_id: u32, q: u64) -> Result<Option<CqUnit>, BrokerError> {
    let Some(cq) = node.store.queue(topic, queue_id) else {
        return Ok(None);
    };
    match cq.get(q) {
        Ok(unit) => Ok(Some(unit)),
        Err(_) if gone(node, topic, queue_id, q) => Ok(None),
        Err(e) => Err(damaged(node, topic, queue_id, q, &e.to_string())),
    }
}

/// The message `unit` led to, parsed, once the unit is found to describe
/// it (its size and tag hash).
pub fn parse<'a>(
    node: &RaftNode,
    topic: &str,
    queue_id: u32,
    q: u64,
    unit: &CqUnit,
    bytes: &'a [u8],
) -> Result<MessageView<'a>, BrokerError> {
    let why = match MessageView::parse(bytes) {
        Ok((view, len)) if len == bytes.len() && tag_hash(view.tag) == unit.tag_hash => return Ok(view),
        Ok(_) => format!("the unit ({} bytes) does not describe the message there", bytes.len()),
        Err(e) => e.to_string(),
    };
    Err(damaged(node, topic, queue_id, q, &why))
}

/// Whether offset `q` could not be read for a reason that is not damage:
/// retention took it (it is below the queue's start, or its unit points
/// below the log's start: retention and a snapshot install move the log's
/// start before the queues'), or the queue is gone or was made again
/// (a topic deleted meanwhile).
fn gone(node: &RaftNode, topic: &str, queue_id: u32, q: u64) -> bool {
    let Some(cq) = node.store.queue(topic, queue_id) else {
        return true;
    };
    if q < cq.min_offset() || q >= cq.max_offset() {
        return true;
    }
    cq.get(q)
        .is_ok_and(|unit| unit.phys < node.store.commitlog().min_offset())
}

/// Notes the damage and says so to the client.
fn damaged(node: &RaftNode, topic: &str, queue_id: u32, q: u64, why: &str) -> BrokerError {
    node.note_damage(&format!(
        "{topic}/{queue_id} offset {q}: a ConsumeQueue unit does not lead to its message: {why}"
    ));
    BrokerError::Internal(format!(
        "{topic}/{queue_id} offset {q}: this node's index is damaged ({why}); read from another node"
    ))
}
