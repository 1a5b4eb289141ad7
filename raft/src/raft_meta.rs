//! Small Raft state kept beside the log in `<data>/raft/`: the vote, the
//! last purged log id and the committed log id, one JSON file each.
//!
//! Each is replaced atomically (temporary file, fsync, rename, fsync of the
//! directory). The committed id is an optimization for restart (entries up
//! to it are re-applied at once) and may lag, so it is written without the
//! fsyncs and at most every [`COMMITTED_WRITE_INTERVAL`].

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{LogId, Vote};

pub const VOTE_FILE: &str = "vote.json";
pub const PURGED_FILE: &str = "purged.json";
pub const COMMITTED_FILE: &str = "committed.json";
/// How often at most the committed log id is rewritten.
pub const COMMITTED_WRITE_INTERVAL: Duration = Duration::from_millis(200);

pub struct RaftMeta {
    dir: PathBuf,
    vote: Mutex<Option<Vote>>,
    purged: Mutex<Option<LogId>>,
    committed: Mutex<(Option<LogId>, Option<Instant>)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    match fs::read(dir.join(name)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", dir.join(name).display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write<T: Serialize>(dir: &Path, name: &str, value: &T, durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(value).map_err(io::Error::other)?)?;
    if durable {
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl RaftMeta {
    pub fn open(dir: &Path) -> io::Result<RaftMeta> {
        fs::create_dir_all(dir)?;
        // A damaged committed id only costs re-applying later: start without.
        let committed = read(dir, COMMITTED_FILE).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "ignoring unreadable committed log id");
            None
        });
        Ok(RaftMeta {
            dir: dir.to_path_buf(),
            vote: Mutex::new(read(dir, VOTE_FILE)?),
            purged: Mutex::new(read(dir, PURGED_FILE)?),
            committed: Mutex::new((committed, None)),
        })
    }

    pub fn vote(&self) -> Option<Vote> {
        *lock(&self.vote)
    }

    pub fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        let mut v = lock(&self.vote);
        write(&self.dir, VOTE_FILE, vote, true)?;
        *v = Some(*vote);
        Ok(())
    }

    pub fn purged(&self) -> Option<LogId> {
        *lock(&self.purged)
    }

    pub fn save_purged(&self, id: Option<LogId>) -> io::Result<()> {
        let mut p = lock(&self.purged);
        write(&self.dir, PURGED_FILE, &id, true)?;
        *p = id;
        Ok(())
    }

    pub fn committed(&self) -> Option<LogId> {
        lock(&self.committed).0
    }

    pub fn save_committed(&self, id: Option<LogId>) -> io::Result<()> {
        let mut c = lock(&self.committed);
        c.0 = id;
        if c.1.is_none_or(|at| at.elapsed() >= COMMITTED_WRITE_INTERVAL) {
            write(&self.dir, COMMITTED_FILE, &id, false)?;
            c.1 = Some(Instant::now());
        }
        Ok(())
    }

    /// Writes the latest committed id (at shutdown).
    pub fn flush_committed(&self) -> io::Result<()> {
        let c = lock(&self.committed);
        write(&self.dir, COMMITTED_FILE, &c.0, true)
    }
}
