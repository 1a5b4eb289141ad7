//! The store's one error type.
//!
//! Callers care about three questions, and the variants answer them:
//! is the data on disk damaged ([`StoreError::Corrupt`]), is the disk out of
//! space (an I/O error for which [`StoreError::is_out_of_space`] holds: the
//! same call succeeds once space is freed, and a failed append wrote
//! nothing), or did the caller ask for something impossible
//! ([`StoreError::BadArgument`], [`StoreError::NotRecordBoundary`],
//! [`StoreError::OutOfRange`])? Everything else is an I/O failure of the host.
//! (Disk use past the refuse watermark is no error here: see
//! `CommitLog::disk_full`.)

use std::io;
use std::path::PathBuf;

impl StoreError {
    /// The filesystem had no room (`ENOSPC`, or `EDQUOT` for a quota).
    pub fn is_out_of_space(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => is_out_of_space(source),
            _ => false,
        }
    }
}

/// Whether an I/O error is the filesystem having no room.
pub fn is_out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) || e.kind() == io::ErrorKind::StorageFull
}

/// Result alias used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bytes read from disk failed validation (length, magic, CRC, layout).
    #[error("corrupt data in {file} at offset {offset}: {reason}")]
    Corrupt { file: PathBuf, offset: u64, reason: String },

    /// The caller passed a value the store cannot accept (too large a record,
    /// an invalid name, a bad config value).
    #[error("bad argument: {0}")]
    BadArgument(String),

    /// `truncate` was asked to cut inside a record.
    #[error("offset {offset} is not a record boundary")]
    NotRecordBoundary { offset: u64 },

    /// An offset outside `[min, max]` of the log or queue.
    #[error("offset {offset} is out of range [{min}, {max})")]
    OutOfRange { offset: u64, min: u64, max: u64 },

    /// The store has been closed.
    #[error("the store is closed")]
    Closed,

    /// An earlier I/O failure left the log in a state this process can no
    /// longer vouch for (for example an msync error, after which the kernel
    /// may have dropped dirty pages); the store must be reopened, which runs
    /// recovery.
    #[error("the log stopped after an earlier failure ({reason}); reopen the store to recover")]
    Poisoned { reason: String },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub(crate) fn corrupt(file: impl Into<PathBuf>, offset: u64, reason: impl Into<String>) -> Self {
        StoreError::Corrupt {
            file: file.into(),
            offset,
            reason: reason.into(),
        }
    }
}

/// Attaches a path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
