//! `raftmq store verify`: an offline look at a store directory.

use std::fmt;
use std::path::Path;

use anyhow::Context;
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
    pub queues: Vec<QueueSummary>,
}

#[derive(Debug, Serialize)]
pub struct QueueSummary {
    pub topic: String,
    pub queue_id: u32,
    pub min_offset: u64,
    pub max_offset: u64,
}

/// Opens the store (recovering it if needed), reads every record and closes
/// it cleanly.
/// `segment_size` defaults to the one recorded in the store's checkpoint.
pub fn verify(dir: &Path, segment_size: Option<u64>) -> anyhow::Result<Summary> {
    if !dir.join(raftmq_store::commitlog::COMMITLOG_DIR).is_dir() {
        anyhow::bail!(
            "{} holds no store (no {}/ directory); pass a broker's data directory",
            dir.display(),
            raftmq_store::commitlog::COMMITLOG_DIR
        );
    }
    if dir.join(raftmq_store::store::ABORT_FILE).exists() {
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
    let cfg = StoreConfig {
        segment_size,
        // The largest any store may hold, so no valid record is mistaken for
        // a torn one whatever limit the store was written with.
        max_record_size: (raftmq_store::record::MAX_RECORD_LEN as u64)
            .min(segment_size.saturating_sub(raftmq_store::record::EOS_LEN as u64)),
        ..defaults
    };
    let store = Store::open(dir, &cfg).with_context(|| format!("opening the store in {}", dir.display()))?;
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
    for (topic, queue_id, cq) in store.queues().queues() {
        s.queues.push(QueueSummary {
            topic,
            queue_id,
            min_offset: cq.min_offset(),
            max_offset: cq.max_offset(),
        });
    }
    store.close().context("closing the store")?;
    Ok(s)
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
