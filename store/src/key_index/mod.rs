//! A hash index from message key to CommitLog physical offsets: RocketMQ's
//! `IndexFile`, in our own layout.
//!
//! Every key of every message is one entry `(key hash, physical offset,
//! time)`. Entries whose hashes fall in the same slot are chained newest
//! first, so a lookup reads one slot and walks its chain. Different keys can
//! share a hash: callers verify the key of every message returned.
//!
//! # Files
//!
//! Index files live in `<root>/index/` ([`INDEX_DIR`]), each named by the
//! physical offset of its first entry as 20 decimal digits (`{:020}`). A file
//! holds at most `index_entries` entries and `index_slots` slots (from the
//! config). When it is full it is flushed completely, and the next put starts
//! a new file, so every file but the newest is complete and durable. Entries
//! are appended in physical-offset order, within a file and across files.
//!
//! # Layout of one file (little-endian)
//!
//! ```text
//! [0, 512)                        header, one 512-byte sector
//! [512, 512 + 4 * slot_count)     slot table (SLOTS_POS, SLOT_SIZE)
//! [entries_pos, file length)      entries, sector-packed with packed::unit_pos
//!
//! entries_pos = 512 + 4 * slot_count, rounded up to a multiple of 512
//! file length = entries_pos + packed::file_len(max entries)
//! ```
//!
//! Header (only the first [`HEADER_USED`] bytes of the sector are used; the
//! rest is zero). It is rewritten after every put with one copy inside one
//! sector, so the disk writes it atomically.
//!
//! | offset | size | field                | meaning                                              |
//! |-------:|-----:|----------------------|------------------------------------------------------|
//! |      0 |    4 | `magic`              | [`INDEX_MAGIC`]: `"RMI"` and the layout version        |
//! |      4 |    8 | `begin_timestamp_ms` | store time of the first entry                         |
//! |     12 |    8 | `end_timestamp_ms`   | greatest store time of any entry                      |
//! |     20 |    8 | `begin_phys`         | physical offset of the first entry (= the file name)  |
//! |     28 |    8 | `end_phys`           | physical offset of the last entry                     |
//! |     36 |    4 | `slot_count`         | slots in the slot table, at least 1                   |
//! |     40 |    4 | `entry_count`        | entries in use                                        |
//!
//! Slot (4 bytes, 4-byte aligned, so never torn): entry number + 1 of the
//! newest entry whose `key_hash % slot_count` is the slot; 0 = empty.
//!
//! Every block of entries carries a seal (`packed`: a CRC32 of its 25
//! entries, in what was padding), written anew with each entry and checked
//! whenever a query reads an entry; and every entry a chain walk reaches
//! must belong to the slot it started from. A flipped bit in an entry, a
//! link or a slot is then a `Corrupt` error, not a lookup that silently
//! misses messages. Blocks written before seals are all zeros there and are
//! read unchecked.
//!
//! Entry ([`ENTRY_SIZE`] bytes, never crossing a sector, see `packed`):
//!
//! | offset | size | field          | meaning                                                        |
//! |-------:|-----:|----------------|----------------------------------------------------------------|
//! |      0 |    4 | `key_hash`     | CRC32 of the key, with 0 replaced by 1; 0 marks an empty entry  |
//! |      4 |    8 | `phys`         | CommitLog physical offset of the message                        |
//! |     12 |    4 | `time_delta_s` | `ts / 1000 - begin_timestamp_ms / 1000`, clamped to `0..=u32::MAX` |
//! |     16 |    4 | `prev`         | entry number + 1 of the previous entry of the same slot; 0 = none; always below this entry's number + 1 |
//!
//! # Sizes
//!
//! With the defaults (5 M slots, 20 M entries) a file is
//! 20,000,768 + 409,600,000 = 429,600,768 bytes (about 410 MiB). A file has at
//! most [`MAX_SLOTS`] slots and [`MAX_ENTRIES`] entries (an entry number + 1
//! must fit in a `u32`, with 0 meaning none).
//!
//! # Versioning
//!
//! The low byte of the magic is the layout version ([`INDEX_VERSION`]). Bump
//! it on any change a reader of the old version would misread; readers reject
//! versions they do not know (a `Corrupt` error naming the file), so a
//! downgrade fails loudly instead of misreading the index.
//!
//! # Crash recovery
//!
//! After a clean stop the headers are trusted. After a crash, given the
//! dispatch checkpoint `valid_below` (every entry with a smaller physical
//! offset was durable): files starting at or above it are deleted; the newest
//! remaining file is cut back to its prefix of entries below it (stopping at
//! the first empty entry), the seals of the blocks it keeps are checked,
//! its slot table is rebuilt from those entries (their `prev` links are
//! durable), everything after them is zeroed, and the header is rewritten.
//! Recovery scans the whole newest file once.
//!
//! # Concurrency
//!
//! One writer at a time (a `Mutex`, also holding the last physical offset);
//! any number of concurrent queries. The newest file is mutated while queries
//! read it, so every file's header, slots and entries are guarded by that
//! file's `RwLock` (queries read, puts write briefly). Every value read from
//! disk (slot values, `prev` links, counts) is bounds-checked; corrupt data is
//! a `Corrupt` error, never a panic or an endless chain walk.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::error::{IoContext, Result, StoreError};
use crate::layout::INDEX_DIR;
use crate::le::{u32_at, u64_at};
use crate::locks::{lock, read_lock, write_lock};
use crate::mapped_file::{MapOptions, MappedFile, parse_offset_name, sync_dir};
use crate::packed::{self, BLOCK_SIZE, Fit, UNITS_PER_BLOCK};
use crate::prefault::{self, Mapped};

/// The current layout version.
pub const INDEX_VERSION: u8 = 1;
/// `"RMI"` in the top three bytes, layout version in the low byte.
pub const INDEX_MAGIC: u32 = 0x524D_4900 | INDEX_VERSION as u32;
const MAGIC_FAMILY_MASK: u32 = 0xFFFF_FF00;
/// The header sector.
pub const HEADER_LEN: u64 = BLOCK_SIZE;
/// Bytes of the header sector in use.
pub const HEADER_USED: usize = 44;
/// Where the slot table starts.
pub const SLOTS_POS: u64 = HEADER_LEN;
/// Size of one slot.
pub const SLOT_SIZE: u64 = 4;
/// Size of one entry.
pub const ENTRY_SIZE: u64 = packed::UNIT_SIZE;
/// Most slots a file may have.
pub const MAX_SLOTS: u64 = u32::MAX as u64;
/// Most entries a file may have.
pub const MAX_ENTRIES: u64 = u32::MAX as u64 - 1;

// Header field offsets.
const H_MAGIC: usize = 0;
const H_BEGIN_TS: usize = 4;
const H_END_TS: usize = 12;
const H_BEGIN_PHYS: usize = 20;
const H_END_PHYS: usize = 28;
const H_SLOT_COUNT: usize = 36;
const H_ENTRY_COUNT: usize = 40;

// Entry field offsets.
const E_HASH: usize = 0;
const E_PHYS: usize = 4;
const E_TIME: usize = 12;
const E_PREV: usize = 16;

/// Where the entries of a file with `slot_count` slots start.
const fn entries_pos(slot_count: u64) -> u64 {
    (SLOTS_POS + slot_count * SLOT_SIZE).next_multiple_of(BLOCK_SIZE)
}

/// Length of an index file with `slots` slots and room for `entries` entries.
pub const fn index_file_len(slots: u64, entries: u64) -> u64 {
    entries_pos(slots) + packed::file_len(entries)
}

/// The hash stored for `key`: CRC32, with 0 replaced by 1 so that a zero
/// `key_hash` always means "no entry here".
fn key_hash(key: &[u8]) -> u32 {
    match crc32fast::hash(key) {
        0 => 1,
        h => h,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    begin_ts: u64,
    end_ts: u64,
    begin_phys: u64,
    end_phys: u64,
    slot_count: u32,
    entry_count: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_USED] {
        let mut b = [0u8; HEADER_USED];
        b[H_MAGIC..H_MAGIC + 4].copy_from_slice(&INDEX_MAGIC.to_le_bytes());
        b[H_BEGIN_TS..H_BEGIN_TS + 8].copy_from_slice(&self.begin_ts.to_le_bytes());
        b[H_END_TS..H_END_TS + 8].copy_from_slice(&self.end_ts.to_le_bytes());
        b[H_BEGIN_PHYS..H_BEGIN_PHYS + 8].copy_from_slice(&self.begin_phys.to_le_bytes());
        b[H_END_PHYS..H_END_PHYS + 8].copy_from_slice(&self.end_phys.to_le_bytes());
        b[H_SLOT_COUNT..H_SLOT_COUNT + 4].copy_from_slice(&self.slot_count.to_le_bytes());
        b[H_ENTRY_COUNT..H_ENTRY_COUNT + 4].copy_from_slice(&self.entry_count.to_le_bytes());
        b
    }

    /// Decodes `b` (at least `HEADER_USED` bytes); returns the magic too.
    fn decode(b: &[u8]) -> (u32, Header) {
        let h = Header {
            begin_ts: u64_at(b, H_BEGIN_TS),
            end_ts: u64_at(b, H_END_TS),
            begin_phys: u64_at(b, H_BEGIN_PHYS),
            end_phys: u64_at(b, H_END_PHYS),
            slot_count: u32_at(b, H_SLOT_COUNT),
            entry_count: u32_at(b, H_ENTRY_COUNT),
        };
        (u32_at(b, H_MAGIC), h)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    hash: u32,
    phys: u64,
    delta: u32,
    prev: u32,
}

impl Entry {
    fn encode(&self) -> [u8; ENTRY_SIZE as usize] {
        let mut b = [0u8; ENTRY_SIZE as usize];
        b[E_HASH..E_HASH + 4].copy_from_slice(&self.hash.to_le_bytes());
        b[E_PHYS..E_PHYS + 8].copy_from_slice(&self.phys.to_le_bytes());
        b[E_TIME..E_TIME + 4].copy_from_slice(&self.delta.to_le_bytes());
        b[E_PREV..E_PREV + 4].copy_from_slice(&self.prev.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Entry {
        Entry {
            hash: u32_at(b, E_HASH),
            phys: u64_at(b, E_PHYS),
            delta: u32_at(b, E_TIME),
            prev: u32_at(b, E_PREV),
        }
    }
}

/// One open index file.
///
/// Soundness of the `unsafe` [`MappedFile`] calls: bytes of a file are only
/// read or written by the `unsafe fn` helpers below, whose callers either
/// hold `head` (a read guard to read, the write guard to write) or have
/// `&mut self` (exclusive access, during open and recovery). Slices never
/// outlive the helper that takes them (values are copied out), so no byte is
/// written while a slice of it is alive, and no two threads write at once
/// (writes need the write guard, and puts are serialized by the writer mutex
/// of [`KeyIndex`] besides).
struct IndexFile {
    mf: MappedFile,
    slot_count: u64,
    entries_pos: u64,
    /// Entries the file has room for, from its size (at most `MAX_ENTRIES`).
    capacity: u64,
    /// The header as last written; guards the bytes of the file.
    head: RwLock<Header>,
}

impl Mapped for IndexFile {
    fn mapped(&self) -> &MappedFile {
        &self.mf
    }
}

impl IndexFile {
    fn path(&self) -> &Path {
        self.mf.path()
    }

    fn corrupt(&self, offset: u64, reason: impl Into<String>) -> StoreError {
        StoreError::corrupt(self.path(), offset, reason)
    }

    fn header(&self) -> Header {
        *read_lock(&self.head)
    }

    /// Bytes in use: header, slot table and the blocks holding `count` entries.
    fn used_len(&self, count: u64) -> u64 {
        (self.entries_pos + packed::file_len(count)).min(self.mf.len())
    }

    /// Creates a new file with room for `entries` entries and writes (and
    /// flushes) its header. On failure the file is removed again.
    fn create(path: &Path, slots: u64, entries: u64, map: MapOptions, phys: u64, ts: u64) -> Result<IndexFile> {
        let mf = MappedFile::create(path, index_file_len(slots, entries), map)?;
        let head = Header {
            begin_ts: ts,
            end_ts: ts,
            begin_phys: phys,
            end_phys: phys,
            slot_count: slots as u32, // checked by `KeyIndex::open`
            entry_count: 0,
        };
        let file = IndexFile {
            slot_count: slots,
            entries_pos: entries_pos(slots),
            capacity: entries,
            head: RwLock::new(head),
            mf,
        };
        // SAFETY: the file is not shared yet.
        let res = unsafe { file.mf.write(0, &head.encode()) }.and_then(|()| file.mf.flush(0, HEADER_LEN));
        match res {
            Ok(()) => Ok(file),
            Err(e) => {
                drop(file);
                let _ = fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Opens and validates an existing file whose name says `name_phys`.
    fn open(path: &Path, name_phys: u64, map: MapOptions) -> Result<IndexFile> {
        let len = fs::metadata(path).at(path)?.len();
        if len < 2 * BLOCK_SIZE || len % BLOCK_SIZE != 0 {
            return Err(StoreError::corrupt(
                path,
                0,
                format!("file length {len} is not a multiple of {BLOCK_SIZE} of at least two blocks"),
            ));
        }
        let mf = MappedFile::open(path, len, map)?;
        // SAFETY: the file is not shared yet; the slice dies within the statement.
        let (magic, head) = Header::decode(unsafe { mf.slice(0, HEADER_USED as u64)? });
        let bad = |offset: usize, reason: String| Err(StoreError::corrupt(path, offset as u64, reason));
        if magic & MAGIC_FAMILY_MASK != INDEX_MAGIC & MAGIC_FAMILY_MASK {
            return bad(H_MAGIC, format!("bad magic {magic:#010x}, not an index file"));
        }
        if magic as u8 != INDEX_VERSION {
            return bad(
                H_MAGIC,
                format!(
                    "index layout version {} is unknown (this build reads version {INDEX_VERSION})",
                    magic as u8
                ),
            );
        }
        let slot_count = u64::from(head.slot_count);
        let ep = entries_pos(slot_count);
        if slot_count == 0 || ep > len {
            return bad(
                H_SLOT_COUNT,
                format!("slot count {slot_count} does not fit a file of {len} bytes"),
            );
        }
        let capacity = ((len - ep) / BLOCK_SIZE * UNITS_PER_BLOCK).min(MAX_ENTRIES);
        if u64::from(head.entry_count) > capacity {
            return bad(
                H_ENTRY_COUNT,
                format!(
                    "entry count {} exceeds the {capacity} entries the file has room for",
                    head.entry_count
                ),
            );
        }
        if head.begin_phys != name_phys {
            return bad(
                H_BEGIN_PHYS,
                format!("begin_phys {} does not match the file name", head.begin_phys),
            );
        }
        if head.end_phys < head.begin_phys || head.end_ts < head.begin_ts {
            return bad(
                H_END_PHYS,
                format!(
                    "range ends before it begins (phys {}..{}, time {}..{})",
                    head.begin_phys, head.end_phys, head.begin_ts, head.end_ts
                ),
            );
        }
        Ok(IndexFile {
            mf,
            slot_count,
            entries_pos: ep,
            capacity,
            head: RwLock::new(head),
        })
    }

    /// # Safety
    /// The caller holds `head` (read or write) or has exclusive access.
    unsafe fn read_slot(&self, slot: u64) -> Result<u32> {
        // SAFETY: per the contract, nothing writes the file while we read it.
        Ok(u32_at(
            unsafe { self.mf.slice(SLOTS_POS + slot * SLOT_SIZE, SLOT_SIZE)? },
            0,
        ))
    }

    /// # Safety
    /// As for [`IndexFile::read_slot`].
    unsafe fn read_entry(&self, i: u64) -> Result<Entry> {
        // SAFETY: as for `read_slot`.
        let b = unsafe { self.mf.slice(self.entries_pos + packed::unit_pos(i), ENTRY_SIZE)? };
        Ok(Entry::decode(b))
    }

    /// # Safety
    /// The caller holds the write guard of `head` or has exclusive access.
    unsafe fn write_slot(&self, slot: u64, value: u32) -> Result<()> {
        // SAFETY: per the contract, no slice is alive and no one else writes.
        unsafe { self.mf.write(SLOTS_POS + slot * SLOT_SIZE, &value.to_le_bytes()) }
    }

    /// # Safety
    /// As for [`IndexFile::write_slot`].
    unsafe fn write_entry(&self, i: u64, e: &Entry) -> Result<()> {
        // SAFETY: as for `write_slot`.
        unsafe { self.mf.write(self.entries_pos + packed::unit_pos(i), &e.encode()) }
    }

    /// # Safety
    /// As for [`IndexFile::write_slot`].
    unsafe fn write_header(&self, h: &Header) -> Result<()> {
        // SAFETY: as for `write_slot`.
        unsafe { self.mf.write(0, &h.encode()) }
    }

    /// Appends one entry. The caller is the single writer (holds the writer
    /// mutex) and has checked that the file has room.
    fn append(&self, hash: u32, phys: u64, ts: u64) -> Result<()> {
        let mut head = write_lock(&self.head);
        let n = u64::from(head.entry_count);
        if n >= self.capacity {
            return Err(self.corrupt(H_ENTRY_COUNT as u64, format!("file is full ({n} entries)")));
        }
        let slot = u64::from(hash) % self.slot_count;
        // SAFETY (all calls below): we hold the write guard of `head`.
        let prev = unsafe { self.read_slot(slot)? };
        if u64::from(prev) > n {
            return Err(self.corrupt(
                SLOTS_POS + slot * SLOT_SIZE,
                format!("slot {slot} points at entry number {prev} but only {n} entries are in use"),
            ));
        }
        let delta = (ts / 1000)
            .saturating_sub(head.begin_ts / 1000)
            .min(u64::from(u32::MAX)) as u32;
        let entry = Entry {
            hash,
            phys,
            delta,
            prev,
        };
        unsafe {
            self.write_entry(n, &entry)?;
            packed::reseal(&self.mf, self.entries_pos, n, UNITS_PER_BLOCK)?;
        }
        // n < capacity <= MAX_ENTRIES, so n + 1 fits in a u32.
        unsafe { self.write_slot(slot, n as u32 + 1)? };
        let mut next = *head;
        next.entry_count = n as u32 + 1;
        next.end_phys = phys;
        next.end_ts = next.end_ts.max(ts);
        unsafe { self.write_header(&next)? };
        *head = next;
        Ok(())
    }

    /// Pushes onto `out` (until it holds `max`) the offsets of entries with
    /// `hash` whose time in seconds is in `[bs, es]`, newest first.
    fn query(&self, hash: u32, bs: u64, es: u64, max: usize, out: &mut Vec<u64>) -> Result<()> {
        let head = read_lock(&self.head);
        let count = u64::from(head.entry_count);
        if count == 0 || head.begin_ts / 1000 > es || head.end_ts / 1000 < bs {
            return Ok(());
        }
        let begin_s = head.begin_ts / 1000;
        let slot = u64::from(hash) % self.slot_count;
        // SAFETY (all reads below): we hold a read guard of `head`.
        let mut cur = u64::from(unsafe { self.read_slot(slot)? });
        if cur > count {
            return Err(self.corrupt(
                SLOTS_POS + slot * SLOT_SIZE,
                format!("slot {slot} points at entry number {cur} but only {count} entries are in use"),
            ));
        }
        // Every step goes to a strictly smaller entry number, so the walk
        // takes at most `count` steps whatever the data says.
        while cur != 0 {
            let e = unsafe {
                packed::check_block(&self.mf, self.entries_pos, cur - 1, Fit::Exact)?;
                self.read_entry(cur - 1)?
            };
            // A damaged slot or link leads into another slot's chain, whose
            // entries would all be passed over: a silent miss.
            if u64::from(e.hash) % self.slot_count != slot {
                return Err(self.corrupt(
                    self.entries_pos + packed::unit_pos(cur - 1),
                    format!(
                        "entry {} (hash {:#x}) is in the chain of slot {slot}, not its own",
                        cur - 1,
                        e.hash
                    ),
                ));
            }
            if e.hash == hash {
                let t = begin_s + u64::from(e.delta);
                if (bs..=es).contains(&t) {
                    out.push(e.phys);
                    if out.len() >= max {
                        break;
                    }
                }
            }
            let prev = u64::from(e.prev);
            if prev >= cur {
                return Err(self.corrupt(
                    self.entries_pos + packed::unit_pos(cur - 1) + E_PREV as u64,
                    format!("entry {} links to entry number {prev}, which is not older", cur - 1),
                ));
            }
            cur = prev;
        }
        Ok(())
    }

    /// Makes everything written so far durable.
    fn flush_used(&self) -> Result<()> {
        let count = u64::from(self.header().entry_count);
        self.mf.flush(0, self.used_len(count))
    }

    /// Crash recovery of the newest file: keeps the prefix of entries below
    /// `valid_below`, rebuilds the slot table, zeroes everything after the
    /// kept entries and rewrites the header. Returns the entries kept.
    fn recover(&mut self, valid_below: u64) -> Result<u64> {
        let mut head = self.header();
        let mut k = 0;
        let mut last_phys = head.begin_phys;
        let mut max_delta = 0u32;
        // SAFETY (all `unsafe` below): `&mut self` gives exclusive access.
        while k < self.capacity {
            let e = unsafe { self.read_entry(k)? };
            if e.hash == 0 || e.phys >= valid_below {
                break;
            }
            if e.phys < last_phys || u64::from(e.prev) > k {
                tracing::warn!(
                    path = %self.path().display(),
                    entry = k,
                    "index entry out of order or with a bad link after a crash; cutting the index here"
                );
                break;
            }
            last_phys = e.phys;
            max_delta = max_delta.max(e.delta);
            k += 1;
        }
        // The kept entries were durable whole, blocks and seals: each whole
        // block's seal must fit. The block the cut falls in may hold a seal
        // older or newer than its entries (a crash), but of some prefix of
        // them; it is sealed anew once cut.
        for b in (0..k).step_by(UNITS_PER_BLOCK as usize) {
            let fit = match b + UNITS_PER_BLOCK <= k {
                true => Fit::Exact,
                false => Fit::Prefix(UNITS_PER_BLOCK),
            };
            unsafe { packed::check_block(&self.mf, self.entries_pos, b, fit)? };
        }
        unsafe { self.mf.zero(SLOTS_POS, self.slot_count * SLOT_SIZE)? };
        for i in 0..k {
            let e = unsafe { self.read_entry(i)? };
            // i < capacity <= MAX_ENTRIES, so i + 1 fits in a u32.
            unsafe { self.write_slot(u64::from(e.hash) % self.slot_count, i as u32 + 1)? };
        }
        let tail = self.entries_pos + packed::unit_pos(k);
        let tail_end = unsafe { self.mf.nonzero_end(tail)? };
        if tail_end > tail {
            unsafe { self.mf.zero(tail, tail_end - tail)? };
        }
        if k % UNITS_PER_BLOCK != 0 {
            unsafe { packed::reseal(&self.mf, self.entries_pos, k - 1, UNITS_PER_BLOCK)? };
        }
        let old_count = head.entry_count;
        head.entry_count = k as u32;
        head.end_phys = last_phys;
        head.end_ts = (head.begin_ts / 1000)
            .saturating_add(u64::from(max_delta))
            .saturating_mul(1000)
            .max(head.begin_ts);
        unsafe { self.write_header(&head)? };
        *self.head.get_mut().unwrap_or_else(PoisonError::into_inner) = head;
        self.mf.flush(0, self.used_len(k).max(tail_end))?;
        if u64::from(old_count) != k || tail_end > tail {
            tracing::info!(
                path = %self.path().display(),
                header_count = old_count,
                kept = k,
                "key index recovered after a crash"
            );
        }
        Ok(k)
    }
}

/// Lists `<dir>/<20 digits>` files, sorted by the offset in their names.
fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let path = entry.path();
        let name = entry.file_name();
        let parsed = name.to_str().and_then(parse_offset_name);
        match parsed {
            Some(phys) if entry.file_type().at(&path)?.is_file() => out.push((phys, path)),
            _ => tracing::warn!(path = %path.display(), "ignoring a file that is not an index file"),
        }
    }
    out.sort();
    Ok(out)
}

/// True if the file has no header at all: shorter than one sector, or an
/// all-zero first sector (created, then a crash before the header was
/// durable).
fn header_unwritten(path: &Path) -> Result<bool> {
    let mut buf = Vec::with_capacity(HEADER_LEN as usize);
    fs::File::open(path)
        .and_then(|f| f.take(HEADER_LEN).read_to_end(&mut buf))
        .at(path)?;
    Ok(buf.len() < HEADER_LEN as usize || buf.iter().all(|&b| b == 0))
}

fn remove(path: &Path) -> Result<()> {
    fs::remove_file(path).at(path)
}

/// The key index of one store: a sequence of index files, newest last.
pub struct KeyIndex {
    dir: PathBuf,
    slots: u64,
    entries: u64,
    map: MapOptions,
    /// Serializes writers (`put`, `purge_below_phys`); holds the physical
    /// offset of the last put.
    writer: Mutex<Option<u64>>,
    /// Open files, oldest first. Queries clone the list and drop the lock.
    files: RwLock<Vec<Arc<IndexFile>>>,
}

impl std::fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex")
            .field("dir", &self.dir)
            .field("slots", &self.slots)
            .field("entries", &self.entries)
            .field("files", &read_lock(&self.files).len())
            .finish()
    }
}

impl KeyIndex {
    /// Opens or creates `<root>/index/`.
    ///
    /// `crashed` means the last stop was a crash; `valid_below` is the
    /// CommitLog physical offset below which indexed data is known good (the
    /// dispatch checkpoint; the caller indexes everything from there again).
    /// Files starting at or above `valid_below` are deleted and the newest
    /// remaining file is cut back to its entries below it, with its slot
    /// table rebuilt (see the module docs): after a crash always, otherwise
    /// when its header says it holds entries at or past `valid_below`.
    /// Every header is validated; a bad file is a `Corrupt` error naming it.
    pub(crate) fn open(
        root: &Path,
        slots: u64,
        entries: u64,
        map: MapOptions,
        crashed: bool,
        valid_below: u64,
    ) -> Result<Self> {
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(StoreError::BadArgument(format!(
                "index_slots {slots} must be between 1 and {MAX_SLOTS}"
            )));
        }
        if !(1..=MAX_ENTRIES).contains(&entries) {
            return Err(StoreError::BadArgument(format!(
                "index_entries {entries} must be between 1 and {MAX_ENTRIES}"
            )));
        }
        let dir = root.join(INDEX_DIR);
        fs::create_dir_all(&dir).at(&dir)?;
        let mut names = list_files(&dir)?;
        let mut removed = false;
        // Entries at or past `valid_below` are dispatched again by the caller,
        // crash or not (a clean stop can still follow a partly dispatched
        // record), so files that hold only such entries go.
        {
            while let Some((phys, path)) = names.last() {
                if *phys < valid_below {
                    break;
                }
                tracing::warn!(path = %path.display(), valid_below, "deleting a key index file written after the checkpoint");
                remove(path)?;
                removed = true;
                names.pop();
            }
        }
        let mut files = Vec::with_capacity(names.len());
        let n = names.len();
        for (i, (phys, path)) in names.into_iter().enumerate() {
            let recover = crashed && i + 1 == n;
            if recover && header_unwritten(&path)? {
                tracing::warn!(path = %path.display(), "deleting a key index file whose header was never written");
                remove(&path)?;
                removed = true;
                continue;
            }
            let mut file = IndexFile::open(&path, phys, map)?;
            let recover = recover || (i + 1 == n && file.header().end_phys >= valid_below);
            if recover && file.recover(valid_below)? == 0 {
                drop(file);
                tracing::warn!(path = %path.display(), "deleting a key index file left without entries by recovery");
                remove(&path)?;
                removed = true;
                continue;
            }
            files.push(Arc::new(file));
        }
        if removed {
            sync_dir(&dir)?;
        }
        let last = files.last().map(|f| f.header().end_phys);
        Ok(KeyIndex {
            dir,
            slots,
            entries,
            map,
            writer: Mutex::new(last),
            files: RwLock::new(files),
        })
    }

    /// Indexes `key` for the message at `phys` stored at `timestamp_ms`.
    /// `phys` must be >= the last put's `phys`.
    pub fn put(&self, key: &[u8], phys: u64, timestamp_ms: u64) -> Result<()> {
        let mut last = lock(&self.writer);
        if let Some(l) = *last
            && phys < l
        {
            return Err(StoreError::BadArgument(format!(
                "key index put at physical offset {phys} is below the last one, {l}"
            )));
        }
        let newest = read_lock(&self.files).last().cloned();
        let file = match newest {
            Some(f) if u64::from(f.header().entry_count) < f.capacity.min(self.entries) => f,
            old => self.roll(old.as_deref(), phys, timestamp_ms)?,
        };
        file.append(key_hash(key), phys, timestamp_ms)?;
        prefault::wrote_to(&file, file.used_len(u64::from(file.header().entry_count)));
        *last = Some(phys);
        Ok(())
    }

    /// The physical offset of the last put, if any.
    pub fn last_phys(&self) -> Option<u64> {
        *lock(&self.writer)
    }

    /// Flushes the full newest file `old` (if any) and starts a new one at
    /// `phys`. Called with the writer mutex held.
    fn roll(&self, old: Option<&IndexFile>, phys: u64, ts: u64) -> Result<Arc<IndexFile>> {
        if let Some(old) = old {
            if old.header().begin_phys == phys {
                return Err(StoreError::BadArgument(format!(
                    "more keys at physical offset {phys} than a key index file holds ({})",
                    old.capacity.min(self.entries)
                )));
            }
            old.flush_used()?;
        }
        let path = self.dir.join(format!("{phys:020}"));
        let file = Arc::new(IndexFile::create(&path, self.slots, self.entries, self.map, phys, ts)?);
        // The slot table is written at random: fault it in whole, ahead.
        prefault::populate(&file, SLOTS_POS, file.entries_pos);
        write_lock(&self.files).push(Arc::clone(&file));
        sync_dir(&self.dir)?;
        Ok(file)
    }

    /// Up to `max` physical offsets of messages whose key hash matches and
    /// whose timestamp (second granularity) falls in `[begin_ms, end_ms]`,
    /// newest first, searching files newest to oldest and skipping files
    /// whose time range does not overlap. Hash collisions are possible: the
    /// caller verifies the key at each offset. A message indexed twice under
    /// the same key is returned twice.
    pub fn query(&self, key: &[u8], begin_ms: u64, end_ms: u64, max: usize) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if max == 0 || begin_ms > end_ms {
            return Ok(out);
        }
        let (bs, es) = (begin_ms / 1000, end_ms / 1000);
        let hash = key_hash(key);
        let files = read_lock(&self.files).clone();
        for f in files.iter().rev() {
            if out.len() >= max {
                break;
            }
            f.query(hash, bs, es, max, &mut out)?;
        }
        Ok(out)
    }

    /// Makes every put so far durable. (Files before the newest were
    /// flushed completely when the next one started.)
    pub fn flush(&self) -> Result<()> {
        let newest = read_lock(&self.files).last().cloned();
        match newest {
            Some(f) => f.flush_used(),
            None => Ok(()),
        }
    }

    /// Deletes whole files whose `end_phys < min_phys` (never the newest).
    pub fn purge_below_phys(&self, min_phys: u64) -> Result<()> {
        let _writer = lock(&self.writer);
        let doomed: Vec<Arc<IndexFile>> = {
            let mut files = write_lock(&self.files);
            let mut n = 0;
            while n + 1 < files.len() && files[n].header().end_phys < min_phys {
                n += 1;
            }
            files.drain(..n).collect()
        };
        if doomed.is_empty() {
            return Ok(());
        }
        // Queries still holding a file keep its mapping alive after unlink.
        let mut first_err = None;
        for f in doomed {
            if let Err(e) = remove(f.path()) {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = sync_dir(&self.dir) {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests;
