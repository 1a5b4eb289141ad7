//! The Store as a whole: dispatch into ConsumeQueues and the key index,
//! rebuild after a crash, timestamp and key lookups, retention.

use std::collections::BTreeMap;

use raftmq_store::retention::{Clock, DiskProbe, DiskUsage, Reason};
use raftmq_store::{Dispatch, Dispatcher, NewRecord, RecordMeta, RecordRef, Result, Store, StoreConfig, StoreError};

/// A toy message format for these tests: records hold messages encoded as
/// `u32 len | u64 timestamp | u32 queue | u8 topic len | topic | u8 key len | key | body`.
#[derive(Debug, Clone)]
struct Msg {
    ts: u64,
    queue: u32,
    topic: String,
    key: String,
    body: Vec<u8>,
}

fn encode(msgs: &[Msg]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        let len = 4 + 8 + 4 + 1 + m.topic.len() + 1 + m.key.len() + m.body.len();
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&m.ts.to_le_bytes());
        out.extend_from_slice(&m.queue.to_le_bytes());
        out.push(m.topic.len() as u8);
        out.extend_from_slice(m.topic.as_bytes());
        out.push(m.key.len() as u8);
        out.extend_from_slice(m.key.as_bytes());
        out.extend_from_slice(&m.body);
    }
    out
}

/// Stands in for the tag hash the broker will compute.
fn tag_hash(topic: &str) -> u64 {
    topic
        .bytes()
        .fold(17u64, |h, x| h.wrapping_mul(31).wrapping_add(x as u64))
}

fn timestamp_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[4..12].try_into().unwrap())
}

struct ToyDispatcher;

impl Dispatcher for ToyDispatcher {
    fn decode<'r>(&mut self, record: &'r RecordRef) -> Result<Vec<Dispatch<'r>>> {
        let p = record.payload();
        let mut out = Vec::new();
        let mut i = 0;
        while i < p.len() {
            let len = u32::from_le_bytes(p[i..i + 4].try_into().unwrap()) as usize;
            let m = &p[i..i + len];
            let ts = u64::from_le_bytes(m[4..12].try_into().unwrap());
            let queue = u32::from_le_bytes(m[12..16].try_into().unwrap());
            let tl = m[16] as usize;
            let topic = std::str::from_utf8(&m[17..17 + tl]).unwrap();
            let kl = m[17 + tl] as usize;
            let key = &m[18 + tl..18 + tl + kl];
            out.push(Dispatch {
                topic,
                queue_id: queue,
                phys: record.payload_offset() + i as u64,
                size: len as u32,
                tag_hash: tag_hash(topic),
                store_timestamp_ms: ts,
                keys: vec![key],
            });
            i += len;
        }
        Ok(out)
    }
}

fn cfg() -> StoreConfig {
    StoreConfig {
        segment_size: 16 * 1024,
        max_record_size: 8 * 1024,
        ..StoreConfig::small_for_tests()
    }
}

fn msgs(batch: u64) -> Vec<Msg> {
    (0..3)
        .map(|j| {
            let n = batch * 3 + j;
            Msg {
                ts: 1_000_000 + n * 1000,
                queue: (n % 4) as u32,
                topic: if n.is_multiple_of(5) {
                    "Orders".into()
                } else {
                    "Events".into()
                },
                key: format!("key-{}", n % 50),
                body: vec![n as u8; 100 + (n as usize % 200)],
            }
        })
        .collect()
}

/// Appends and dispatches `batches` records the way a state machine would.
fn produce(store: &Store, from: u64, batches: u64) {
    for b in from..from + batches {
        let payload = encode(&msgs(b));
        let meta = RecordMeta {
            term: 1,
            index: b + 1,
            kind: 1,
        };
        let appended = store
            .commitlog()
            .append(&[NewRecord {
                meta,
                payload: &payload,
            }])
            .unwrap();
        let record = store.commitlog().read(appended.offsets[0]).unwrap();
        for d in ToyDispatcher.decode(&record).unwrap() {
            store.dispatch(&d).unwrap();
        }
        store.mark_dispatched(record.end());
    }
}

/// Every queue's units (phys, size, tag hash), by (topic, queue id).
type QueueSnapshot = BTreeMap<(String, u32), Vec<(u64, u32, u64)>>;

fn snapshot(store: &Store) -> QueueSnapshot {
    store
        .queues()
        .queues()
        .into_iter()
        .map(|(topic, q, cq)| {
            let units = (cq.min_offset()..cq.max_offset())
                .map(|o| {
                    let u = cq.get(o).unwrap();
                    (u.phys, u.size, u.tag_hash)
                })
                .collect();
            ((topic, q), units)
        })
        .collect()
}

#[test]
fn consume_queues_rebuilt_after_a_crash_match_the_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    produce(&store, 0, 300);
    let live = snapshot(&store);
    assert_eq!(live.len(), 8, "two topics x four queues");
    // The indexes were last flushed somewhere in the middle; then the
    // process dies (no close: the abort marker stays).
    store.flush_indexes().unwrap();
    produce(&store, 300, 100);
    let live_after = snapshot(&store);
    drop(store);

    let store = Store::open(dir.path(), &cfg()).unwrap();
    assert!(store.recovered_from_crash());
    assert!(store.dispatched_offset() < store.commitlog().max_offset());
    let n = store.redispatch(&mut ToyDispatcher).unwrap();
    assert_eq!(
        n, 300,
        "the 100 records after the last index flush are dispatched again"
    );
    assert_eq!(snapshot(&store), live_after);
    assert!(live_after.iter().all(|(k, v)| v.starts_with(&live[k])));

    // Messages read back through their unit, and by key.
    let (unit, bytes) = store.message("Events", 1, 10).unwrap();
    assert_eq!(bytes.len() as u32, unit.size);
    let hits = store.query_key(b"key-7", 0, u64::MAX, 100).unwrap();
    assert_eq!(hits.len(), 24, "key-7 is used by messages 7, 57, ..., 1157");
    assert!(hits.windows(2).all(|w| w[0] > w[1]), "newest first");
    store.close().unwrap();

    let store = Store::open(dir.path(), &cfg()).unwrap();
    assert!(!store.recovered_from_crash());
    assert_eq!(
        store.redispatch(&mut ToyDispatcher).unwrap(),
        0,
        "a clean stop leaves nothing to redo"
    );
    assert_eq!(snapshot(&store), live_after);
}

#[test]
fn timestamp_search_finds_the_first_message_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    produce(&store, 0, 100);
    let cq = store.queue("Events", 1).unwrap();
    let ts_of = |u: &raftmq_store::CqUnit| -> Result<u64> {
        Ok(timestamp_of(&store.commitlog().read_bytes(u.phys, u64::from(u.size))?))
    };
    for probe in [0, 1_000_000, 1_050_500, 1_120_000, u64::MAX] {
        let found = cq.find_by_timestamp(probe, ts_of).unwrap();
        let expected = (cq.min_offset()..cq.max_offset())
            .find(|&o| ts_of(&cq.get(o).unwrap()).unwrap() >= probe)
            .unwrap_or(cq.max_offset());
        assert_eq!(found, expected, "timestamp {probe}");
    }
}

struct FakeClock(u64, u8);
impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
    fn local_hour(&self, _: u64) -> u8 {
        self.1
    }
}
struct FakeDisk(f64);
impl DiskProbe for FakeDisk {
    fn usage(&self, _: &std::path::Path) -> Result<DiskUsage> {
        Ok(DiskUsage {
            total_bytes: 1 << 30,
            used_bytes: ((1u64 << 30) as f64 * self.0) as u64,
        })
    }
}

#[test]
fn retention_deletes_segments_and_the_indexes_below_them() {
    let dir = tempfile::tempdir().unwrap();
    // The default watermarks (warn 75 %, force 85 %, refuse 90 %), which
    // `small_for_tests` turns off.
    let cfg = StoreConfig {
        retention: Default::default(),
        ..cfg()
    };
    let store = Store::open(dir.path(), &cfg).unwrap();
    produce(&store, 0, 400);
    let segments = store.commitlog().segment_infos().unwrap().len();
    assert!(segments > 5);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    // Nothing is old, the disk is fine: nothing happens.
    let plan = store
        .enforce_retention(&FakeClock(now, 4), &FakeDisk(0.5), u64::MAX)
        .unwrap();
    assert_eq!(plan.reason, Reason::Nothing);

    // 73 hours later at 04:00, everything but the active segment expired.
    let later = now + 73 * 3600 * 1000;
    let plan = store
        .enforce_retention(&FakeClock(later, 4), &FakeDisk(0.5), u64::MAX)
        .unwrap();
    assert_eq!(plan.reason, Reason::Expired);
    assert_eq!(store.commitlog().segment_infos().unwrap().len(), 1);
    let min = store.commitlog().min_offset();
    for (_, _, cq) in store.queues().queues() {
        if cq.min_offset() < cq.max_offset() {
            assert!(cq.get(cq.min_offset()).unwrap().phys >= min);
        }
        assert!(matches!(cq.get(0), Err(StoreError::OutOfRange { .. })));
    }
    assert!(
        store
            .query_key(b"key-1", 0, u64::MAX, 100)
            .unwrap()
            .iter()
            .all(|&p| p >= min)
    );

    // Above 90 % disk use the log is marked full (new sends are refused by
    // whoever admits them), and unmarked below; both retention and the
    // cheap disk watch set the mark.
    produce(&store, 400, 10);
    store
        .enforce_retention(&FakeClock(now, 12), &FakeDisk(0.95), 0)
        .unwrap();
    assert!(store.commitlog().disk_full().is_some_and(|(used, limit)| used > limit));
    store.enforce_retention(&FakeClock(now, 12), &FakeDisk(0.5), 0).unwrap();
    assert_eq!(store.commitlog().disk_full(), None);
    assert_eq!(
        store.watch_disk(&FakeDisk(0.95)).unwrap(),
        store.commitlog().disk_full()
    );
    assert!(store.commitlog().disk_full().is_some());
    assert_eq!(store.watch_disk(&FakeDisk(0.89)).unwrap(), None);
    assert_eq!(store.commitlog().disk_full(), None);
}

#[test]
fn a_store_cannot_be_opened_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let err = Store::open(dir.path(), &cfg()).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    store.close().unwrap();
    drop(store);
    Store::open(dir.path(), &cfg()).unwrap().close().unwrap();
}

#[test]
fn dispatching_a_record_again_finds_what_the_first_try_indexed() {
    // An apply that ran out of disk space half-way is tried again whole:
    // the messages it had indexed must keep their offsets, not get twins.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    produce(&store, 0, 3);
    let before = snapshot(&store);
    let payload = encode(&msgs(3));
    let appended = store
        .commitlog()
        .append(&[NewRecord {
            meta: RecordMeta {
                term: 1,
                index: 4,
                kind: 1,
            },
            payload: &payload,
        }])
        .unwrap();
    let record = store.commitlog().read(appended.offsets[0]).unwrap();
    let dispatches = ToyDispatcher.decode(&record).unwrap();
    assert!(dispatches.len() > 1);
    // The first try got half-way; the second does it all.
    let half: Vec<u64> = dispatches[..dispatches.len() / 2]
        .iter()
        .map(|d| store.dispatch(d).unwrap())
        .collect();
    let all: Vec<u64> = dispatches.iter().map(|d| store.dispatch(d).unwrap()).collect();
    assert_eq!(&all[..half.len()], &half[..]);
    let after = snapshot(&store);
    let added: usize = after.values().map(Vec::len).sum::<usize>() - before.values().map(Vec::len).sum::<usize>();
    assert_eq!(added, dispatches.len(), "every message once");
    // Its keys are found once each.
    for d in &dispatches {
        let found = store.query_key(d.keys[0], 0, u64::MAX, 100).unwrap();
        assert_eq!(found.iter().filter(|&&p| p == d.phys).count(), 1, "{:?}", d.keys[0]);
    }
}
