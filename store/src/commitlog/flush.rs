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

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Segment;
use crate::checkpoint::CheckpointFile;
use crate::config::FlushMode;
use crate::error::{Result, StoreError};
use crate::locks::lock;

/// What the flusher needs of a log: its flush state, the segments over a
/// range, how far it is written, and its checkpoint. The CommitLog's shared
/// state implements it, so the flusher never reaches into the log's types.
pub(crate) trait FlushTarget: Send + Sync + 'static {
    fn flush_state(&self) -> &Arc<FlushShared>;
    /// The segments overlapping `[from, to)`.
    fn segments_in(&self, from: u64, to: u64) -> Vec<Arc<Segment>>;
    /// End of the last complete record.
    fn written(&self) -> u64;
    fn checkpoint(&self) -> &CheckpointFile;
}

/// Told once the data below the offset it was registered for is durable.
pub type DurableCallback = Box<dyn FnOnce(Result<()>) + Send>;

struct State {
    /// Callbacks waiting for the flushed mark to reach their offset.
    waiters: Vec<(u64, DurableCallback)>,
    /// Threads blocked in [`FlushShared::wait`], and the highest offset one
    /// of them waits for. They share one condvar, woken once per round.
    blocked: usize,
    blocked_end: u64,
    /// Bumped by every failed round and every truncate, so that blocked
    /// threads can tell their wait is over without being satisfied.
    failures: u64,
    last_error: String,
    truncations: u64,
    /// The flusher is parked on `wake` (otherwise nobody needs to wake it).
    idle: bool,
    shutdown: bool,
    /// Set after a failure the log cannot recover from in this process (see
    /// [`StoreError::Poisoned`]).
    poisoned: Option<String>,
}

impl State {
    fn has_work(&self, flushed: u64) -> bool {
        !self.waiters.is_empty() || self.blocked_end > flushed
    }
}

pub(crate) struct FlushShared {
    state: Mutex<State>,
    /// Wakes the flusher.
    wake: Condvar,
    /// Wakes threads blocked in `wait`.
    durable: Condvar,
    io: Mutex<()>,
    flushed: AtomicU64,
    rounds: AtomicU64,
    latency: FlushLatency,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Callbacks whose round is over, run by [`FlushShared::fire_ready`]
    /// once no store lock is held (a callback may append again).
    ready: Mutex<Vec<(DurableCallback, Result<()>)>>,
}

impl FlushShared {
    pub fn new(flushed: u64) -> FlushShared {
        FlushShared {
            state: Mutex::new(State {
                waiters: Vec::new(),
                blocked: 0,
                blocked_end: 0,
                failures: 0,
                last_error: String::new(),
                truncations: 0,
                idle: false,
                shutdown: false,
                poisoned: None,
            }),
            wake: Condvar::new(),
            durable: Condvar::new(),
            io: Mutex::new(()),
            flushed: AtomicU64::new(flushed),
            rounds: AtomicU64::new(0),
            latency: FlushLatency::default(),
            thread: Mutex::new(None),
            ready: Mutex::new(Vec::new()),
        }
    }

    pub fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    pub fn flush_count(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    pub fn latency(&self) -> &FlushLatency {
        &self.latency
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

    /// Marks the log failed: every waiter, now and later, gets
    /// [`StoreError::Poisoned`], and appends are refused.
    pub fn poison(&self, reason: String) {
        let pending = {
            let mut st = lock(&self.state);
            st.poisoned.get_or_insert(reason);
            self.durable.notify_all();
            std::mem::take(&mut st.waiters)
        };
        let err = self.check_poisoned().err();
        let mut ready = lock(&self.ready);
        for (_, cb) in pending {
            let reason = match &err {
                Some(StoreError::Poisoned { reason }) => reason.clone(),
                _ => String::new(),
            };
            ready.push((cb, Err(StoreError::Poisoned { reason })));
        }
    }

    pub fn check_poisoned(&self) -> Result<()> {
        match &lock(&self.state).poisoned {
            Some(reason) => Err(StoreError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Registers `cb` for when everything below `end` is msynced and wakes
    /// the flusher if it sleeps.
    pub fn request(&self, end: u64, cb: DurableCallback) {
        let mut st = lock(&self.state);
        if st.shutdown {
            drop(st);
            return cb(Err(StoreError::Closed));
        }
        if let Some(reason) = &st.poisoned {
            let reason = reason.clone();
            drop(st);
            return cb(Err(StoreError::Poisoned { reason }));
        }
        if end <= self.flushed() {
            drop(st);
            return cb(Ok(()));
        }
        st.waiters.push((end, cb));
        if st.idle {
            self.wake.notify_one();
        }
    }

    /// Blocks until everything below `end` is msynced (cheaper than a
    /// callback for a blocked thread: one shared condvar, one wake-up per
    /// round for all of them).
    pub fn wait(&self, end: u64) -> Result<()> {
        let mut st = lock(&self.state);
        let (failures, truncations) = (st.failures, st.truncations);
        loop {
            if self.flushed() >= end || st.truncations != truncations {
                return Ok(());
            }
            if st.shutdown {
                return Err(StoreError::Closed);
            }
            if let Some(reason) = &st.poisoned {
                return Err(StoreError::Poisoned { reason: reason.clone() });
            }
            if st.failures != failures {
                return Err(StoreError::Io {
                    path: Default::default(),
                    source: std::io::Error::other(st.last_error.clone()),
                });
            }
            st.blocked += 1;
            st.blocked_end = st.blocked_end.max(end);
            if st.idle {
                self.wake.notify_one();
            }
            st = self.durable.wait(st).unwrap_or_else(|e| e.into_inner());
            st.blocked -= 1;
        }
    }

    /// After a truncate or reset to `offset` (with `io` held and everything
    /// kept below `offset` already msynced): nothing is left to wait for.
    pub fn truncated(&self, offset: u64) {
        self.flushed.store(offset, Ordering::Release);
        let done = {
            let mut st = lock(&self.state);
            st.truncations += 1;
            st.blocked_end = 0;
            self.durable.notify_all();
            std::mem::take(&mut st.waiters)
        };
        lock(&self.ready).extend(done.into_iter().map(|(_, cb)| (cb, Ok(()))));
    }

    /// Runs the callbacks of finished rounds. Called with no store lock held.
    pub fn fire_ready(&self) {
        let ready = std::mem::take(&mut *lock(&self.ready));
        for (cb, result) in ready {
            cb(result);
        }
    }

    /// Ends a flush round that reached `upto` (or failed).
    fn complete(&self, upto: u64, result: &Result<()>) {
        let done: Vec<_> = {
            let mut st = lock(&self.state);
            if let Err(e) = result {
                st.failures += 1;
                st.last_error = e.to_string();
            }
            if st.blocked > 0 {
                self.durable.notify_all();
            }
            if st.blocked_end <= upto {
                st.blocked_end = 0;
            }
            let (done, keep) = std::mem::take(&mut st.waiters)
                .into_iter()
                .partition(|(end, _)| *end <= upto || result.is_err());
            st.waiters = keep;
            done
        };
        let mut ready = lock(&self.ready);
        for (_, cb) in done {
            let r = match result {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::Io {
                    path: Default::default(),
                    source: std::io::Error::other(e.to_string()),
                }),
            };
            ready.push((cb, r));
        }
    }

    /// Stops the flusher; waiters still pending get [`StoreError::Closed`].
    pub fn shutdown(&self) {
        let pending = {
            let mut st = lock(&self.state);
            st.shutdown = true;
            self.durable.notify_all();
            std::mem::take(&mut st.waiters)
        };
        self.wake.notify_all();
        for (_, cb) in pending {
            cb(Err(StoreError::Closed));
        }
        let handle = lock(&self.thread).take();
        if let Some(h) = handle
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

/// Msyncs `[flushed, target)` with `io` held by the caller, and advances the
/// flushed mark (never past `target`).
pub(crate) fn flush_to_locked(log: &impl FlushTarget, target: u64) -> Result<()> {
    let shared = log.flush_state();
    let from = shared.flushed();
    if target <= from {
        return Ok(());
    }
    let segs = log.segments_in(from, target);
    let mut result = Ok(());
    let started = Instant::now();
    for s in &segs {
        let a = from.max(s.start) - s.start;
        let b = target.min(s.end()) - s.start;
        if let Err(e) = s.file.flush(a, b - a) {
            result = Err(e);
            break;
        }
    }
    shared.latency.record(started.elapsed());
    shared.rounds.fetch_add(1, Ordering::Relaxed);
    if result.is_ok() {
        shared.flushed.store(target, Ordering::Release);
    }
    shared.complete(target, &result);
    result
}

/// One flush of everything written so far.
pub(crate) fn flush_once(log: &impl FlushTarget) -> Result<()> {
    let shared = log.flush_state();
    let result = {
        let _io = shared.io_lock();
        flush_to_locked(log, log.written())
    };
    shared.fire_ready();
    result
}

/// Starts the flusher thread of `log`; it ends when the log is dropped or
/// shut down. `dir` names the log in errors.
pub(crate) fn spawn_flusher<T: FlushTarget>(
    log: &Arc<T>,
    mode: FlushMode,
    interval: Duration,
    checkpoint_every: Duration,
    dir: &Path,
) -> Result<()> {
    let weak: Weak<T> = Arc::downgrade(log);
    let shared = log.flush_state().clone();
    let thread_shared = shared.clone();
    let handle = std::thread::Builder::new()
        .name("raftmq-flush".into())
        .spawn(move || run(weak, thread_shared, mode, interval, checkpoint_every))
        .map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    *lock(&shared.thread) = Some(handle);
    Ok(())
}

fn run<T: FlushTarget>(
    weak: Weak<T>,
    shared: Arc<FlushShared>,
    mode: FlushMode,
    interval: Duration,
    checkpoint_every: Duration,
) {
    let mut last_checkpoint = Instant::now();
    loop {
        {
            let deadline = Instant::now() + interval;
            let mut st = lock(&shared.state);
            st.idle = true;
            loop {
                if st.shutdown {
                    return;
                }
                if st.has_work(shared.flushed()) {
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
                let (next, timeout) = shared.wake.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner());
                st = next;
                if mode == FlushMode::Sync && timeout.timed_out() {
                    break;
                }
            }
            st.idle = false;
        }
        let Some(log) = weak.upgrade() else { return };
        if let Err(e) = flush_once(&*log) {
            // After a failed msync Linux may already have marked the dirty
            // pages clean, so a retry could "succeed" over lost data: stop.
            tracing::error!(error = %e, "commitlog flush failed; the log refuses further writes until reopened");
            shared.poison(format!("flush: {e}"));
            shared.fire_ready();
            return;
        }
        if last_checkpoint.elapsed() >= checkpoint_every {
            // Under `io`, so a concurrent truncate cannot lower the
            // checkpoint between our read of `flushed` and the write.
            let _io = shared.io_lock();
            let flushed = shared.flushed();
            if log.checkpoint().get().flushed < flushed
                && let Err(e) = log.checkpoint().update(|c| c.flushed = flushed)
            {
                tracing::error!(error = %e, "checkpoint write failed");
            }
            last_checkpoint = Instant::now();
        }
    }
}

/// Upper bounds (µs) of the msync latency buckets.
pub const FLUSH_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// How long msync rounds took: a fixed-bucket histogram (metrics read it;
/// the store stays free of any metrics library).
#[derive(Debug, Default)]
pub struct FlushLatency {
    /// Rounds per bucket of [`FLUSH_BUCKETS_US`], and a last one for slower.
    buckets: [AtomicU64; FLUSH_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl FlushLatency {
    fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let i = FLUSH_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(FLUSH_BUCKETS_US.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// (rounds per bucket, the last one above every bound; total µs).
    pub fn snapshot(&self) -> (Vec<u64>, u64) {
        (
            self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            self.sum_us.load(Ordering::Relaxed),
        )
    }
}
