//! openraft's log storage on the CommitLog: every Raft entry is exactly one
//! CommitLog record, written once.
//!
//! openraft addresses entries by log index, the CommitLog by physical
//! offset. The log index maps one to the other: a ConsumeQueue of its own
//! (`raft/log_index/`) whose queue offset is the Raft index and whose unit
//! holds the record's offset, its length and (in the tag-hash field) its
//! term. It is cut back to the log's end and rebuilt from the records at
//! open, so it can never disagree with the CommitLog for long.
//!
//! Purges delete whole segments only below the floor retention sets
//! ([`LogStore::allow_deletion_below`]): the log is the message store, and
//! openraft also purges after installing a snapshot.
//!
//! ```text
//!  append(entries) ──► CommitLog.append (one record each) ──► log index units
//!        │                                                      (index -> offset, len, term)
//!        └─► CommitLog.on_durable(end) ──► IOFlushed callback (async: at once; sync: after msync)
//!  truncate_after(id) ──► CommitLog.truncate(offset of id+1), index.truncate(id+1)
//!  purge(id)          ──► purged id saved first, then whole segments below id+1 deleted
//! ```
//!
//! # Durability ordering (openraft issue #2118)
//!
//! openraft orders IO ids by vote first, and once `save_vote` returns it
//! counts every earlier append as flushed; alpha.37 waits for the previous
//! IO on become-leader, but a store must still keep durability a prefix.
//! Here it is one: the CommitLog is a single append-only file sequence whose
//! flush mark only moves forward over what was written before, callbacks
//! fire when that mark passes their records, and `save_vote` first waits for
//! the mark to reach the end of the log, so a vote is never durable ahead of
//! an append that preceded it.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use raftmq_store::commitlog::NewRecord;
use raftmq_store::{ConsumeQueue, CqUnit, RecordMeta, RecordRef, Store};

use crate::command::{Command, Decoded};
use crate::entry;
use crate::error::io_err;
use crate::held::HeldId;
use crate::message::{Message, MessageView};
use crate::raft_meta::RaftMeta;
use crate::room::until_room;
use crate::types::{Entry, LogId, TypeConfig, Vote, log_id};

/// Units per log-index file (20 bytes each, sector-packed: about 6 MB).
/// Unit tests use small files, to have several without 300,000 entries.
pub const LOG_INDEX_UNITS_PER_FILE: u64 = if cfg!(test) { 100 } else { 300_000 };

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Asked for what the entry does not hold (not damage).
fn absent(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, msg)
}

struct Inner {
    store: Store,
    index: ConsumeQueue,
    meta: RaftMeta,
    /// Serializes log mutations: openraft's, and the state machine's
    /// snapshot install, which replaces the log under this lock.
    write: Mutex<()>,
    /// Set at shutdown: storage steps waiting for disk space give up.
    stopping: AtomicBool,
    /// Physical offset below which a purge may delete whole segments. Set by
    /// retention only: the log is the message store, so openraft's own purges
    /// (after a snapshot install, say) must not delete messages that
    /// retention would keep.
    delete_floor: std::sync::atomic::AtomicU64,
    /// Set at open when the log ends before the index it knew committed
    /// (damage cut it short): that index. See [`LogStore::lost_up_to`].
    lost_up_to: Option<u64>,
}

/// The Raft log of one node. Cloning gives another handle (openraft's log
/// reader is one).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

/// How far an append got before it ran out of disk space (see
/// [`LogStore::append_step`]).
#[derive(Default)]
struct AppendProgress {
    /// The records are in the CommitLog, at these offsets.
    appended: Option<raftmq_store::Appended>,
    /// Log-index units written for them so far.
    indexed: usize,
}

/// Owns a record and exposes its payload, so entries read from the log can
/// carry `Bytes` that point into the mapped segment.
struct Payload(RecordRef);

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self.0.payload()
    }
}

impl LogStore {
    /// Opens the log over `store`, with its own state in `raft_dir`.
    pub fn open(store: Store, raft_dir: &Path) -> io::Result<LogStore> {
        let meta = RaftMeta::open(raft_dir)?;
        let index_dir = raft_dir.join("log_index");
        let open_index = || ConsumeQueue::open_dir(&index_dir, LOG_INDEX_UNITS_PER_FILE, store.recovered_from_crash());
        let index = match open_index() {
            // Derived from the CommitLog's records: damage that keeps it
            // from opening (a file cut short, say) costs a rebuild.
            Err(e @ raftmq_store::StoreError::Corrupt { .. }) => {
                // Kept beside it for the operator, as quarantine keeps files.
                let aside = raft_dir.join(format!(
                    "log_index.damaged.{}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                ));
                tracing::error!(error = %e, aside = %aside.display(), "the log index cannot be opened; rebuilding it from the commitlog");
                std::fs::rename(&index_dir, &aside)?;
                open_index().map_err(io_err)?
            }
            opened => opened.map_err(io_err)?,
        };
        let mut log = LogStore {
            inner: Arc::new(Inner {
                store,
                index,
                meta,
                write: Mutex::new(()),
                stopping: AtomicBool::new(false),
                delete_floor: std::sync::atomic::AtomicU64::new(0),
                lost_up_to: None,
            }),
        };
        if let Err(e) = log.reconcile_index() {
            // A block that fails its seal (after a power loss, one written
            // back before its seal was) is damage to data the CommitLog
            // holds: rebuilt, as below, not the whole store set aside.
            if !crate::quarantine::wraps_corrupt(&e) {
                return Err(e);
            }
            tracing::error!(error = %e, "the log index is damaged; rebuilding it from the commitlog");
            log.inner.index.truncate(log.inner.index.min_offset()).map_err(io_err)?;
            log.reconcile_index()?;
        }
        if let Err(why) = log.check_index() {
            tracing::error!(%why, "the log index is damaged; rebuilding it from the commitlog");
            log.inner.index.truncate(log.inner.index.min_offset()).map_err(io_err)?;
            log.reconcile_index()?;
            log.check_index()
                .map_err(|why| invalid(format!("the rebuilt log index is still wrong: {why}")))?;
        }
        let committed = log.inner.meta.committed().map(|c| c.index);
        let last = log.last_log_id()?.map(|l| l.index);
        if let Some(c) = committed.filter(|&c| last.is_none_or(|l| l < c)) {
            tracing::error!(
                committed = c,
                last = ?last,
                "the log ends before the index it had committed: entries were lost to damage. \
                 This node catches up from the leader and neither votes nor campaigns until it has them again"
            );
            Arc::get_mut(&mut log.inner).expect("not shared yet").lost_up_to = Some(c);
        }
        Ok(log)
    }

    /// The committed index this node had before damage cut its log short,
    /// if that happened: until its log holds that index again, its vote
    /// could elect a leader that lacks entries this node helped commit, so
    /// it must not vote or campaign (see `RaftNode::start`).
    pub fn lost_up_to(&self) -> Option<u64> {
        self.inner.lost_up_to
    }

    /// Checks the log index's units against each other and against the
    /// records at its ends: each record starts where the one before ended
    /// (or at the start of the next segment), terms never decrease, and the
    /// first and last units name the records they point at. A unit that
    /// damage changed fails one of these, and then the whole index is
    /// rebuilt from the CommitLog (which is CRC-checked).
    fn check_index(&self) -> Result<(), String> {
        let (first, end) = self.bounds();
        if first >= end {
            return Ok(());
        }
        let segment = self.inner.store.commitlog().config().segment_size;
        let unit = |i: u64| self.inner.index.get(i).map_err(|e| format!("unit {i}: {e}"));
        if first > self.after_purge() {
            self.check_nothing_before(first, unit(first)?.phys)?;
        }
        let mut prev = unit(first)?;
        for i in first + 1..end {
            let u = unit(i)?;
            let after = prev.phys + u64::from(prev.size);
            let next_segment = (prev.phys / segment + 1) * segment;
            if (u.phys != after && u.phys != next_segment) || u.tag_hash < prev.tag_hash || u.size == 0 {
                return Err(format!(
                    "unit {i} (offset {}, {} bytes, term {}) does not follow unit {} (offset {}, {} bytes, term {})",
                    u.phys,
                    u.size,
                    u.tag_hash,
                    i - 1,
                    prev.phys,
                    prev.size,
                    prev.tag_hash
                ));
            }
            prev = u;
        }
        for i in [first, end - 1] {
            let u = unit(i)?;
            let r = self
                .inner
                .store
                .commitlog()
                .read(u.phys)
                .map_err(|e| format!("unit {i}: {e}"))?;
            if r.meta().index != i || r.meta().term != u.tag_hash || r.encoded().len() != u.size as usize {
                return Err(format!(
                    "unit {i} points at the record of entry {} (term {}, {} bytes)",
                    r.meta().index,
                    r.meta().term,
                    r.encoded().len()
                ));
            }
        }
        Ok(())
    }

    /// An index that starts above the purged entries (at `first`, whose
    /// record is at `phys`) must have no unpurged record before it in the
    /// CommitLog: one whose first file went missing opens further on, and
    /// the entries in between would read as absent. Reads the log's head up
    /// to `phys`, purged records retention still keeps included; only at
    /// open, and only when the index starts late, which a healthy log's
    /// never does.
    fn check_nothing_before(&self, first: u64, phys: u64) -> Result<(), String> {
        let (log, after_purge) = (self.inner.store.commitlog(), self.after_purge());
        for record in log.iter_from(log.min_offset()) {
            let record = record.map_err(|e| format!("the log before entry {first}: {e}"))?;
            if record.offset() >= phys {
                break;
            }
            let i = record.meta().index;
            if i >= after_purge {
                return Err(format!(
                    "the index starts at entry {first}, but the commitlog holds entry {i} before it (at offset {})",
                    record.offset()
                ));
            }
        }
        Ok(())
    }

    /// Makes the log index agree with the CommitLog: drops units past the
    /// log's end or below its start, and indexes records it has not seen.
    fn reconcile_index(&self) -> io::Result<()> {
        let (log, index) = (self.inner.store.commitlog(), &self.inner.index);
        // A purge of the whole log resets the index to the first entry
        // after it, deleting the old files newest first; a crash part-way
        // leaves some of them, ending at or below that entry. Appends must
        // go on from it, not from their end.
        let after_purge = self.after_purge();
        if index.min_offset() < index.max_offset() && index.max_offset() <= after_purge {
            tracing::warn!(
                index_end = index.max_offset(),
                after_purge,
                "the log index ends in the purged entries: starting it again after them"
            );
            index.reset(after_purge).map_err(io_err)?;
        }
        index.truncate_phys(log.max_offset()).map_err(io_err)?;
        index.purge_below_phys(log.min_offset()).map_err(io_err)?;
        let from = match index.max_offset().checked_sub(1).filter(|&q| q >= index.min_offset()) {
            Some(q) => {
                let u = index.get(q).map_err(io_err)?;
                u.phys + u64::from(u.size)
            }
            None => log.min_offset(),
        };
        let purged = self.inner.meta.purged().map(|p| p.index);
        let mut added = 0u64;
        for record in log.iter_from(from) {
            let record = record.map_err(io_err)?;
            let i = record.meta().index;
            if purged.is_some_and(|p| i <= p) {
                continue;
            }
            self.index_record(&record)?;
            added += 1;
        }
        if added > 0 {
            tracing::info!(added, "log index caught up with the commitlog");
        }
        Ok(())
    }

    /// Adds one record to the log index, which must continue densely.
    fn index_record(&self, record: &RecordRef) -> io::Result<()> {
        let index = &self.inner.index;
        let i = record.meta().index;
        if index.max_offset() != i {
            if index.min_offset() == index.max_offset() {
                index.reset(i).map_err(io_err)?;
            } else {
                return Err(invalid(format!(
                    "log index expects entry {} next, the log has {i} at offset {}",
                    index.max_offset(),
                    record.offset()
                )));
            }
        }
        index
            .append(CqUnit {
                phys: record.offset(),
                size: record.encoded().len() as u32,
                tag_hash: record.meta().term,
            })
            .map_err(io_err)?;
        Ok(())
    }

    /// The log's write lock (see `Inner::write`).
    fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Position and length of entry `index`'s record, and its term.
    pub fn locate(&self, index: u64) -> io::Result<CqUnit> {
        self.inner.index.get(index).map_err(io_err)
    }

    /// First index after the purged prefix, and one past the last entry.
    pub fn bounds(&self) -> (u64, u64) {
        let index = &self.inner.index;
        (index.min_offset().max(self.after_purge()), index.max_offset())
    }

    /// The first index not purged.
    fn after_purge(&self) -> u64 {
        self.inner.meta.purged().map_or(0, |p| p.index + 1)
    }

    /// The command of entry `index` (none for blank and membership
    /// entries).
    pub fn command_at(&self, index: u64) -> io::Result<Option<Command>> {
        Ok(match self.read_entry(index)?.payload {
            openraft::EntryPayload::Normal(cmd) => Some(cmd),
            _ => None,
        })
    }

    /// A held message ([`crate::held`]) read back from its entry, with the
    /// time it was stored.
    pub fn read_held(&self, id: HeldId) -> io::Result<(Message, u64)> {
        self.with_messages(id.index, |messages| {
            messages
                .nth(id.ordinal as usize)
                .map(|v| (v.to_message(), v.store_timestamp_ms))
                .ok_or_else(|| absent(format!("entry {} has no message {}", id.index, id.ordinal)))
        })
    }

    /// Every message of entry `index` (held or not, by ordinal), with their
    /// store times: one decode for all the held messages of an entry.
    pub fn messages_at(&self, index: u64) -> io::Result<Vec<(Message, u64)>> {
        self.with_messages(index, |messages| {
            Ok(messages.map(|v| (v.to_message(), v.store_timestamp_ms)).collect())
        })
    }

    /// Runs `f` over the messages of entry `index`, across its batches.
    fn with_messages<R>(
        &self,
        index: u64,
        f: impl FnOnce(&mut dyn Iterator<Item = &MessageView<'_>>) -> io::Result<R>,
    ) -> io::Result<R> {
        let cmd = self
            .command_at(index)?
            .ok_or_else(|| absent(format!("entry {index} holds no messages")))?;
        let batches = match cmd.decode().map_err(|e| invalid(e.to_string()))? {
            Decoded::Send(b) | Decoded::GuardedSend(_, b) => b,
            Decoded::Admin(_) => return Err(absent(format!("entry {index} holds no messages"))),
        };
        f(&mut batches.iter().flat_map(|b| b.messages.iter()).map(|(_, _, v)| v))
    }

    fn read_entry(&self, i: u64) -> io::Result<Entry> {
        let unit = self.locate(i)?;
        let record = self.inner.store.commitlog().read(unit.phys).map_err(io_err)?;
        let meta = record.meta();
        if meta.index != i {
            return Err(invalid(format!(
                "log index points entry {i} at a record of entry {}",
                meta.index
            )));
        }
        entry::from_parts(meta.term, meta.index, meta.kind, Bytes::from_owner(Payload(record)))
    }

    fn last_log_id(&self) -> io::Result<Option<LogId>> {
        let (first, end) = self.bounds();
        if end > first {
            let unit = self.locate(end - 1)?;
            Ok(Some(log_id(unit.tag_hash, end - 1)))
        } else {
            Ok(self.inner.meta.purged())
        }
    }

    /// Replaces the log for a snapshot: the store restarts empty at
    /// `next_phys` with the given queue positions, and the log continues
    /// after `last`. Under the write lock, so no append can land in between.
    /// Safe to repeat (a crash half-way is finished at the next open).
    pub(crate) fn reset_for_snapshot(
        &self,
        last: LogId,
        next_phys: u64,
        queues: &[(String, u32, u64)],
    ) -> io::Result<()> {
        let _w = self.write_lock();
        self.inner.store.reset(next_phys, queues).map_err(io_err)?;
        self.inner.meta.save_purged(last)?;
        self.inner.index.reset(last.index + 1).map_err(io_err)
    }

    /// Lets the next purges delete whole segments below `phys` (retention).
    pub fn allow_deletion_below(&self, phys: u64) {
        self.inner
            .delete_floor
            .fetch_max(phys, std::sync::atomic::Ordering::AcqRel);
    }

    /// Writes the latest committed log id and msyncs the log index (at
    /// shutdown).
    pub fn flush_meta(&self) -> io::Result<()> {
        self.inner.index.flush().map_err(io_err)?;
        self.inner.meta.flush_committed()
    }

    /// The last entry whose record ends at or before physical offset
    /// `phys` (records are in index order, so a binary search).
    pub fn last_entry_ending_by(&self, phys: u64) -> io::Result<Option<LogId>> {
        let (first, end) = self.bounds();
        let (mut lo, mut hi) = (first, end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let u = self.locate(mid)?;
            if u.phys + u64::from(u.size) <= phys {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == first {
            return Ok(None);
        }
        let u = self.locate(lo - 1)?;
        Ok(Some(log_id(u.tag_hash, lo - 1)))
    }

    /// The last entry whose record lies wholly below the store's dispatch
    /// mark. It was applied, hence committed.
    fn dispatched_log_id(&self) -> io::Result<Option<LogId>> {
        self.last_entry_ending_by(self.inner.store.dispatched_offset())
    }

    /// Writes entries (as their records `parts`) into the CommitLog and the log
    /// index, going on from `progress` when an earlier try ran out of space
    /// half-way: the records are appended once, then the index units still
    /// missing. Returns the log's end after them.
    fn append_step(&self, parts: &[(RecordMeta, Bytes)], progress: &mut AppendProgress) -> io::Result<u64> {
        let _w = self.write_lock();
        let index = &self.inner.index;
        let appended = match &progress.appended {
            Some(a) => {
                // Nothing else writes the log while openraft waits on this
                // append; if it moved anyway, going on would corrupt it.
                let first = parts.first().map_or(0, |(meta, _)| meta.index);
                let expected = first + progress.indexed as u64;
                if index.max_offset() != expected {
                    return Err(invalid(format!(
                        "the log index moved to {} while an append waited for disk space at {expected}",
                        index.max_offset()
                    )));
                }
                a
            }
            None => {
                let records: Vec<NewRecord<'_>> = parts
                    .iter()
                    .map(|(meta, payload)| NewRecord { meta: *meta, payload })
                    .collect();
                if let Some(first) = records.first() {
                    let next = index.max_offset();
                    if first.meta.index != next && index.min_offset() != index.max_offset() {
                        return Err(invalid(format!(
                            "append of entry {} leaves a hole: the log ends before {next}",
                            first.meta.index
                        )));
                    }
                    if records.windows(2).any(|w| w[1].meta.index != w[0].meta.index + 1) {
                        return Err(invalid("appended entries are not consecutive".into()));
                    }
                    // An empty log (fresh, or right after a snapshot install) starts
                    // wherever its first entry is.
                    if index.max_offset() != first.meta.index {
                        index.reset(first.meta.index).map_err(io_err)?;
                    }
                }
                progress
                    .appended
                    .insert(self.inner.store.commitlog().append(&records).map_err(io_err)?)
            }
        };
        for ((meta, payload), &phys) in parts.iter().zip(&appended.offsets).skip(progress.indexed) {
            index
                .append(CqUnit {
                    phys,
                    size: (raftmq_store::record::encoded_len(payload.len())) as u32,
                    tag_hash: meta.term,
                })
                .map_err(io_err)?;
            progress.indexed += 1;
        }
        Ok(appended.end)
    }

    /// Lets storage steps that wait for disk space give up (at shutdown).
    pub fn stop_waiting_for_room(&self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Set once storage steps waiting for disk space must give up.
    pub(crate) fn stopping(&self) -> &AtomicBool {
        &self.inner.stopping
    }

    fn truncate_now(&self, first: u64) -> io::Result<()> {
        let _w = self.write_lock();
        let index = &self.inner.index;
        let first = first.max(index.min_offset());
        if first >= index.max_offset() {
            return Ok(());
        }
        let unit = index.get(first).map_err(io_err)?;
        self.inner.store.truncate(unit.phys).map_err(io_err)?;
        index.truncate(first).map_err(io_err)
    }

    fn purge_now(&self, upto: LogId) -> io::Result<()> {
        let _w = self.write_lock();
        // Record the purge first: once it is durable the entries are gone
        // for openraft, whatever happens to the files.
        self.inner.meta.save_purged(upto)?;
        let index = &self.inner.index;
        let keep = upto.index + 1;
        let keep_phys = if keep < index.max_offset() {
            index.get(keep).map_err(io_err)?.phys
        } else {
            self.inner.store.commitlog().max_offset()
        };
        let floor = self.inner.delete_floor.load(std::sync::atomic::Ordering::Acquire);
        let min = self.inner.store.purge_before(keep_phys.min(floor)).map_err(io_err)?;
        if keep >= index.max_offset() {
            index.reset(keep).map_err(io_err)?;
        } else {
            index.purge_below_phys(min).map_err(io_err)?;
        }
        Ok(())
    }
}

fn range_start(range: &impl RangeBounds<u64>) -> u64 {
    match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    }
}

fn range_end(range: &impl RangeBounds<u64>) -> u64 {
    match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (first, end) = self.bounds();
        let (from, to) = (range_start(&range).max(first), range_end(&range).min(end));
        (from..to.max(from)).map(|i| self.read_entry(i)).collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.inner.meta.vote())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        Ok(LogState {
            last_purged_log_id: self.inner.meta.purged(),
            last_log_id: self.last_log_id()?,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let vote = *vote;
        until_room("vote", &self.inner.stopping, || {
            let this = self.clone();
            let saved = tokio::task::spawn_blocking(move || {
                // A vote must not become durable ahead of an append submitted
                // before it (see the module docs).
                let log = this.inner.store.commitlog();
                log.wait_durable(log.max_offset()).map_err(io_err)?;
                this.inner.meta.save_vote(&vote)
            });
            async move { saved.await.map_err(io::Error::other)? }
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.inner.meta.save_committed(committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        // The saved id may lag; everything below the dispatch mark was
        // applied, so it is committed too. Reporting it makes a restart
        // replay up to there (and never truncate below it).
        let committed = self.inner.meta.committed().max(self.dispatched_log_id()?);
        // A log cut short by damage has lost entries it had committed (see
        // `lost_up_to`): it reports only what it still has, and the leader
        // sends the rest.
        let last = self.last_log_id()?;
        if committed.is_some_and(|c| last.is_none_or(|l| l.index < c.index)) {
            return Ok(last);
        }
        Ok(committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let parts: Vec<_> = entries.iter().map(entry::to_record).collect();
        let mut progress = AppendProgress::default();
        let end = until_room("log append", &self.inner.stopping, || {
            std::future::ready(self.append_step(&parts, &mut progress))
        })
        .await?;
        self.inner
            .store
            .commitlog()
            .on_durable(end, Box::new(move |r| callback.io_completed(r.map_err(io_err))));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        // The checkpoint's temporary file may need room. (A segment copy
        // made for readers that fails poisons the log: no retry helps.)
        until_room("log truncate", &self.inner.stopping, || {
            let this = self.clone();
            let cut = tokio::task::spawn_blocking(move || this.truncate_now(last_log_id.map_or(0, |l| l.index + 1)));
            async move { cut.await.map_err(io::Error::other)? }
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        until_room("log purge", &self.inner.stopping, || {
            let this = self.clone();
            let purged = tokio::task::spawn_blocking(move || this.purge_now(log_id));
            async move { purged.await.map_err(io::Error::other)? }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_store::StoreConfig;

    fn blank(index: u64) -> (RecordMeta, Bytes) {
        entry::to_record(&Entry {
            log_id: log_id(1, index),
            payload: openraft::EntryPayload::Blank,
        })
    }

    /// The log index's files, oldest first.
    fn index_files(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir.join("raft/log_index"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    fn open(dir: &Path) -> LogStore {
        let store = Store::open(dir, &StoreConfig::small_for_tests()).unwrap();
        LogStore::open(store, &dir.join("raft")).unwrap()
    }

    #[test]
    fn an_index_that_lost_its_first_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let parts: Vec<_> = (1..=3 * LOG_INDEX_UNITS_PER_FILE).map(blank).collect();
        log.append_step(&parts, &mut AppendProgress::default()).unwrap();
        log.store().close().unwrap();
        drop(log);

        let files = index_files(dir.path());
        assert_eq!(files.len(), 3, "{files:?}");
        std::fs::remove_file(&files[0]).unwrap();

        let log = open(dir.path());
        assert_eq!(log.bounds(), (1, 3 * LOG_INDEX_UNITS_PER_FILE + 1));
        for i in 1..=3 * LOG_INDEX_UNITS_PER_FILE {
            let u = log.locate(i).unwrap();
            assert_eq!(log.store().commitlog().read(u.phys).unwrap().meta().index, i);
        }
        log.store().close().unwrap();
    }

    /// A block of the log index that fails its seal (a flipped bit, or a
    /// block written back before its seal at a power loss) costs a rebuild
    /// from the CommitLog, never the whole store.
    #[test]
    fn an_index_block_that_fails_its_seal_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let parts: Vec<_> = (1..=60).map(blank).collect();
        log.append_step(&parts, &mut AppendProgress::default()).unwrap();
        log.store().close().unwrap();
        drop(log);
        // Entry 1's unit (the first unit of the first block: read at open).
        let file = index_files(dir.path()).remove(0);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[3] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();

        let log = open(dir.path());
        assert_eq!(log.bounds(), (1, 61));
        for i in 1..=60 {
            let u = log.locate(i).unwrap();
            assert_eq!(log.store().commitlog().read(u.phys).unwrap().meta().index, i);
        }
        log.store().close().unwrap();
    }

    #[test]
    fn an_index_left_behind_by_a_purge_of_everything_starts_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let parts: Vec<_> = (1..=3 * LOG_INDEX_UNITS_PER_FILE).map(blank).collect();
        log.append_step(&parts, &mut AppendProgress::default()).unwrap();
        // The purge was recorded, and the index's reset deleted only its
        // newest file before the crash.
        let last = 3 * LOG_INDEX_UNITS_PER_FILE;
        log.inner.meta.save_purged(log_id(1, last)).unwrap();
        log.store().close().unwrap();
        drop(log);
        let files = index_files(dir.path());
        std::fs::remove_file(files.last().unwrap()).unwrap();

        let log = open(dir.path());
        assert_eq!(log.bounds(), (last + 1, last + 1));
        log.append_step(&[blank(last + 1)], &mut AppendProgress::default())
            .unwrap();
        assert_eq!(log.bounds(), (last + 1, last + 2));
        log.store().close().unwrap();
    }
}
