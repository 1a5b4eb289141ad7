//! The store's typed configuration, with defaults and validation.
//!
//! It deserializes from the `[store]` table of a broker's TOML config;
//! unknown keys are rejected by serde with a message naming the key.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::record;

/// When appended records count as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Durable once copied into the mapped pages (a process crash loses
    /// nothing; a machine crash may lose up to one flush interval). A
    /// background flusher msyncs every `flush_interval_ms`.
    ///
    /// For a Raft group this is RocketMQ's ASYNC_FLUSH trade-off: a
    /// committed write survives process crashes of any number of nodes, but
    /// a power loss on one node combined with a crash of another within the
    /// flush interval can lose it. Use `Sync` for Raft's full guarantee.
    #[default]
    Async,
    /// Durable once msynced. Concurrent appenders share one msync (group
    /// commit). With Raft, a committed write survives the loss (power
    /// included) of any minority of the group.
    Sync,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Size of one CommitLog segment file in bytes. All replicas of a group
    /// must use the same value: it decides where records land.
    pub segment_size: u64,
    /// Upper bound of one record (header included); bounds every length read
    /// from disk.
    pub max_record_size: u64,
    pub flush_mode: FlushMode,
    /// Background flush period in async mode.
    pub flush_interval_ms: u64,
    /// How often the indexes (ConsumeQueues, key index) are msynced and the
    /// checkpoint's dispatched mark moved up to them. They are rebuilt from
    /// the CommitLog above that mark at a restart, so this only bounds the
    /// re-dispatch; it is longer than `flush_interval_ms` because every
    /// msync write-protects the pages it cleaned, and the key index's slot
    /// table, written at random, then takes a page fault per page on the
    /// next writes (RocketMQ flushes its ConsumeQueues every second too).
    pub index_flush_interval_ms: u64,
    /// How often the `checkpoint` file is rewritten (it only bounds how much
    /// recovery must rescan).
    pub checkpoint_interval_ms: u64,
    /// Touch every page of a new CommitLog segment before writing to it.
    pub warm_up: bool,
    /// `mlock` mapped CommitLog segments (index files are not locked).
    pub mlock: bool,
    /// ConsumeQueue units per file (a multiple of 25, see `packed`).
    pub cq_units_per_file: u64,
    /// Hash slots per key-index file.
    pub index_slots: u64,
    /// Entries per key-index file.
    pub index_entries: u64,
    pub retention: RetentionConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            segment_size: 1 << 30,
            max_record_size: 8 << 20,
            flush_mode: FlushMode::Async,
            flush_interval_ms: 200,
            index_flush_interval_ms: 1000,
            checkpoint_interval_ms: 1000,
            warm_up: false,
            mlock: false,
            cq_units_per_file: 300_000,
            index_slots: 5_000_000,
            index_entries: 20_000_000,
            retention: RetentionConfig::default(),
        }
    }
}

/// Smallest segment a test may configure.
pub const MIN_SEGMENT_SIZE: u64 = 4096;

impl StoreConfig {
    /// A configuration with tiny files, for tests that want segments and
    /// queue files to roll often.
    pub fn small_for_tests() -> Self {
        StoreConfig {
            segment_size: 64 * 1024,
            max_record_size: 16 * 1024,
            cq_units_per_file: 100,
            index_slots: 64,
            index_entries: 200,
            // The host's disk use must not decide a test: retention that
            // acts on it has tests of its own, with a fake disk.
            retention: RetentionConfig {
                disk_warn_ratio: 1.0,
                disk_force_ratio: 1.0,
                disk_refuse_ratio: 1.0,
                ..RetentionConfig::default()
            },
            ..StoreConfig::default()
        }
    }

    pub fn flush_interval(&self) -> Duration {
        Duration::from_millis(self.flush_interval_ms)
    }

    pub fn index_flush_interval(&self) -> Duration {
        Duration::from_millis(self.index_flush_interval_ms)
    }

    pub fn checkpoint_interval(&self) -> Duration {
        Duration::from_millis(self.checkpoint_interval_ms)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(StoreError::BadArgument(msg));
        if self.segment_size < MIN_SEGMENT_SIZE {
            return bad(format!(
                "segment_size {} is below the minimum {MIN_SEGMENT_SIZE}",
                self.segment_size
            ));
        }
        if self.max_record_size < record::HEADER_LEN as u64 || self.max_record_size > record::MAX_RECORD_LEN as u64 {
            return bad(format!(
                "max_record_size {} must be between {} and {}",
                self.max_record_size,
                record::HEADER_LEN,
                record::MAX_RECORD_LEN
            ));
        }
        if self.max_record_size + record::EOS_LEN as u64 > self.segment_size {
            return bad(format!(
                "max_record_size {} plus the {}-byte end-of-segment marker must fit in segment_size {}",
                self.max_record_size,
                record::EOS_LEN,
                self.segment_size
            ));
        }
        if self.flush_interval_ms == 0 {
            return bad("flush_interval_ms must be positive".into());
        }
        if self.index_flush_interval_ms == 0 {
            return bad("index_flush_interval_ms must be positive".into());
        }
        if self.checkpoint_interval_ms == 0 {
            return bad("checkpoint_interval_ms must be positive".into());
        }
        if self.cq_units_per_file == 0 || !self.cq_units_per_file.is_multiple_of(crate::packed::UNITS_PER_BLOCK) {
            return bad(format!(
                "cq_units_per_file {} must be a positive multiple of {}",
                self.cq_units_per_file,
                crate::packed::UNITS_PER_BLOCK
            ));
        }
        if self.index_slots == 0 || self.index_slots > u32::MAX as u64 {
            return bad(format!(
                "index_slots {} must be between 1 and {}",
                self.index_slots,
                u32::MAX
            ));
        }
        if self.index_entries == 0 || self.index_entries >= u32::MAX as u64 {
            return bad(format!(
                "index_entries {} must be between 1 and {}",
                self.index_entries,
                u32::MAX - 1
            ));
        }
        self.retention.validate()
    }
}

/// When whole CommitLog segments are deleted. Defaults follow RocketMQ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Segments whose last write is older than this are expired.
    pub file_reserved_hours: u64,
    /// Local hour of the day (0-23) at which expired segments are deleted.
    pub delete_when_hour: u8,
    /// Above this disk use, expired segments are deleted at any hour.
    pub disk_warn_ratio: f64,
    /// Above this disk use, the oldest segments are deleted even if not
    /// expired.
    pub disk_force_ratio: f64,
    /// Above this disk use, appends are refused.
    pub disk_refuse_ratio: f64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            file_reserved_hours: 72,
            delete_when_hour: 4,
            disk_warn_ratio: 0.75,
            disk_force_ratio: 0.85,
            disk_refuse_ratio: 0.90,
        }
    }
}

impl RetentionConfig {
    pub fn validate(&self) -> Result<()> {
        if self.delete_when_hour > 23 {
            return Err(StoreError::BadArgument(format!(
                "retention.delete_when_hour {} must be 0-23",
                self.delete_when_hour
            )));
        }
        // Refusing writes before deleting unconsumed data for room (force
        // above refuse, 1.0 for never) is a choice an operator may make.
        let ok = 0.0 < self.disk_warn_ratio
            && self.disk_warn_ratio <= self.disk_force_ratio
            && self.disk_warn_ratio <= self.disk_refuse_ratio
            && self.disk_force_ratio <= 1.0
            && self.disk_refuse_ratio <= 1.0;
        if !ok {
            return Err(StoreError::BadArgument(format!(
                "retention ratios must satisfy 0 < warn ({}) <= force ({}) <= 1 and warn <= refuse ({}) <= 1",
                self.disk_warn_ratio, self.disk_force_ratio, self.disk_refuse_ratio
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        StoreConfig::default().validate().unwrap();
        StoreConfig::small_for_tests().validate().unwrap();
        let cfg = StoreConfig {
            segment_size: 100,
            ..StoreConfig::default()
        };
        assert!(cfg.validate().unwrap_err().to_string().contains("segment_size"));
        let cfg = StoreConfig {
            cq_units_per_file: 30,
            ..StoreConfig::default()
        };
        assert!(cfg.validate().unwrap_err().to_string().contains("cq_units_per_file"));
        // Refuse before force (never delete for room) is allowed; warn
        // above either is not.
        let retention = |warn, force, refuse| RetentionConfig {
            disk_warn_ratio: warn,
            disk_force_ratio: force,
            disk_refuse_ratio: refuse,
            ..RetentionConfig::default()
        };
        retention(0.75, 1.0, 0.9).validate().unwrap();
        assert!(retention(0.95, 1.0, 0.9).validate().is_err());
        assert!(retention(0.75, 1.1, 0.9).validate().is_err());
    }
}
