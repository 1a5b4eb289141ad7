//! Receipt handles: the opaque string a consumer gets with each delivery and
//! hands back to ack it or change its invisibility.
//!
//! # Format (version 1)
//!
//! `1.<queue id>.<queue offset>.<handle>.<check>`: lowercase hex numbers,
//! where the handle is the log index of the entry that made the delivery
//! ([`raftmq_raft::consumption`]) and the check is the CRC32 of the text
//! before it. The check catches a mangled or made-up handle before it costs
//! a Raft round; a well-formed but stale handle is caught when the ack is
//! applied.

use raftmq_raft::consumption::Receipt;

/// Leading version field; bumped on any change of the format.
const VERSION: &str = "1";
/// Longest handle accepted (the format needs at most 60 characters).
const MAX_LEN: usize = 128;

pub fn encode(r: &Receipt) -> String {
    let body = format!("{VERSION}.{:x}.{:x}.{:x}", r.queue_id, r.offset, r.handle);
    let check = crc32fast::hash(body.as_bytes());
    format!("{body}.{check:x}")
}

/// Parses a handle; `None` if it is not one this broker made.
pub fn decode(s: &str) -> Option<Receipt> {
    if s.len() > MAX_LEN {
        return None;
    }
    let (body, check) = s.rsplit_once('.')?;
    if u32::from_str_radix(check, 16).ok()? != crc32fast::hash(body.as_bytes()) {
        return None;
    }
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
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let r = Receipt {
            queue_id: 7,
            offset: u64::MAX,
            handle: 12345,
        };
        let s = encode(&r);
        assert_eq!(decode(&s), Some(r));
        for bad in [
            "",
            "1",
            "1.7.0.0",
            "2.7.0.0.0",
            "x.y.z.w.v",
            &s[..s.len() - 1],
            &"9".repeat(500),
        ] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        // One changed digit fails the check.
        let tampered = s.replacen("1.7.", "1.6.", 1);
        assert_eq!(decode(&tampered), None);
    }
}
