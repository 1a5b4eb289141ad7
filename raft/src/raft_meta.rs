//! Small Raft state kept beside the log in `<data>/raft/`: the vote, the
//! last purged log id and the committed log id, one JSON file each.
//!
//! The vote and the purged id are replaced atomically (temporary file,
//! fsync, rename, fsync of the directory).
//!
//! The committed id is an optimization for restart (entries up to it are
//! re-applied at once), rewritten on every advance, so cheaply: its JSON,
//! padded with spaces to [`COMMITTED_SLOT`] bytes, is written in place at
//! offset 0 with one `pwrite` and no fsync. A killed process loses nothing
//! (the write is in the page cache), so a node never comes back knowing
//! less committed than it had applied and served; a power loss may lose or
//! tear the last write, which costs only re-learning the commit index from
//! the leader (a file that does not parse is ignored).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{LogId, Vote};

pub const VOTE_FILE: &str = "vote.json";
pub const PURGED_FILE: &str = "purged.json";
pub const COMMITTED_FILE: &str = "committed.json";
/// Bytes of `committed.json`: its JSON (about 60 bytes), then spaces.
pub const COMMITTED_SLOT: usize = 256;

pub struct RaftMeta {
    dir: PathBuf,
    vote: Mutex<Option<Vote>>,
    purged: Mutex<Option<LogId>>,
    committed: Mutex<(Option<LogId>, fs::File)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    match fs::read(dir.join(name)) {
        // Created but never written (the committed id's file is opened
        // before its first write).
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(None),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", dir.join(name).display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write<T: Serialize>(dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(value).map_err(io::Error::other)?)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    fs::File::open(dir)?.sync_all()
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
            committed: Mutex::new((
                committed,
                fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(dir.join(COMMITTED_FILE))?,
            )),
        })
    }

    pub fn vote(&self) -> Option<Vote> {
        *lock(&self.vote)
    }

    pub fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        let mut v = lock(&self.vote);
        write(&self.dir, VOTE_FILE, vote)?;
        *v = Some(*vote);
        Ok(())
    }

    pub fn purged(&self) -> Option<LogId> {
        *lock(&self.purged)
    }

    pub fn save_purged(&self, id: Option<LogId>) -> io::Result<()> {
        let mut p = lock(&self.purged);
        write(&self.dir, PURGED_FILE, &id)?;
        *p = id;
        Ok(())
    }

    pub fn committed(&self) -> Option<LogId> {
        lock(&self.committed).0
    }

    pub fn save_committed(&self, id: Option<LogId>) -> io::Result<()> {
        let mut c = lock(&self.committed);
        write_slot(&c.1, &id)?;
        c.0 = id;
        Ok(())
    }

    /// Makes the latest committed id durable (at shutdown).
    pub fn flush_committed(&self) -> io::Result<()> {
        let c = lock(&self.committed);
        write_slot(&c.1, &c.0)?;
        c.1.sync_all()
    }
}

/// Writes `value`'s JSON over the start of `file`, padded to
/// [`COMMITTED_SLOT`] bytes so no longer earlier value shows through.
fn write_slot<T: Serialize>(file: &fs::File, value: &T) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = serde_json::to_vec(value).map_err(io::Error::other)?;
    if buf.len() >= COMMITTED_SLOT {
        return Err(io::Error::other(format!(
            "a committed log id of {} bytes does not fit its {COMMITTED_SLOT}-byte slot",
            buf.len()
        )));
    }
    buf.resize(COMMITTED_SLOT - 1, b' ');
    buf.push(b'\n');
    file.write_all_at(&buf, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::testing::log_id::<crate::types::TypeConfig>(term, 1, index)
    }

    #[test]
    fn every_committed_id_survives_a_reopen_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let meta = RaftMeta::open(dir.path()).unwrap();
        assert_eq!(meta.committed(), None);
        // A long id, then a short one: the padding hides the longer tail.
        meta.save_committed(Some(log_id(12_345_678, 9_876_543_210))).unwrap();
        meta.save_committed(Some(log_id(2, 7))).unwrap();
        drop(meta); // no flush_committed: as a kill -9
        let meta = RaftMeta::open(dir.path()).unwrap();
        assert_eq!(meta.committed(), Some(log_id(2, 7)));
        assert_eq!(
            fs::metadata(dir.path().join(COMMITTED_FILE)).unwrap().len(),
            COMMITTED_SLOT as u64
        );
    }

    #[test]
    fn an_empty_or_torn_committed_file_means_none() {
        let dir = tempfile::tempdir().unwrap();
        drop(RaftMeta::open(dir.path()).unwrap());
        assert_eq!(RaftMeta::open(dir.path()).unwrap().committed(), None);
        fs::write(dir.path().join(COMMITTED_FILE), b"{\"leader_id\":{\"te").unwrap();
        let meta = RaftMeta::open(dir.path()).unwrap();
        assert_eq!(meta.committed(), None);
        meta.save_committed(Some(log_id(1, 3))).unwrap();
        meta.flush_committed().unwrap();
        assert_eq!(RaftMeta::open(dir.path()).unwrap().committed(), Some(log_id(1, 3)));
    }
}
