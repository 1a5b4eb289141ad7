//! Raft entries in their two stored forms: a CommitLog record (header term,
//! index, kind; payload) and the wire's `pb::Entry` (the same four fields).
//!
//! | kind | meaning    | payload                               |
//! |-----:|------------|---------------------------------------|
//! |    0 | blank      | empty                                 |
//! |    1 | normal     | an encoded [`crate::command::Command`] |
//! |    2 | membership | openraft's `Membership` as JSON       |

use std::io;

use bytes::Bytes;
use openraft::EntryPayload as Payload;
use raftmq_store::RecordMeta;

use crate::command::Command;
use crate::pb;
use crate::types::{Entry, EntryPayload, Membership, log_id, term_of};

pub const KIND_BLANK: u8 = 0;
pub const KIND_NORMAL: u8 = 1;
pub const KIND_MEMBERSHIP: u8 = 2;

/// The record header fields and payload of an entry.
pub fn to_record(entry: &Entry) -> (RecordMeta, Bytes) {
    let (kind, payload) = match &entry.payload {
        Payload::Blank => (KIND_BLANK, Bytes::new()),
        Payload::Normal(cmd) => (KIND_NORMAL, cmd.bytes().clone()),
        // A membership is plain data; serializing it cannot fail.
        Payload::Membership(m) => (KIND_MEMBERSHIP, Bytes::from(serde_json::to_vec(m).unwrap_or_default())),
    };
    let meta = RecordMeta {
        term: term_of(&entry.log_id),
        index: entry.log_id.index,
        kind,
    };
    (meta, payload)
}

/// Rebuilds an entry from a record's (or the wire's) fields.
pub fn from_parts(term: u64, index: u64, kind: u8, payload: Bytes) -> io::Result<Entry> {
    let payload: EntryPayload = match kind {
        KIND_BLANK => Payload::Blank,
        KIND_NORMAL => Payload::Normal(Command::from_bytes(payload)),
        KIND_MEMBERSHIP => {
            let m: Membership = serde_json::from_slice(&payload)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("membership entry {index}: {e}")))?;
            Payload::Membership(m)
        }
        k => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("entry {index} has unknown kind {k}"),
            ));
        }
    };
    Ok(openraft::Entry {
        log_id: log_id(term, index),
        payload,
    })
}

pub fn to_pb(entry: &Entry) -> pb::Entry {
    let (meta, payload) = to_record(entry);
    pb::Entry {
        term: meta.term,
        index: meta.index,
        kind: u32::from(meta.kind),
        payload,
    }
}

pub fn from_pb(e: pb::Entry) -> io::Result<Entry> {
    let kind = u8::try_from(e.kind).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("entry kind {} out of range", e.kind),
        )
    })?;
    from_parts(e.term, e.index, kind, e.payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_kind_round_trips_through_record_and_wire() {
        let m = Membership::new_with_defaults(vec![BTreeSet::from([1, 2, 3])], []);
        for payload in [
            Payload::Blank,
            Payload::Normal(Command::admin(&crate::command::AdminCommand::DeleteTopic {
                name: "T".into(),
            })),
            Payload::Membership(m),
        ] {
            let e: Entry = openraft::Entry {
                log_id: log_id(3, 9),
                payload,
            };
            let (meta, bytes) = to_record(&e);
            assert_eq!(from_parts(meta.term, meta.index, meta.kind, bytes).unwrap(), e);
            assert_eq!(from_pb(to_pb(&e)).unwrap(), e);
        }
        assert!(from_parts(1, 1, 7, Bytes::new()).is_err());
        assert!(from_parts(1, 1, KIND_MEMBERSHIP, Bytes::from_static(b"{")).is_err());
    }
}
