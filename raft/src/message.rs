//! The stored form of one message: what a ConsumeQueue unit addresses inside
//! a record's payload, and what a read returns.
//!
//! # Layout (little-endian, version 1)
//!
//! | offset | size | field                                                  |
//! |-------:|-----:|--------------------------------------------------------|
//! |      0 |    4 | `total_len`, this field included                        |
//! |      4 |    1 | `version` = [`MESSAGE_VERSION`]                         |
//! |      5 |    1 | `flags` (reserved, zero)                                |
//! |      6 |    8 | `born_timestamp_ms` (set by the producer)               |
//! |     14 |    8 | `store_timestamp_ms` (set by the leader when proposing) |
//! |     22 |  2+n | `tag` (u16 length, UTF-8)                               |
//! |      … |  2+n | `keys` (u16 length, UTF-8, space separated)            |
//! |      … |  2+n | `message_id` (u16 length, UTF-8)                        |
//! |      … |  4+n | `properties` (u32 length; then `u16 len key, u16 len value` pairs) |
//! |      … |  4+n | `body` (u32 length)                                     |
//!
//! Every length is checked against `total_len` when parsing; a message
//! read from disk or the network is validated before any field is used.

use bytes::Bytes;

/// Layout version; bumped on any incompatible change.
pub const MESSAGE_VERSION: u8 = 1;
/// Bytes before the variable-length fields.
pub const FIXED_LEN: usize = 22;

/// A message as a producer hands it over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub message_id: String,
    pub tag: String,
    pub keys: Vec<String>,
    pub properties: Vec<(String, String)>,
    pub body: Bytes,
    pub born_timestamp_ms: u64,
}

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct MalformedMessage(pub String);

impl Message {
    /// Size of the encoded message.
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN
            + 2
            + self.tag.len()
            + 2
            + self.keys.iter().map(|k| k.len() + 1).sum::<usize>().saturating_sub(1)
            + 2
            + self.message_id.len()
            + 4
            + self
                .properties
                .iter()
                .map(|(k, v)| 4 + k.len() + v.len())
                .sum::<usize>()
            + 4
            + self.body.len()
    }

    /// Checks the limits the layout imposes (16-bit string lengths, no
    /// spaces inside keys).
    pub fn validate(&self) -> Result<(), MalformedMessage> {
        let short = |what: &str, s: &str| {
            if s.len() > u16::MAX as usize {
                Err(MalformedMessage(format!("{what} is longer than {} bytes", u16::MAX)))
            } else {
                Ok(())
            }
        };
        short("tag", &self.tag)?;
        short("message id", &self.message_id)?;
        let keys_len = self.keys.iter().map(|k| k.len() + 1).sum::<usize>().saturating_sub(1);
        if keys_len > u16::MAX as usize {
            return Err(MalformedMessage("keys are too long".into()));
        }
        if self.keys.iter().any(|k| k.is_empty() || k.contains(' ')) {
            return Err(MalformedMessage("a key is empty or contains a space".into()));
        }
        for (k, v) in &self.properties {
            short("a property name", k)?;
            short("a property value", v)?;
        }
        if self.encoded_len() > u32::MAX as usize {
            return Err(MalformedMessage("message too large".into()));
        }
        Ok(())
    }

    /// Appends the encoded message to `out`. Call [`Message::validate`]
    /// first; lengths are truncated otherwise.
    pub fn encode(&self, store_timestamp_ms: u64, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(&(self.encoded_len() as u32).to_le_bytes());
        out.push(MESSAGE_VERSION);
        out.push(0);
        out.extend_from_slice(&self.born_timestamp_ms.to_le_bytes());
        out.extend_from_slice(&store_timestamp_ms.to_le_bytes());
        put_short(out, self.tag.as_bytes());
        put_short(out, self.keys.join(" ").as_bytes());
        put_short(out, self.message_id.as_bytes());
        let props_len: usize = self.properties.iter().map(|(k, v)| 4 + k.len() + v.len()).sum();
        out.extend_from_slice(&(props_len as u32).to_le_bytes());
        for (k, v) in &self.properties {
            put_short(out, k.as_bytes());
            put_short(out, v.as_bytes());
        }
        out.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.body);
    }
}

fn put_short(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s);
}

/// A parsed, validated view of a stored message.
#[derive(Debug, Clone, Copy)]
pub struct MessageView<'a> {
    pub born_timestamp_ms: u64,
    pub store_timestamp_ms: u64,
    pub tag: &'a str,
    /// Space-separated keys.
    pub keys: &'a str,
    pub message_id: &'a str,
    properties: &'a [u8],
    pub body: &'a [u8],
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], MalformedMessage> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| MalformedMessage(format!("{what} runs past the end of the message")))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self, what: &str) -> Result<usize, MalformedMessage> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]) as usize)
    }
    fn u32(&mut self, what: &str) -> Result<usize, MalformedMessage> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    fn u64(&mut self, what: &str) -> Result<u64, MalformedMessage> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn short_str(&mut self, what: &str) -> Result<&'a str, MalformedMessage> {
        let n = self.u16(what)?;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| MalformedMessage(format!("{what} is not UTF-8")))
    }
}

impl<'a> MessageView<'a> {
    /// Parses the message at the start of `buf`; returns it and its length.
    pub fn parse(buf: &'a [u8]) -> Result<(MessageView<'a>, usize), MalformedMessage> {
        let mut r = Reader { buf, at: 0 };
        let total = r.u32("length")?;
        if total < FIXED_LEN || total > buf.len() {
            return Err(MalformedMessage(format!(
                "length {total} outside [{FIXED_LEN}, {}]",
                buf.len()
            )));
        }
        let mut r = Reader {
            buf: &buf[..total],
            at: 4,
        };
        let version = r.take(1, "version")?[0];
        if version != MESSAGE_VERSION {
            return Err(MalformedMessage(format!("unsupported message version {version}")));
        }
        r.take(1, "flags")?;
        let born_timestamp_ms = r.u64("born timestamp")?;
        let store_timestamp_ms = r.u64("store timestamp")?;
        let tag = r.short_str("tag")?;
        let keys = r.short_str("keys")?;
        let message_id = r.short_str("message id")?;
        let props_len = r.u32("properties")?;
        let properties = r.take(props_len, "properties")?;
        let body_len = r.u32("body")?;
        let body = r.take(body_len, "body")?;
        if r.at != total {
            return Err(MalformedMessage(format!("{} trailing bytes", total - r.at)));
        }
        let view = MessageView {
            born_timestamp_ms,
            store_timestamp_ms,
            tag,
            keys,
            message_id,
            properties,
            body,
        };
        // Validate the property list once (without allocating), so
        // iterating it later cannot fail.
        view.walk_properties(|_, _| {})?;
        Ok((view, total))
    }

    fn walk_properties(&self, mut f: impl FnMut(&'a str, &'a str)) -> Result<(), MalformedMessage> {
        let mut r = Reader {
            buf: self.properties,
            at: 0,
        };
        while r.at < self.properties.len() {
            let k = r.short_str("property name")?;
            let v = r.short_str("property value")?;
            f(k, v);
        }
        Ok(())
    }

    /// The user properties, in order.
    pub fn properties(&self) -> Vec<(&'a str, &'a str)> {
        let mut out = Vec::new();
        // Validated by `parse`.
        let _ = self.walk_properties(|k, v| out.push((k, v)));
        out
    }

    /// The keys, split.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.keys.split(' ').filter(|k| !k.is_empty())
    }

    /// An owned copy.
    pub fn to_message(&self) -> Message {
        Message {
            message_id: self.message_id.to_string(),
            tag: self.tag.to_string(),
            keys: self.keys().map(str::to_string).collect(),
            properties: self
                .properties()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: Bytes::copy_from_slice(self.body),
            born_timestamp_ms: self.born_timestamp_ms,
        }
    }
}

/// The hash RocketMQ stores for a tag in a ConsumeQueue unit: Java's
/// `String.hashCode` (over UTF-16 code units), sign-extended. Filters
/// compare hashes first and confirm with the tag itself.
pub fn tag_hash(tag: &str) -> u64 {
    if tag.is_empty() {
        return 0;
    }
    let h = tag
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    i64::from(h) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Message {
        Message {
            message_id: "01ABC".into(),
            tag: "TagA".into(),
            keys: vec!["k1".into(), "order-7".into()],
            properties: vec![("a".into(), "1".into()), ("color".into(), "red".into())],
            body: Bytes::from_static(b"hello"),
            born_timestamp_ms: 42,
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        m.validate().unwrap();
        let mut buf = Vec::new();
        m.encode(99, &mut buf);
        assert_eq!(buf.len(), m.encoded_len());
        buf.extend_from_slice(b"next message");
        let (v, len) = MessageView::parse(&buf).unwrap();
        assert_eq!(len, m.encoded_len());
        assert_eq!(v.store_timestamp_ms, 99);
        assert_eq!(v.to_message(), m);
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error() {
        let mut buf = Vec::new();
        sample().encode(1, &mut buf);
        for cut in 0..buf.len() {
            assert!(MessageView::parse(&buf[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] = 0xFF;
            let _ = MessageView::parse(&bad);
        }
    }

    #[test]
    fn java_string_hash() {
        // "TagA".hashCode() in Java is 2598919.
        assert_eq!(tag_hash("TagA"), 2598919);
        assert_eq!(tag_hash(""), 0);
        // Negative hashes are sign-extended, as RocketMQ's long tagsCode.
        assert_eq!(tag_hash("polygenelubricants") as i64, i64::from(i32::MIN));
    }
}
