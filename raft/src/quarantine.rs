//! Setting a damaged store aside: when a node's data fails its checks at
//! open (a CRC, a length, the structure of an index: `StoreError::Corrupt`
//! or an `InvalidData` error) in a way recovery cannot simply cut, the
//! node moves its log, indexes, checkpoint and snapshot into
//! `<data>/quarantine/<ms since the epoch>/` and starts with an empty
//! store: the leader sends it the log again (or a snapshot), so it serves
//! no damaged record and leaves no silent gap.
//!
//! The vote files and the committed id stay: the vote so that the node
//! cannot vote twice in a term, the committed id so that it knows what it
//! lost and neither votes nor campaigns until it has it again
//! ([`crate::catching_up`]). The quarantined files are kept for the
//! operator to inspect and delete, but only the newest set, and only when
//! the disk keeps room for the new store beside it: a node damaged again
//! and again must not fill its disk with copies and then fail to start (a
//! jepsen campaign's node did, at its third copy on a 256 MiB disk). A
//! node configured without peers has no one to send it the log: its
//! damaged store is all there is, so it refuses to start instead.
//!
//! Damage found while the node runs (a reader meets a ConsumeQueue block
//! that does not match its seal) cannot be cut from under the readers: the
//! node refuses those reads, and [`note_damage`] leaves a note in the data
//! directory so that its next start sets the store aside the same way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use raftmq_store::retention::DiskProbe;

use crate::error::RaftError;
use crate::raft_meta::{COMMITTED_FILE, VOTE_COPY_FILE, VOTE_FILE};

/// Directory under the data directory where damaged stores go.
pub const QUARANTINE_DIR: &str = "quarantine";

/// File in the data directory saying what damage the running node found
/// (one line per finding, the first few only); its next start sets the
/// store aside.
pub const DAMAGE_NOTE: &str = "damaged";
/// Findings kept in the note: the first few say all an operator needs.
pub const NOTE_LINES: usize = 16;

/// Adds `what` to the damage note in `data` (made durable), unless it holds
/// [`NOTE_LINES`] findings already.
pub fn note_damage(data: &Path, what: &str) -> io::Result<()> {
    use std::io::Write;
    let path = data.join(DAMAGE_NOTE);
    let lines = fs::read_to_string(&path).map_or(0, |s| s.lines().count());
    if lines >= NOTE_LINES {
        return Ok(());
    }
    let mut f = fs::OpenOptions::new().create(true).append(true).open(&path)?;
    writeln!(f, "{}", what.replace('\n', " "))?;
    f.sync_all()?;
    fs::File::open(data)?.sync_all()
}

/// What the damage note in `data` says, if there is one.
pub fn noted_damage(data: &Path) -> Option<String> {
    fs::read_to_string(data.join(DAMAGE_NOTE)).ok()
}

/// Whether `e`, from opening the store, the log or the state machine, says
/// the data on disk is damaged.
pub fn is_damage(e: &RaftError) -> bool {
    match e {
        RaftError::Store(raftmq_store::StoreError::Corrupt { .. }) => true,
        // The log store hands store errors to openraft as `io::Error`s.
        RaftError::Io(io) => io.kind() == io::ErrorKind::InvalidData || wraps_corrupt(io),
        _ => false,
    }
}

/// Whether `e` is a store's `Corrupt` error as the log store wraps it.
pub(crate) fn wraps_corrupt(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<raftmq_store::StoreError>())
        .is_some_and(|s| matches!(s, raftmq_store::StoreError::Corrupt { .. }))
}

/// Moves everything in `data` but the quarantine itself, the store's lock
/// file and the vote and committed files into a new quarantine directory,
/// after deleting any older one. Returns the new directory, or `None` when
/// it was deleted too because fewer than `room` bytes would be left free
/// for the new store (the group holds the good copy; a store that cannot
/// start helps no one).
pub fn set_aside(data: &Path, room: u64) -> io::Result<Option<PathBuf>> {
    let quarantine = data.join(QUARANTINE_DIR);
    if let Ok(older) = fs::read_dir(&quarantine) {
        for entry in older {
            let path = entry?.path();
            tracing::warn!(dir = %path.display(), "deleting an older quarantined store: only the newest is kept");
            fs::remove_dir_all(&path)?;
        }
    }
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let to = quarantine.join(ms.to_string());
    fs::create_dir_all(to.join("raft"))?;
    let keep_raft = [VOTE_FILE, VOTE_COPY_FILE, COMMITTED_FILE];
    for entry in fs::read_dir(data)? {
        let entry = entry?;
        let name = entry.file_name();
        match name.to_str() {
            Some(QUARANTINE_DIR) | Some(raftmq_store::layout::LOCK_FILE) => {}
            Some("raft") => {
                for inner in fs::read_dir(entry.path())? {
                    let inner = inner?;
                    if !keep_raft.iter().any(|k| inner.file_name() == *k) {
                        fs::rename(inner.path(), to.join("raft").join(inner.file_name()))?;
                    }
                }
            }
            _ => fs::rename(entry.path(), to.join(&name))?,
        }
    }
    fs::File::open(data)?.sync_all()?;
    fs::File::open(data.join("raft"))?.sync_all()?;
    let free = raftmq_store::retention::StatvfsProbe
        .usage(data)
        .map(|u| u.total_bytes.saturating_sub(u.used_bytes))
        .unwrap_or(u64::MAX);
    if free < room {
        tracing::error!(dir = %to.display(), free, needed = room,
            "no room to keep the damaged store beside a new one; deleting it");
        fs::remove_dir_all(&to)?;
        return Ok(None);
    }
    Ok(Some(to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_is_recognised_bare_and_as_the_log_store_wraps_it() {
        let corrupt = || raftmq_store::StoreError::Corrupt {
            file: "x".into(),
            offset: 0,
            reason: "bad".into(),
        };
        assert!(is_damage(&RaftError::Store(corrupt())));
        assert!(is_damage(&RaftError::Io(io::Error::other(corrupt()))));
        assert!(is_damage(&RaftError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "x"
        ))));
        assert!(!is_damage(&RaftError::Io(io::Error::other("disk on fire"))));
    }

    #[test]
    fn the_vote_and_committed_id_stay_and_the_rest_moves() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in [
            "commitlog/00000000000000000000",
            "consumequeue/t/0/00000000000000000000",
            "checkpoint",
            "lock",
        ] {
            fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            fs::write(d.join(f), b"x").unwrap();
        }
        fs::create_dir_all(d.join("raft/log_index")).unwrap();
        for f in [
            VOTE_FILE,
            VOTE_COPY_FILE,
            COMMITTED_FILE,
            "snapshot.json",
            "purged.json",
        ] {
            fs::write(d.join("raft").join(f), b"x").unwrap();
        }
        let to = set_aside(d, 0).unwrap().unwrap();
        for kept in ["lock", "raft/vote.json", "raft/vote.copy.json", "raft/committed.json"] {
            assert!(d.join(kept).exists(), "{kept} stays");
        }
        for moved in [
            "commitlog",
            "consumequeue",
            "checkpoint",
            "raft/log_index",
            "raft/snapshot.json",
            "raft/purged.json",
        ] {
            assert!(!d.join(moved).exists(), "{moved} moved");
            assert!(to.join(moved).exists(), "{moved} in the quarantine");
        }
        // A second quarantine replaces the first: only the newest is kept.
        std::thread::sleep(std::time::Duration::from_millis(2));
        fs::create_dir_all(d.join("commitlog")).unwrap();
        let again = set_aside(d, 0).unwrap().unwrap();
        assert!(!to.exists() && again.exists());
        assert_eq!(fs::read_dir(d.join(QUARANTINE_DIR)).unwrap().count(), 1);
        // Without room for a new store beside it, the copy goes too.
        fs::create_dir_all(d.join("commitlog")).unwrap();
        assert_eq!(set_aside(d, u64::MAX).unwrap(), None);
        assert_eq!(fs::read_dir(d.join(QUARANTINE_DIR)).unwrap().count(), 0);
        assert!(d.join("raft/vote.json").exists(), "the vote still stays");
    }

    #[test]
    fn a_damage_note_is_kept_short_and_goes_with_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(noted_damage(d), None);
        for i in 0..40 {
            note_damage(d, &format!("block {i}\nbad")).unwrap();
        }
        let note = noted_damage(d).unwrap();
        assert_eq!(note.lines().count(), NOTE_LINES);
        assert!(note.starts_with("block 0 bad\n"));
        fs::create_dir_all(d.join("raft")).unwrap();
        set_aside(d, 0).unwrap();
        assert_eq!(noted_damage(d), None, "the note is set aside with the store");
    }
}
