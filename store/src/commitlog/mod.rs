//! The CommitLog: records in fixed-size, memory-mapped segment files.
//!
//! A physical offset is a byte position in the log as a whole; segment `k`
//! covers `[start_k, start_k + segment_size)` and is the file
//! `commitlog/<20-digit start_k>`. Segments are contiguous. Record layout and
//! the rule that decides when a segment is closed are in [`crate::record`].
//!
//! # Concurrency
//!
//! One writer at a time (append, truncate, purge and reset take `writer`);
//! any number of readers. The writer copies records into the free tail of the
//! newest segment, then publishes the new end with a release store of
//! `written`; readers load it with acquire and only look below it. Bytes
//! below `written` are never modified while a reader may hold a view of them:
//! views ([`LogSlice`], [`RecordRef`]) keep their segment alive through an
//! `Arc`, purge only unlinks files (the mapping lives on until the last view
//! is dropped), and truncate zeroes a segment in place only when no view of
//! it exists; otherwise it writes the kept prefix to a fresh file and renames
//! it over the old one, leaving old views reading the old, unchanged inode.

mod flush;
mod recovery;
mod segment;
mod view;

pub use flush::{FLUSH_BUCKETS_US, FlushLatency};
pub(crate) use segment::Segment;
pub use view::{LogSlice, RecordRef};

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::checkpoint::CheckpointFile;
use crate::config::{FlushMode, StoreConfig};
use crate::error::{IoContext, Result, StoreError};
use crate::layout::{COMMITLOG_DIR, SPARE_SEGMENT_SUFFIX};
use crate::locks::{lock, read_lock, write_lock};
use crate::mapped_file::{MapOptions, MappedFile, offset_name, sync_dir};
use crate::prefault::{self, SpareSlot};
use crate::record::{self, Decoded, EOS_LEN, HEADER_LEN, RecordMeta};
use flush::{DurableCallback, FlushShared, FlushTarget};

/// A record to append.
#[derive(Debug, Clone, Copy)]
pub struct NewRecord<'a> {
    pub meta: RecordMeta,
    pub payload: &'a [u8],
}

/// Where an appended batch landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Physical offset of each record, in order.
    pub offsets: Vec<u64>,
    /// The log's end after the batch: pass it to [`CommitLog::wait_durable`]
    /// or [`CommitLog::on_durable`].
    pub end: u64,
}

/// State only the writer touches.
#[derive(Default)]
pub(crate) struct Writer {
    /// The segment the last append wrote to (saves a lookup per append);
    /// cleared by anything that changes the segment list's tail.
    active: Option<Arc<Segment>>,
    /// Disk usage (percent, limit) while appends are refused.
    disk_full: Option<(f64, f64)>,
    /// The next segment, being created ahead by the prefault thread: its
    /// start and where it lands (see [`crate::prefault`]).
    spare: Option<(u64, SpareSlot)>,
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub cfg: StoreConfig,
    pub map_opts: MapOptions,
    pub segments: RwLock<Vec<Arc<Segment>>>,
    pub writer: Mutex<Writer>,
    /// End of the last complete record (the next append position).
    pub written: AtomicU64,
    /// First readable offset.
    pub log_start: AtomicU64,
    pub flush: Arc<FlushShared>,
    pub checkpoint: Arc<CheckpointFile>,
    pub closed: AtomicBool,
}

/// The CommitLog. Cloning gives another handle to the same log.
#[derive(Clone)]
pub struct CommitLog {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CommitLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog")
            .field("dir", &self.inner.dir)
            .field("min", &self.min_offset())
            .field("max", &self.max_offset())
            .finish()
    }
}

impl Inner {
    pub fn segs(&self) -> RwLockReadGuard<'_, Vec<Arc<Segment>>> {
        read_lock(&self.segments)
    }
    fn segs_mut(&self) -> RwLockWriteGuard<'_, Vec<Arc<Segment>>> {
        write_lock(&self.segments)
    }
    fn seg_size(&self) -> u64 {
        self.cfg.segment_size
    }
    /// The segment holding `offset` together with the log's bounds, read
    /// under one lock: truncate and reset lower the bounds under the write
    /// lock, so a reader either pinned the segment before (and truncate then
    /// leaves its bytes alone, see `cut_segment`) or sees the new bounds.
    fn pin(&self, offset: u64) -> Result<(Arc<Segment>, u64)> {
        let segs = self.segs();
        let end = self.written.load(Ordering::Acquire);
        let min = self.log_start.load(Ordering::Acquire);
        let out_of_range = || StoreError::OutOfRange { offset, min, max: end };
        if offset < min || offset >= end {
            return Err(out_of_range());
        }
        let first = segs.first().ok_or_else(out_of_range)?;
        let i = offset.checked_sub(first.start).ok_or_else(out_of_range)? / self.seg_size();
        let seg = segs.get(i as usize).ok_or_else(out_of_range)?.clone();
        Ok((seg, end))
    }

    /// The segment covering `offset`, if it exists.
    fn segment_for(&self, offset: u64) -> Option<Arc<Segment>> {
        let segs = self.segs();
        let first = segs.first()?;
        if offset < first.start {
            return None;
        }
        let i = ((offset - first.start) / self.seg_size()) as usize;
        segs.get(i).cloned()
    }
    fn create_segment(&self, start: u64) -> Result<Arc<Segment>> {
        self.create_segment_from(start, None)
    }

    /// Creates the segment starting at `start`, from `spare` (a file made
    /// ahead for it, renamed into place) when there is one.
    fn create_segment_from(&self, start: u64, spare: Option<MappedFile>) -> Result<Arc<Segment>> {
        let path = self.dir.join(offset_name(start));
        let file = match spare {
            Some(mut f) => {
                fs::rename(f.path(), &path).at(&path).inspect_err(|_| {
                    let _ = fs::remove_file(f.path());
                })?;
                f.set_path(path.clone());
                f
            }
            None => MappedFile::create(&path, self.seg_size(), self.map_opts)?,
        };
        if let Err(e) = sync_dir(&self.dir) {
            // Not listed yet: remove it, so the same create can be tried again.
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        tracing::debug!(start, path = %path.display(), "created segment");
        Ok(Arc::new(Segment { start, file }))
    }

    /// Asks the prefault thread to create the segment after `last` (the
    /// newest) ahead of need, under the name `<start>.next`, which recovery
    /// removes; gives up an earlier spare for another start.
    fn want_spare(&self, w: &mut Writer, last: u64) {
        let next = last + self.seg_size();
        if w.spare.as_ref().is_some_and(|(s, _)| *s == next) {
            return;
        }
        if let Some((_, old)) = w.spare.take() {
            prefault::abandon_spare(&old);
        }
        let path = self.dir.join(format!("{}{SPARE_SEGMENT_SUFFIX}", offset_name(next)));
        w.spare = Some((next, prefault::create_ahead(path, self.seg_size(), self.map_opts)));
    }
}

impl FlushTarget for Inner {
    fn flush_state(&self) -> &Arc<FlushShared> {
        &self.flush
    }
    fn segments_in(&self, from: u64, to: u64) -> Vec<Arc<Segment>> {
        self.segs()
            .iter()
            .filter(|s| s.end() > from && s.start < to)
            .cloned()
            .collect()
    }
    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }
    fn checkpoint(&self) -> &CheckpointFile {
        &self.checkpoint
    }
}

impl CommitLog {
    /// Opens the CommitLog under `root` (the store directory), creating it if
    /// needed. `crashed` says the last stop was not clean (the `abort` marker
    /// was found): then recovery verifies every record from the checkpoint on.
    pub fn open(root: &Path, cfg: &StoreConfig, crashed: bool) -> Result<CommitLog> {
        cfg.validate()?;
        let dir = root.join(COMMITLOG_DIR);
        fs::create_dir_all(&dir).at(&dir)?;
        let (checkpoint, found) = CheckpointFile::load(root)?;
        if let Some(size) = found
            .map(|c| c.segment_size)
            .filter(|&s| s != 0 && s != cfg.segment_size)
        {
            return Err(StoreError::BadArgument(format!(
                "segment_size is {} but the existing log in {} was written with {size}; \
                 the segment size of a log cannot change",
                cfg.segment_size,
                root.display()
            )));
        }
        let map_opts = MapOptions {
            warm_up: cfg.warm_up,
            mlock: cfg.mlock,
        };
        let recovered = recovery::recover(&dir, cfg, map_opts, found, crashed)?;
        let flushed = recovered.end;
        let inner = Arc::new(Inner {
            dir,
            cfg: cfg.clone(),
            map_opts,
            segments: RwLock::new(recovered.segments),
            writer: Mutex::new(Writer::default()),
            written: AtomicU64::new(recovered.end),
            log_start: AtomicU64::new(recovered.log_start),
            flush: Arc::new(FlushShared::new(flushed)),
            checkpoint: Arc::new(checkpoint),
            closed: AtomicBool::new(false),
        });
        // Whatever recovery kept past the last checkpoint may still sit only
        // in the page cache (after a process crash): make it durable before
        // anyone relies on it.
        {
            let durable = found.map_or(0, |c| c.flushed);
            let segs = inner.segs().clone();
            for s in segs.iter().filter(|s| s.end() > durable) {
                s.file.flush(0, s.file.len())?;
            }
        }
        inner.checkpoint.update(|c| {
            c.segment_size = inner.cfg.segment_size;
            c.log_start = recovered.log_start;
            c.flushed = recovered.end;
            c.dispatched = c.dispatched.min(recovered.end);
        })?;
        flush::spawn_flusher(
            &inner,
            inner.cfg.flush_mode,
            inner.cfg.flush_interval(),
            inner.cfg.checkpoint_interval(),
            &inner.dir,
        )?;
        Ok(CommitLog { inner })
    }

    pub fn checkpoint(&self) -> &Arc<CheckpointFile> {
        &self.inner.checkpoint
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// First readable offset.
    pub fn min_offset(&self) -> u64 {
        self.inner.log_start.load(Ordering::Acquire)
    }

    /// End of the log: the offset the next record will be written at (or the
    /// start of the next segment, if it does not fit in the current one).
    pub fn max_offset(&self) -> u64 {
        self.inner.written.load(Ordering::Acquire)
    }

    /// Offset up to which data is known durable.
    pub fn flushed_offset(&self) -> u64 {
        self.inner.flush.flushed()
    }

    /// How many msync rounds the flusher has done (for tests and metrics).
    pub fn flush_count(&self) -> u64 {
        self.inner.flush.flush_count()
    }

    /// How long the msync rounds took.
    pub fn flush_latency(&self) -> &flush::FlushLatency {
        self.inner.flush.latency()
    }

    /// Start offsets and last-modified times of all segments (for retention).
    pub fn segment_infos(&self) -> Result<Vec<crate::retention::SegmentInfo>> {
        let segs = self.inner.segs().clone();
        segs.iter()
            .map(|s| {
                let meta = fs::metadata(s.file.path()).at(s.file.path())?;
                let modified = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0);
                Ok(crate::retention::SegmentInfo {
                    start: s.start,
                    end: s.end(),
                    last_modified_ms: modified,
                })
            })
            .collect()
    }

    /// Marks the disk as past its refuse watermark
    /// (`Some((used_percent, limit_percent))`) or not (`None`); set by
    /// retention. It refuses nothing here: whoever admits new writes asks
    /// [`CommitLog::disk_full`] (the broker, before proposing a send), while
    /// entries a Raft leader already committed to replicate must still go
    /// in, or the node would fall out of its group.
    pub fn set_disk_full(&self, state: Option<(f64, f64)>) {
        lock(&self.inner.writer).disk_full = state;
    }

    /// Whether appends are refused for disk use, and at what use and limit.
    pub fn disk_full(&self) -> Option<(f64, f64)> {
        lock(&self.inner.writer).disk_full
    }

    /// Appends a batch of records and returns their offsets. The records are
    /// readable when this returns; durability is reported by
    /// [`CommitLog::on_durable`] / [`CommitLog::wait_durable`]. All records of
    /// a batch are validated before any is written, so a rejected batch
    /// writes nothing.
    pub fn append(&self, records: &[NewRecord<'_>]) -> Result<Appended> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        self.check_usable()?;
        let max = inner.cfg.max_record_size as usize;
        for r in records {
            let n = record::encoded_len(r.payload.len());
            if n > max {
                return Err(StoreError::BadArgument(format!(
                    "record of {n} bytes exceeds max_record_size {max}"
                )));
            }
        }

        // Plan where every record goes, and create any segment the batch
        // needs, before writing a byte: a failure then leaves nothing behind.
        let seg_size = inner.seg_size();
        let start = inner.written.load(Ordering::Relaxed);
        let mut offsets = Vec::with_capacity(records.len());
        let mut pos = start;
        for r in records {
            let n = record::encoded_len(r.payload.len()) as u64;
            if pos % seg_size + n > seg_size - EOS_LEN as u64 {
                pos += seg_size - pos % seg_size;
            }
            offsets.push(pos);
            pos += n;
        }
        let end = pos;
        let mut seg = match w.active.take().filter(|s| s.start <= start && start < s.end()) {
            Some(s) => s,
            None => match inner.segment_for(start) {
                Some(s) => s,
                None => self.roll(&mut w, start - start % seg_size)?,
            },
        };
        if let Some(&last) = offsets.last() {
            let mut next = seg.start;
            while next + seg_size <= last {
                next += seg_size;
                if inner.segment_for(next).is_none() {
                    self.roll(&mut w, next)?;
                }
            }
        }

        // The records go in through the file, a run of adjacent ones per
        // call (see `MappedFile::write_through` for why not the map).
        // SAFETY (every write below): at or above the published end, which
        // no reader looks at; we are the only writer.
        let headers: Vec<[u8; HEADER_LEN]> = records
            .iter()
            .map(|r| record::encode_header(&r.meta, r.payload))
            .collect();
        let mut run: Vec<&[u8]> = Vec::with_capacity(2 * records.len());
        let mut run_at = start - seg.start;
        let mut prev_end = start;
        for ((r, &off), header) in records.iter().zip(&offsets).zip(&headers) {
            if off >= seg.end() {
                unsafe {
                    seg.file.write_through(run_at, &run)?;
                    seg.file.write_through(
                        prev_end - seg.start,
                        &[&record::encode_eos((seg.end() - prev_end) as u32)],
                    )?;
                }
                run.clear();
                seg = inner
                    .segment_for(off)
                    .ok_or_else(|| StoreError::BadArgument(format!("no segment for offset {off}")))?;
                run_at = off - seg.start;
            }
            debug_assert_eq!(
                run_at + run.iter().map(|b| b.len() as u64).sum::<u64>(),
                off - seg.start
            );
            run.push(header);
            run.push(r.payload);
            prev_end = off + header.len() as u64 + r.payload.len() as u64;
        }
        unsafe { seg.file.write_through(run_at, &run)? };
        inner.written.store(end, Ordering::Release);
        // Asked for at the first append rather than at open, so a store
        // opened only to be read (`raftmq store verify`) makes no spare.
        if w.spare.is_none() {
            inner.want_spare(&mut w, seg.start);
        }
        w.active = Some(seg);
        Ok(Appended { offsets, end })
    }

    /// Creates the segment starting at `start` (the writer lock is held),
    /// from the spare made ahead for it if it is ready, and asks for the
    /// next spare.
    fn roll(&self, w: &mut Writer, start: u64) -> Result<Arc<Segment>> {
        let spare = match w.spare.take() {
            Some((s, slot)) if s == start => prefault::take_spare(&slot),
            Some((_, slot)) => {
                prefault::abandon_spare(&slot);
                None
            }
            None => None,
        };
        let seg = self.inner.create_segment_from(start, spare)?;
        self.inner.segs_mut().push(seg.clone());
        self.inner.want_spare(w, start);
        Ok(seg)
    }

    /// Calls `cb` once everything below `end` is as durable as the flush
    /// mode promises: at once in async mode (the data is in the mapped
    /// pages), after a shared msync in sync mode (group commit). The callback
    /// runs on the flusher thread or the caller's; it must not block.
    pub fn on_durable(&self, end: u64, cb: DurableCallback) {
        if end > self.max_offset() {
            return cb(Err(beyond_end(end, self.max_offset())));
        }
        self.inner.flush.on_durable(self.inner.cfg.flush_mode, end, cb);
    }

    /// Blocks until [`CommitLog::on_durable`] would have fired for `end`.
    pub fn wait_durable(&self, end: u64) -> Result<()> {
        if end > self.max_offset() {
            return Err(beyond_end(end, self.max_offset()));
        }
        match self.inner.cfg.flush_mode {
            FlushMode::Async => Ok(()),
            FlushMode::Sync => self.inner.flush.wait(end),
        }
    }

    /// Msyncs everything written so far, whatever the flush mode, and
    /// returns the durable end.
    pub fn flush(&self) -> Result<u64> {
        let end = self.max_offset();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.inner.flush.request(
            end,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().map_err(|_| StoreError::Closed)??;
        Ok(end)
    }

    /// Reads and verifies the record at `offset`, without copying.
    pub fn read(&self, offset: u64) -> Result<RecordRef> {
        let (seg, end) = self.inner.pin(offset)?;
        let in_seg = offset - seg.start;
        let avail = (end.min(seg.end()) - offset).min(seg.file.len() - in_seg);
        // SAFETY: below the published end: immutable while views exist.
        let buf = unsafe { seg.file.slice(in_seg, avail)? };
        match record::decode(buf, self.inner.cfg.max_record_size as usize) {
            Ok(Decoded::Record(v)) => Ok(RecordRef {
                meta: v.meta,
                crc: v.crc,
                bytes: LogSlice {
                    pos: in_seg,
                    len: v.len as u64,
                    seg,
                },
            }),
            Ok(Decoded::End) => Err(StoreError::corrupt(seg.file.path(), in_seg, "no record here (zeros)")),
            Ok(Decoded::EndOfSegment) => Err(StoreError::corrupt(
                seg.file.path(),
                in_seg,
                "end-of-segment marker, not a record",
            )),
            Err(why) => {
                if record::is_eos(buf, seg.file.len() - in_seg) {
                    Err(StoreError::corrupt(
                        seg.file.path(),
                        in_seg,
                        "end-of-segment marker, not a record",
                    ))
                } else {
                    Err(StoreError::corrupt(seg.file.path(), in_seg, why))
                }
            }
        }
    }

    /// A view of `len` bytes at `offset` (for example one message inside a
    /// record's payload, as a ConsumeQueue unit addresses it). Not
    /// CRC-checked: the range must lie inside one segment, below the end.
    pub fn read_bytes(&self, offset: u64, len: u64) -> Result<LogSlice> {
        let (seg, end) = self.inner.pin(offset)?;
        let stop = offset.checked_add(len).filter(|&s| s <= end && s <= seg.end());
        if stop.is_none() {
            return Err(StoreError::BadArgument(format!(
                "range {offset}+{len} crosses the end of the log or of its segment"
            )));
        }
        Ok(LogSlice {
            pos: offset - seg.start,
            len,
            seg,
        })
    }

    /// Iterates records from `offset` (a record boundary) to the end of the
    /// log as it is at each step.
    pub fn iter_from(&self, offset: u64) -> Iter {
        Iter {
            log: self.clone(),
            pos: offset,
            failed: false,
        }
    }

    /// Drops every record at or after `offset`, which must be a record
    /// boundary (Raft conflict resolution). Durable when it returns. Pending
    /// durability callbacks for the dropped range complete with `Ok`: the
    /// records they waited for no longer exist, and what remains is durable.
    pub fn truncate(&self, offset: u64) -> Result<()> {
        let result = self.truncate_locked(offset);
        self.inner.flush.fire_ready();
        result
    }

    fn truncate_locked(&self, offset: u64) -> Result<()> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        self.check_usable()?;
        // Drop the cached segment: it would count as a live view below.
        w.active = None;
        let _io = inner.flush.io_lock();
        let end = inner.written.load(Ordering::Acquire);
        let min = inner.log_start.load(Ordering::Acquire);
        if offset == end {
            return Ok(());
        }
        if offset < min || offset > end {
            return Err(StoreError::OutOfRange { offset, min, max: end });
        }
        let seg = inner
            .segment_for(offset)
            .ok_or(StoreError::OutOfRange { offset, min, max: end })?;
        self.check_boundary(&seg, offset, end)?;

        // Make what we keep durable and lower the checkpoint before touching
        // anything: a crash half-way then leaves either the old tail (this
        // truncate was never acknowledged) or the cut one.
        flush::flush_to_locked(inner, offset)?;
        inner.checkpoint.update(|c| {
            c.flushed = c.flushed.min(offset);
            c.dispatched = c.dispatched.min(offset);
        })?;

        // From here on a failure leaves memory and disk disagreeing.
        let removed = self
            .cut_segment(seg, offset, end)
            .map_err(|e| self.poison("truncate", e))?;
        for s in &removed {
            fs::remove_file(s.file.path())
                .at(s.file.path())
                .map_err(|e| self.poison("truncate", e))?;
        }
        if !removed.is_empty() {
            sync_dir(&inner.dir).map_err(|e| self.poison("truncate", e))?;
        }
        inner.flush.truncated(offset);
        tracing::info!(offset, dropped = end - offset, "truncated commitlog");
        Ok(())
    }

    /// Under the segment list's write lock: publishes the new end, clears
    /// `[offset, end)` of `seg` durably, and unlinks the later segments from
    /// the list (returning them for deletion). The segment is cleared in place
    /// when no view of it is alive; otherwise its kept prefix is copied to a
    /// fresh file renamed over it, so old views keep reading the old inode.
    fn cut_segment(&self, seg: Arc<Segment>, offset: u64, end: u64) -> Result<Vec<Arc<Segment>>> {
        let inner = &*self.inner;
        let mut segs = inner.segs_mut();
        // Readers pin a segment and read the end under the read side of this
        // lock, so from here on no new view can reach past `offset`.
        inner.written.store(offset, Ordering::Release);
        let idx = segs
            .iter()
            .position(|s| Arc::ptr_eq(s, &seg))
            .ok_or_else(|| StoreError::BadArgument("segment vanished during truncate".into()))?;
        let from = offset - seg.start;
        let to = end.min(seg.end()) - seg.start;
        // Two references: the list's and ours. With the list write-locked no
        // new view can be made, so a count of two means no view exists.
        if Arc::strong_count(&seg) == 2 {
            // SAFETY: no views of this segment exist and we are the writer.
            unsafe { seg.file.zero(from, to - from)? };
            seg.file.flush(from, to - from)?;
        } else {
            let path = seg.file.path().to_path_buf();
            let tmp = path.with_extension("truncating");
            let _ = fs::remove_file(&tmp);
            let mut fresh = MappedFile::create(&tmp, seg.file.len(), inner.map_opts)?;
            // SAFETY: the prefix is below the published end, so immutable; the
            // fresh file is private to us until renamed.
            unsafe { fresh.write(0, seg.file.slice(0, from)?)? };
            fresh.flush(0, from)?;
            fs::rename(&tmp, &path).at(&path)?;
            sync_dir(&inner.dir)?;
            fresh.set_path(path);
            tracing::debug!(
                start = seg.start,
                "truncated a segment with live readers by copying its prefix"
            );
            segs[idx] = Arc::new(Segment {
                start: seg.start,
                file: fresh,
            });
        }
        Ok(segs.split_off(idx + 1))
    }

    /// Walks record lengths from the segment start to see whether `offset`
    /// is a boundary. Cheap: one header read per record, no CRC.
    fn check_boundary(&self, seg: &Segment, offset: u64, end: u64) -> Result<()> {
        let max = self.inner.cfg.max_record_size as usize;
        let mut p = seg.start.max(self.min_offset());
        let stop = end.min(seg.end());
        while p < offset {
            let in_seg = p - seg.start;
            // SAFETY: below the published end.
            let buf = unsafe { seg.file.slice(in_seg, stop - p)? };
            let len = if record::is_eos(buf, seg.file.len() - in_seg) {
                (seg.file.len() - in_seg) as usize
            } else {
                record::peek_len(buf, max)
                    .ok_or_else(|| StoreError::corrupt(seg.file.path(), in_seg, "bad record header"))?
            };
            p += len as u64;
        }
        if p == offset {
            Ok(())
        } else {
            Err(StoreError::NotRecordBoundary { offset })
        }
    }

    /// Deletes whole segments that end at or before `offset` (never the
    /// newest one). Returns the new minimum offset.
    pub fn purge_before(&self, offset: u64) -> Result<u64> {
        let inner = &*self.inner;
        let _w = lock(&inner.writer);
        self.check_usable()?;
        let _io = inner.flush.io_lock();
        let (n, new_min) = {
            let segs = inner.segs();
            let n = segs
                .iter()
                .take(segs.len().saturating_sub(1))
                .take_while(|s| s.end() <= offset)
                .count();
            match segs.get(n) {
                Some(first_kept) if n > 0 => (n, first_kept.start.max(inner.log_start.load(Ordering::Acquire))),
                _ => return Ok(self.min_offset()),
            }
        };
        // The checkpoint names the new start before any file goes.
        inner.checkpoint.update(|c| c.log_start = new_min)?;
        let removed: Vec<Arc<Segment>> = {
            let mut segs = inner.segs_mut();
            inner.log_start.store(new_min, Ordering::Release);
            segs.drain(..n).collect()
        };
        for s in &removed {
            fs::remove_file(s.file.path())
                .at(s.file.path())
                .map_err(|e| self.poison("purge", e))?;
            tracing::info!(start = s.start, "purged segment");
        }
        sync_dir(&inner.dir).map_err(|e| self.poison("purge", e))?;
        Ok(new_min)
    }

    /// Discards the whole log and makes it start (empty) at `offset`: a node
    /// that installs a snapshot continues at the same physical offsets as the
    /// rest of its group.
    pub fn reset(&self, offset: u64) -> Result<()> {
        let result = self.reset_locked(offset);
        self.inner.flush.fire_ready();
        result
    }

    fn reset_locked(&self, offset: u64) -> Result<()> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        self.check_usable()?;
        w.active = None;
        let _io = inner.flush.io_lock();
        let seg_start = offset - offset % inner.seg_size();
        // The checkpoint goes first; recovery recognizes a reset that died
        // half-way by a `log_start` past every segment it finds.
        inner.checkpoint.update(|c| {
            c.log_start = offset;
            c.flushed = offset;
            c.dispatched = offset;
        })?;
        let old: Vec<Arc<Segment>> = {
            let mut segs = inner.segs_mut();
            inner.written.store(offset, Ordering::Release);
            inner.log_start.store(offset, Ordering::Release);
            std::mem::take(&mut *segs)
        };
        let result = (|| {
            for s in &old {
                fs::remove_file(s.file.path()).at(s.file.path())?;
            }
            inner.create_segment(seg_start)
        })();
        let seg = result.map_err(|e| self.poison("reset", e))?;
        inner.segs_mut().push(seg);
        inner.flush.truncated(offset);
        tracing::info!(offset, "reset commitlog");
        Ok(())
    }

    /// Refuses to change a log that is closed or poisoned.
    fn check_usable(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        self.inner.flush.check_poisoned()
    }

    /// Stops the log after a failure that left memory and disk disagreeing;
    /// returns the error to pass on.
    fn poison(&self, what: &str, e: StoreError) -> StoreError {
        tracing::error!(error = %e, "{what} failed half-way; the log refuses further changes until reopened");
        self.inner.flush.poison(format!("{what}: {e}"));
        e
    }

    /// Flushes everything, writes the checkpoint and stops the flusher.
    /// Later appends fail with [`StoreError::Closed`].
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let end = {
            let mut w = lock(&self.inner.writer);
            if let Some((_, slot)) = w.spare.take() {
                prefault::abandon_spare(&slot);
            }
            self.inner.written.load(Ordering::Acquire)
        };
        flush::flush_once(&*self.inner)?;
        self.inner.flush.shutdown();
        self.inner.checkpoint.update(|c| c.flushed = end)?;
        Ok(())
    }
}

fn beyond_end(end: u64, max: u64) -> StoreError {
    StoreError::BadArgument(format!("cannot wait for offset {end}: the log ends at {max}"))
}

/// Iterator over records; see [`CommitLog::iter_from`].
pub struct Iter {
    log: CommitLog,
    pos: u64,
    failed: bool,
}

impl Iterator for Iter {
    type Item = Result<RecordRef>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let result = (|| loop {
            if self.pos >= self.log.max_offset() {
                return Ok(None);
            }
            let (seg, end) = self.log.inner.pin(self.pos)?;
            let in_seg = self.pos - seg.start;
            // SAFETY: below the end read together with the pin.
            let head = unsafe {
                seg.file
                    .slice(in_seg, (end.min(seg.end()) - self.pos).min(EOS_LEN as u64))?
            };
            if record::is_eos(head, seg.file.len() - in_seg) {
                self.pos = seg.end();
                continue;
            }
            let r = self.log.read(self.pos)?;
            self.pos = r.end();
            return Ok(Some(r));
        })();
        self.failed = result.is_err();
        result.transpose()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.flush.shutdown();
    }
}
