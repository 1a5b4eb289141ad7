//! The ConsumeQueue: the index of one (topic, queue id), mapping a dense
//! queue offset (0, 1, 2, ...) to where the message lies in the CommitLog.
//!
//! # On-disk layout
//!
//! ```text
//! <root>/consumequeue/<topic>/<queue_id>/<20-digit queue offset of the file's first unit>
//! ```
//!
//! Each file holds exactly `units_per_file` units ([`StoreConfig::cq_units_per_file`]),
//! sector-packed as described in `packed` (25 units per 512-byte block, the
//! file is `packed::file_len(units_per_file)` bytes). The unit with queue
//! offset `q` lives in the file named `first` (`first <= q < first +
//! units_per_file`) at byte `packed::unit_pos(q - first)`. Files are
//! contiguous: each starts where the previous one ends.
//!
//! One unit ([`UNIT_SIZE`] bytes, little-endian):
//!
//! | offset | size | field      | meaning                                          |
//! |-------:|-----:|------------|--------------------------------------------------|
//! |      0 |    8 | `phys`     | byte offset of the message in the CommitLog      |
//! |      8 |    4 | `size`     | message length in bytes, never 0                 |
//! |     12 |    8 | `tag_hash` | hash of the message tag, for consumer filtering  |
//!
//! Files are preallocated with zeros, so a unit whose `size` is 0 is empty:
//! the end of the data. Every file but the last is full; within the last file
//! the units form a prefix (possibly empty). After a crash that prefix may
//! have gaps (mapped pages reach the disk in any order), which
//! `ConsumeQueue::open` cuts away.
//!
//! Every block carries a seal (`packed`: a CRC32 of its units), written anew
//! with each unit. A reader checks the seal of every whole block it reads
//! from, and `open` the seal of the block still growing, so a bit flipped
//! on disk is an error naming the file, never a unit that sends a reader
//! to the wrong bytes: a unit has no room for a checksum of its own, and
//! one whose `phys` moved onto another message of the same size and tag
//! would otherwise be served as that message. (The growing block is
//! checked at open only: damage to it in memory while the node runs is not
//! caught.) Blocks written before seals existed are all zeros there and
//! are read unchecked; a block appended to by such an older build after
//! being sealed fails its seal.
//!
//! The smallest readable offset (`min_offset`) is not persisted: it starts at
//! the first unit of the first file, and the owner re-applies
//! [`ConsumeQueue::purge_below_phys`] with the CommitLog's first offset after
//! opening.
//!
//! [`StoreConfig::cq_units_per_file`]: crate::config::StoreConfig::cq_units_per_file

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{IoContext, Result, StoreError};
use crate::locks::{lock, read_lock, write_lock};
use crate::mapped_file::{MapOptions, MappedFile, offset_name, parse_offset_name, sync_dir};
use crate::packed::{self, Fit};

/// Bytes of one unit.
pub const UNIT_SIZE: u64 = packed::UNIT_SIZE;
/// Byte offset of `phys` (u64) within a unit.
const PHYS_AT: usize = 0;
/// Byte offset of `size` (u32) within a unit.
const SIZE_AT: usize = 8;
/// Byte offset of `tag_hash` (u64) within a unit.
const TAG_AT: usize = 12;
/// Upper bound of `units_per_file` (keeps every file size computation far
/// from overflow).
pub const MAX_UNITS_PER_FILE: u64 = u32::MAX as u64;
/// After a crash, how many files at the tail are scanned unit by unit for a
/// gap (as RocketMQ does). Earlier files are known full if their last unit
/// is present; if one is not, the scan starts there instead.
const CRASH_SCAN_FILES: usize = 3;

/// One ConsumeQueue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqUnit {
    /// Byte offset of the message in the CommitLog.
    pub phys: u64,
    /// Message length in bytes (> 0).
    pub size: u32,
    /// Hash of the message tag.
    pub tag_hash: u64,
}

impl CqUnit {
    fn encode(&self) -> [u8; UNIT_SIZE as usize] {
        let mut b = [0u8; UNIT_SIZE as usize];
        b[PHYS_AT..PHYS_AT + 8].copy_from_slice(&self.phys.to_le_bytes());
        b[SIZE_AT..SIZE_AT + 4].copy_from_slice(&self.size.to_le_bytes());
        b[TAG_AT..TAG_AT + 8].copy_from_slice(&self.tag_hash.to_le_bytes());
        b
    }

    fn decode(b: &[u8; UNIT_SIZE as usize]) -> CqUnit {
        let mut u64b = [0u8; 8];
        let mut u32b = [0u8; 4];
        u64b.copy_from_slice(&b[PHYS_AT..PHYS_AT + 8]);
        let phys = u64::from_le_bytes(u64b);
        u32b.copy_from_slice(&b[SIZE_AT..SIZE_AT + 4]);
        let size = u32::from_le_bytes(u32b);
        u64b.copy_from_slice(&b[TAG_AT..TAG_AT + 8]);
        let tag_hash = u64::from_le_bytes(u64b);
        CqUnit { phys, size, tag_hash }
    }
}

/// One file of the queue.
struct Seg {
    /// Queue offset of its first unit.
    first: u64,
    file: Arc<MappedFile>,
}

/// State owned by the single writer.
struct Writer {
    /// `phys` of the unit at `max - 1`, when known: appends must not go
    /// backwards, which keeps `truncate_phys`' binary search valid.
    last_phys: Option<u64>,
}

/// The index of one (topic, queue id). See the module docs for the layout.
///
/// One writer at a time (appends, truncates and purges are serialized by an
/// internal mutex), any number of concurrent readers.
pub struct ConsumeQueue {
    dir: PathBuf,
    units_per_file: u64,
    map: MapOptions,
    /// Serializes append / truncate / purge. Lock order: `writer`, then
    /// `flushed`, then `files`.
    writer: Mutex<Writer>,
    /// Queue offset below which everything has been msynced.
    flushed: Mutex<u64>,
    /// The files, contiguous, ascending. Readers hold the read lock while
    /// copying a unit; anything that zeroes bytes or changes the list takes
    /// the write lock.
    files: RwLock<Vec<Seg>>,
    min: AtomicU64,
    /// Next queue offset to assign. Stored with Release after the unit bytes
    /// are written; readers load it with Acquire and read only below it.
    max: AtomicU64,
}

impl std::fmt::Debug for ConsumeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumeQueue")
            .field("dir", &self.dir)
            .field("min", &self.min_offset())
            .field("max", &self.max_offset())
            .finish()
    }
}

/// Copies unit `idx` out of `file`.
///
/// # Safety
/// No write to the unit's bytes may happen during the call (see
/// [`MappedFile::slice`]).
unsafe fn read_unit(file: &MappedFile, idx: u64) -> Result<CqUnit> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { file.slice(packed::unit_pos(idx), UNIT_SIZE)? };
    let mut b = [0u8; UNIT_SIZE as usize];
    b.copy_from_slice(bytes);
    Ok(CqUnit::decode(&b))
}

/// The index range (in its file) of the block holding unit `idx`.
fn block_units(units_per_file: u64, idx: u64) -> std::ops::Range<u64> {
    let first = idx - idx % packed::UNITS_PER_BLOCK;
    first..(first + packed::UNITS_PER_BLOCK).min(units_per_file)
}

/// Writes the seal of the block holding unit `idx`, for its units as they
/// are now.
///
/// # Safety
/// Only the queue's single writer may call it, and no reader may read the
/// block's seal meanwhile (readers check the seal of whole blocks below
/// the published end only).
unsafe fn reseal(file: &MappedFile, idx: u64) -> Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe { packed::reseal(file, 0, idx, packed::UNITS_PER_BLOCK) }
}

/// The file holding queue offset `q` and the unit's index in it.
fn locate(files: &[Seg], units_per_file: u64, q: u64) -> Option<(&Seg, u64)> {
    let i = q.checked_sub(files.first()?.first)? / units_per_file;
    let seg = files.get(usize::try_from(i).ok()?)?;
    let idx = q.checked_sub(seg.first)?;
    (idx < units_per_file).then_some((seg, idx))
}

/// First `x` in `[lo, hi)` for which `pred` holds, assuming `pred` is false
/// then true along the range; `hi` if it never holds.
fn partition_point(mut lo: u64, mut hi: u64, mut pred: impl FnMut(u64) -> Result<bool>) -> Result<u64> {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

impl ConsumeQueue {
    /// Opens or creates the queue directory `dir`
    /// (`<root>/consumequeue/<topic>/<queue_id>`).
    ///
    /// `crashed` says the last stop was a crash: the tail files are then
    /// scanned forward for the first empty unit, every non-zero byte after it
    /// is zeroed and later files are deleted. Otherwise the end is found by
    /// a binary search in the last file. Bad file names, sizes or a gap
    /// between files are [`StoreError::Corrupt`] naming the file.
    pub(crate) fn open(dir: &Path, units_per_file: u64, map: MapOptions, crashed: bool) -> Result<Self> {
        if units_per_file == 0 || units_per_file > MAX_UNITS_PER_FILE {
            return Err(StoreError::BadArgument(format!(
                "consume queue units_per_file {units_per_file} must be between 1 and {MAX_UNITS_PER_FILE}"
            )));
        }
        let flen = packed::file_len(units_per_file);
        fs::create_dir_all(dir).at(dir)?;

        let mut found = Vec::new();
        for entry in fs::read_dir(dir).at(dir)? {
            let path = entry.at(dir)?.path();
            let first = path.file_name().and_then(|n| n.to_str()).and_then(parse_offset_name);
            let Some(first) = first else {
                // Like the commitlog and index directories: a stray file
                // (an editor's backup, a note) is not ours to judge.
                tracing::warn!(file = %path.display(), "ignoring unexpected file in a consume queue directory");
                continue;
            };
            let meta = fs::metadata(&path).at(&path)?;
            if !meta.is_file() {
                return Err(StoreError::corrupt(&path, 0, "not a regular file"));
            }
            if meta.len() > flen {
                return Err(StoreError::corrupt(
                    &path,
                    flen,
                    format!(
                        "file is {} bytes, more than the {flen} bytes of {units_per_file} units \
                         (was cq_units_per_file changed?)",
                        meta.len()
                    ),
                ));
            }
            // Files are made at their full size, so a shorter one (other
            // than one that died before its first byte) was cut short: its
            // lost units would shift every queue offset after them.
            if meta.len() != 0 && meta.len() < flen {
                return Err(StoreError::corrupt(
                    &path,
                    meta.len(),
                    format!(
                        "file is {} bytes, shorter than the {flen} it was made with: cut short",
                        meta.len()
                    ),
                ));
            }
            found.push((first, path));
        }
        found.sort_unstable_by_key(|(first, _)| *first);
        for (i, (first, path)) in found.iter().enumerate() {
            let Some(end) = first.checked_add(units_per_file) else {
                return Err(StoreError::corrupt(path, 0, "queue offset overflows u64"));
            };
            if let Some((next, next_path)) = found.get(i + 1)
                && *next != end
            {
                return Err(StoreError::corrupt(
                    next_path,
                    0,
                    format!("file starts at queue offset {next} but the previous file ends at {end}"),
                ));
            }
        }

        let mut segs = Vec::with_capacity(found.len());
        for (first, path) in found {
            let file = MappedFile::open(&path, flen, map)?;
            segs.push(Seg {
                first,
                file: Arc::new(file),
            });
        }

        // SAFETY (all unsafe calls until `Ok(ConsumeQueue ..)`): the files are
        // not shared yet; this thread is their only reader and writer.
        let max = match segs.last() {
            None => 0,
            Some(_) if crashed => unsafe { Self::recover_after_crash(dir, units_per_file, &mut segs)? },
            Some(last) => {
                for seg in &segs[..segs.len() - 1] {
                    if unsafe { read_unit(&seg.file, units_per_file - 1)? }.size == 0 {
                        return Err(StoreError::corrupt(
                            seg.file.path(),
                            packed::unit_pos(units_per_file - 1),
                            "a file before the last is not full (was the previous stop a crash?)",
                        ));
                    }
                }
                let n = partition_point(
                    0,
                    units_per_file,
                    |i| Ok(unsafe { read_unit(&last.file, i)? }.size == 0),
                )?;
                last.first + n
            }
        };
        let min = segs.first().map_or(max, |s| s.first);
        // SAFETY: as above.
        unsafe { Self::check_tail(units_per_file, &segs, max)? };
        let last_phys = match max.checked_sub(1).and_then(|q| locate(&segs, units_per_file, q)) {
            Some((seg, idx)) if max > min => Some(unsafe { read_unit(&seg.file, idx)? }.phys),
            _ => None,
        };

        Ok(ConsumeQueue {
            dir: dir.to_path_buf(),
            units_per_file,
            map,
            writer: Mutex::new(Writer { last_phys }),
            // Not `max`: after a crash the data may sit in dirty pages only.
            flushed: Mutex::new(min),
            files: RwLock::new(segs),
            min: AtomicU64::new(min),
            max: AtomicU64::new(max),
        })
    }

    /// Finds the end of data after a crash: the first empty unit of a
    /// forward scan over the tail files. Zeroes every non-zero byte after
    /// it, deletes later files and returns the end. `segs` is non-empty.
    ///
    /// # Safety
    /// The files must not be shared with any other thread.
    unsafe fn recover_after_crash(dir: &Path, units_per_file: u64, segs: &mut Vec<Seg>) -> Result<u64> {
        let mut start = segs.len().saturating_sub(CRASH_SCAN_FILES);
        for (i, seg) in segs[..start].iter().enumerate() {
            if unsafe { read_unit(&seg.file, units_per_file - 1)? }.size == 0 {
                start = i;
                break;
            }
        }
        let mut cut = None;
        'scan: for (i, seg) in segs.iter().enumerate().skip(start) {
            for k in 0..units_per_file {
                if unsafe { read_unit(&seg.file, k)? }.size == 0 {
                    cut = Some((i, k));
                    break 'scan;
                }
            }
        }
        let Some((i, k)) = cut else {
            return Ok(segs.last().map_or(0, |last| last.first + units_per_file));
        };

        let Some(seg) = segs.get(i) else {
            return Ok(0);
        };
        // A crash leaves a block as it was before some unit was written:
        // its seal fits the units before the gap. A unit emptied by damage
        // leaves the seal of a longer block. Checked before the zeroing
        // below takes the seal too.
        unsafe { packed::check_block(&seg.file, 0, k, Fit::Prefix(k % packed::UNITS_PER_BLOCK))? };
        let from = packed::unit_pos(k);
        let to = unsafe { seg.file.nonzero_end(from)? };
        if to > from {
            tracing::warn!(file = %seg.file.path().display(), unit = k, bytes = to - from,
                "consume queue: zeroing data after a gap left by a crash");
            unsafe { seg.file.zero(from, to - from)? };
            seg.file.flush(from, to - from)?;
        }
        let end = seg.first + k;
        let removed = segs.split_off(i + 1);
        for later in removed.iter().rev() {
            tracing::warn!(file = %later.file.path().display(),
                "consume queue: deleting a file after a gap left by a crash");
            fs::remove_file(later.file.path()).at(later.file.path())?;
        }
        if !removed.is_empty() {
            sync_dir(dir)?;
        }
        Ok(end)
    }

    /// Checks, at open, the block that holds the last unit (the one whole
    /// blocks' readers never check while it grows): its seal fits its units
    /// as a crash may leave them, and nothing follows the end in the block
    /// that holds it (a unit whose size was flipped to zero would otherwise
    /// end the queue early, and what follows would be written over). Then
    /// seals it anew, exactly.
    ///
    /// # Safety
    /// The files must not be shared with any other thread.
    unsafe fn check_tail(units_per_file: u64, segs: &[Seg], max: u64) -> Result<()> {
        // SAFETY (all below): forwarded to the caller.
        if let Some((seg, idx)) = locate(segs, units_per_file, max) {
            let from = packed::unit_pos(idx);
            // The rest of the block's units; its seal too when no unit of
            // the block is in use.
            let to = match idx % packed::UNITS_PER_BLOCK {
                0 => packed::block_pos(idx) + packed::BLOCK_SIZE,
                _ => packed::block_pos(idx) + packed::UNIT_BYTES,
            };
            let after = unsafe { seg.file.slice(from, to - from)? };
            if let Some(i) = after.iter().position(|&b| b != 0) {
                return Err(StoreError::corrupt(
                    seg.file.path(),
                    from + i as u64,
                    format!("data after the queue's end at queue offset {max}: a unit before it was emptied"),
                ));
            }
        }
        let Some((seg, idx)) = max.checked_sub(1).and_then(|q| locate(segs, units_per_file, q)) else {
            return Ok(());
        };
        let present = idx + 1 - block_units(units_per_file, idx).start;
        unsafe {
            packed::check_block(&seg.file, 0, idx, Fit::Prefix(present))?;
            reseal(&seg.file, idx)
        }
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        // Nothing panics while holding these locks, and every update leaves
        // the state consistent, so a poisoned lock is still usable.
        lock(&self.writer)
    }

    fn lock_flushed(&self) -> MutexGuard<'_, u64> {
        lock(&self.flushed)
    }

    fn read_files(&self) -> RwLockReadGuard<'_, Vec<Seg>> {
        read_lock(&self.files)
    }

    fn write_files(&self) -> RwLockWriteGuard<'_, Vec<Seg>> {
        write_lock(&self.files)
    }

    /// The file holding queue offset `q` and the unit's index in it.
    fn locate<'a>(&self, files: &'a [Seg], q: u64) -> Result<(&'a Seg, u64)> {
        locate(files, self.units_per_file, q)
            .ok_or_else(|| StoreError::corrupt(&self.dir, q, "no file holds this queue offset"))
    }

    /// Opens (or creates) a queue directory of its own, outside a
    /// [`crate::QueueTable`] (for example the Raft layer's index from log
    /// index to record position).
    pub fn open_dir(dir: &Path, units_per_file: u64, crashed: bool) -> Result<Self> {
        Self::open(dir, units_per_file, MapOptions::default(), crashed)
    }

    /// Appends a unit and returns the queue offset assigned to it.
    pub fn append(&self, unit: CqUnit) -> Result<u64> {
        let mut w = self.lock_writer();
        self.append_locked(&mut w, unit)
    }

    /// As [`ConsumeQueue::append`], unless the queue already holds a unit
    /// at `unit.phys` (an apply tried again after failing half-way): then
    /// that unit's offset, and `true`. A unit past the last goes straight
    /// in; only one at or below it is looked up (under the writer lock, so
    /// no purge moves the queue's start meanwhile).
    pub fn append_once(&self, unit: CqUnit) -> Result<(u64, bool)> {
        let mut w = self.lock_writer();
        if w.last_phys.is_some_and(|last| unit.phys <= last)
            && let Some(q) = self.offset_of_phys(unit.phys)?
        {
            return Ok((q, true));
        }
        Ok((self.append_locked(&mut w, unit)?, false))
    }

    fn append_locked(&self, w: &mut Writer, unit: CqUnit) -> Result<u64> {
        if unit.size == 0 {
            return Err(StoreError::BadArgument(
                "a consume queue unit's size must be positive".into(),
            ));
        }
        if let Some(prev) = w.last_phys
            && unit.phys < prev
        {
            return Err(StoreError::BadArgument(format!(
                "consume queue {}: physical offset {} is below the previous unit's {prev}",
                self.dir.display(),
                unit.phys
            )));
        }
        let q = self.max.load(Ordering::Relaxed);
        let (file, idx) = self.file_for_append(q)?;
        // SAFETY: the unit lies at queue offset `max`, which readers never read
        // (they read only below the published `max`), and the writer mutex
        // rules out any other writer. Readers check the seal of whole blocks
        // only, and this block becomes whole only when `max` passes it,
        // after its seal is written.
        unsafe {
            file.write(packed::unit_pos(idx), &unit.encode())?;
            reseal(&file, idx)?;
        }
        self.max.store(q + 1, Ordering::Release);
        crate::prefault::wrote_to(&file, packed::unit_pos(idx));
        w.last_phys = Some(unit.phys);
        Ok(q)
    }

    /// The file to write queue offset `q` (= max) into, creating it if the
    /// last file is full. Called with the writer mutex held.
    fn file_for_append(&self, q: u64) -> Result<(Arc<MappedFile>, u64)> {
        let first = {
            let files = self.read_files();
            match files.last() {
                Some(last) if q >= last.first && q - last.first < self.units_per_file => {
                    return Ok((Arc::clone(&last.file), q - last.first));
                }
                Some(last) if last.first.checked_add(self.units_per_file) != Some(q) => {
                    return Err(StoreError::corrupt(
                        last.file.path(),
                        0,
                        format!("queue offset {q} does not follow the last file"),
                    ));
                }
                _ => q,
            }
        };
        if first.checked_add(self.units_per_file).is_none() {
            return Err(StoreError::BadArgument(format!("queue offset {first} overflows")));
        }
        let path = self.dir.join(offset_name(first));
        let file = Arc::new(MappedFile::create(
            &path,
            packed::file_len(self.units_per_file),
            self.map,
        )?);
        self.write_files().push(Seg {
            first,
            file: Arc::clone(&file),
        });
        sync_dir(&self.dir)?;
        Ok((file, 0))
    }

    /// The unit at `queue_offset`; [`StoreError::OutOfRange`] outside
    /// `[min_offset, max_offset)`.
    pub fn get(&self, queue_offset: u64) -> Result<CqUnit> {
        let files = self.read_files();
        let min = self.min.load(Ordering::Acquire);
        let max = self.max.load(Ordering::Acquire);
        if queue_offset < min || queue_offset >= max {
            return Err(StoreError::OutOfRange {
                offset: queue_offset,
                min,
                max,
            });
        }
        let (seg, idx) = self.locate(&files, queue_offset)?;
        // SAFETY: the unit is below `max` (loaded with Acquire, so its bytes
        // are visible), and bytes below `max` are only written by truncate,
        // which holds the files write lock, excluded by our read lock.
        let unit = unsafe { read_unit(&seg.file, idx)? };
        // A whole block's seal was written before `max` passed it, and is
        // written again only by truncate (excluded, as above).
        if seg.first + block_units(self.units_per_file, idx).end <= max {
            // SAFETY: as above.
            unsafe { packed::check_block(&seg.file, 0, idx, Fit::Exact)? };
        }
        if unit.size == 0 {
            return Err(StoreError::corrupt(
                seg.file.path(),
                packed::unit_pos(idx),
                format!("empty unit at queue offset {queue_offset}, below the end {max}"),
            ));
        }
        Ok(unit)
    }

    /// The first readable queue offset.
    pub fn min_offset(&self) -> u64 {
        self.min.load(Ordering::Acquire)
    }

    /// The next queue offset to assign.
    pub fn max_offset(&self) -> u64 {
        self.max.load(Ordering::Acquire)
    }

    /// Drops the units at and above `queue_offset`: zeroes them (and msyncs
    /// the zeroed bytes) and deletes whole files beyond. A `queue_offset` at
    /// or above `max_offset` is a no-op; one below `min_offset` drops every
    /// readable unit (`max_offset` becomes `min_offset`).
    pub fn truncate(&self, queue_offset: u64) -> Result<()> {
        let mut w = self.lock_writer();
        self.truncate_locked(&mut w, queue_offset)
    }

    /// Checks every unit against the ones beside it and the log: sizes are
    /// positive, physical offsets strictly increase and stay inside
    /// `[log_start, log_end)`. Damage that changed a unit mostly breaks one
    /// of these; a unit that breaks none is only caught when its message is
    /// read (the reader checks what it finds there).
    pub fn check_units(&self, log_start: u64, log_end: u64) -> Result<()> {
        let _w = self.lock_writer();
        let files = self.read_files();
        let max = self.max_offset();
        let mut prev: Option<CqUnit> = None;
        // Each whole block's seal once, not once per unit as `get` would.
        let mut sealed: Option<(u64, u64)> = None;
        for q in self.min_offset()..max {
            let (seg, idx) = self.locate(&files, q)?;
            let block = block_units(self.units_per_file, idx);
            // SAFETY (both): the writer mutex and the files read lock
            // exclude every write.
            if sealed != Some((seg.first, block.start)) && seg.first + block.end <= max {
                unsafe { packed::check_block(&seg.file, 0, idx, Fit::Exact)? };
                sealed = Some((seg.first, block.start));
            }
            let u = unsafe { read_unit(&seg.file, idx)? };
            let bad = u.size == 0
                || u.phys < log_start
                || u.phys.checked_add(u64::from(u.size)).is_none_or(|end| end > log_end)
                || prev.is_some_and(|p| u.phys < p.phys + u64::from(p.size));
            if bad {
                return Err(StoreError::corrupt(
                    &self.dir,
                    q,
                    format!(
                        "unit at queue offset {q} (offset {}, {} bytes) does not fit after {:?} inside the log [{log_start}, {log_end})",
                        u.phys, u.size, prev
                    ),
                ));
            }
            prev = Some(u);
        }
        Ok(())
    }

    /// Drops the units whose `phys >= phys`.
    ///
    /// The search for the cut reads units without checking their blocks'
    /// seals: after a power loss a whole block above the durable mark may
    /// hold a seal older than its units, and the cut is what removes it.
    /// (Units kept are below the mark, where blocks reached the disk whole.)
    pub fn truncate_phys(&self, phys: u64) -> Result<()> {
        let mut w = self.lock_writer();
        let q = self.first_at_least(phys, |q| self.unit_unchecked(q))?;
        self.truncate_locked(&mut w, q)
    }

    /// The unit at `q` (in `[min, max)`), its block's seal not checked.
    fn unit_unchecked(&self, q: u64) -> Result<CqUnit> {
        let files = self.read_files();
        let (seg, idx) = self.locate(&files, q)?;
        // SAFETY: as in `get`.
        unsafe { read_unit(&seg.file, idx) }
    }

    /// First queue offset in `[min, max)` whose unit has `phys >= phys`;
    /// `max` if none. Writers call it with the writer mutex held (so min
    /// and max are stable); a reader without it may get an answer a
    /// concurrent append or purge has just made stale, or an error for a
    /// unit purged under it.
    fn first_with_phys_at_least(&self, phys: u64) -> Result<u64> {
        self.first_at_least(phys, |q| self.get(q))
    }

    /// As [`ConsumeQueue::first_with_phys_at_least`], reading units with
    /// `unit`.
    fn first_at_least(&self, phys: u64, unit: impl Fn(u64) -> Result<CqUnit>) -> Result<u64> {
        let (min, max) = (self.min_offset(), self.max_offset());
        // The common cases at open (nothing to purge, nothing to cut): one
        // read each, not a search of the whole queue.
        if min < max && unit(min)?.phys >= phys {
            return Ok(min);
        }
        if min < max && unit(max - 1)?.phys < phys {
            return Ok(max);
        }
        partition_point(min, max, |q| Ok(unit(q)?.phys >= phys))
    }

    fn truncate_locked(&self, w: &mut Writer, q: u64) -> Result<()> {
        let mut flushed = self.lock_flushed();
        let mut files = self.write_files();
        let min = self.min.load(Ordering::Relaxed);
        let max = self.max.load(Ordering::Relaxed);
        let q = q.max(min);
        if q >= max {
            return Ok(());
        }
        // Keep the files that start below `q`, and always the first one.
        let keep = files.iter().take_while(|s| s.first < q).count().max(1);
        let keep = keep.min(files.len());
        let removed = files.split_off(keep);
        let last = files
            .last()
            .ok_or_else(|| StoreError::corrupt(&self.dir, q, "no file holds this queue offset"))?;
        let end = max.min(last.first.saturating_add(self.units_per_file));
        if q < end {
            let idx = q - last.first;
            let from = packed::unit_pos(idx);
            // To the end of the last unit's block: its seal goes too.
            let to = packed::block_pos(end - 1 - last.first) + packed::BLOCK_SIZE;
            // SAFETY: the files write lock excludes every reader, and the
            // writer mutex every other writer.
            unsafe {
                // The units kept in the cut block get a seal of their own,
                // written first: a kill before the zeroing ends leaves the
                // seal of a prefix, which open accepts.
                let kept = idx % packed::UNITS_PER_BLOCK;
                if kept != 0 {
                    packed::reseal(&last.file, 0, idx, kept)?;
                }
                last.file.zero(from, to - from)?;
            }
            let from = packed::block_pos(idx);
            last.file.flush(from, to - from)?;
        }
        self.max.store(q, Ordering::Release);
        *flushed = (*flushed).min(q);
        w.last_phys = if q > min {
            let (seg, idx) = self.locate(&files, q - 1)?;
            // SAFETY: as above.
            Some(unsafe { read_unit(&seg.file, idx)? }.phys)
        } else {
            None
        };
        drop(files);
        drop(flushed);
        // Still under the writer mutex: no append can recreate a file of the
        // same name before it is gone.
        for seg in removed.iter().rev() {
            fs::remove_file(seg.file.path()).at(seg.file.path())?;
        }
        if !removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Deletes whole files whose units all have `phys < min_phys` (never the
    /// last file), then moves `min_offset` to the first unit with
    /// `phys >= min_phys` (`max_offset` if none).
    pub fn purge_below_phys(&self, min_phys: u64) -> Result<()> {
        let _w = self.lock_writer();
        let q = self.first_with_phys_at_least(min_phys)?;
        if q <= self.min_offset() {
            return Ok(());
        }
        let removed: Vec<Seg> = {
            let mut files = self.write_files();
            let n = files
                .iter()
                .take_while(|s| s.first.saturating_add(self.units_per_file) <= q)
                .count()
                .min(files.len().saturating_sub(1));
            self.min.store(q, Ordering::Release);
            files.drain(..n).collect()
        };
        for seg in &removed {
            fs::remove_file(seg.file.path()).at(seg.file.path())?;
        }
        if !removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Empties the queue and makes it continue at queue offset `next` (a
    /// node installing a snapshot continues every queue at its group's
    /// offsets). The new, empty first file is made durable before the old
    /// files go, newest first, so a crash leaves either a contiguous prefix of
    /// the old files or the new start.
    pub fn reset(&self, next: u64) -> Result<()> {
        let mut w = self.lock_writer();
        if next.checked_add(self.units_per_file).is_none() {
            return Err(StoreError::BadArgument(format!("queue offset {next} overflows")));
        }
        let mut files = self.write_files();
        let path = self.dir.join(offset_name(next));
        let tmp = path.with_extension("resetting");
        let _ = fs::remove_file(&tmp);
        let mut fresh = MappedFile::create(&tmp, packed::file_len(self.units_per_file), self.map)?;
        fresh.flush(0, fresh.len())?;
        for seg in files.drain(..).rev() {
            fs::remove_file(seg.file.path()).at(seg.file.path())?;
        }
        fs::rename(&tmp, &path).at(&path)?;
        sync_dir(&self.dir)?;
        fresh.set_path(path);
        files.push(Seg {
            first: next,
            file: Arc::new(fresh),
        });
        self.min.store(next, Ordering::Release);
        self.max.store(next, Ordering::Release);
        *self.lock_flushed() = next;
        w.last_phys = None;
        Ok(())
    }

    /// The first queue offset in `[min_offset, max_offset)` whose store
    /// timestamp (`ts_of`, looked up by the caller in the CommitLog) is
    /// `>= ts_ms`; `max_offset` if none. Timestamps are assumed
    /// non-decreasing along the queue (binary search).
    pub fn find_by_timestamp(&self, ts_ms: u64, ts_of: impl Fn(&CqUnit) -> Result<u64>) -> Result<u64> {
        let min = self.min_offset();
        let max = self.max_offset();
        partition_point(min, max, |q| Ok(ts_of(&self.get(q)?)? >= ts_ms))
    }

    /// The queue offset of the unit at physical offset `phys`, if this
    /// queue holds one (a binary search: units' `phys` increase along the
    /// queue).
    pub fn offset_of_phys(&self, phys: u64) -> Result<Option<u64>> {
        let q = self.first_with_phys_at_least(phys)?;
        Ok((q < self.max_offset() && self.get(q)?.phys == phys).then_some(q))
    }

    /// Msyncs every unit appended since the last flush.
    pub fn flush(&self) -> Result<()> {
        let mut flushed = self.lock_flushed();
        // Truncation needs `flushed`, so `max` can only grow from here on.
        let target = self.max.load(Ordering::Acquire);
        if *flushed >= target {
            return Ok(());
        }
        let mut ranges = Vec::new();
        {
            let files = self.read_files();
            for seg in files.iter() {
                let lo = (*flushed).max(seg.first);
                let hi = target.min(seg.first.saturating_add(self.units_per_file));
                if lo < hi {
                    let from = packed::unit_pos(lo - seg.first);
                    let to = packed::unit_pos(hi - 1 - seg.first) + UNIT_SIZE;
                    ranges.push((Arc::clone(&seg.file), from, to - from));
                }
            }
        }
        for (file, pos, len) in ranges {
            file.flush(pos, len)?;
        }
        *flushed = target;
        Ok(())
    }

    /// The queue's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests;
