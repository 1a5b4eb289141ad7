//! The record codec: one record is one Raft entry.
//!
//! # Record layout (little-endian)
//!
//! | offset | size | field     | meaning                                              |
//! |-------:|-----:|-----------|------------------------------------------------------|
//! |      0 |    4 | `len`     | total record length, header included                 |
//! |      4 |    4 | `magic`   | [`RECORD_MAGIC`]: `"RMQ"` and the layout version       |
//! |      8 |    4 | `crc`     | CRC32 (IEEE, crc32fast) of bytes `12..len`           |
//! |     12 |    8 | `term`    | Raft term of the entry                               |
//! |     20 |    8 | `index`   | Raft log index of the entry                          |
//! |     28 |    1 | `kind`    | entry kind, opaque to the store                      |
//! |     29 |    3 | reserved  | zero; a reader rejects anything else                 |
//! |     32 |    … | `payload` | `len - 32` bytes                                     |
//!
//! `len` is at least [`HEADER_LEN`] and at most the configured maximum (never
//! above [`MAX_RECORD_LEN`]), which bounds any allocation or read made from a
//! length found on disk.
//!
//! # End-of-segment marker
//!
//! | offset | size | field   | meaning                                       |
//! |-------:|-----:|---------|-----------------------------------------------|
//! |      0 |    4 | `len`   | bytes from the marker to the end of segment  |
//! |      4 |    4 | `magic` | [`EOS_MAGIC`]                                 |
//!
//! Records never span segments. A record of `n` bytes is written at position
//! `p` of a segment of size `S` only if `p + n <= S - EOS_LEN`; otherwise an
//! end-of-segment marker is written at `p` and the record starts the next
//! segment. The rule looks only at sizes, so replicas appending the same
//! records put them at the same physical offsets, and there is always room
//! for the marker.
//!
//! # End of data
//!
//! Segment files are preallocated with zeros, so a `len` of zero marks the end
//! of the written data.
//!
//! # Versioning
//!
//! The low byte of the magic is the layout version. It is bumped on any
//! change a reader of the old version would misread; readers reject versions
//! they do not know, so a downgrade fails loudly instead of misparsing.

/// Fixed header length.
pub const HEADER_LEN: usize = 32;
/// Length of the end-of-segment marker; the room always left free at the end
/// of a segment.
pub const EOS_LEN: usize = 8;
/// `"RMQ"` in the top three bytes, layout version in the low byte.
pub const RECORD_MAGIC: u32 = 0x524D_5100 | RECORD_VERSION as u32;
/// The current layout version.
pub const RECORD_VERSION: u8 = 1;
/// Magic of the end-of-segment marker (`"RMQ"`, then 0xFE).
pub const EOS_MAGIC: u32 = 0x524D_51FE;
/// The absolute upper bound of one record, whatever the configuration.
pub const MAX_RECORD_LEN: usize = 64 << 20;

const MAGIC_FAMILY_MASK: u32 = 0xFFFF_FF00;
/// First byte covered by the CRC.
const CRC_START: usize = 12;

/// The Raft-level identity of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RecordMeta {
    pub term: u64,
    pub index: u64,
    pub kind: u8,
}

/// A decoded record borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub meta: RecordMeta,
    pub crc: u32,
    /// Total encoded length, header included.
    pub len: u32,
    pub payload: &'a [u8],
}

/// What the bytes at a position hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    Record(RecordView<'a>),
    /// An end-of-segment marker: the next record is in the next segment.
    EndOfSegment,
    /// Zeros: nothing was ever written here.
    End,
}

/// Encoded length of a record with `payload_len` payload bytes.
pub fn encoded_len(payload_len: usize) -> usize {
    HEADER_LEN + payload_len
}

/// Builds the header of a record; the payload is written right after it.
/// The caller has checked that the total length fits in a `u32`.
pub fn encode_header(meta: &RecordMeta, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    let len = encoded_len(payload.len()) as u32;
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[12..20].copy_from_slice(&meta.term.to_le_bytes());
    h[20..28].copy_from_slice(&meta.index.to_le_bytes());
    h[28] = meta.kind;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[CRC_START..]);
    crc.update(payload);
    h[8..12].copy_from_slice(&crc.finalize().to_le_bytes());
    h
}

/// The end-of-segment marker for a gap of `gap` bytes (at least `EOS_LEN`).
pub fn encode_eos(gap: u32) -> [u8; EOS_LEN] {
    let mut m = [0u8; EOS_LEN];
    m[0..4].copy_from_slice(&gap.to_le_bytes());
    m[4..8].copy_from_slice(&EOS_MAGIC.to_le_bytes());
    m
}

use crate::le::{u32_at, u64_at};

/// Decodes what starts at `buf[0]`, where `buf` runs to the end of the
/// segment. Never panics; on damage returns why, for the recovery log.
pub fn decode(buf: &[u8], max_len: usize) -> Result<Decoded<'_>, String> {
    if buf.len() < EOS_LEN {
        return if buf.iter().all(|&b| b == 0) {
            Ok(Decoded::End)
        } else {
            Err(format!("{} stray bytes at the end of the segment", buf.len()))
        };
    }
    let len = u32_at(buf, 0) as usize;
    let magic = u32_at(buf, 4);
    if len == 0 {
        return Ok(Decoded::End);
    }
    if magic == EOS_MAGIC {
        return if len == buf.len() {
            Ok(Decoded::EndOfSegment)
        } else {
            Err(format!(
                "end-of-segment marker claims {len} bytes but {} remain",
                buf.len()
            ))
        };
    }
    if magic != RECORD_MAGIC {
        return Err(if magic & MAGIC_FAMILY_MASK == RECORD_MAGIC & MAGIC_FAMILY_MASK {
            format!("unsupported record version {}", magic & 0xFF)
        } else {
            format!("bad magic {magic:#010x}")
        });
    }
    if len < HEADER_LEN || len > max_len.min(MAX_RECORD_LEN) {
        return Err(format!(
            "record length {len} outside [{HEADER_LEN}, {}]",
            max_len.min(MAX_RECORD_LEN)
        ));
    }
    if len > buf.len() {
        return Err(format!(
            "record length {len} runs past the segment end ({} bytes left)",
            buf.len()
        ));
    }
    let stored = u32_at(buf, 8);
    let actual = crc32fast::hash(&buf[CRC_START..len]);
    if stored != actual {
        return Err(format!("CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"));
    }
    if buf[29..32] != [0, 0, 0] {
        return Err("reserved header bytes are not zero".into());
    }
    Ok(Decoded::Record(RecordView {
        meta: RecordMeta {
            term: u64_at(buf, 12),
            index: u64_at(buf, 20),
            kind: buf[28],
        },
        crc: stored,
        len: len as u32,
        payload: &buf[HEADER_LEN..len],
    }))
}

/// True when `buf` starts with an end-of-segment marker for the
/// `to_seg_end` bytes left in the segment (`buf` may be shorter than that:
/// readers only look below the published end).
pub(crate) fn is_eos(buf: &[u8], to_seg_end: u64) -> bool {
    buf.len() >= EOS_LEN && u32_at(buf, 4) == EOS_MAGIC && u64::from(u32_at(buf, 0)) == to_seg_end
}

/// Length of the item at `buf[0]` without checking its CRC: used to walk
/// record boundaries quickly. `None` at end of data or on a bad header.
pub(crate) fn peek_len(buf: &[u8], max_len: usize) -> Option<usize> {
    if buf.len() < EOS_LEN {
        return None;
    }
    let len = u32_at(buf, 0) as usize;
    match u32_at(buf, 4) {
        EOS_MAGIC if len == buf.len() => Some(len),
        RECORD_MAGIC if (HEADER_LEN..=max_len.min(buf.len())).contains(&len) => Some(len),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(meta: &RecordMeta, payload: &[u8]) -> Vec<u8> {
        let mut v = encode_header(meta, payload).to_vec();
        v.extend_from_slice(payload);
        v
    }

    proptest! {
        #[test]
        fn round_trip(term: u64, index: u64, kind: u8, payload in proptest::collection::vec(any::<u8>(), 0..2048), tail in 0usize..64) {
            let meta = RecordMeta { term, index, kind };
            let mut buf = encode(&meta, &payload);
            let len = buf.len();
            buf.resize(len + tail, 0);
            match decode(&buf, 1 << 20).unwrap() {
                Decoded::Record(v) => {
                    prop_assert_eq!(v.meta, meta);
                    prop_assert_eq!(v.payload, &payload[..]);
                    prop_assert_eq!(v.len as usize, len);
                }
                other => prop_assert!(false, "decoded {:?}", other),
            }
            prop_assert_eq!(peek_len(&buf, 1 << 20), Some(len));
        }

        #[test]
        fn any_single_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..256), bit in 0usize..(8 * 288)) {
            let buf = encode(&RecordMeta { term: 3, index: 9, kind: 1 }, &payload);
            let bit = bit % (buf.len() * 8);
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flip can only ever turn a record into an error, or into "end"
            // when it zeroes the length; never into a different valid record.
            match decode(&bad, 1 << 20) {
                Ok(Decoded::Record(_)) | Ok(Decoded::EndOfSegment) => prop_assert!(false, "flip of bit {} went unnoticed", bit),
                Ok(Decoded::End) | Err(_) => {}
            }
        }

        #[test]
        fn never_panics_on_garbage(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&buf, 1 << 20);
            let _ = peek_len(&buf, 1 << 20);
        }
    }

    #[test]
    fn markers_and_limits() {
        let mut seg = vec![0u8; 100];
        seg[..EOS_LEN].copy_from_slice(&encode_eos(100));
        assert_eq!(decode(&seg, 1 << 20), Ok(Decoded::EndOfSegment));
        assert!(
            decode(&seg[..50], 1 << 20).is_err(),
            "marker length must reach the segment end"
        );
        assert_eq!(decode(&[0u8; 40], 1 << 20), Ok(Decoded::End));
        let big = encode(&RecordMeta::default(), &[7u8; 100]);
        assert!(decode(&big, 64).unwrap_err().contains("outside"));
        let mut v2 = big.clone();
        v2[4] = 2;
        assert!(decode(&v2, 1 << 20).unwrap_err().contains("version 2"));
    }
}
