//! raftmq-store: the storage engine of a raftmq broker node.
//!
//! It knows nothing of Raft or gRPC: it stores opaque records (one per Raft
//! entry, written once) and the indexes a message broker needs over them.
//!
//! # Module map
//!
//! | module            | what it holds                                                        |
//! |-------------------|----------------------------------------------------------------------|
//! | [`record`]        | the record codec: header layout, CRC, end-of-segment marker          |
//! | `mapped_file`     | a preallocated, memory-mapped file (segments and index files)        |
//! | `prefault`        | the thread that faults pages in ahead of writers; the next segment made ahead |
//! | `locks`, `le`     | poison-tolerant lock helpers; little-endian field access             |
//! | `packed`          | sector-packed 20-byte unit arrays (ConsumeQueue, key index); block seals |
//! | [`commitlog`]     | the CommitLog: segments, append, zero-copy reads, truncate, purge; its flusher (group commit) and the start-up recovery scan |
//! | [`checkpoint`]    | the `checkpoint` file: how far data and indexes are known durable    |
//! | [`consume_queue`] | one queue's index: queue offset -> (physical offset, size, tag hash)  |
//! | [`queue_table`]   | all ConsumeQueues of a node, by topic and queue id                    |
//! | [`key_index`]     | hash index from message key to physical offsets                      |
//! | [`retention`]     | which segments to delete, by age and disk-use watermarks             |
//! | [`store`]         | [`Store`]: all of the above, the `abort` marker, dispatch, recovery   |
//! | [`layout`]        | the names of a node's directories and files, and where they sit      |
//! | [`config`]        | typed configuration with defaults and validation                    |
//! | [`error`]         | [`StoreError`]                                                        |
//!
//! # Data flow
//!
//! ```text
//!  append(records) ──► CommitLog segments ──► flusher (msync, group commit)
//!                          │      ▲                     │
//!                          │      └── read(offset) ◄─── readers (zero-copy views)
//!                          ▼
//!  dispatch(entry) ──► ConsumeQueue (topic, queue) ──► queue offset
//!                 └──► key index (key -> physical offset)
//!
//!  open(): abort marker? ──► recovery scan from checkpoint ──► truncate at the
//!          first torn record ──► cut indexes back to the dispatch checkpoint
//! ```
//!
//! The on-disk layout of one node is in [`layout`].

pub mod checkpoint;
pub mod commitlog;
pub mod config;
pub mod consume_queue;
pub mod error;
pub mod key_index;
pub mod layout;
mod le;
mod locks;
mod mapped_file;
mod packed;
mod prefault;
pub mod queue_table;
pub mod record;
pub mod retention;
pub mod store;

pub use commitlog::{Appended, CommitLog, LogSlice, NewRecord, RecordRef};
pub use commitlog::{FLUSH_BUCKETS_US, FlushLatency};
pub use config::{FlushMode, RetentionConfig, StoreConfig};
pub use consume_queue::{ConsumeQueue, CqUnit};
pub use error::{Result, StoreError};
pub use key_index::KeyIndex;
pub use queue_table::QueueTable;
pub use record::RecordMeta;
pub use store::{Dispatch, Dispatcher, Store};
