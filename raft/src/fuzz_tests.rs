//! Property tests of every decoder a peer or a client reaches in this
//! crate: whatever the bytes, each one answers with a value or an error,
//! never a panic, and what it accepts keeps its invariants.
//!
//! PROPTEST_CASES sets the count (256 unless told); a longer run is
//! `PROPTEST_CASES=100000 cargo test -p raftmq-raft fuzz`.

use bytes::Bytes;
use proptest::prelude::*;

use crate::command::{Command, Decoded, MAX_QUEUES};
use crate::message::MessageView;
use crate::types::{SnapshotMeta, term_of};
use crate::{entry, pb, wire};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Numbers as a peer might send them: small, near the edges, anything.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..8,
        Just(u64::MAX),
        Just(u64::MAX >> 2),
        (u64::MAX - 8)..=u64::MAX,
        any::<u64>()
    ]
}

fn pb_entry() -> impl Strategy<Value = pb::Entry> {
    (number(), number(), 0u32..8, bytes(64)).prop_map(|(term, index, kind, payload)| pb::Entry {
        term,
        index,
        kind,
        payload: payload.into(),
    })
}

fn log_id() -> impl Strategy<Value = pb::LogId> {
    (number(), number()).prop_map(|(term, index)| pb::LogId { term, index })
}

proptest! {
    /// A command from the log or the network: a send, an admin command, a
    /// guarded send, or an error.
    #[test]
    fn commands(kind in 0u8..6, body in bytes(512)) {
        let mut raw = vec![kind];
        raw.extend_from_slice(&body);
        let len = raw.len();
        let c = Command::from_bytes(Bytes::from(raw));
        if let Ok(Decoded::Send(batches)) = c.decode() {
            // Every message accepted lies inside the command.
            for b in batches {
                for (at, n, _) in b.messages {
                    prop_assert!(at + n <= len);
                }
            }
        }
    }

    /// Admin commands are JSON: arbitrary JSON-ish text never panics.
    #[test]
    fn admin_commands(text in "\\{\"[A-Za-z]{0,12}\":[ -~]{0,80}\\}") {
        let mut raw = vec![Command::admin(&crate::command::AdminCommand::DeleteTopic { name: "T".into() }).bytes()[0]];
        raw.extend_from_slice(text.as_bytes());
        let _ = Command::from_bytes(Bytes::from(raw)).decode();
    }

    /// A stored message, as the log or a peer holds it.
    #[test]
    fn messages(raw in bytes(512)) {
        if let Ok((v, used)) = MessageView::parse(&raw) {
            prop_assert!(used <= raw.len());
            let _ = v.to_message();
        }
    }

    /// Raft entries from a peer, alone and as an append request.
    #[test]
    fn appends(vote_term in number(), prev in proptest::option::of(log_id()),
               entries in proptest::collection::vec(pb_entry(), 0..6), commit in proptest::option::of(log_id())) {
        for e in &entries {
            let _ = entry::from_pb(e.clone());
        }
        let req = pb::AppendRequest {
            vote: Some(pb::Vote { term: vote_term, voted_for: 1, committed: true }),
            prev_log_id: prev,
            entries,
            leader_commit: commit,
        };
        if let Ok(r) = wire::append_from_pb(req, u64::MAX) {
            // What is accepted follows on: consecutive indexes, terms that
            // never go down nor pass the leader's.
            let mut last = r.prev_log_id;
            for e in &r.entries {
                if let Some(p) = last {
                    prop_assert_eq!(e.log_id.index, p.index + 1);
                    prop_assert!(term_of(&p) <= term_of(&e.log_id));
                }
                prop_assert!(term_of(&e.log_id) <= r.vote.leader_id.term);
                last = Some(e.log_id);
            }
        }
    }

    /// Votes and vote requests with any terms.
    #[test]
    fn votes(term in number(), voted_for in number(), committed: bool, last in proptest::option::of(log_id())) {
        let vote = Some(pb::Vote { term, voted_for, committed });
        let _ = wire::vote_from_pb(vote);
        let _ = wire::vote_req_from_pb(pb::VoteRequest { vote, last_log_id: last, leadership_transfer: committed });
    }

    /// Snapshot data from a peer: bytes, or JSON with made-up queues.
    #[test]
    fn snapshots(raw in bytes(256), queues in proptest::collection::vec(("[ -~]{0,12}", any::<u32>(), any::<u64>()), 0..8)) {
        let meta = SnapshotMeta::default();
        let _ = crate::state_machine::check_snapshot(&meta, &raw);
        let json = serde_json::json!({
            "meta": meta,
            "metadata": { "topics": {}, "offsets": {} },
            "next_phys": 0,
            "queues": queues,
        });
        let data = serde_json::to_vec(&json).unwrap();
        if crate::state_machine::check_snapshot(&meta, &data).is_ok() {
            for (topic, q, _) in &queues {
                prop_assert!(*q < MAX_QUEUES);
                prop_assert!(raftmq_store::queue_table::validate_topic(topic).is_ok());
            }
        }
    }
}
