//! Waiting out a full disk. openraft treats every storage error as fatal:
//! the node's Raft stops for good. Running out of space is no such failure:
//! it passes when retention, the operator or another program frees space.
//! So a log append, truncation, vote, purge, entry apply or snapshot build
//! that fails for want of space is tried again every [`RETRY`] until it
//! goes through, and meanwhile the node
//! neither acknowledges nor votes: its group goes on without it (a leader
//! stops heartbeating, so the others elect one), and it catches up after.
//!
//! Each retried step must be safe to repeat after a failure: a failed
//! CommitLog append wrote nothing (segments are created, and removed again
//! when preallocation fails, before a byte is written), log-index units go
//! in one at a time, metadata and snapshot files are rewritten whole, and an
//! entry applied again finds the queue units and keys the failed try wrote
//! (`Store::dispatch`) and the outcome of its guard (a guarded send's ack);
//! no snapshot is taken while an entry is half applied.
//!
//! Not covered, failing as before: installing a snapshot (its queue resets
//! allocate before they free), and a truncation that must copy a segment
//! readers still hold. A purge needs a little room (the purged id's file)
//! before it frees any, so on a disk full to the last byte it waits until
//! something else frees space.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use raftmq_store::StoreError;

/// How often a step that ran out of space is tried again.
pub const RETRY: Duration = Duration::from_millis(250);
/// How often the wait is logged again while it lasts.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether `e` (as the storage traits carry it) is the disk having no room.
pub fn is_out_of_space(e: &io::Error) -> bool {
    raftmq_store::error::is_out_of_space(e)
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<StoreError>())
            .is_some_and(StoreError::is_out_of_space)
}

/// The log lines of one wait: the first miss, one every [`LOG_EVERY`]
/// while it lasts, and the end.
struct Waiting {
    what: &'static str,
    since: Option<Instant>,
    logged: Instant,
}

impl Waiting {
    fn new(what: &'static str) -> Waiting {
        Waiting {
            what,
            since: None,
            logged: Instant::now(),
        }
    }

    /// Whether to wait and try again after `e`.
    fn again(&mut self, e: &io::Error, stopping: &AtomicBool) -> bool {
        if !is_out_of_space(e) || stopping.load(Ordering::Acquire) {
            return false;
        }
        if self.since.is_none() || self.logged.elapsed() >= LOG_EVERY {
            tracing::error!(what = self.what, error = %e, "out of disk space: waiting for room, not answering the group meanwhile");
            self.logged = Instant::now();
        }
        self.since.get_or_insert_with(Instant::now);
        true
    }

    fn done(&self) {
        if let Some(since) = self.since {
            tracing::info!(
                what = self.what,
                waited_ms = since.elapsed().as_millis() as u64,
                "disk has room again"
            );
        }
    }
}

/// Runs `step` until it succeeds or fails for another reason than space,
/// waiting [`RETRY`] between tries. Gives the error back at once when
/// `stopping` is set (a node shutting down must not hang on its disk).
pub async fn until_room<T, F>(what: &'static str, stopping: &AtomicBool, mut step: impl FnMut() -> F) -> io::Result<T>
where
    F: Future<Output = io::Result<T>>,
{
    let mut waiting = Waiting::new(what);
    loop {
        match step().await {
            Err(e) if waiting.again(&e, stopping) => tokio::time::sleep(RETRY).await,
            other => {
                waiting.done();
                return other;
            }
        }
    }
}

/// [`until_room`] for a step on a blocking thread (snapshot builds).
pub fn until_room_blocking<T>(
    what: &'static str,
    stopping: &AtomicBool,
    mut step: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let mut waiting = Waiting::new(what);
    loop {
        match step() {
            Err(e) if waiting.again(&e, stopping) => std::thread::sleep(RETRY),
            other => {
                waiting.done();
                return other;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enospc() -> io::Error {
        io::Error::new(io::ErrorKind::StorageFull, "no space left on device")
    }

    #[test]
    fn out_of_space_is_recognised_bare_and_wrapped() {
        assert!(is_out_of_space(&enospc()));
        let wrapped = io::Error::other(StoreError::Io {
            path: "x".into(),
            source: enospc(),
        });
        assert!(is_out_of_space(&wrapped));
        assert!(!is_out_of_space(&io::Error::other("other")));
        assert!(!is_out_of_space(&io::Error::new(io::ErrorKind::PermissionDenied, "no")));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_room_and_gives_other_errors_back() {
        let stopping = AtomicBool::new(false);
        let mut tries = 0;
        let got = until_room("test", &stopping, || {
            tries += 1;
            std::future::ready(if tries < 5 { Err(enospc()) } else { Ok(tries) })
        })
        .await
        .unwrap();
        assert_eq!(got, 5);

        let err = until_room("test", &stopping, || async { Err::<(), _>(io::Error::other("broken")) })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "broken");

        // A node on its way down gets the error at once.
        stopping.store(true, Ordering::Release);
        let err = until_room("test", &stopping, || async { Err::<(), _>(enospc()) })
            .await
            .unwrap_err();
        assert!(is_out_of_space(&err));
    }
}
