//! `raftmq store verify` and `raftmq store dump`: an offline look at a store
//! directory.

use std::fmt;
use std::path::Path;

use anyhow::Context;
use raftmq_store::record::HEADER_LEN;
use raftmq_store::{Store, StoreConfig};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub dir: String,
    pub recovered_from_crash: bool,
    pub min_offset: u64,
    pub max_offset: u64,
    pub records: u64,
    pub payload_bytes: u64,
    pub first_index: Option<u64>,
    pub last_index: Option<u64>,
    pub last_term: Option<u64>,
    pub dispatched_offset: u64,
    /// The last committed Raft log index the node persisted
    /// (`raft/committed.json`), if any.
    pub committed_index: Option<u64>,
    pub queues: Vec<QueueSummary>,
}

#[derive(Debug, Serialize)]
pub struct QueueSummary {
    pub topic: String,
    pub queue_id: u32,
    pub min_offset: u64,
    pub max_offset: u64,
}

/// Opens a stopped broker's store for reading; `segment_size` defaults to
/// the one recorded in the store's checkpoint.
fn open(dir: &Path, segment_size: Option<u64>) -> anyhow::Result<Store> {
    if !dir.join(raftmq_store::layout::COMMITLOG_DIR).is_dir() {
        anyhow::bail!(
            "{} holds no store (no {}/ directory); pass a broker's data directory",
            dir.display(),
            raftmq_store::layout::COMMITLOG_DIR
        );
    }
    if dir.join(raftmq_store::layout::ABORT_FILE).exists() {
        anyhow::bail!(
            "the last stop of the store in {} was a crash; start its broker to recover it \
             (verify reads clean stores only, since recovery here could not repair the Raft log index)",
            dir.display()
        );
    }
    let defaults = StoreConfig::default();
    let recorded = raftmq_store::checkpoint::CheckpointFile::load(dir)?
        .1
        .map(|c| c.segment_size)
        .filter(|&s| s != 0);
    let segment_size = segment_size.or(recorded).unwrap_or(defaults.segment_size);
    let cq_units_per_file =
        raftmq_store::queue_table::units_per_file_on_disk(&dir.join(raftmq_store::layout::CONSUME_QUEUE_DIR))
            .unwrap_or(defaults.cq_units_per_file);
    let cfg = StoreConfig {
        segment_size,
        cq_units_per_file,
        // The largest any store may hold, so no valid record is mistaken for
        // a torn one whatever limit the store was written with.
        max_record_size: (raftmq_store::record::MAX_RECORD_LEN as u64)
            .min(segment_size.saturating_sub(raftmq_store::record::EOS_LEN as u64)),
        ..defaults
    };
    Store::open(dir, &cfg).with_context(|| format!("opening the store in {}", dir.display()))
}

/// Runs `f` on the store opened in `dir`, then closes it cleanly whatever
/// `f` returned: a failed read must not leave the store looking crashed.
fn with_store<T>(
    dir: &Path,
    segment_size: Option<u64>,
    f: impl FnOnce(&Store) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let store = open(dir, segment_size)?;
    let out = f(&store);
    let closed = store.close().context("closing the store");
    let out = out?;
    closed?;
    Ok(out)
}

/// Opens the store (recovering it if needed), reads every record and every
/// ConsumeQueue unit, and closes it cleanly. Damage the node noted while it
/// ran (`damaged`, set aside at its next start) is an error too.
pub fn verify(dir: &Path, segment_size: Option<u64>) -> anyhow::Result<Summary> {
    let committed_index = raftmq_raft::raft_meta::committed_index(&dir.join("raft"))
        .with_context(|| format!("reading {}/raft", dir.display()))?;
    if let Some(note) = raftmq_raft::quarantine::noted_damage(dir) {
        anyhow::bail!(
            "the node found its store damaged while it ran ({}): started, a node with peers sets the store \
             aside to be sent the log again by its group (a node without peers keeps it: remove the \
             `damaged` note once you have dealt with it)",
            note.trim().replace('\n', "; ")
        );
    }
    with_store(dir, segment_size, |store| {
        let log = store.commitlog();
        let mut s = Summary {
            dir: dir.display().to_string(),
            recovered_from_crash: store.recovered_from_crash(),
            min_offset: log.min_offset(),
            max_offset: log.max_offset(),
            records: 0,
            payload_bytes: 0,
            first_index: None,
            last_index: None,
            last_term: None,
            dispatched_offset: store.dispatched_offset(),
            committed_index,
            queues: Vec::new(),
        };
        for record in log.iter_from(log.min_offset()) {
            let record = record.context("reading the log")?;
            s.records += 1;
            s.payload_bytes += record.payload().len() as u64;
            s.first_index.get_or_insert(record.meta().index);
            s.last_index = Some(record.meta().index);
            s.last_term = Some(record.meta().term);
        }
        // Every unit, its block's seal checked (a running node checks a
        // block only when it reads it).
        store
            .queues()
            .check_all(log.min_offset(), store.dispatched_offset())
            .context("checking the consume queues")?;
        for (topic, queue_id, cq) in store.queues().queues() {
            s.queues.push(QueueSummary {
                topic,
                queue_id,
                min_offset: cq.min_offset(),
                max_offset: cq.max_offset(),
            });
        }
        Ok(s)
    })
}

/// One record's identity, as `raftmq store dump` prints it (one JSON object
/// per line).
#[derive(Debug, Serialize)]
pub struct DumpedRecord {
    pub index: u64,
    pub term: u64,
    pub kind: u8,
    /// The stored CRC32 of the record's header fields and payload.
    pub crc: u32,
    pub len: u64,
}

/// Writes every record's identity, oldest first, so replicas' logs can be
/// compared record by record (the jepsen harness does).
pub fn dump(dir: &Path, segment_size: Option<u64>, out: &mut dyn std::io::Write) -> anyhow::Result<u64> {
    with_store(dir, segment_size, |store| {
        let log = store.commitlog();
        let mut n = 0;
        for record in log.iter_from(log.min_offset()) {
            let record = record.context("reading the log")?;
            let meta = record.meta();
            let line = DumpedRecord {
                index: meta.index,
                term: meta.term,
                kind: meta.kind,
                crc: record.crc(),
                len: (HEADER_LEN + record.payload().len()) as u64,
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
            n += 1;
        }
        out.flush()?;
        Ok(n)
    })
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        writeln!(f, "store            {}", self.dir)?;
        writeln!(
            f,
            "last stop        {}",
            if self.recovered_from_crash {
                "crash (recovered)"
            } else {
                "clean"
            }
        )?;
        writeln!(f, "offsets          [{}, {})", self.min_offset, self.max_offset)?;
        writeln!(
            f,
            "records          {} ({} payload bytes), all CRCs valid",
            self.records, self.payload_bytes
        )?;
        writeln!(
            f,
            "raft indexes     {} .. {} (last term {})",
            opt(self.first_index),
            opt(self.last_index),
            opt(self.last_term)
        )?;
        writeln!(f, "dispatched up to {}", self.dispatched_offset)?;
        writeln!(f, "committed index  {}", opt(self.committed_index))?;
        writeln!(f, "queues           {}", self.queues.len())?;
        for q in &self.queues {
            writeln!(
                f,
                "  {}/{}  offsets [{}, {})",
                q.topic, q.queue_id, q.min_offset, q.max_offset
            )?;
        }
        Ok(())
    }
}
