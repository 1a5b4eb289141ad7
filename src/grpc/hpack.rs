//! Reads a client's HPACK header blocks without decoding them, to fix the
//! `:authority` fields h2 would refuse ([`super::h2_authority`]).
//!
//! A header block is a sequence of field representations (RFC 7541 §6),
//! each referring to or adding to the sender's dynamic table. Decoding
//! every block and encoding it again (what this shim did first) cost a
//! fifth of the leader's CPU. Instead, [`AuthorityFix`] walks the
//! representations, decoding only what it must: the `:authority` values,
//! and the lengths of Huffman-coded strings the client adds to its table
//! (an entry's size is its decoded length, RFC 7541 §4.1). Every other
//! byte passes through as it came, so h2 decodes the client's own
//! encoding with a dynamic table that follows the client's.
//!
//! # Replacing a field without losing the table
//!
//! A bad authority the client adds to its table ("literal with incremental
//! indexing") is replaced by a representation that adds the *fixed* value
//! instead. Both tables then hold the same entries in the same order; only
//! that entry is smaller in h2's. Entries are evicted oldest first until the
//! table fits its size, so h2's table always holds at least the newest
//! entries the client's holds, and an index (counted from the newest) names
//! the same entry in both. A later reference to that entry yields the fixed
//! value. The replacement must never be larger than the original, which is
//! why an authority that cannot be cut to a valid address is replaced by
//! [`PLACEHOLDER`] (one byte) rather than dropped.
//!
//! # Representations (RFC 7541 §6), by their first bits
//!
//! | first bits | representation                        | integer prefix |
//! |------------|---------------------------------------|---------------:|
//! | `1`        | indexed field                         | 7 bits         |
//! | `01`       | literal, added to the table           | 6 bits (name)  |
//! | `001`      | dynamic table size update             | 5 bits         |
//! | `0000`     | literal, not added                    | 4 bits (name)  |
//! | `0001`     | literal, never to be added            | 4 bits (name)  |
//!
//! A name index of 0 means a literal name follows. A string is one bit
//! (Huffman-coded or not), a 7-bit-prefix length, then that many bytes.
//! Indices 1..=61 are the static table, 62 and up the dynamic table,
//! newest first.

use std::collections::VecDeque;

/// What HPACK counts for each table entry beyond its name and value.
const ENTRY_OVERHEAD: usize = 32;
/// The dynamic table size the client may use: the protocol default, which
/// h2 announces unless told otherwise.
pub const TABLE_SIZE: usize = 4096;
/// Largest integer accepted: far above any length a 64 KiB block can hold,
/// and small enough that decoding cannot overflow.
const MAX_INTEGER: usize = 1 << 24;
/// Stands in for an authority the client adds to its table that cannot be
/// made valid: one byte, so it is never larger than the original.
pub const PLACEHOLDER: &[u8] = b"x";
const AUTHORITY: &[u8] = b":authority";

/// Names of the static table (RFC 7541 Appendix A), index 1 first. Only
/// their lengths matter here (an entry added with a static name counts it),
/// and only index 1 is the authority.
const STATIC_NAMES: [&str; 61] = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
];

/// A malformed header block; the connection is closed.
#[derive(Debug, PartialEq, Eq)]
pub struct BadBlock(pub &'static str);

/// An entry of the client's dynamic table, as far as the fix needs it.
#[derive(Clone, Copy, Debug)]
struct Entry {
    name_len: usize,
    /// Name, value and overhead, as the client counts it.
    size: usize,
    authority: bool,
    /// For an authority: h2's copy of the entry is valid (fixed on the way
    /// in, or valid as sent). Always true for other names.
    valid: bool,
}

/// What the fix does to one authority value.
enum Verdict {
    Keep,
    Replace(Vec<u8>),
    /// Invalid and not fixable.
    Bad,
}

/// The client's dynamic table, mirrored for one connection.
pub struct AuthorityFix {
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// A decoded string, reused.
    scratch: Vec<u8>,
}

impl Default for AuthorityFix {
    fn default() -> Self {
        AuthorityFix {
            table: VecDeque::new(),
            size: 0,
            max_size: TABLE_SIZE,
            scratch: Vec::new(),
        }
    }
}

impl AuthorityFix {
    /// Reads one complete header block. Returns `None` when it passes as
    /// it is (the common case: nothing is copied), or the block to send on
    /// instead, with every authority valid or gone.
    pub fn fix(&mut self, block: &[u8]) -> Result<Option<Vec<u8>>, BadBlock> {
        let mut out: Option<Vec<u8>> = None;
        // Bytes of `block` before this have been copied to `out` (or dropped).
        let mut copied = 0;
        let mut at = 0;
        let mut fields = 0usize;
        while at < block.len() {
            let start = at;
            let first = block[at];
            if first & 0x80 != 0 {
                let index = integer(block, &mut at, 7)?;
                let entry = self.lookup(index)?;
                fields += 1;
                if entry.authority && !entry.valid {
                    // No table effect: the reference can simply go.
                    let out = out.get_or_insert_with(|| Vec::with_capacity(block.len()));
                    out.extend_from_slice(&block[copied..start]);
                    copied = at;
                }
                continue;
            }
            if first & 0xe0 == 0x20 {
                // RFC 7541 §4.2: only at the start of a block.
                if fields > 0 {
                    return Err(BadBlock("table size update after a header field"));
                }
                let size = integer(block, &mut at, 5)?;
                if size > TABLE_SIZE {
                    return Err(BadBlock("table size update above the agreed size"));
                }
                self.max_size = size;
                self.evict(0);
                continue;
            }
            fields += 1;
            let (prefix, indexed) = if first & 0xc0 == 0x40 { (6, true) } else { (4, false) };
            let name_index = integer(block, &mut at, prefix)?;
            let (name_len, authority) = if name_index == 0 {
                let name = self.string(block, &mut at)?;
                (name.len(), name == AUTHORITY)
            } else {
                let e = self.lookup(name_index)?;
                (e.name_len, e.authority)
            };
            let value_len = if authority {
                self.string(block, &mut at)?.len()
            } else {
                self.string_len(block, &mut at)?
            };
            let verdict = if authority { judge(&self.scratch) } else { Verdict::Keep };
            let mut valid = true;
            match verdict {
                Verdict::Keep => {}
                Verdict::Bad if !indexed => {
                    let out = out.get_or_insert_with(|| Vec::with_capacity(block.len()));
                    out.extend_from_slice(&block[copied..start]);
                    copied = at;
                }
                Verdict::Bad if value_len < PLACEHOLDER.len() => {
                    // An empty authority added to the table: nothing valid is
                    // as small, so it goes on as sent and h2 refuses the
                    // request (and those that refer to it).
                    valid = false;
                }
                Verdict::Bad | Verdict::Replace(_) => {
                    let value = match verdict {
                        Verdict::Replace(v) => v,
                        _ => PLACEHOLDER.to_vec(),
                    };
                    let out = out.get_or_insert_with(|| Vec::with_capacity(block.len()));
                    out.extend_from_slice(&block[copied..start]);
                    // Same kind of representation, the static name, a raw value.
                    let kind = if indexed { 0x40 } else { first & 0xf0 };
                    put_integer(out, kind, if indexed { 6 } else { 4 }, 1);
                    put_integer(out, 0, 7, value.len());
                    out.extend_from_slice(&value);
                    copied = at;
                }
            }
            if indexed {
                self.insert(Entry {
                    name_len,
                    size: name_len + value_len + ENTRY_OVERHEAD,
                    authority,
                    valid,
                });
            }
        }
        Ok(out.map(|mut out| {
            out.extend_from_slice(&block[copied..]);
            out
        }))
    }

    fn lookup(&self, index: usize) -> Result<Entry, BadBlock> {
        match index {
            0 => Err(BadBlock("header field index 0")),
            1..=61 => Ok(Entry {
                name_len: STATIC_NAMES[index - 1].len(),
                size: 0,
                authority: index == 1,
                // The static authority has an empty value.
                valid: index != 1,
            }),
            _ => self
                .table
                .get(index - 62)
                .copied()
                .ok_or(BadBlock("header field index beyond the table")),
        }
    }

    fn insert(&mut self, e: Entry) {
        if e.size > self.max_size {
            // RFC 7541 §4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(e.size);
        self.size += e.size;
        self.table.push_front(e);
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some(old) = self.table.pop_back() else { break };
            self.size -= old.size;
        }
    }

    /// Decodes the string at `at` into `scratch`.
    fn string<'a>(&'a mut self, block: &[u8], at: &mut usize) -> Result<&'a [u8], BadBlock> {
        let (huffman, raw) = string_bytes(block, at)?;
        self.scratch.clear();
        if huffman {
            httlib_huffman::decode(raw, &mut self.scratch, httlib_huffman::DecoderSpeed::FourBits)
                .map_err(|_| BadBlock("bad Huffman code"))?;
        } else {
            self.scratch.extend_from_slice(raw);
        }
        Ok(&self.scratch)
    }

    /// The decoded length of the string at `at`.
    fn string_len(&mut self, block: &[u8], at: &mut usize) -> Result<usize, BadBlock> {
        let mut peek = *at;
        let (huffman, raw) = string_bytes(block, &mut peek)?;
        if !huffman {
            *at = peek;
            return Ok(raw.len());
        }
        Ok(self.string(block, at)?.len())
    }
}

/// What becomes of an authority value: kept when valid, cut to its first
/// comma-separated address when that is valid, bad otherwise.
fn judge(value: &[u8]) -> Verdict {
    let valid = |v: &[u8]| !v.is_empty() && tonic::codegen::http::uri::Authority::try_from(v).is_ok();
    if valid(value) {
        return Verdict::Keep;
    }
    let first = value.split(|b| *b == b',').next().unwrap_or_default();
    if valid(first) {
        Verdict::Replace(first.to_vec())
    } else {
        Verdict::Bad
    }
}

/// The string at `at`: whether it is Huffman-coded, and its bytes.
fn string_bytes<'a>(block: &'a [u8], at: &mut usize) -> Result<(bool, &'a [u8]), BadBlock> {
    let huffman = block.get(*at).ok_or(BadBlock("header block ends inside a field"))? & 0x80 != 0;
    let len = integer(block, at, 7)?;
    let raw = block
        .get(*at..*at + len)
        .ok_or(BadBlock("string longer than the header block"))?;
    *at += len;
    Ok((huffman, raw))
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn integer(block: &[u8], at: &mut usize, n: u32) -> Result<usize, BadBlock> {
    let mask = (1usize << n) - 1;
    let mut value = *block.get(*at).ok_or(BadBlock("header block ends inside a field"))? as usize & mask;
    *at += 1;
    if value < mask {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let b = *block.get(*at).ok_or(BadBlock("header block ends inside an integer"))?;
        *at += 1;
        value += ((b & 0x7f) as usize) << shift;
        // Also stops a run of zero continuation bytes.
        if value > MAX_INTEGER || shift > 21 {
            return Err(BadBlock("integer too large"));
        }
        if b & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

fn put_integer(out: &mut Vec<u8>, first_bits: u8, n: u32, value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        out.push(first_bits | value as u8);
        return;
    }
    out.push(first_bits | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    /// How a field was sent.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum How {
        /// A literal not added to the table.
        Literal,
        Added,
        /// A reference to a table entry.
        Reference,
    }

    type Sent = (Vec<u8>, Vec<u8>, How);

    /// What h2 should see for what the client sent: authorities valid,
    /// cut to their first address, or (when the field is in the client's
    /// table) the placeholder; otherwise dropped.
    fn expected(sent: &[Sent]) -> Headers {
        sent.iter()
            .filter_map(|(n, v, how)| {
                let indexed = *how != How::Literal;
                if n.as_slice() != AUTHORITY {
                    return Some((n.clone(), v.clone()));
                }
                match judge(v) {
                    Verdict::Keep => Some((n.clone(), v.clone())),
                    Verdict::Replace(f) => Some((n.clone(), f)),
                    Verdict::Bad if indexed && !v.is_empty() => Some((n.clone(), PLACEHOLDER.to_vec())),
                    // Empty, added: as sent (h2 refuses it); referred to: dropped.
                    Verdict::Bad if *how == How::Added => Some((n.clone(), v.clone())),
                    Verdict::Bad => None,
                }
            })
            .collect()
    }

    /// A client encoder that uses every representation: indexed fields,
    /// literals added to the table or not, static or literal names, raw or
    /// Huffman strings, and table size updates. It keeps its own model of
    /// its table to refer to earlier entries.
    #[derive(Default)]
    struct Client {
        table: VecDeque<(Vec<u8>, Vec<u8>)>,
        max: usize,
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A new field: name (0: authority), value, how to send it.
        Literal {
            name: u8,
            value: Vec<u8>,
            kind: u8,
            huffman: bool,
        },
        /// A reference to the n-th newest table entry (if any).
        Indexed(usize),
        /// A table size update first.
        Resize(usize),
    }

    fn put_string(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
        if huffman {
            let mut h = Vec::new();
            httlib_huffman::encode(s, &mut h).unwrap();
            put_integer(out, 0x80, 7, h.len());
            out.extend_from_slice(&h);
        } else {
            put_integer(out, 0, 7, s.len());
            out.extend_from_slice(s);
        }
    }

    impl Client {
        fn add(&mut self, n: &[u8], v: &[u8]) {
            let size = n.len() + v.len() + ENTRY_OVERHEAD;
            let used = |t: &VecDeque<(Vec<u8>, Vec<u8>)>| {
                t.iter().map(|(n, v)| n.len() + v.len() + ENTRY_OVERHEAD).sum::<usize>()
            };
            while !self.table.is_empty() && used(&self.table) + size > self.max {
                self.table.pop_back();
            }
            if size <= self.max {
                self.table.push_front((n.to_vec(), v.to_vec()));
            }
        }

        /// Encodes a block; returns it and the fields as sent, with whether
        /// each one was added to the table or came from it.
        fn encode(&mut self, ops: &[Op]) -> (Vec<u8>, Vec<Sent>) {
            let mut out = Vec::new();
            let mut sent = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Resize(size) if i == 0 => {
                        self.max = *size;
                        while self.table.iter().map(|(n, v)| n.len() + v.len() + 32).sum::<usize>() > self.max {
                            self.table.pop_back();
                        }
                        put_integer(&mut out, 0x20, 5, *size);
                    }
                    Op::Resize(_) => {}
                    Op::Indexed(n) => {
                        if self.table.is_empty() {
                            continue;
                        }
                        let n = n % self.table.len();
                        put_integer(&mut out, 0x80, 7, 62 + n);
                        let (name, value) = self.table[n].clone();
                        sent.push((name, value, How::Reference));
                    }
                    Op::Literal {
                        name,
                        value,
                        kind,
                        huffman,
                    } => {
                        let name: Vec<u8> = match name {
                            0 => AUTHORITY.to_vec(),
                            n => format!("x-h{n}").into_bytes(),
                        };
                        let (first, prefix) = match kind % 3 {
                            0 => (0x40, 6),
                            1 => (0x00, 4),
                            _ => (0x10, 4),
                        };
                        // The authority by its static index or spelled out.
                        if name.as_slice() == AUTHORITY && !huffman {
                            put_integer(&mut out, first, prefix, 1);
                        } else {
                            put_integer(&mut out, first, prefix, 0);
                            put_string(&mut out, &name, *huffman);
                        }
                        put_string(&mut out, value, *huffman);
                        if first == 0x40 {
                            self.add(&name, value);
                        }
                        let how = if first == 0x40 { How::Added } else { How::Literal };
                        sent.push((name, value.clone(), how));
                    }
                }
            }
            {
                // Every block ends with a plain field: one of nothing but a
                // size update (all else dropped) is one loona's decoder
                // refuses.
                put_integer(&mut out, 0x00, 4, 0);
                put_string(&mut out, b"x-end", false);
                put_string(&mut out, b"1", false);
                sent.push((b"x-end".to_vec(), b"1".to_vec(), How::Literal));
            }
            (out, sent)
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..4, "[a-z0-9.:,]{0,24}", any::<u8>(), any::<bool>()).prop_map(|(name, v, kind, huffman)| Op::Literal {
                name,
                value: v.into_bytes(),
                kind,
                huffman
            }),
            1 => (0u8..4, proptest::collection::vec(any::<u8>(), 0..300), any::<u8>(), any::<bool>())
                .prop_map(|(name, value, kind, huffman)| Op::Literal { name, value, kind, huffman }),
            3 => any::<usize>().prop_map(Op::Indexed),
            1 => prop_oneof![Just(0usize), Just(100), Just(600), Just(TABLE_SIZE)].prop_map(Op::Resize),
        ]
    }

    #[test]
    fn static_names_are_rfc_7541s() {
        let mut d = loona_hpack::Decoder::new();
        for (i, name) in STATIC_NAMES.iter().enumerate() {
            let got = d.decode(&[0x80 | (i as u8 + 1)]).unwrap();
            assert_eq!(got[0].0, name.as_bytes(), "index {}", i + 1);
        }
    }

    #[test]
    fn a_multi_address_authority_in_the_table_is_cut_and_stays_cut() {
        let mut client = Client {
            max: TABLE_SIZE,
            ..Default::default()
        };
        let mut fix = AuthorityFix::default();
        let mut h2 = loona_hpack::Decoder::new();
        let a = Op::Literal {
            name: 0,
            value: b"127.0.0.1:8081,127.0.0.1:8082".to_vec(),
            kind: 0,
            huffman: true,
        };
        let (b1, _) = client.encode(&[a]);
        let end = (b"x-end".to_vec(), b"1".to_vec());
        let cut = (AUTHORITY.to_vec(), b"127.0.0.1:8081".to_vec());
        let out = fix.fix(&b1).unwrap().expect("rewritten");
        assert_eq!(h2.decode(&out).unwrap(), vec![cut.clone(), end.clone()]);
        // The next request refers to the entry: it passes untouched and h2
        // finds the cut value in its table.
        let (b2, _) = client.encode(&[Op::Indexed(0)]);
        assert_eq!(fix.fix(&b2).unwrap(), None);
        assert_eq!(h2.decode(&b2).unwrap(), vec![cut, end]);
        // A valid authority is not copied at all.
        let ok = Op::Literal {
            name: 0,
            value: b"127.0.0.1:8081".to_vec(),
            kind: 1,
            huffman: false,
        };
        let (b3, _) = client.encode(&[ok]);
        assert_eq!(fix.fix(&b3).unwrap(), None);
    }

    #[test]
    fn malformed_blocks_are_refused() {
        let mut fix = AuthorityFix::default();
        for (block, why) in [
            (&[0x80][..], "index 0"),
            (&[0xbe][..], "beyond"),
            (&[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01][..], "integer"),
            (&[0xff, 0xff, 0xff, 0xff, 0x7f][..], "integer too large"),
            (&[0x41, 0x05, b'a'][..], "longer"),
            (&[0x82, 0x20][..], "after a header field"),
            (&[0x3f, 0xe2, 0x1f][..], "above the agreed"),
            (&[0x41, 0x81, 0xff][..], "Huffman"),
        ] {
            let err = fix.fix(block).unwrap_err();
            assert!(err.0.contains(why), "{block:?}: {err:?}");
        }
    }

    proptest! {
        /// Through any sequence of blocks, what h2 decodes from the output
        /// is what the client meant, with its authorities fixed, and the
        /// blocks without a bad authority pass untouched.
        #[test]
        fn h2_sees_the_clients_headers_with_fixed_authorities(
            blocks in proptest::collection::vec(proptest::collection::vec(op(), 0..12), 1..12),
        ) {
            let mut client = Client { max: TABLE_SIZE, ..Default::default() };
            let mut fix = AuthorityFix::default();
            let mut h2 = loona_hpack::Decoder::new();
            for ops in &blocks {
                let (block, sent) = client.encode(ops);
                let out = fix.fix(&block).unwrap();
                let changed = out.is_some();
                let got = h2.decode(out.as_deref().unwrap_or(&block)).unwrap();
                let want = expected(&sent);
                prop_assert_eq!(&got, &want);
                // Copied only to change a field as sent (a reference to an
                // entry fixed on its way in needs nothing).
                if !changed {
                    prop_assert!(sent.iter().all(|(n, v, how)| n.as_slice() != AUTHORITY
                        || *how == How::Reference
                        || matches!(judge(v), Verdict::Keep)
                        || (v.is_empty() && *how == How::Added)));
                }
            }
        }

        /// Random bytes are an error or a block, never a panic, and never
        /// grow the block by more than a replaced field each.
        #[test]
        fn arbitrary_blocks_never_panic(
            blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..8),
        ) {
            let mut fix = AuthorityFix::default();
            for b in &blocks {
                if let Ok(Some(out)) = fix.fix(b) {
                    prop_assert!(out.len() <= b.len() * 2 + 8);
                }
            }
        }
    }
}
