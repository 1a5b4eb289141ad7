//! The flusher thread and group commit.
//!
//! One background thread per CommitLog msyncs the range written since the
//! last flush. In async mode it runs every `flush_interval_ms` and on demand
//! ([`crate::CommitLog::flush`]); appends never wait for it. In sync mode it
//! runs whenever someone waits for durability: everyone who registered
//! before a round starts shares that round's msync, and whoever arrives
//! during it shares the next (group commit). The flusher also rewrites the
//! checkpoint, at most every `checkpoint_interval_ms`.
//!
//! `io` serializes msync with truncate, purge and reset, so the flushed mark
//! can never be raised past a cut made while an msync was in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::commitlog::Inner;
use crate::config::FlushMode;
use crate::error::{Result, StoreError};

/// Told once the data below the offset it was registered for is durable.
pub type DurableCallback = Box<dyn FnOnce(Result<()>) + Send>;

struct State {
    waiters: Vec<(u64, DurableCallback)>,
    shutdown: bool,
}

pub(crate) struct FlushShared {
    state: Mutex<State>,
    wake: Condvar,
    io: Mutex<()>,
    flushed: AtomicU64,
    rounds: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FlushShared {
    pub fn new(flushed: u64) -> FlushShared {
        FlushShared {
            state: Mutex::new(State {
                waiters: Vec::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            io: Mutex::new(()),
            flushed: AtomicU64::new(flushed),
            rounds: AtomicU64::new(0),
            thread: Mutex::new(None),
        }
    }

    pub fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    pub fn flush_count(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    pub fn io_lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.io)
    }

    pub fn on_durable(&self, mode: FlushMode, end: u64, cb: DurableCallback) {
        match mode {
            FlushMode::Async => cb(Ok(())),
            FlushMode::Sync => self.request(end, cb),
        }
    }

    /// Registers `cb` for when everything below `end` is msynced and wakes
    /// the flusher.
    pub fn request(&self, end: u64, cb: DurableCallback) {
        let mut st = lock(&self.state);
        if st.shutdown {
            drop(st);
            return cb(Err(StoreError::Closed));
        }
        if end <= self.flushed() {
            drop(st);
            return cb(Ok(()));
        }
        st.waiters.push((end, cb));
        drop(st);
        self.wake.notify_one();
    }

    /// After a truncate or reset to `offset` (with `io` held and everything
    /// kept below `offset` already msynced): nothing is left to wait for.
    pub fn truncated(&self, offset: u64) {
        self.flushed.store(offset, Ordering::Release);
        let done = std::mem::take(&mut lock(&self.state).waiters);
        for (_, cb) in done {
            cb(Ok(()));
        }
    }

    fn complete(&self, upto: u64, result: &Result<()>) {
        let done: Vec<_> = {
            let mut st = lock(&self.state);
            let (done, keep) = std::mem::take(&mut st.waiters)
                .into_iter()
                .partition(|(end, _)| *end <= upto);
            st.waiters = keep;
            done
        };
        for (_, cb) in done {
            cb(match result {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::Io {
                    path: Default::default(),
                    source: std::io::Error::other(e.to_string()),
                }),
            });
        }
    }

    /// Stops the flusher; waiters still pending get [`StoreError::Closed`].
    pub fn shutdown(&self) {
        let pending = {
            let mut st = lock(&self.state);
            st.shutdown = true;
            std::mem::take(&mut st.waiters)
        };
        self.wake.notify_all();
        for (_, cb) in pending {
            cb(Err(StoreError::Closed));
        }
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// Msyncs `[flushed, target)` with `io` held by the caller, and advances the
/// flushed mark (never past `target`).
pub(crate) fn flush_to_locked(inner: &Inner, target: u64) -> Result<()> {
    let shared = &inner.flush;
    let from = shared.flushed();
    if target <= from {
        return Ok(());
    }
    let segs: Vec<_> = inner
        .segs()
        .iter()
        .filter(|s| s.end() > from && s.start < target)
        .cloned()
        .collect();
    let mut result = Ok(());
    for s in &segs {
        let a = from.max(s.start) - s.start;
        let b = target.min(s.end()) - s.start;
        if let Err(e) = s.file.flush(a, b - a) {
            result = Err(e);
            break;
        }
    }
    shared.rounds.fetch_add(1, Ordering::Relaxed);
    if result.is_ok() {
        shared.flushed.store(target, Ordering::Release);
    }
    shared.complete(if result.is_ok() { target } else { u64::MAX }, &result);
    result
}

/// One flush of everything written so far.
pub(crate) fn flush_once(inner: &Inner) -> Result<()> {
    let _io = inner.flush.io_lock();
    let target = inner.written.load(Ordering::Acquire);
    flush_to_locked(inner, target)
}

pub(crate) fn spawn_flusher(inner: &Arc<Inner>) -> Result<()> {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let shared = inner.flush.clone();
    let mode = inner.cfg.flush_mode;
    let interval = inner.cfg.flush_interval();
    let checkpoint_every = inner.cfg.checkpoint_interval();
    let handle = std::thread::Builder::new()
        .name("raftmq-flush".into())
        .spawn(move || run(weak, shared, mode, interval, checkpoint_every))
        .map_err(|source| StoreError::Io {
            path: inner.dir.clone(),
            source,
        })?;
    *lock(&inner.flush.thread) = Some(handle);
    Ok(())
}

fn run(weak: Weak<Inner>, shared: Arc<FlushShared>, mode: FlushMode, interval: Duration, checkpoint_every: Duration) {
    let mut last_checkpoint = Instant::now();
    loop {
        {
            let deadline = Instant::now() + interval;
            let mut st = lock(&shared.state);
            loop {
                if st.shutdown {
                    return;
                }
                if !st.waiters.is_empty() {
                    break;
                }
                let now = Instant::now();
                if mode == FlushMode::Async && now >= deadline {
                    break;
                }
                // Sync mode also wakes periodically, to write the checkpoint.
                let wait = if mode == FlushMode::Async {
                    deadline - now
                } else {
                    checkpoint_every
                };
                st = shared.wake.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
                if mode == FlushMode::Sync && st.waiters.is_empty() {
                    break;
                }
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        let _io = inner.flush.io_lock();
        let target = inner.written.load(Ordering::Acquire);
        if let Err(e) = flush_to_locked(&inner, target) {
            tracing::error!(error = %e, "commitlog flush failed; will retry");
            drop(_io);
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if last_checkpoint.elapsed() >= checkpoint_every {
            let flushed = inner.flush.flushed();
            if inner.checkpoint.get().flushed < flushed {
                if let Err(e) = inner.checkpoint.update(|c| c.flushed = flushed) {
                    tracing::error!(error = %e, "checkpoint write failed");
                }
            }
            last_checkpoint = Instant::now();
        }
    }
}
