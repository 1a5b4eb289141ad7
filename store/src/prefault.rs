//! Files and pages made ready ahead of their writers, off the write path.
//!
//! The first store to a page of a freshly preallocated mapped file costs a
//! page fault in which the kernel allocates and zeroes a page-cache page;
//! creating and preallocating a 1 GiB segment costs milliseconds. At broker
//! rates both were on the append path, under the writer lock. One
//! process-wide thread (`raftmq-prefault`) takes them instead, as RocketMQ's
//! AllocateMappedFileService and warm-up do:
//!
//! - [`create_ahead`] creates the CommitLog's next segment in the
//!   background, so a roll is a rename. Its pages are not faulted in: the
//!   CommitLog writes through the file (`MappedFile::write_through`), which
//!   fills page-cache pages without zeroing them first, so zero pages made
//!   ahead would be work thrown away;
//! - the index files (ConsumeQueues, key index), written through their
//!   maps a few dozen bytes a message, report how far they have written
//!   ([`wrote_to`]); once a writer comes within half a [`WINDOW`] of what
//!   was faulted in, the thread faults in the next stretch, so the pages
//!   `[written, written + WINDOW)` are normally resident and writable
//!   before the writer gets there.
//!
//! Faulting in uses `madvise(MADV_POPULATE_WRITE)` (Linux 5.14 on): it maps
//! the pages writable without touching their bytes, so it is safe beside a
//! writer and beside readers of the same file. Where the kernel lacks it,
//! `MADV_WILLNEED` brings the pages into the page cache instead (the write
//! then takes a cheap minor fault, with no zeroing). Touching the bytes by
//! hand would race the writer, so it is not used on live files.
//!
//! Nothing here is needed for correctness: a request that does not fit the
//! queue ([`QUEUE`]) is dropped, and the writer then creates its file or
//! faults its pages in itself. Jobs hold their file weakly, so a file
//! deleted meanwhile is not kept alive (or faulted in) for them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::locks::lock;
use crate::mapped_file::{MapOptions, MappedFile};

/// How far ahead of its writer an index file is kept faulted in. One is
/// written per queue, a few dozen bytes a message, so a small lead
/// suffices, and a broker with thousands of queues does not hold gigabytes
/// of zero pages for them.
pub(crate) const WINDOW: u64 = 256 << 10;
/// Most requests waiting for the thread. Requests come at most once per
/// half window per file, so this is only reached when the thread is starved;
/// then dropping requests (the writer faults its own pages) is right.
const QUEUE: usize = 256;
/// Largest range faulted in by one call, so one big request does not delay
/// the next file's.
const CHUNK: u64 = 4 << 20;
const PAGE: u64 = 4096;

/// Something that owns a mapped file (a CommitLog segment, a ConsumeQueue or
/// key-index file), so a job can hold it weakly.
pub(crate) trait Mapped: Send + Sync + 'static {
    fn mapped(&self) -> &MappedFile;
}

impl Mapped for MappedFile {
    fn mapped(&self) -> &MappedFile {
        self
    }
}

/// A file created in the background by [`create_ahead`].
#[derive(Debug)]
pub(crate) enum Spare {
    /// The thread has not got to it yet.
    Pending,
    Ready(MappedFile),
    /// Creating it failed (the writer creates the file itself, and reports
    /// the error if it fails again).
    Failed,
    /// The writer no longer wants it: whoever sees this removes the file.
    Abandoned,
}

pub(crate) type SpareSlot = Arc<Mutex<Spare>>;

enum Job {
    Populate {
        file: Weak<dyn Mapped>,
        from: u64,
        to: u64,
    },
    Create {
        path: PathBuf,
        len: u64,
        opts: MapOptions,
        slot: SpareSlot,
    },
}

/// The writer of `owner`'s file has written up to `pos`: keep the
/// [`WINDOW`] ahead of it faulted in. Cheap when there is nothing to do
/// (one atomic load); must be called by the file's single writer.
pub(crate) fn wrote_to<M: Mapped>(owner: &Arc<M>, pos: u64) {
    let file = owner.mapped();
    let len = file.len();
    let ahead = &file.faulted_to();
    let faulted = ahead.load(Ordering::Relaxed);
    if faulted >= len || pos.saturating_add(WINDOW / 2) <= faulted {
        return;
    }
    let from = faulted.max(pos);
    let to = pos.saturating_add(WINDOW).min(len);
    ahead.store(to, Ordering::Relaxed);
    let weak: Weak<M> = Arc::downgrade(owner);
    submit(Job::Populate { file: weak, from, to });
}

/// Faults in `[from, to)` of `owner`'s file in the background (used for
/// regions written at random, such as the key index's hash slots).
pub(crate) fn populate<M: Mapped>(owner: &Arc<M>, from: u64, to: u64) {
    let weak: Weak<M> = Arc::downgrade(owner);
    submit(Job::Populate { file: weak, from, to });
}

/// Creates `path` (`len` bytes, preallocated, mapped) in the background;
/// the result lands in the returned slot.
pub(crate) fn create_ahead(path: PathBuf, len: u64, opts: MapOptions) -> SpareSlot {
    let slot = Arc::new(Mutex::new(Spare::Pending));
    submit(Job::Create {
        path,
        len,
        opts,
        slot: slot.clone(),
    });
    slot
}

/// Takes a spare's file if it is ready; otherwise marks it abandoned (a job
/// still running removes its file when it finishes). Returns `None` when
/// the caller must create the file itself.
pub(crate) fn take_spare(slot: &SpareSlot) -> Option<MappedFile> {
    let mut s = lock(slot);
    match std::mem::replace(&mut *s, Spare::Abandoned) {
        Spare::Ready(f) => Some(f),
        Spare::Pending | Spare::Abandoned | Spare::Failed => None,
    }
}

/// Gives up a spare that will not be used, removing its file.
pub(crate) fn abandon_spare(slot: &SpareSlot) {
    if let Some(f) = take_spare(slot) {
        remove(f);
    }
}

fn remove(f: MappedFile) {
    let path = f.path().to_path_buf();
    drop(f);
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(path = %path.display(), error = %e, "could not remove an unused spare file");
    }
}

fn submit(job: Job) {
    let Some(tx) = sender() else { return };
    match tx.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(job)) => {
            tracing::debug!("prefault queue full; the writer faults its own pages");
            if let Job::Create { slot, .. } = job {
                *lock(&slot) = Spare::Failed;
            }
        }
        Err(TrySendError::Disconnected(_)) => {}
    }
}

/// The thread's queue, started on first use. `None` if the thread could not
/// be started (then writers fault their own pages, as without this module).
fn sender() -> Option<&'static SyncSender<Job>> {
    static TX: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE);
        match std::thread::Builder::new()
            .name("raftmq-prefault".into())
            .spawn(move || run(rx))
        {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "could not start the prefault thread; writers fault their own pages");
                None
            }
        }
    })
    .as_ref()
}

fn run(rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        match job {
            Job::Populate { file, from, to } => {
                let mut pos = from - from % PAGE;
                while pos < to {
                    // Re-upgraded per chunk: a file deleted meanwhile is let go.
                    let Some(owner) = file.upgrade() else { break };
                    let end = (pos + CHUNK).min(to);
                    fault_in(owner.mapped(), pos, end);
                    pos = end;
                }
            }
            Job::Create { path, len, opts, slot } => {
                if matches!(*lock(&slot), Spare::Abandoned) {
                    continue;
                }
                let created = MappedFile::create(&path, len, opts);
                let mut s = lock(&slot);
                match (created, &*s) {
                    (Ok(f), Spare::Abandoned) => {
                        drop(s);
                        remove(f);
                    }
                    (Ok(f), _) => *s = Spare::Ready(f),
                    (Err(e), Spare::Abandoned) => {
                        tracing::debug!(path = %path.display(), error = %e, "abandoned spare file failed");
                    }
                    (Err(e), _) => {
                        tracing::warn!(path = %path.display(), error = %e, "could not create a file ahead; the writer will try itself");
                        *s = Spare::Failed;
                    }
                }
            }
        }
    }
}

/// Whether `MADV_POPULATE_WRITE` was refused once (an older kernel).
static NO_POPULATE_WRITE: AtomicBool = AtomicBool::new(false);

/// Faults in `[from, to)` of `file` without changing a byte of it.
fn fault_in(file: &MappedFile, from: u64, to: u64) {
    if to <= from {
        return;
    }
    if !NO_POPULATE_WRITE.load(Ordering::Relaxed) {
        match file.advise(memmap2::Advice::PopulateWrite, from, to - from) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!("MADV_POPULATE_WRITE unsupported by this kernel; using MADV_WILLNEED");
                NO_POPULATE_WRITE.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                // EFAULT/ENOMEM: the range could not be backed (no memory,
                // a hole the file system refuses); the writer will see it.
                tracing::debug!(path = %file.path().display(), error = %e, "prefault failed");
                return;
            }
        }
    }
    let _ = file.advise(memmap2::Advice::WillNeed, from, to - from);
}

/// Results of [`create_ahead`] for tests: waits until the slot is no longer
/// pending.
#[cfg(test)]
pub(crate) fn wait_spare(slot: &SpareSlot) {
    for _ in 0..1000 {
        if !matches!(*lock(slot), Spare::Pending) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("spare file not created within 5 s");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_pages(f: &MappedFile) -> usize {
        f.resident_pages().unwrap()
    }

    #[test]
    fn a_spare_is_created_in_the_background_and_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spare");
        let slot = create_ahead(path.clone(), 1 << 20, MapOptions::default());
        wait_spare(&slot);
        let f = take_spare(&slot).expect("spare ready");
        assert!(path.exists());
        assert_eq!(f.len(), 1 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
        assert!(take_spare(&slot).is_none(), "a spare is taken once");
    }

    #[test]
    fn an_abandoned_spare_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spare");
        let slot = create_ahead(path.clone(), 1 << 20, MapOptions::default());
        wait_spare(&slot);
        abandon_spare(&slot);
        assert!(!path.exists());
    }

    #[test]
    fn writing_keeps_the_window_ahead_resident() {
        let dir = tempfile::tempdir().unwrap();
        // Large beside the window: the kernel may read around what was
        // faulted in (up to a few MiB with large folios).
        let f = Arc::new(MappedFile::create(&dir.path().join("f"), 256 * WINDOW, MapOptions::default()).unwrap());
        assert_eq!(resident_pages(&f), 0);
        wrote_to(&f, 0);
        // The request is asynchronous: wait for the thread to get to it.
        for _ in 0..1000 {
            if resident_pages(&f) as u64 >= WINDOW / PAGE {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(resident_pages(&f) as u64 >= WINDOW / PAGE);
        assert!(
            (resident_pages(&f) as u64) < 64 * WINDOW / PAGE,
            "only the window is faulted in, not the whole file"
        );
        // Content is untouched.
        assert_eq!(unsafe { f.nonzero_end(0).unwrap() }, 0);
    }
}
