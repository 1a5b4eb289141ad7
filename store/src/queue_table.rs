//! The QueueTable: every [`ConsumeQueue`] of a node, by (topic, queue id).
//!
//! ```text
//! <root>/consumequeue/<topic>/<queue_id>/...   one ConsumeQueue (see consume_queue)
//! ```
//!
//! `<topic>` is a topic name as [`validate_topic`] accepts it (which makes it
//! a safe directory name: no `/`, no `.`), `<queue_id>` a u32 in decimal.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::consume_queue::ConsumeQueue;
use crate::error::{IoContext, Result, StoreError};
use crate::layout::CONSUME_QUEUE_DIR;
use crate::locks::{read_lock, write_lock};
use crate::mapped_file::{MapOptions, sync_dir};

/// Longest topic name (RocketMQ's limit).
pub const MAX_TOPIC_LEN: usize = 127;

/// Checks a topic name against RocketMQ's rule: `^[%|a-zA-Z0-9_-]+$`, at
/// most [`MAX_TOPIC_LEN`] characters.
pub fn validate_topic(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-');
    if name.is_empty() || name.len() > MAX_TOPIC_LEN || !name.chars().all(ok_char) {
        let shown: String = name.chars().take(MAX_TOPIC_LEN + 1).collect();
        return Err(StoreError::BadArgument(format!(
            "invalid topic name {shown:?}: a topic name is 1 to {MAX_TOPIC_LEN} characters from \
             a-z, A-Z, 0-9, '_', '-', '%' and '|'"
        )));
    }
    Ok(())
}

/// A queue id directory name: a u32 in canonical decimal.
fn parse_queue_id(name: &str) -> Option<u32> {
    let id: u32 = name.parse().ok()?;
    (id.to_string() == name).then_some(id)
}

/// topic -> queue id -> queue; nested so that a lookup by `&str` needs no
/// allocation.
type Map = BTreeMap<String, BTreeMap<u32, Arc<ConsumeQueue>>>;

/// All ConsumeQueues of a node.
pub struct QueueTable {
    /// `<root>/consumequeue`.
    dir: PathBuf,
    units_per_file: u64,
    map: MapOptions,
    queues: RwLock<Map>,
}

impl std::fmt::Debug for QueueTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueTable")
            .field("dir", &self.dir)
            .field("queues", &self.read().values().map(BTreeMap::len).sum::<usize>())
            .finish()
    }
}

impl QueueTable {
    /// Opens every queue found under `<root>/consumequeue/` (`root` is the
    /// store directory), creating that directory if needed. Entries that are
    /// not valid topic names or queue ids are logged and skipped.
    pub(crate) fn open(root: &Path, units_per_file: u64, map: MapOptions, crashed: bool) -> Result<Self> {
        let dir = root.join(CONSUME_QUEUE_DIR);
        fs::create_dir_all(&dir).at(&dir)?;
        let mut queues = Map::new();
        for topic_entry in fs::read_dir(&dir).at(&dir)? {
            let topic_path = topic_entry.at(&dir)?.path();
            let Some(topic) = topic_path
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|t| validate_topic(t).is_ok())
            else {
                tracing::warn!(path = %topic_path.display(), "skipping a consume queue entry that is not a valid topic name");
                continue;
            };
            if !fs::metadata(&topic_path).is_ok_and(|m| m.is_dir()) {
                tracing::warn!(path = %topic_path.display(), "skipping a consume queue entry that is not a directory");
                continue;
            }
            for queue_entry in fs::read_dir(&topic_path).at(&topic_path)? {
                let queue_path = queue_entry.at(&topic_path)?.path();
                let Some(queue_id) = queue_path.file_name().and_then(|n| n.to_str()).and_then(parse_queue_id) else {
                    tracing::warn!(path = %queue_path.display(), "skipping a consume queue entry that is not a queue id");
                    continue;
                };
                if !fs::metadata(&queue_path).is_ok_and(|m| m.is_dir()) {
                    tracing::warn!(path = %queue_path.display(), "skipping a consume queue entry that is not a directory");
                    continue;
                }
                let cq = ConsumeQueue::open(&queue_path, units_per_file, map, crashed)?;
                queues
                    .entry(topic.to_owned())
                    .or_default()
                    .insert(queue_id, Arc::new(cq));
            }
        }
        Ok(QueueTable {
            dir,
            units_per_file,
            map,
            queues: RwLock::new(queues),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Map> {
        // Nothing panics while holding the lock; the map stays consistent.
        read_lock(&self.queues)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Map> {
        write_lock(&self.queues)
    }

    /// The queue, if it exists.
    pub fn get(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        self.read().get(topic)?.get(&queue_id).cloned()
    }

    /// The queue, created (with its directory) if it does not exist yet.
    pub fn get_or_create(&self, topic: &str, queue_id: u32) -> Result<Arc<ConsumeQueue>> {
        validate_topic(topic)?;
        if let Some(cq) = self.get(topic, queue_id) {
            return Ok(cq);
        }
        let mut queues = self.write();
        if let Some(cq) = queues.get(topic).and_then(|t| t.get(&queue_id)) {
            return Ok(Arc::clone(cq));
        }
        let topic_dir = self.dir.join(topic);
        let cq = ConsumeQueue::open(
            &topic_dir.join(queue_id.to_string()),
            self.units_per_file,
            self.map,
            false,
        )?;
        // Make the new directories durable, so the files later created in them
        // are found after a power loss.
        sync_dir(&topic_dir)?;
        sync_dir(&self.dir)?;
        let cq = Arc::new(cq);
        queues
            .entry(topic.to_owned())
            .or_default()
            .insert(queue_id, Arc::clone(&cq));
        Ok(cq)
    }

    /// A snapshot of all queues, sorted by (topic, queue id).
    pub fn queues(&self) -> Vec<(String, u32, Arc<ConsumeQueue>)> {
        self.read()
            .iter()
            .flat_map(|(topic, ids)| ids.iter().map(move |(id, cq)| (topic.clone(), *id, Arc::clone(cq))))
            .collect()
    }

    /// How many queues each topic has in the store (a snapshot lists them
    /// all, whatever the topics' configs say now).
    pub fn counts(&self) -> std::collections::HashMap<String, usize> {
        self.read()
            .iter()
            .map(|(topic, ids)| (topic.clone(), ids.len()))
            .collect()
    }

    /// Applies `f` to every queue; all are visited, the first error is
    /// returned.
    fn for_each(&self, f: impl Fn(&ConsumeQueue) -> Result<()>) -> Result<()> {
        let mut first_err = None;
        for (_, _, cq) in self.queues() {
            if let Err(e) = f(&cq) {
                tracing::warn!(dir = %cq.dir().display(), error = %e, "consume queue operation failed");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Msyncs every queue.
    pub fn flush_all(&self) -> Result<()> {
        self.for_each(|cq| cq.flush())
    }

    /// Crash recovery: cuts every queue back to the units with `phys < phys`.
    pub fn truncate_all_phys(&self, phys: u64) -> Result<()> {
        self.for_each(|cq| cq.truncate_phys(phys))
    }

    /// Checks every queue's units (see [`ConsumeQueue::check_units`]).
    pub fn check_all(&self, log_start: u64, log_end: u64) -> Result<()> {
        self.for_each(|cq| cq.check_units(log_start, log_end))
    }

    /// Drops, in every queue, the units below `min_phys` (the CommitLog's new
    /// first offset); see [`ConsumeQueue::purge_below_phys`].
    pub fn purge_below_phys(&self, min_phys: u64) -> Result<()> {
        self.for_each(|cq| cq.purge_below_phys(min_phys))
    }

    /// Removes the topic's queues and its directory. Handles already given
    /// out keep working on the unlinked files until dropped.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        validate_topic(topic)?;
        // Held across the removal so a concurrent get_or_create cannot
        // recreate the directory half way.
        let mut queues = self.write();
        queues.remove(topic);
        let topic_dir = self.dir.join(topic);
        match fs::remove_dir_all(&topic_dir) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io {
                path: topic_dir,
                source: e,
            }),
        }
    }
}

/// The `cq_units_per_file` the ConsumeQueues under `root` (a store's
/// `consumequeue/` directory) were written with, for tools that read a
/// stopped node's store without its config: the distance between two
/// files' names where a queue has two, else what the length of a file
/// holds (a multiple of the units per 512-byte block, at least the
/// setting). `None` without any queue file.
pub fn units_per_file_on_disk(root: &Path) -> Option<u64> {
    let mut by_length = None;
    for topic in fs::read_dir(root).ok()?.flatten() {
        for queue in fs::read_dir(topic.path()).into_iter().flatten().flatten() {
            let mut firsts: Vec<(u64, u64)> = fs::read_dir(queue.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|f| {
                    let first = crate::mapped_file::parse_offset_name(f.file_name().to_str()?)?;
                    Some((first, f.metadata().ok()?.len()))
                })
                .collect();
            firsts.sort_unstable();
            if let [(a, _), (b, _), ..] = firsts[..] {
                return Some(b - a);
            }
            if let Some(&(_, len)) = firsts.first()
                && len > 0
                && len % crate::packed::BLOCK_SIZE == 0
            {
                by_length.get_or_insert(len / crate::packed::BLOCK_SIZE * crate::packed::UNITS_PER_BLOCK);
            }
        }
    }
    by_length
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume_queue::CqUnit;

    const OPTS: MapOptions = MapOptions {
        warm_up: false,
        mlock: false,
    };

    fn unit(phys: u64) -> CqUnit {
        CqUnit {
            phys,
            size: 10,
            tag_hash: 7,
        }
    }

    #[test]
    fn the_units_per_file_are_read_off_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(CONSUME_QUEUE_DIR);
        assert_eq!(units_per_file_on_disk(&root), None);
        let t = QueueTable::open(dir.path(), 30, OPTS, false).unwrap();
        let one = t.get_or_create("One", 0).unwrap();
        one.append(unit(0)).unwrap();
        // One file: what its length holds (two 512-byte blocks of 25).
        assert_eq!(units_per_file_on_disk(&root), Some(50));
        let two = t.get_or_create("Two", 0).unwrap();
        for i in 0..31 {
            two.append(unit(i * 10)).unwrap();
        }
        // Two files of a queue: the distance between their names.
        assert_eq!(units_per_file_on_disk(&root), Some(30));
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<QueueTable>();
    }

    #[test]
    fn topic_validation() {
        let long = "a".repeat(127);
        for ok in ["a", "TopicTest", "%RETRY%group", "a|b", "x_y-z09", long.as_str()] {
            assert!(validate_topic(ok).is_ok(), "{ok:?}");
        }
        let too_long = "a".repeat(128);
        for bad in [
            "",
            too_long.as_str(),
            "a/b",
            "a.b",
            ".",
            "..",
            "a b",
            "é",
            "a\0",
            "a\\b",
            "a*",
        ] {
            match validate_topic(bad) {
                Err(StoreError::BadArgument(msg)) => assert!(msg.contains("1 to 127 characters"), "{msg}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn open_discovers_queues_and_skips_junk() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let table = QueueTable::open(root, 25, OPTS, false).unwrap();
        assert!(table.get("T", 0).is_none());
        assert!(matches!(table.get_or_create("a/b", 0), Err(StoreError::BadArgument(_))));
        let q = table.get_or_create("T", 3).unwrap();
        for i in 0..30 {
            q.append(unit(i * 10)).unwrap();
        }
        assert!(Arc::ptr_eq(&q, &table.get_or_create("T", 3).unwrap()));
        assert!(Arc::ptr_eq(&q, &table.get("T", 3).unwrap()));
        table.get_or_create("T", 1).unwrap().append(unit(5)).unwrap();
        table.get_or_create("%RETRY%g", 0).unwrap();
        table.flush_all().unwrap();
        drop((q, table));

        let cq_dir = root.join(CONSUME_QUEUE_DIR);
        fs::create_dir_all(cq_dir.join("bad.topic/0")).unwrap();
        fs::create_dir_all(cq_dir.join("T/notanumber")).unwrap();
        fs::create_dir_all(cq_dir.join("T/01")).unwrap();
        fs::create_dir_all(cq_dir.join("T/4294967296")).unwrap();
        fs::write(cq_dir.join("T/7"), b"a file").unwrap();
        fs::write(cq_dir.join("stray"), b"a file").unwrap();

        let table = QueueTable::open(root, 25, OPTS, true).unwrap();
        let list: Vec<(String, u32, u64)> = table
            .queues()
            .into_iter()
            .map(|(t, id, cq)| (t, id, cq.max_offset()))
            .collect();
        assert_eq!(
            list,
            [
                ("%RETRY%g".to_owned(), 0, 0),
                ("T".to_owned(), 1, 1),
                ("T".to_owned(), 3, 30)
            ]
        );
        assert_eq!(table.get("T", 3).unwrap().get(29).unwrap(), unit(290));

        table.truncate_all_phys(100).unwrap();
        assert_eq!(table.get("T", 3).unwrap().max_offset(), 10);
        assert_eq!(table.get("T", 1).unwrap().max_offset(), 1);
        table.purge_below_phys(50).unwrap();
        assert_eq!(table.get("T", 3).unwrap().min_offset(), 5);
        assert_eq!(table.get("T", 1).unwrap().min_offset(), 1);
    }

    #[test]
    fn delete_topic_removes_queues_and_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let table = QueueTable::open(root, 25, OPTS, false).unwrap();
        for id in 0..3 {
            table.get_or_create("gone", id).unwrap().append(unit(1)).unwrap();
        }
        table.get_or_create("kept", 0).unwrap().append(unit(2)).unwrap();
        let held = table.get("gone", 1).unwrap();
        table.delete_topic("gone").unwrap();
        table.delete_topic("gone").unwrap();
        table.delete_topic("never").unwrap();
        assert!(matches!(table.delete_topic("../x"), Err(StoreError::BadArgument(_))));
        assert!(table.get("gone", 0).is_none());
        assert!(!root.join(CONSUME_QUEUE_DIR).join("gone").exists());
        assert_eq!(held.get(0).unwrap(), unit(1));
        let names: Vec<_> = table.queues().into_iter().map(|(t, id, _)| (t, id)).collect();
        assert_eq!(names, [("kept".to_owned(), 0)]);
        drop(table);
        let table = QueueTable::open(root, 25, OPTS, false).unwrap();
        assert_eq!(table.queues().len(), 1);
        // Recreating the topic starts afresh.
        assert_eq!(table.get_or_create("gone", 1).unwrap().max_offset(), 0);
    }
}
