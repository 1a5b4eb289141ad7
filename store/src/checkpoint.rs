//! The `checkpoint` file: how far the CommitLog and its indexes are known to
//! be durable, so that recovery rescans only what might be torn.
//!
//! # Layout (64 bytes, little-endian)
//!
//! | offset | size | field        | meaning                                                   |
//! |-------:|-----:|--------------|-----------------------------------------------------------|
//! |      0 |    4 | `magic`      | [`CHECKPOINT_MAGIC`]: `"RMQ"` and the layout version (low byte) |
//! |      4 |    4 | `crc`        | CRC32 of bytes `8..64`                                    |
//! |      8 |    8 | `log_start`  | first valid CommitLog offset (raised by purge and reset)   |
//! |     16 |    8 | `flushed`    | CommitLog bytes below this offset were msynced             |
//! |     24 |    8 | `dispatched` | ConsumeQueue and key-index entries for records below this offset were msynced |
//! |     32 |    8 | `written_at_ms` | wall-clock time of the write, for operators             |
//! |     40 |    8 | `segment_size` | the CommitLog segment size the files were written with (0 = unknown) |
//! |     48 |   16 | reserved     | zero                                                       |
//!
//! The file is replaced atomically (write a temporary file, fsync, rename,
//! fsync the directory), so it is always either the old or the new version.
//! Every value in it may lag the truth (it is written at most every
//! `checkpoint_interval_ms`), never lead it: each is recorded only after the
//! data it describes was msynced. A missing or damaged checkpoint makes
//! recovery scan the whole log, which is slow but correct.

use crate::layout::CHECKPOINT_FILE;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{IoContext, Result};
use crate::locks::lock;
use crate::mapped_file::sync_dir;

/// `"RMQ"`, then layout version 0x43 ('C' for checkpoint, version 1).
pub const CHECKPOINT_MAGIC: u32 = 0x524D_5143;
/// Encoded size.
pub const CHECKPOINT_LEN: usize = 64;

/// The values a checkpoint records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub log_start: u64,
    pub flushed: u64,
    pub dispatched: u64,
    pub segment_size: u64,
}

impl Checkpoint {
    pub fn encode(&self) -> [u8; CHECKPOINT_LEN] {
        let mut b = [0u8; CHECKPOINT_LEN];
        b[0..4].copy_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.log_start.to_le_bytes());
        b[16..24].copy_from_slice(&self.flushed.to_le_bytes());
        b[24..32].copy_from_slice(&self.dispatched.to_le_bytes());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        b[32..40].copy_from_slice(&now.to_le_bytes());
        b[40..48].copy_from_slice(&self.segment_size.to_le_bytes());
        let crc = crc32fast::hash(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a checkpoint; `Err` says why it is unusable.
    pub fn decode(b: &[u8]) -> std::result::Result<Checkpoint, String> {
        if b.len() != CHECKPOINT_LEN {
            return Err(format!("{} bytes, expected {CHECKPOINT_LEN}", b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        if u32_at(0) != CHECKPOINT_MAGIC {
            return Err(format!("bad magic {:#010x}", u32_at(0)));
        }
        if u32_at(4) != crc32fast::hash(&b[8..]) {
            return Err("CRC mismatch".into());
        }
        Ok(Checkpoint {
            log_start: u64_at(8),
            flushed: u64_at(16),
            dispatched: u64_at(24),
            segment_size: u64_at(40),
        })
    }
}

/// The checkpoint file of one store, shared by the CommitLog (log start,
/// flushed) and the store's index flusher (dispatched).
#[derive(Debug)]
pub struct CheckpointFile {
    dir: PathBuf,
    current: Mutex<Checkpoint>,
}

impl CheckpointFile {
    /// Loads `<dir>/checkpoint`. Returns the file handle and what was read:
    /// `None` if it is missing or damaged (logged).
    pub fn load(dir: &Path) -> Result<(CheckpointFile, Option<Checkpoint>)> {
        let path = dir.join(CHECKPOINT_FILE);
        let found = match fs::read(&path) {
            Ok(bytes) => match Checkpoint::decode(&bytes) {
                Ok(c) => Some(c),
                Err(why) => {
                    tracing::warn!(path = %path.display(), %why, "ignoring damaged checkpoint; recovery will scan the whole log");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).at(&path),
        };
        let file = CheckpointFile {
            dir: dir.to_path_buf(),
            current: Mutex::new(found.unwrap_or_default()),
        };
        Ok((file, found))
    }

    pub fn get(&self) -> Checkpoint {
        *lock(&self.current)
    }

    /// Changes the in-memory values and writes the file atomically.
    pub fn update(&self, f: impl FnOnce(&mut Checkpoint)) -> Result<()> {
        let mut cur = lock(&self.current);
        let mut next = *cur;
        f(&mut next);
        self.write(&next)?;
        *cur = next;
        Ok(())
    }

    fn write(&self, c: &Checkpoint) -> Result<()> {
        let path = self.dir.join(CHECKPOINT_FILE);
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let mut f = File::create(&tmp).at(&tmp)?;
        f.write_all(&c.encode()).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        fs::rename(&tmp, &path).at(&path)?;
        sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (file, found) = CheckpointFile::load(dir.path()).unwrap();
        assert_eq!(found, None);
        file.update(|c| {
            c.segment_size = 4096;
            c.flushed = 42;
            c.dispatched = 40;
            c.log_start = 7;
        })
        .unwrap();
        let (_, found) = CheckpointFile::load(dir.path()).unwrap();
        assert_eq!(
            found,
            Some(Checkpoint {
                log_start: 7,
                flushed: 42,
                dispatched: 40,
                segment_size: 4096
            })
        );
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut bytes = fs::read(&path).unwrap();
        for i in 0..bytes.len() {
            bytes[i] ^= 0x10;
            assert!(Checkpoint::decode(&bytes).is_err(), "flip in byte {i} went unnoticed");
            bytes[i] ^= 0x10;
        }
        fs::write(&path, &bytes[..10]).unwrap();
        let (_, found) = CheckpointFile::load(dir.path()).unwrap();
        assert_eq!(found, None);
    }
}
