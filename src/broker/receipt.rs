//! Receipt handles: the opaque string a consumer gets with each delivery and
//! hands back to ack it or change its invisibility.
//!
//! # Format (version 2)
//!
//! `2.<queue id>.<queue offset>.<handle>.<tag>`: lowercase hex numbers,
//! where the handle is the log index of the entry that made the delivery
//! ([`raftmq_raft::consumption`]) and the tag is the group's seal
//! ([`super::seal`]) over the consumer group, the topic and the text before
//! it. A made-up handle, or one given to another group or for another
//! topic, is refused before it costs a Raft round; a genuine but stale one
//! is caught when the ack is applied.

use raftmq_raft::consumption::Receipt;

use super::seal::Seal;

/// Leading version field; bumped on any change of the format.
const VERSION: &str = "2";
/// Seal domain of receipt handles.
const DOMAIN: &str = "receipt";
/// Longest handle accepted (the format needs at most 76 characters).
const MAX_LEN: usize = 128;

pub fn encode(seal: &Seal, group: &str, topic: &str, r: &Receipt) -> String {
    let body = format!("{VERSION}.{:x}.{:x}.{:x}", r.queue_id, r.offset, r.handle);
    seal.seal(DOMAIN, &[group.as_bytes(), topic.as_bytes()], body)
}

/// Parses a handle; `None` if it is not one this group made for `group`
/// and `topic`.
pub fn decode(seal: &Seal, group: &str, topic: &str, s: &str) -> Option<Receipt> {
    let body = seal.open(DOMAIN, &[group.as_bytes(), topic.as_bytes()], s, MAX_LEN)?;
    let mut parts = body.split('.');
    if parts.next()? != VERSION {
        return None;
    }
    let queue_id = u32::from_str_radix(parts.next()?, 16).ok()?;
    let offset = u64::from_str_radix(parts.next()?, 16).ok()?;
    let handle = u64::from_str_radix(parts.next()?, 16).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(Receipt {
        queue_id,
        offset,
        handle,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use raftmq_raft::secret::GroupSecret;

    use super::*;

    fn seal(k: u8) -> Seal {
        Seal::new(GroupSecret::from_bytes([k; 32]))
    }

    #[test]
    fn round_trip_and_garbage() {
        let r = Receipt {
            queue_id: 7,
            offset: u64::MAX,
            handle: 12345,
        };
        let s = encode(&seal(1), "G", "T", &r);
        assert!(s.len() <= MAX_LEN);
        assert_eq!(decode(&seal(1), "G", "T", &s), Some(r));
        for bad in [
            "",
            "2",
            "2.7.0.0",
            "1.7.0.0.0",
            "x.y.z.w.v",
            &s[..s.len() - 1],
            &"9".repeat(500),
        ] {
            assert_eq!(decode(&seal(1), "G", "T", bad), None, "{bad}");
        }
        // A changed field, another group or topic, or another secret fails.
        assert_eq!(decode(&seal(1), "G", "T", &s.replacen("2.7.", "2.6.", 1)), None);
        assert_eq!(decode(&seal(1), "H", "T", &s), None);
        assert_eq!(decode(&seal(1), "G", "U", &s), None);
        assert_eq!(decode(&seal(2), "G", "T", &s), None);
    }

    proptest! {
        /// Any string is refused or decoded, never a panic; only sealed
        /// ones decode.
        #[test]
        fn arbitrary_handles(s in ".{0,200}", tail in "[0-9a-f.]{0,80}") {
            prop_assert_eq!(decode(&seal(1), "G", "T", &s), None);
            prop_assert_eq!(decode(&seal(1), "G", "T", &format!("2.{tail}")), None);
        }

        #[test]
        fn sealed_handles_round_trip(queue_id: u32, offset: u64, handle: u64) {
            let r = Receipt { queue_id, offset, handle };
            prop_assert_eq!(decode(&seal(3), "G", "T", &encode(&seal(3), "G", "T", &r)), Some(r));
        }
    }
}
