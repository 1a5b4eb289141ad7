//! [`Store`]: the CommitLog with its indexes, the `abort` marker, dispatch,
//! crash recovery of the indexes, and retention.
//!
//! Dispatch is driven by the caller (the Raft state machine): for every
//! message of an applied record it calls [`Store::dispatch`], which appends
//! the ConsumeQueue unit (assigning the queue offset) and indexes the keys,
//! then [`Store::mark_dispatched`] with the record's end. A background thread
//! msyncs the indexes and records that mark in the checkpoint as
//! `dispatched`. At open, every ConsumeQueue is cut back to units below
//! `dispatched` (after a crash the units past it may be missing or partial),
//! and [`Store::dispatched_offset`] tells the caller where to re-dispatch
//! from; [`Store::redispatch`] does it with a [`Dispatcher`] that decodes
//! records.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use crate::commitlog::{CommitLog, LogSlice, RecordRef};
use crate::config::{RetentionConfig, StoreConfig};
use crate::consume_queue::{ConsumeQueue, CqUnit};
use crate::error::{IoContext, Result, StoreError};
use crate::key_index::KeyIndex;
use crate::layout::{ABORT_FILE, LOCK_FILE};
use crate::locks::lock;
use crate::mapped_file::{MapOptions, sync_dir};
use crate::queue_table::QueueTable;
use crate::retention::{self, Clock, DiskProbe, RetentionPlan};

/// One message to index, as the caller decoded it from an applied record.
#[derive(Debug, Clone)]
pub struct Dispatch<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    /// Physical offset of the message bytes (inside a record's payload).
    pub phys: u64,
    pub size: u32,
    pub tag_hash: u64,
    pub store_timestamp_ms: u64,
    /// Keys to index (message keys, message id), already qualified by the
    /// caller if it wants per-topic lookups (RocketMQ uses `topic#key`).
    pub keys: Vec<&'a [u8]>,
}

/// Decodes the messages of a record, for [`Store::redispatch`].
pub trait Dispatcher {
    fn decode<'r>(&mut self, record: &'r RecordRef) -> Result<Vec<Dispatch<'r>>>;
}

struct Inner {
    root: PathBuf,
    /// As opened; `cfg.retention` is only the starting value of
    /// `retention`, which may change while the store is open.
    cfg: StoreConfig,
    retention: Mutex<RetentionConfig>,
    log: CommitLog,
    queues: QueueTable,
    index: KeyIndex,
    /// End of the last record the caller has finished dispatching.
    dispatched: AtomicU64,
    crashed: bool,
    closed: AtomicBool,
    stop: Arc<(Mutex<bool>, Condvar)>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Holds the directory's flock until the store is closed or dropped.
    lock: Mutex<Option<File>>,
}

/// A node's store. Cloning gives another handle to the same store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.inner.root).finish()
    }
}

impl Store {
    /// Opens (or creates) the store in `root`, recovering from a crash if the
    /// `abort` marker is there.
    pub fn open(root: &Path, cfg: &StoreConfig) -> Result<Store> {
        Self::open_above(root, cfg, 0)
    }

    /// As [`Store::open`], for a caller that knows the indexes were durable
    /// for every record below `durable_dispatch`: the Raft state machine
    /// writes a snapshot (which records that offset) only after flushing
    /// them. The checkpoint says so too, unless it is damaged or lost; then
    /// recovery would otherwise truncate every index to the log's start,
    /// and the entries the snapshot covers are never applied again to
    /// rebuild them: their queues would restart at offset 0.
    pub fn open_above(root: &Path, cfg: &StoreConfig, durable_dispatch: u64) -> Result<Store> {
        cfg.validate()?;
        fs::create_dir_all(root).at(root)?;
        let dir_lock = lock_dir(root)?;
        let abort = root.join(ABORT_FILE);
        let crashed = abort.exists();
        if crashed {
            tracing::warn!(dir = %root.display(), "the last stop was not clean; recovering");
        }
        File::create(&abort).and_then(|f| f.sync_all()).at(&abort)?;
        sync_dir(root)?;
        let opened = Self::open_marked(root, cfg, crashed, dir_lock, durable_dispatch);
        // A store found clean and refused (damage, a wrong setting) is left
        // as found: not marked crashed for the next reader.
        if opened.is_err() && !crashed {
            let _ = fs::remove_file(&abort);
            let _ = sync_dir(root);
        }
        opened
    }

    /// The rest of [`Store::open`], once the `abort` marker is in place.
    fn open_marked(
        root: &Path,
        cfg: &StoreConfig,
        crashed: bool,
        dir_lock: File,
        durable_dispatch: u64,
    ) -> Result<Store> {
        let log = CommitLog::open(root, cfg, crashed)?;
        let checkpoint = log.checkpoint().get();
        let dispatched = checkpoint
            .dispatched
            .max(durable_dispatch)
            .clamp(log.min_offset(), log.max_offset());
        if dispatched > checkpoint.dispatched {
            tracing::warn!(
                checkpoint = checkpoint.dispatched,
                durable = dispatched,
                "the checkpoint's dispatch mark is below what the last snapshot found durable; keeping the indexes below that"
            );
        }
        let map = MapOptions::default();
        let queues = QueueTable::open(root, cfg.cq_units_per_file, map, crashed)?;
        // Units past the dispatch mark may be partial; the caller dispatches
        // those records again.
        queues.truncate_all_phys(dispatched)?;
        // Queue minimums are not persisted: raise them to the log's start.
        queues.purge_below_phys(log.min_offset())?;
        // After a crash, every unit is checked: a damaged one would send
        // readers to the wrong bytes (about 20 bytes read per message kept).
        if crashed {
            queues.check_all(log.min_offset(), dispatched)?;
        }
        let index = KeyIndex::open(root, cfg.index_slots, cfg.index_entries, map, crashed, dispatched)?;

        let inner = Arc::new(Inner {
            root: root.to_path_buf(),
            cfg: cfg.clone(),
            retention: Mutex::new(cfg.retention.clone()),
            log,
            queues,
            index,
            dispatched: AtomicU64::new(dispatched),
            crashed,
            closed: AtomicBool::new(false),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            flusher: Mutex::new(None),
            lock: Mutex::new(Some(dir_lock)),
        });
        let weak = Arc::downgrade(&inner);
        let stop = inner.stop.clone();
        let interval = cfg.index_flush_interval();
        let handle = std::thread::Builder::new()
            .name("raftmq-index-flush".into())
            .spawn(move || index_flusher(weak, stop, interval))
            .map_err(|source| StoreError::Io {
                path: root.to_path_buf(),
                source,
            })?;
        *lock(&inner.flusher) = Some(handle);
        Ok(Store { inner })
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The config the store was opened with (see [`Store::retention`] for
    /// the retention rules in force).
    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// The retention rules in force.
    pub fn retention(&self) -> RetentionConfig {
        lock(&self.inner.retention).clone()
    }

    /// New retention rules, from the next retention run on.
    pub fn set_retention(&self, cfg: RetentionConfig) {
        *lock(&self.inner.retention) = cfg;
    }

    /// Whether the last stop was a crash.
    pub fn recovered_from_crash(&self) -> bool {
        self.inner.crashed
    }

    pub fn commitlog(&self) -> &CommitLog {
        &self.inner.log
    }

    pub fn queues(&self) -> &QueueTable {
        &self.inner.queues
    }

    pub fn key_index(&self) -> &KeyIndex {
        &self.inner.index
    }

    pub fn queue(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        self.inner.queues.get(topic, queue_id)
    }

    /// Indexes one message; returns its queue offset. A message already in
    /// its queue (an apply tried again after running out of space half-way)
    /// is found there, not added again.
    pub fn dispatch(&self, d: &Dispatch<'_>) -> Result<u64> {
        let cq = self.inner.queues.get_or_create(d.topic, d.queue_id)?;
        let (offset, queued_before) = cq.append_once(CqUnit {
            phys: d.phys,
            size: d.size,
            tag_hash: d.tag_hash,
        })?;
        // A message queued by the failed try had its keys indexed too,
        // unless it was the last one (its keys may be half in: put again,
        // and a key found twice is reported once).
        if queued_before && self.inner.index.last_phys().is_some_and(|last| d.phys < last) {
            return Ok(offset);
        }
        for key in &d.keys {
            self.inner.index.put(key, d.phys, d.store_timestamp_ms)?;
        }
        Ok(offset)
    }

    /// Every record below `end` has been dispatched.
    pub fn mark_dispatched(&self, end: u64) {
        self.inner.dispatched.fetch_max(end, Ordering::AcqRel);
    }

    /// End of the last dispatched record; after open, where dispatching must
    /// resume.
    pub fn dispatched_offset(&self) -> u64 {
        self.inner.dispatched.load(Ordering::Acquire)
    }

    /// Drops the log's records at and after `offset` (Raft conflict
    /// resolution). Only records not yet dispatched can go: dispatched ones
    /// were committed, and Raft never truncates committed entries.
    pub fn truncate(&self, offset: u64) -> Result<()> {
        let dispatched = self.dispatched_offset();
        if offset < dispatched {
            return Err(StoreError::BadArgument(format!(
                "cannot truncate at {offset}: records up to {dispatched} are already dispatched"
            )));
        }
        self.inner.log.truncate(offset)
    }

    /// Dispatches every record from [`Store::dispatched_offset`] to the end
    /// of the log; returns how many messages were indexed.
    pub fn redispatch(&self, dispatcher: &mut dyn Dispatcher) -> Result<u64> {
        let mut n = 0;
        for record in self.inner.log.iter_from(self.dispatched_offset()) {
            let record = record?;
            for d in dispatcher.decode(&record)? {
                self.dispatch(&d)?;
                n += 1;
            }
            self.mark_dispatched(record.end());
        }
        Ok(n)
    }

    /// The message a ConsumeQueue unit points at.
    pub fn message(&self, topic: &str, queue_id: u32, queue_offset: u64) -> Result<(CqUnit, LogSlice)> {
        let cq = self
            .queue(topic, queue_id)
            .ok_or_else(|| StoreError::BadArgument(format!("no queue {topic}/{queue_id}")))?;
        let unit = cq.get(queue_offset)?;
        let bytes = self.inner.log.read_bytes(unit.phys, u64::from(unit.size))?;
        Ok((unit, bytes))
    }

    /// Physical offsets of messages indexed under `key` in the time range,
    /// newest first, without duplicates. Candidates only: the caller checks
    /// the key of each message (hashes collide).
    pub fn query_key(&self, key: &[u8], begin_ms: u64, end_ms: u64, max: usize) -> Result<Vec<u64>> {
        let mut found = self.inner.index.query(key, begin_ms, end_ms, max.saturating_mul(2))?;
        let min = self.inner.log.min_offset();
        let mut seen = std::collections::HashSet::new();
        found.retain(|&p| p >= min && seen.insert(p));
        found.truncate(max);
        Ok(found)
    }

    /// Msyncs the ConsumeQueues and key index and records the dispatch mark
    /// in the checkpoint.
    pub fn flush_indexes(&self) -> Result<()> {
        flush_indexes(&self.inner)
    }

    /// Applies the retention rules once: deletes the segments the plan
    /// names (never at or past `limit`, the offset below which the caller
    /// no longer needs the log), the index files wholly below the new
    /// minimum, and refuses or re-allows appends by disk use.
    pub fn enforce_retention(&self, clock: &dyn Clock, probe: &dyn DiskProbe, limit: u64) -> Result<RetentionPlan> {
        let plan = self.plan_retention(clock, probe, limit)?;
        if let Some(before) = plan.delete_before {
            let min = self.purge_before(before)?;
            tracing::info!(
                min,
                segments = plan.segments_to_delete,
                reason = plan.reason.as_str(),
                "retention deleted segments"
            );
        }
        Ok(plan)
    }

    /// The retention decision without the deletion (for callers that must
    /// delete through another path, like a Raft log purge); appends are
    /// refused or re-allowed by disk use here already.
    pub fn plan_retention(&self, clock: &dyn Clock, probe: &dyn DiskProbe, limit: u64) -> Result<RetentionPlan> {
        let inner = &*self.inner;
        let now = clock.now_ms();
        let usage = probe.usage(&inner.root)?;
        let segments = inner.log.segment_infos()?;
        let limit = limit.min(self.dispatched_offset());
        let rules = self.retention();
        let plan = retention::plan(&rules, &segments, usage, now, clock.local_hour(now), limit);
        self.mark_disk_full(
            plan.refuse_writes
                .then_some((plan.disk_ratio * 100.0, rules.disk_refuse_ratio * 100.0)),
        );
        Ok(plan)
    }

    /// Reads the disk's use and marks it full (`CommitLog::disk_full`) at
    /// or past `disk_refuse_ratio`, or no longer full. Cheap (one
    /// `statvfs`), so it runs far more often than retention. Returns the
    /// mark.
    pub fn watch_disk(&self, probe: &dyn DiskProbe) -> Result<Option<(f64, f64)>> {
        let ratio = probe.usage(&self.inner.root)?.ratio();
        let limit = self.retention().disk_refuse_ratio;
        let full = (ratio >= limit).then_some((ratio * 100.0, limit * 100.0));
        self.mark_disk_full(full);
        Ok(full)
    }

    /// Sets the disk-full mark, logging when it changes (not at every look).
    fn mark_disk_full(&self, full: Option<(f64, f64)>) {
        let log = self.commitlog();
        match (log.disk_full(), full) {
            (None, Some((used, limit))) => tracing::error!(
                disk_percent = used,
                limit_percent = limit,
                "disk nearly full: refusing new messages"
            ),
            (Some(_), None) => tracing::info!("disk has room again: taking new messages"),
            _ => {}
        }
        log.set_disk_full(full);
    }

    /// Deletes the log's whole segments that end at or before `offset`, and
    /// the ConsumeQueue and key-index files wholly below the new start.
    /// Returns the new start.
    pub fn purge_before(&self, offset: u64) -> Result<u64> {
        let min = self.inner.log.purge_before(offset)?;
        self.inner.queues.purge_below_phys(min)?;
        self.inner.index.purge_below_phys(min)?;
        Ok(min)
    }

    /// Replaces everything with an empty log that starts at `next_phys` and
    /// queues that continue at the given offsets (every other queue restarts
    /// at 0): a node installing a snapshot continues exactly where its group
    /// is. Key-index entries of the old log stay but point below the new
    /// start, where queries no longer look.
    pub fn reset(&self, next_phys: u64, queues: &[(String, u32, u64)]) -> Result<()> {
        let inner = &*self.inner;
        inner.log.reset(next_phys)?;
        inner.dispatched.store(next_phys, Ordering::Release);
        for (topic, queue_id, cq) in inner.queues.queues() {
            if !queues.iter().any(|(t, q, _)| *t == topic && *q == queue_id) {
                cq.reset(0)?;
            }
        }
        for (topic, queue_id, next) in queues {
            inner.queues.get_or_create(topic, *queue_id)?.reset(*next)?;
        }
        Ok(())
    }

    /// Flushes everything, stops the background threads and removes the
    /// `abort` marker: the next open is a clean one.
    pub fn close(&self) -> Result<()> {
        let inner = &*self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        stop_flusher(inner);
        flush_indexes(inner)?;
        inner.log.close()?;
        let abort = inner.root.join(ABORT_FILE);
        fs::remove_file(&abort).at(&abort)?;
        sync_dir(&inner.root)?;
        // Closing the descriptor releases the flock.
        drop(lock(&inner.lock).take());
        Ok(())
    }
}

/// Takes the exclusive lock on the store directory.
fn lock_dir(root: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let path = root.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .at(&path)?;
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.kind() == std::io::ErrorKind::WouldBlock {
            StoreError::BadArgument(format!("the store in {} is in use by another process", root.display()))
        } else {
            StoreError::Io { path, source: err }
        });
    }
    Ok(file)
}

fn flush_indexes(inner: &Inner) -> Result<()> {
    // Capture the mark first: everything below it is in the maps now, so
    // msyncing them makes it durable.
    let mark = inner.dispatched.load(Ordering::Acquire);
    inner.queues.flush_all()?;
    inner.index.flush()?;
    if inner.log.checkpoint().get().dispatched != mark {
        inner.log.checkpoint().update(|c| c.dispatched = mark)?;
    }
    Ok(())
}

fn stop_flusher(inner: &Inner) {
    *lock(&inner.stop.0) = true;
    inner.stop.1.notify_all();
    let handle = lock(&inner.flusher).take();
    if let Some(h) = handle
        && h.thread().id() != std::thread::current().id()
    {
        let _ = h.join();
    }
}

/// Flushes the indexes every `interval`. Holds the store only while
/// flushing, so dropping the last handle drops the store at once.
fn index_flusher(weak: Weak<Inner>, stop: Arc<(Mutex<bool>, Condvar)>, interval: std::time::Duration) {
    loop {
        {
            let stopped = lock(&stop.0);
            let (stopped, _) = stop
                .1
                .wait_timeout_while(stopped, interval, |s| !*s)
                .unwrap_or_else(|e| e.into_inner());
            if *stopped {
                return;
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        if let Err(e) = flush_indexes(&inner) {
            tracing::error!(error = %e, "index flush failed; will retry");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Not closed: behave like a crash (the abort marker stays), but stop
        // the thread.
        stop_flusher(self);
    }
}
