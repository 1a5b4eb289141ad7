//! Zero-copy views of the log that readers hold: raw bytes ([`LogSlice`])
//! and verified records ([`RecordRef`]). Each keeps its segment mapped while
//! it lives (see the concurrency notes in [`super`]).

use std::ops::Deref;
use std::sync::Arc;

use super::Segment;
use crate::record::{HEADER_LEN, RecordMeta};

/// A zero-copy view of bytes in the log. Cheap to clone; keeps its segment
/// mapped while alive.
#[derive(Clone)]
pub struct LogSlice {
    pub(super) seg: Arc<Segment>,
    pub(super) pos: u64,
    pub(super) len: u64,
}

impl LogSlice {
    /// Physical offset of the first byte.
    pub fn offset(&self) -> u64 {
        self.seg.start + self.pos
    }
}

impl Deref for LogSlice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range was checked against the segment when the view was
        // made, lies below the published write mark, and is never written
        // while this view (which holds the segment's Arc) exists; see the
        // module docs. `slice` cannot fail for a range checked at creation.
        unsafe { self.seg.file.slice(self.pos, self.len) }.unwrap_or(&[])
    }
}

impl std::fmt::Debug for LogSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LogSlice({}..{})", self.offset(), self.offset() + self.len)
    }
}

/// A record read from the log, verified (length, magic, CRC) when read.
#[derive(Clone, Debug)]
pub struct RecordRef {
    pub(super) bytes: LogSlice,
    pub(super) meta: RecordMeta,
    pub(super) crc: u32,
}

impl RecordRef {
    pub fn offset(&self) -> u64 {
        self.bytes.offset()
    }
    /// Offset of the byte after this record.
    pub fn end(&self) -> u64 {
        self.offset() + self.bytes.len() as u64
    }
    pub fn meta(&self) -> RecordMeta {
        self.meta
    }
    pub fn crc(&self) -> u32 {
        self.crc
    }
    /// The whole encoded record, header included.
    pub fn encoded(&self) -> &[u8] {
        &self.bytes
    }
    pub fn payload(&self) -> &[u8] {
        &self.bytes[HEADER_LEN..]
    }
    /// Physical offset of the first payload byte (ConsumeQueue units point
    /// inside payloads).
    pub fn payload_offset(&self) -> u64 {
        self.offset() + HEADER_LEN as u64
    }
}
