//! Small Raft state kept beside the log in `<data>/raft/`: the vote, the
//! last purged log id and the committed log id.
//!
//! # Layout
//!
//! Each file is one line of text: the CRC32 (crc32fast, IEEE) of the JSON
//! that follows, as 8 lowercase hex digits, one space, then the JSON:
//!
//! ```text
//! 1f2e3d4c {"seq":7,"value":{"leader_id":{"term":3,"node_id":1},"committed":true}}
//! ```
//!
//! A file whose CRC does not match is damaged and is not believed. A file
//! that is plain JSON (written before the CRC was added) is read as it is.
//!
//! The vote and the purged id are kept **twice** ([`VOTE_FILE`] and
//! [`VOTE_COPY_FILE`], [`PURGED_FILE`] and [`PURGED_COPY_FILE`]), each
//! `{"seq": n, "value": ...}` with `n` counting saves: a save writes both
//! temporary files, fsyncs them, renames both and fsyncs the directory
//! before it returns, so a copy is never newer than a vote already acted
//! on. At open the valid copy with the higher `seq` wins; one damaged copy
//! is repaired from the other. With both damaged the node refuses to start:
//! a node that forgot its vote could vote twice in one term.
//!
//! The committed id is an optimization for restart (entries up to it are
//! re-applied at once), rewritten on every advance, so cheaply: its line,
//! padded with spaces to [`COMMITTED_SLOT`] bytes, is written in place at
//! offset 0 with one `pwrite` and no fsync. A killed process loses nothing
//! (the write is in the page cache), so a node never comes back knowing
//! less committed than it had applied and served; a power loss may lose or
//! tear the last write, and a damaged file is ignored, which costs only
//! re-learning the commit index from the leader. (The log store also never
//! reports a committed id past the end of its log.)

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{LogId, Vote};

pub const VOTE_FILE: &str = "vote.json";
pub const VOTE_COPY_FILE: &str = "vote.copy.json";
pub const PURGED_FILE: &str = "purged.json";
pub const PURGED_COPY_FILE: &str = "purged.copy.json";
pub const COMMITTED_FILE: &str = "committed.json";
/// Bytes of `committed.json`: its line (about 70 bytes), then spaces.
pub const COMMITTED_SLOT: usize = 256;
/// The CRC's hex digits and the space after them.
const CRC_PREFIX_LEN: usize = 9;

pub struct RaftMeta {
    dir: PathBuf,
    vote: Mutex<Twice<Vote>>,
    purged: Mutex<Twice<LogId>>,
    committed: Mutex<(Option<LogId>, fs::File)>,
}

/// A value stored in two files, with the number of its save.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Saved<T> {
    seq: u64,
    value: Option<T>,
}

/// The current value of a doubly stored file pair.
struct Twice<T> {
    names: [&'static str; 2],
    saved: Saved<T>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display()))
}

/// `json` with its CRC in front (see the layout above; the snapshot file
/// is kept the same way).
pub(crate) fn checked(json: &[u8]) -> Vec<u8> {
    let mut out = format!("{:08x} ", crc32fast::hash(json)).into_bytes();
    out.extend_from_slice(json);
    out
}

/// The JSON of a file's bytes, its CRC verified (plain JSON, from before
/// files carried one, is taken as it is); empty when the file holds
/// nothing yet, an error when it is damaged.
pub(crate) fn verified<'a>(path: &Path, bytes: &'a [u8]) -> io::Result<&'a [u8]> {
    let text = bytes.trim_ascii();
    if text.is_empty() || text[0] == b'{' || text == b"null" {
        return Ok(text);
    }
    let (crc, json) = text.split_at(CRC_PREFIX_LEN.min(text.len()));
    let stored = std::str::from_utf8(&crc[..crc.len().min(8)])
        .ok()
        .filter(|_| crc.len() == CRC_PREFIX_LEN && crc[8] == b' ')
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| invalid(path, "no CRC at the start"))?;
    let actual = crc32fast::hash(json);
    if stored != actual {
        return Err(invalid(
            path,
            format!("CRC mismatch: stored {stored:08x}, computed {actual:08x}"),
        ));
    }
    Ok(json)
}

/// Parses a file's bytes: `Ok(None)` when it holds nothing yet (created
/// but never written), an error when it is damaged.
fn parse<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> io::Result<Option<T>> {
    let json = verified(path, bytes)?;
    if json.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(json).map(Some).map_err(|e| invalid(path, e))
}

fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => parse(&path, &bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl<T: Serialize + DeserializeOwned + Copy> Twice<T> {
    /// Reads both copies; the valid one with the higher `seq` wins, and a
    /// damaged or stale copy is rewritten from it.
    fn open(dir: &Path, names: [&'static str; 2], what: &str) -> io::Result<Twice<T>> {
        let read_one = |name: &str| -> io::Result<Option<Saved<T>>> {
            let path = dir.join(name);
            match fs::read(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
                Ok(bytes) => {
                    // Before the copies: the bare value, as save number 0.
                    if let Ok(Some(v)) = parse::<Saved<T>>(&path, &bytes) {
                        return Ok(Some(v));
                    }
                    parse::<Option<T>>(&path, &bytes).map(|v| v.map(|value| Saved { seq: 0, value }))
                }
            }
        };
        let (a, b) = (read_one(names[0]), read_one(names[1]));
        let best = match (&a, &b) {
            (Err(ea), Err(eb)) => {
                return Err(invalid(
                    dir,
                    format!(
                        "both copies of the {what} are damaged ({ea}; {eb}): this node cannot know \
                         its {what}. Remove it from its group and add it back with an empty data directory"
                    ),
                ));
            }
            (Ok(x), Ok(y)) => match (x, y) {
                (Some(x), Some(y)) => Some(if y.seq > x.seq { *y } else { *x }),
                (x, y) => x.or(*y),
            },
            // One damaged, and the other never written: nothing to trust.
            (Ok(None), Err(e)) | (Err(e), Ok(None)) => {
                return Err(invalid(
                    dir,
                    format!(
                        "the {what} is damaged ({e}) and has no second copy: this node cannot know \
                         its {what}. Remove it from its group and add it back with an empty data directory"
                    ),
                ));
            }
            (Ok(x), Err(e)) | (Err(e), Ok(x)) => {
                tracing::error!(error = %e, "one copy of the {what} is damaged; using the other");
                *x
            }
        };
        let twice = Twice {
            names,
            saved: best.unwrap_or(Saved { seq: 0, value: None }),
        };
        let agree = |r: &io::Result<Option<Saved<T>>>| matches!(r, Ok(Some(s)) if s.seq == twice.saved.seq);
        if best.is_some() && !(agree(&a) && agree(&b)) {
            twice.write(dir, &twice.saved)?;
        }
        Ok(twice)
    }

    /// Saves both copies; durable when it returns.
    fn save(&mut self, dir: &Path, value: T) -> io::Result<()> {
        let next = Saved {
            seq: self.saved.seq + 1,
            value: Some(value),
        };
        self.write(dir, &next)?;
        self.saved = next;
        Ok(())
    }

    fn write(&self, dir: &Path, saved: &Saved<T>) -> io::Result<()> {
        let line = checked(&serde_json::to_vec(saved).map_err(io::Error::other)?);
        for name in self.names {
            let mut f = fs::File::create(dir.join(format!("{name}.tmp")))?;
            f.write_all(&line)?;
            f.sync_all()?;
        }
        for name in self.names {
            fs::rename(dir.join(format!("{name}.tmp")), dir.join(name))?;
        }
        fs::File::open(dir)?.sync_all()
    }
}

/// The committed index saved in `raft_dir` (for tools reading a stopped
/// node's files); `None` when there is none or it is damaged.
pub fn committed_index(raft_dir: &Path) -> io::Result<Option<u64>> {
    match read::<Option<LogId>>(raft_dir, COMMITTED_FILE) {
        Ok(id) => Ok(id.flatten().map(|id| id.index)),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(None),
        Err(e) => Err(e),
    }
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
            vote: Mutex::new(Twice::open(dir, [VOTE_FILE, VOTE_COPY_FILE], "vote")?),
            purged: Mutex::new(Twice::open(dir, [PURGED_FILE, PURGED_COPY_FILE], "purged log id")?),
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
        lock(&self.vote).saved.value
    }

    pub fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        lock(&self.vote).save(&self.dir, *vote)
    }

    pub fn purged(&self) -> Option<LogId> {
        lock(&self.purged).saved.value
    }

    pub fn save_purged(&self, id: LogId) -> io::Result<()> {
        lock(&self.purged).save(&self.dir, id)
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

/// Writes `value`'s line over the start of `file`, padded to
/// [`COMMITTED_SLOT`] bytes so no longer earlier value shows through.
fn write_slot<T: Serialize>(file: &fs::File, value: &T) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = checked(&serde_json::to_vec(value).map_err(io::Error::other)?);
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

    fn vote(term: u64) -> Vote {
        Vote::new(term, 1)
    }

    #[test]
    fn a_damaged_copy_of_the_vote_is_repaired_from_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let meta = RaftMeta::open(dir.path()).unwrap();
        meta.save_vote(&vote(3)).unwrap();
        meta.save_vote(&vote(5)).unwrap();
        drop(meta);
        for damaged in [VOTE_FILE, VOTE_COPY_FILE] {
            let path = dir.path().join(damaged);
            let mut bytes = fs::read(&path).unwrap();
            // A digit of the term: still JSON, so only the CRC tells.
            let at = bytes.windows(3).position(|w| w == b"\":5").unwrap() + 2;
            bytes[at] = b'4';
            fs::write(&path, &bytes).unwrap();
            let meta = RaftMeta::open(dir.path()).unwrap();
            assert_eq!(meta.vote(), Some(vote(5)), "{damaged}");
            drop(meta);
            // Repaired on open: both copies read alike again.
            assert_eq!(
                fs::read(dir.path().join(VOTE_FILE)).unwrap(),
                fs::read(dir.path().join(VOTE_COPY_FILE)).unwrap()
            );
        }
    }

    #[test]
    fn with_both_copies_damaged_the_node_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        RaftMeta::open(dir.path()).unwrap().save_vote(&vote(2)).unwrap();
        for f in [VOTE_FILE, VOTE_COPY_FILE] {
            fs::write(dir.path().join(f), b"0badc0de {\"seq\":1}").unwrap();
        }
        let err = RaftMeta::open(dir.path()).err().expect("refused");
        assert!(err.to_string().contains("both copies of the vote are damaged"), "{err}");
        // One damaged and no second copy (a store from before the copies).
        fs::remove_file(dir.path().join(VOTE_COPY_FILE)).unwrap();
        let err = RaftMeta::open(dir.path()).err().expect("refused");
        assert!(err.to_string().contains("has no second copy"), "{err}");
    }

    #[test]
    fn the_newer_copy_wins_and_files_from_before_the_crc_are_read() {
        let dir = tempfile::tempdir().unwrap();
        // As a store written before this layout: one plain-JSON file.
        fs::write(dir.path().join(VOTE_FILE), serde_json::to_vec(&vote(7)).unwrap()).unwrap();
        fs::write(dir.path().join(PURGED_FILE), b"null").unwrap();
        let meta = RaftMeta::open(dir.path()).unwrap();
        assert_eq!(meta.vote(), Some(vote(7)));
        assert_eq!(meta.purged(), None);
        // A save that died between its two renames leaves the copy older.
        meta.save_vote(&vote(8)).unwrap();
        let newer = fs::read(dir.path().join(VOTE_FILE)).unwrap();
        meta.save_vote(&vote(9)).unwrap();
        drop(meta);
        fs::write(dir.path().join(VOTE_COPY_FILE), newer).unwrap();
        assert_eq!(RaftMeta::open(dir.path()).unwrap().vote(), Some(vote(9)));
    }

    #[test]
    fn a_committed_id_with_a_bad_crc_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let meta = RaftMeta::open(dir.path()).unwrap();
        meta.save_committed(Some(log_id(2, 17))).unwrap();
        drop(meta);
        let path = dir.path().join(COMMITTED_FILE);
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.windows(2).position(|w| w == b"17").unwrap();
        bytes[at] = b'9';
        fs::write(&path, &bytes).unwrap();
        assert_eq!(RaftMeta::open(dir.path()).unwrap().committed(), None);
    }
}
