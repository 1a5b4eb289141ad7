//! Where a node's data lives on disk: the names of its directories and
//! files, in one place. Each file's byte layout is documented beside its
//! codec ([`crate::record`], [`crate::checkpoint`], [`crate::consume_queue`],
//! [`crate::key_index`]).
//!
//! ```text
//! <dir>/commitlog/<20-digit start offset>       segments (record::*)
//! <dir>/commitlog/<20-digit start offset>.next  the next segment, made ahead (prefault); removed at open
//! <dir>/consumequeue/<topic>/<queue>/<20-digit first queue offset>
//! <dir>/index/<20-digit first physical offset>  key index files
//! <dir>/checkpoint                              checkpoint::*
//! <dir>/abort                                   present while the store is open
//! <dir>/lock                                    held (flock) by the process that has the store open
//! ```
//!
//! The Raft layer keeps its own files under `<dir>/raft/` (vote, log index,
//! snapshot); see `raftmq-raft`.

/// Directory of the CommitLog's segments.
pub const COMMITLOG_DIR: &str = "commitlog";
/// Name suffix of a CommitLog segment created ahead of need and not yet in
/// use (`<start>.next`, see `prefault`); renamed into place at the roll,
/// removed at open.
pub const SPARE_SEGMENT_SUFFIX: &str = ".next";
/// Directory of the ConsumeQueues, one subdirectory per topic and queue.
pub const CONSUME_QUEUE_DIR: &str = "consumequeue";
/// Directory of the key index files.
pub const INDEX_DIR: &str = "index";
/// The checkpoint file.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// Exists while a store is open; found at start-up, it means the last stop
/// was a crash and recovery must re-check the tail.
pub const ABORT_FILE: &str = "abort";
/// Locked by the process that has the store open, so that no second one
/// opens it.
pub const LOCK_FILE: &str = "lock";
