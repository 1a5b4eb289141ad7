//! openraft's own storage conformance suite, run against the log storage
//! on the CommitLog and the state machine.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use raftmq_raft::{LogStore, StateMachine, TypeConfig};
use raftmq_store::{FlushMode, Store, StoreConfig};

struct Builder {
    flush_mode: FlushMode,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = StoreConfig {
            flush_mode: self.flush_mode,
            ..StoreConfig::small_for_tests()
        };
        let store = Store::open(dir.path(), &cfg).expect("store");
        let raft_dir = dir.path().join("raft");
        let log = LogStore::open(store, &raft_dir).expect("log store");
        let sm = StateMachine::open(log.clone(), &raft_dir).expect("state machine");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_async_flush() {
    Suite::test_all(Builder {
        flush_mode: FlushMode::Async,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_sync_flush() {
    Suite::test_all(Builder {
        flush_mode: FlushMode::Sync,
    })
    .await
    .unwrap();
}
