//! CommitLog behaviour through its public API, on real files.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use raftmq_store::{CommitLog, FlushMode, NewRecord, RecordMeta, StoreConfig, StoreError};

fn cfg(segment_size: u64) -> StoreConfig {
    StoreConfig {
        segment_size,
        max_record_size: 1024,
        ..StoreConfig::small_for_tests()
    }
}

fn meta(i: u64) -> RecordMeta {
    RecordMeta {
        term: 1 + i / 10,
        index: i + 1,
        kind: (i % 3) as u8,
    }
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// Appends `n` records of `len` bytes one by one; returns their offsets.
fn fill(log: &CommitLog, from: u64, n: u64, len: usize) -> Vec<u64> {
    (from..from + n)
        .map(|i| {
            let p = payload(i, len);
            log.append(&[NewRecord {
                meta: meta(i),
                payload: &p,
            }])
            .unwrap()
            .offsets[0]
        })
        .collect()
}

fn segment_files(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        // The next segment, made ahead in the background, is not in use.
        .filter(|n| !n.ends_with(raftmq_store::layout::SPARE_SEGMENT_SUFFIX))
        .collect();
    names.sort();
    names
}

#[test]
fn segments_roll_and_reads_cross_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    let offsets = fill(&log, 0, 40, 300);
    // 332-byte records: 12 fit in 4096 - 8, so a segment holds 12 records.
    assert_eq!(offsets[11], 11 * 332);
    assert_eq!(offsets[12], 4096, "the 13th record starts the second segment");
    assert_eq!(segment_files(dir.path()).len(), 4);
    assert_eq!(segment_files(dir.path())[1], "00000000000000004096");
    for (i, &off) in offsets.iter().enumerate() {
        let r = log.read(off).unwrap();
        assert_eq!(r.meta(), meta(i as u64));
        assert_eq!(r.payload(), &payload(i as u64, 300)[..]);
    }
    let all: Vec<_> = log.iter_from(0).map(|r| r.unwrap().offset()).collect();
    assert_eq!(all, offsets);
    assert!(matches!(log.read(log.max_offset()), Err(StoreError::OutOfRange { .. })));
    assert!(
        matches!(log.read(5), Err(StoreError::Corrupt { .. })),
        "not a record boundary"
    );
    assert!(
        log.read(11 * 332 + 332).is_err(),
        "an end-of-segment marker is not a record"
    );

    // A batch is all-or-nothing.
    let big = vec![0u8; 2000];
    let before = log.max_offset();
    let err = log
        .append(&[
            NewRecord {
                meta: meta(99),
                payload: b"ok",
            },
            NewRecord {
                meta: meta(100),
                payload: &big,
            },
        ])
        .unwrap_err();
    assert!(matches!(err, StoreError::BadArgument(_)));
    assert_eq!(log.max_offset(), before);

    log.close().unwrap();
    assert!(matches!(
        log.append(&[NewRecord {
            meta: meta(1),
            payload: b"x"
        }]),
        Err(StoreError::Closed)
    ));
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    assert_eq!(log.max_offset(), before);
    assert_eq!(log.iter_from(0).count(), 40);
}

#[test]
fn truncate_at_and_off_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    let offsets = fill(&log, 0, 30, 300);
    assert!(matches!(
        log.truncate(offsets[20] + 1),
        Err(StoreError::NotRecordBoundary { .. })
    ));
    assert!(matches!(
        log.truncate(log.max_offset() + 1),
        Err(StoreError::OutOfRange { .. })
    ));
    log.truncate(offsets[20]).unwrap();
    assert_eq!(log.max_offset(), offsets[20]);
    assert_eq!(log.iter_from(0).count(), 20);
    // Truncating at a segment start leaves that segment empty; deleting the
    // next ones.
    log.truncate(offsets[12]).unwrap();
    assert_eq!(segment_files(dir.path()).len(), 2);
    // New records land exactly where the dropped ones were, and a shorter one
    // can't resurrect the old bytes behind it on recovery.
    let p = payload(500, 10);
    let off = log
        .append(&[NewRecord {
            meta: meta(500),
            payload: &p,
        }])
        .unwrap()
        .offsets[0];
    assert_eq!(off, offsets[12]);
    drop(log);
    let log = CommitLog::open(dir.path(), &cfg(4096), true).unwrap();
    assert_eq!(log.iter_from(0).count(), 13);
    assert_eq!(log.read(off).unwrap().payload(), &p[..]);
    // Truncate to the very start.
    log.truncate(0).unwrap();
    assert_eq!(log.max_offset(), 0);
    assert_eq!(log.iter_from(0).count(), 0);
}

#[test]
fn truncate_keeps_live_views_intact() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    let offsets = fill(&log, 0, 8, 300);
    let view = log.read(offsets[6]).unwrap();
    log.truncate(offsets[5]).unwrap();
    // The view still shows what it showed; the log no longer has it.
    assert_eq!(view.payload(), &payload(6, 300)[..]);
    assert!(log.read(offsets[6]).is_err());
    fill(&log, 100, 3, 300);
    assert_eq!(view.payload(), &payload(6, 300)[..]);
    assert_eq!(log.read(offsets[6]).unwrap().payload(), &payload(101, 300)[..]);
    drop(view);
    drop(log);
    let log = CommitLog::open(dir.path(), &cfg(4096), true).unwrap();
    assert_eq!(log.iter_from(0).count(), 8);
}

#[test]
fn purge_and_reset() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    let offsets = fill(&log, 0, 40, 300);
    let view = log.read(offsets[0]).unwrap();
    assert_eq!(log.purge_before(5000).unwrap(), 4096, "only whole segments go");
    assert_eq!(log.min_offset(), 4096);
    assert!(matches!(log.read(offsets[0]), Err(StoreError::OutOfRange { .. })));
    assert_eq!(
        view.payload(),
        &payload(0, 300)[..],
        "a view outlives its purged segment"
    );
    assert_eq!(
        log.purge_before(u64::MAX).unwrap(),
        3 * 4096,
        "the newest segment is never purged"
    );
    drop(log);
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    assert_eq!(log.min_offset(), 3 * 4096);
    assert_eq!(log.iter_from(log.min_offset()).count(), 4);

    // A snapshot-installing node continues at the group's offset.
    log.reset(100_000).unwrap();
    assert_eq!((log.min_offset(), log.max_offset()), (100_000, 100_000));
    let off = fill(&log, 0, 1, 10)[0];
    assert_eq!(off, 100_000);
    drop(log);
    for crashed in [true, false] {
        let log = CommitLog::open(dir.path(), &cfg(4096), crashed).unwrap();
        assert_eq!(log.min_offset(), 100_000);
        assert_eq!(log.iter_from(100_000).count(), 1);
    }
}

#[test]
fn replicas_appending_the_same_records_are_byte_identical() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let la = CommitLog::open(a.path(), &cfg(4096), false).unwrap();
    let lb = CommitLog::open(b.path(), &cfg(4096), false).unwrap();
    // Same records, different batching.
    let records: Vec<(RecordMeta, Vec<u8>)> = (0..200)
        .map(|i| (meta(i), payload(i, (i as usize * 37) % 900)))
        .collect();
    let mut oa = Vec::new();
    for r in &records {
        oa.extend(
            la.append(&[NewRecord {
                meta: r.0,
                payload: &r.1,
            }])
            .unwrap()
            .offsets,
        );
    }
    let mut ob = Vec::new();
    for chunk in records.chunks(7) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|r| NewRecord {
                meta: r.0,
                payload: &r.1,
            })
            .collect();
        ob.extend(lb.append(&batch).unwrap().offsets);
    }
    assert_eq!(oa, ob);
    la.close().unwrap();
    lb.close().unwrap();
    let (fa, fb) = (segment_files(a.path()), segment_files(b.path()));
    assert_eq!(fa, fb);
    for name in fa {
        let x = fs::read(a.path().join("commitlog").join(&name)).unwrap();
        let y = fs::read(b.path().join("commitlog").join(&name)).unwrap();
        assert!(x == y, "segment {name} differs");
    }
}

#[test]
fn sync_mode_group_commit_shares_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        flush_mode: FlushMode::Sync,
        ..cfg(1 << 20)
    };
    let log = CommitLog::open(dir.path(), &config, false).unwrap();
    let before = log.flush_count();
    let threads = 16;
    let per_thread = 40;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    let p = payload(t * 1000 + i, 100);
                    let end = log
                        .append(&[NewRecord {
                            meta: meta(i),
                            payload: &p,
                        }])
                        .unwrap()
                        .end;
                    log.wait_durable(end).unwrap();
                    assert!(log.flushed_offset() >= end);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let appends = threads * per_thread;
    let fsyncs = log.flush_count() - before;
    assert!(
        fsyncs < appends,
        "{fsyncs} fsyncs for {appends} appends: no group commit"
    );
    assert_eq!(log.iter_from(0).count() as u64, appends);

    // The callback form fires too, after the data is durable.
    let end = log
        .append(&[NewRecord {
            meta: meta(1),
            payload: b"cb",
        }])
        .unwrap()
        .end;
    let (tx, rx) = std::sync::mpsc::channel();
    let flushed = Arc::new(log.clone());
    log.on_durable(
        end,
        Box::new(move |r| {
            tx.send((r.is_ok(), flushed.flushed_offset())).unwrap();
        }),
    );
    let (ok, at) = rx.recv().unwrap();
    assert!(ok && at >= end);
}

#[test]
fn async_mode_flushes_in_the_background_and_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        flush_interval_ms: 20,
        ..cfg(1 << 20)
    };
    let log = CommitLog::open(dir.path(), &config, false).unwrap();
    let end = fill(&log, 0, 10, 100).last().unwrap() + 132;
    log.wait_durable(end).unwrap(); // immediate in async mode
    assert_eq!(log.flush().unwrap(), end);
    assert!(log.flushed_offset() >= end);
    fill(&log, 10, 1, 100);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while log.flushed_offset() < log.max_offset() {
        assert!(std::time::Instant::now() < deadline, "background flusher never ran");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn disk_full_is_a_mark_for_admission_not_a_refusal_of_appends() {
    // Raft entries already committed to replicate must still go in; the
    // broker asks the mark before it proposes a new send.
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    assert_eq!(log.disk_full(), None);
    log.set_disk_full(Some((91.0, 90.0)));
    assert_eq!(log.disk_full(), Some((91.0, 90.0)));
    log.append(&[NewRecord {
        meta: meta(0),
        payload: b"x",
    }])
    .unwrap();
    log.set_disk_full(None);
    assert_eq!(log.disk_full(), None);
}

#[test]
fn garbage_in_the_directory_is_handled() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    fill(&log, 0, 30, 300);
    log.close().unwrap();
    drop(log);
    let cl = dir.path().join("commitlog");
    fs::write(cl.join("notes.txt"), b"hi").unwrap();
    fs::write(cl.join("00000000000000004096.truncating"), b"half a copy").unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), true).unwrap();
    assert_eq!(log.iter_from(0).count(), 30);
    drop(log);
    // A hole in the segment sequence is corruption, reported, not skipped.
    fs::remove_file(cl.join("00000000000000004096")).unwrap();
    let err = CommitLog::open(dir.path(), &cfg(4096), true).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    // The segment size of an existing log cannot change.
    let err = CommitLog::open(dir.path(), &cfg(8192), true).unwrap_err();
    assert!(err.to_string().contains("segment"), "{err}");
}

#[test]
fn readers_race_truncates_and_appends_safely() {
    // Readers hammer the log while the writer truncates and re-appends over
    // the same offsets: every read either fails cleanly or returns a record
    // whose CRC checks, and views taken before a truncate keep their bytes.
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(dir.path(), &cfg(4096), false).unwrap();
    let offsets = fill(&log, 0, 30, 300);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (log, stop, offsets) = (log.clone(), stop.clone(), offsets.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut reads = 0u64;
                let mut i = r;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 1000 {
                    i = (i * 7 + 3) % offsets.len();
                    if let Ok(rec) = log.read(offsets[i]) {
                        let snapshot = rec.payload().to_vec();
                        held.push((rec, snapshot));
                        if held.len() > 8 {
                            let (rec, snapshot) = held.remove(0);
                            assert_eq!(rec.payload(), &snapshot[..], "a view changed under its reader");
                        }
                        reads += 1;
                    }
                }
            })
        })
        .collect();
    for round in 0..200u64 {
        let cut = offsets[10 + (round % 15) as usize];
        log.truncate(cut).unwrap();
        let n = 30 - offsets.iter().position(|&o| o == cut).unwrap() as u64;
        fill(&log, 1000 + round * 100, n, 300);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    drop(log);
    let log = CommitLog::open(dir.path(), &cfg(4096), true).unwrap();
    assert_eq!(log.iter_from(0).count(), 30);
}

#[test]
fn waiting_beyond_the_end_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        flush_mode: FlushMode::Sync,
        ..cfg(1 << 20)
    };
    let log = CommitLog::open(dir.path(), &config, false).unwrap();
    let end = fill(&log, 0, 1, 10)[0] + 42;
    log.wait_durable(end).unwrap();
    assert!(matches!(log.wait_durable(end + 1), Err(StoreError::BadArgument(_))));
    let (tx, rx) = std::sync::mpsc::channel();
    log.on_durable(end + 1, Box::new(move |r| tx.send(r.is_err()).unwrap()));
    assert!(rx.recv().unwrap());
}
