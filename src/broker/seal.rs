//! Seals on the tokens a broker hands to clients (receipt handles,
//! transaction ids, recall handles): a MAC keyed by the group's secret
//! ([`raftmq_raft::secret`]) over what the token names and where it may be
//! used. A token names log indexes and offsets anyone could guess; the seal
//! is what stops a caller from making one up, or from taking one given to
//! another consumer group or topic and using it there.
//!
//! # Tag
//!
//! HMAC-SHA256 over the token's domain (`"receipt"`, `"transaction"`,
//! `"recall"`) and its parts, each preceded by its length as 4 bytes
//! little-endian (so no two different lists of parts hash alike), cut to
//! its first [`TAG_LEN`] bytes and written as lowercase hex. Verification
//! is constant-time.
//!
//! A token is its body, a `.`, then the tag over the body and the token's
//! context (what it may be used for, not written in it): [`Seal::seal`]
//! and [`Seal::open`] are the only two ways tokens are made and read.
//!
//! A group gets its secret from the first leader that seals a token; until
//! then (a new group that never served a consumer) nothing is sealed.

use hmac::{Hmac, Mac};
use raftmq_raft::command::{AdminCommand, Command};
use raftmq_raft::secret::{GroupSecret, SECRET_LEN};
use sha2::Sha256;

use raftmq_raft::RaftNode;

use crate::error::BrokerError;

/// Bytes of the MAC kept in a token (128 bits).
pub const TAG_LEN: usize = 16;

/// A key to seal and check tokens with.
#[derive(Clone, Copy)]
pub struct Seal {
    secret: GroupSecret,
}

impl Seal {
    pub fn new(secret: GroupSecret) -> Seal {
        Seal { secret }
    }

    fn mac(&self, domain: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(self.secret.bytes()).expect("HMAC takes any key length");
        for p in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    /// `body` made a token of `domain` for `context`: `<body>.<tag>`.
    pub fn seal(&self, domain: &str, context: &[&[u8]], body: String) -> String {
        let tag = self.tag(domain, &with_body(context, &body));
        format!("{body}.{tag}")
    }

    /// The body of `token` if it is at most `max_len` long and was sealed
    /// in `domain` for `context`.
    pub fn open<'a>(&self, domain: &str, context: &[&[u8]], token: &'a str, max_len: usize) -> Option<&'a str> {
        if token.len() > max_len {
            return None;
        }
        let (body, tag) = token.rsplit_once('.')?;
        self.verify(domain, &with_body(context, body), tag).then_some(body)
    }

    /// The tag of `parts` in `domain`, as hex.
    pub fn tag(&self, domain: &str, parts: &[&[u8]]) -> String {
        let full = self.mac(domain, parts).finalize().into_bytes();
        hex::encode(&full[..TAG_LEN])
    }

    /// Whether `tag` (hex) is the tag of `parts` in `domain`.
    pub fn verify(&self, domain: &str, parts: &[&[u8]], tag: &str) -> bool {
        let mut bytes = [0u8; TAG_LEN];
        hex::decode_to_slice(tag, &mut bytes).is_ok() && self.mac(domain, parts).verify_truncated_left(&bytes).is_ok()
    }
}

/// The parts a token's tag covers: its context, then its body.
fn with_body<'a>(context: &[&'a [u8]], body: &'a str) -> Vec<&'a [u8]> {
    context.iter().copied().chain([body.as_bytes()]).collect()
}

/// The seal of `node`'s group as this node has applied it, if it has one.
pub fn current(node: &RaftNode) -> Option<Seal> {
    node.sm.with_metadata(|m| m.secret).map(Seal::new)
}

/// The seal of `node`'s group, on its leader: the group's secret, first
/// proposed through Raft if the group has none yet (concurrent first callers
/// may each propose one; the first committed wins).
pub async fn of(node: &RaftNode) -> Result<Seal, BrokerError> {
    if let Some(s) = current(node) {
        return Ok(s);
    }
    let mut bytes = [0u8; SECRET_LEN];
    rand::fill(&mut bytes);
    let cmd = Command::admin(&AdminCommand::InitSecret {
        secret: GroupSecret::from_bytes(bytes),
    });
    node.write(cmd).await?;
    current(node).ok_or_else(|| BrokerError::Internal("the group's secret was not applied".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_depend_on_key_domain_and_every_part() {
        let a = Seal::new(GroupSecret::from_bytes([1; SECRET_LEN]));
        let b = Seal::new(GroupSecret::from_bytes([2; SECRET_LEN]));
        let t = a.tag("receipt", &[b"G", b"T", b"1.2.3"]);
        assert_eq!(t.len(), 2 * TAG_LEN);
        assert!(a.verify("receipt", &[b"G", b"T", b"1.2.3"], &t));
        assert!(!b.verify("receipt", &[b"G", b"T", b"1.2.3"], &t));
        assert!(!a.verify("recall", &[b"G", b"T", b"1.2.3"], &t));
        assert!(!a.verify("receipt", &[b"H", b"T", b"1.2.3"], &t));
        // Lengths keep part boundaries: ("GT", "") is not ("G", "T").
        assert!(!a.verify("receipt", &[b"GT", b"", b"1.2.3"], &t));
        for bad in ["", "zz", &t[..t.len() - 2], &format!("{t}00"), &t.to_uppercase()[..]] {
            // Upper case hex is the same bytes: accepted; the rest is not.
            assert_eq!(
                a.verify("receipt", &[b"G", b"T", b"1.2.3"], bad),
                bad == t.to_uppercase()
            );
        }
    }
}
