//! The `corrupt` nemesis's damage: on a stopped node, flip bits in, or cut
//! short, one of its data files, chosen from the seed.
//!
//! | target | files (under the node's data directory) | where |
//! |---|---|---|
//! | `commitlog-tail` | the newest `commitlog/` segment | its last 64 KiB of data |
//! | `commitlog-middle` | any `commitlog/` segment | anywhere in its data |
//! | `log-index` | `raft/log_index/...` | anywhere in its data |
//! | `consume-queue` | `consumequeue/<topic>/<queue>/...` | anywhere in its data |
//! | `key-index` | `index/...` | anywhere in its data |
//! | `snapshot` | `raft/snapshot.json` | anywhere |
//! | `raft-meta` | `raft/vote.json`, `raft/committed.json`, `raft/purged.json` and the second copies of the vote and purged id | anywhere |
//! | `checkpoint` | `checkpoint` | anywhere |
//!
//! "Data" is what was written: segments and index files are preallocated
//! with zeros, so damage goes below a file's last non-zero byte, where it
//! can hurt. A `flip` inverts 1 to 8 random bits there; a `truncate` cuts
//! the file at a random byte there (the store extends a short file with
//! zeros again, so the tail after the cut reads as never written). When
//! the drawn target has no file yet (no snapshot, say), another is drawn.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

/// How far back from a segment's end of data `commitlog-tail` reaches.
const TAIL_BYTES: u64 = 64 << 10;

/// Where damage may go: a target's name, and its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    CommitLogTail,
    CommitLogMiddle,
    LogIndex,
    ConsumeQueue,
    KeyIndex,
    Snapshot,
    RaftMeta,
    Checkpoint,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::CommitLogTail,
        Target::CommitLogMiddle,
        Target::LogIndex,
        Target::ConsumeQueue,
        Target::KeyIndex,
        Target::Snapshot,
        Target::RaftMeta,
        Target::Checkpoint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::CommitLogTail => "commitlog-tail",
            Target::CommitLogMiddle => "commitlog-middle",
            Target::LogIndex => "log-index",
            Target::ConsumeQueue => "consume-queue",
            Target::KeyIndex => "key-index",
            Target::Snapshot => "snapshot",
            Target::RaftMeta => "raft-meta",
            Target::Checkpoint => "checkpoint",
        }
    }

    /// Where damage to a file with `used` bytes of data may start: the tail
    /// target hits only the newest 64 KiB of its segment.
    fn region_start(self, used: u64) -> u64 {
        match self {
            Target::CommitLogTail => used.saturating_sub(TAIL_BYTES),
            _ => 0,
        }
    }

    /// The target's files that exist under `data`, sorted.
    fn files(self, data: &Path) -> Vec<PathBuf> {
        let mut out = match self {
            Target::CommitLogTail => files_under(&data.join("commitlog"))
                .into_iter()
                .last()
                .into_iter()
                .collect(),
            Target::CommitLogMiddle => files_under(&data.join("commitlog")),
            Target::LogIndex => files_under(&data.join("raft/log_index")),
            Target::ConsumeQueue => files_under(&data.join("consumequeue")),
            Target::KeyIndex => files_under(&data.join("index")),
            Target::Snapshot => vec![data.join("raft/snapshot.json")],
            Target::RaftMeta => [
                "vote.json",
                "vote.copy.json",
                "committed.json",
                "purged.json",
                "purged.copy.json",
            ]
            .iter()
            .map(|f| data.join("raft").join(f))
            .collect(),
            Target::Checkpoint => vec![data.join("checkpoint")],
        };
        // Only files with data in them: nothing to damage in an empty one.
        out.retain(|p| used_len(p).is_ok_and(|n| n > 0));
        out
    }
}

/// Every regular file below `dir` (any depth), sorted by path.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Bytes up to and including the file's last non-zero byte.
fn used_len(path: &Path) -> std::io::Result<u64> {
    let mut f = fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// What was done, for the history and the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub target: Target,
    /// Relative to the node's data directory.
    pub file: String,
    pub what: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.target.name(), self.file, self.what)
    }
}

/// Damages one file of the (stopped) node whose data directory is `data`.
/// `None` when no target has a file with data yet.
pub fn corrupt(rng: &mut StdRng, data: &Path) -> anyhow::Result<Option<Damage>> {
    let mut targets = Target::ALL.to_vec();
    while !targets.is_empty() {
        let target = targets.remove(rng.random_range(0..targets.len()));
        let files = target.files(data);
        let Some(path) = files.choose(rng) else { continue };
        let used = used_len(path).with_context(|| format!("reading {}", path.display()))?;
        let from = target.region_start(used);
        let what = if rng.random_bool(0.5) {
            let bits = rng.random_range(1..=8);
            let mut at: Vec<(u64, u8)> = (0..bits)
                .map(|_| (rng.random_range(from..used), rng.random_range(0..8u8)))
                .collect();
            at.sort_unstable();
            flip(path, &at)?;
            let shown: Vec<String> = at.iter().map(|(b, bit)| format!("{b}.{bit}")).collect();
            format!("flipped {bits} bits (byte.bit) {}", shown.join(" "))
        } else {
            let cut = rng.random_range(from..used);
            fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(cut))
                .with_context(|| format!("truncating {}", path.display()))?;
            format!("truncated at byte {cut} of {used} written")
        };
        let file = path.strip_prefix(data).unwrap_or(path).display().to_string();
        return Ok(Some(Damage { target, file, what }));
    }
    Ok(None)
}

/// Inverts bit `bit` of byte `byte` for each pair, in place.
fn flip(path: &Path, at: &[(u64, u8)]) -> anyhow::Result<()> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    for &(byte, bit) in at {
        let mut b = [0u8];
        f.seek(SeekFrom::Start(byte))?;
        f.read_exact(&mut b)?;
        b[0] ^= 1 << bit;
        f.seek(SeekFrom::Start(byte))?;
        f.write_all(&b)?;
    }
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn write(p: &Path, bytes: &[u8]) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    #[test]
    fn damage_lands_in_written_bytes_of_an_existing_file() {
        for seed in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path();
            // A preallocated segment: 100 bytes of data, then zeros.
            let mut seg = vec![0xAAu8; 100];
            seg.resize(4096, 0);
            let before = seg.clone();
            write(&data.join("commitlog/00000000000000000000"), &seg);
            write(&data.join("raft/vote.json"), b"{\"term\":1}");
            // An empty file is no target.
            write(&data.join("checkpoint"), &[0u8; 64]);
            let mut rng = StdRng::seed_from_u64(seed);
            let d = corrupt(&mut rng, data).unwrap().expect("a file to damage");
            let path = data.join(&d.file);
            let after = fs::read(&path).unwrap();
            match d.file.as_str() {
                "commitlog/00000000000000000000" if d.what.starts_with("flipped") => {
                    assert_eq!(after.len(), before.len());
                    // (Two draws of one bit cancel out, so a flip may show no change.)
                    let diff: Vec<usize> = (0..after.len()).filter(|&i| after[i] != before[i]).collect();
                    assert!(diff.iter().all(|&i| i < 100), "{d}: {diff:?}");
                }
                "commitlog/00000000000000000000" => {
                    assert!(after.len() < 100, "{d}");
                    assert_eq!(&after[..], &before[..after.len()]);
                }
                "raft/vote.json" => assert_ne!(after, b"{\"term\":1}", "{d}"),
                other => panic!("damaged {other}, which has no data: {d}"),
            }
        }
    }

    #[test]
    fn nothing_to_damage_in_an_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(corrupt(&mut rng, dir.path()).unwrap(), None);
    }

    #[test]
    fn the_tail_target_is_the_newest_64_kib_of_the_newest_segment() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        write(&data.join("commitlog/00000000000000000000"), &vec![1u8; 300 << 10]);
        write(&data.join("commitlog/00000000000001048576"), &vec![1u8; 200 << 10]);
        assert_eq!(
            Target::CommitLogTail.files(data),
            vec![data.join("commitlog/00000000000001048576")]
        );
        assert_eq!(Target::CommitLogMiddle.files(data).len(), 2);
        assert_eq!(Target::CommitLogTail.region_start(200 << 10), 136 << 10);
        assert_eq!(Target::CommitLogTail.region_start(1000), 0);
        assert_eq!(Target::CommitLogMiddle.region_start(200 << 10), 0);
    }
}
