//! Conversions between the `raftmq.v1` messages ([`super::pb`]) and the
//! Raft layer's [`Message`].

use raftmq_raft::Message;

use super::pb;

pub fn from_pb(m: pb::Message) -> Message {
    Message {
        message_id: m.message_id,
        tag: m.tag,
        keys: m.keys,
        properties: m.properties.into_iter().collect(),
        body: m.body,
        born_timestamp_ms: m.born_timestamp_ms,
    }
}

/// A stored message as the wire carries it.
pub fn to_pb(m: Message, store_timestamp_ms: u64, queue_offset: u64) -> pb::Message {
    pb::Message {
        message_id: m.message_id,
        tag: m.tag,
        keys: m.keys,
        properties: m.properties.into_iter().collect(),
        body: m.body,
        born_timestamp_ms: m.born_timestamp_ms,
        store_timestamp_ms,
        queue_offset,
    }
}
