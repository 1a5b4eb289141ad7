//! Crash recovery: damage the files at any byte, recover, and exactly the
//! valid prefix of the log must survive.

use std::fs::{self, OpenOptions};
use std::path::Path;

use proptest::prelude::*;
use raftmq_store::{CommitLog, NewRecord, RecordMeta, StoreConfig};

const SEG: u64 = 4096;
const EOS_LEN: u64 = 8;

fn cfg() -> StoreConfig {
    StoreConfig {
        segment_size: SEG,
        max_record_size: 1024,
        ..StoreConfig::small_for_tests()
    }
}

/// One thing the recovery scan walks over: a record, or an end-of-segment
/// marker (only its 8 bytes matter; the rest of the gap is never read).
#[derive(Debug, Clone)]
struct Item {
    start: u64,
    len: u64,
    record: Option<usize>,
}

struct Written {
    records: Vec<(u64, RecordMeta, Vec<u8>)>,
    items: Vec<Item>,
    end: u64,
}

fn write_log(root: &Path, sizes: &[usize]) -> Written {
    let log = CommitLog::open(root, &cfg(), false).unwrap();
    let mut records = Vec::new();
    let mut items = Vec::new();
    let mut prev_end = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let meta = RecordMeta {
            term: 2,
            index: i as u64 + 1,
            kind: 1,
        };
        let payload: Vec<u8> = (0..size).map(|j| (i * 7 + j) as u8).collect();
        let off = log
            .append(&[NewRecord {
                meta,
                payload: &payload,
            }])
            .unwrap()
            .offsets[0];
        if off != prev_end {
            items.push(Item {
                start: prev_end,
                len: EOS_LEN,
                record: None,
            });
        }
        items.push(Item {
            start: off,
            len: 32 + size as u64,
            record: Some(i),
        });
        prev_end = off + 32 + size as u64;
        records.push((off, meta, payload));
    }
    let end = log.max_offset();
    log.close().unwrap();
    Written { records, items, end }
}

fn seg_path(root: &Path, start: u64) -> std::path::PathBuf {
    root.join("commitlog").join(format!("{start:020}"))
}

/// Reopens as after a crash (full scan: no checkpoint) and checks that the
/// log holds exactly the items before the first damaged one.
fn check_recovers_prefix(root: &Path, w: &Written, first_damaged: Option<usize>) -> Result<(), TestCaseError> {
    let _ = fs::remove_file(root.join("checkpoint"));
    let log = CommitLog::open(root, &cfg(), true).unwrap();
    let (survivors, end) = match first_damaged {
        Some(k) => (w.items[..k].iter().filter_map(|it| it.record).count(), w.items[k].start),
        None => (w.records.len(), w.end),
    };
    prop_assert_eq!(log.max_offset(), end);
    let got: Vec<_> = log
        .iter_from(0)
        .map(|r| {
            let r = r.unwrap();
            (r.offset(), r.meta(), r.payload().to_vec())
        })
        .collect();
    prop_assert_eq!(&got[..], &w.records[..survivors]);

    // The log goes on from there, and a second crash keeps the new record
    // and nothing of the wiped garbage.
    let extra = b"after recovery".to_vec();
    let meta = RecordMeta {
        term: 9,
        index: 999,
        kind: 0,
    };
    let off = log.append(&[NewRecord { meta, payload: &extra }]).unwrap().offsets[0];
    drop(log);
    let log = CommitLog::open(root, &cfg(), true).unwrap();
    let all: Vec<_> = log.iter_from(0).map(|r| r.unwrap()).collect();
    prop_assert_eq!(all.len(), survivors + 1);
    prop_assert_eq!(all[survivors].offset(), off);
    prop_assert_eq!(all[survivors].payload(), &extra[..]);
    Ok(())
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0usize..900, 1..30)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn cut_any_segment_file_at_any_byte(sizes in sizes(), pick in any::<u64>(), at in 0u64..SEG) {
        let dir = tempfile::tempdir().unwrap();
        let w = write_log(dir.path(), &sizes);
        let segments = w.end.div_ceil(SEG).max(1);
        let seg_start = (pick % segments) * SEG;
        let cut = seg_start + at;
        OpenOptions::new().write(true).open(seg_path(dir.path(), seg_start)).unwrap().set_len(at).unwrap();
        // The first item of that segment whose bytes reach past the cut.
        let first_damaged = w.items.iter().position(|it| {
            it.start >= seg_start && it.start < seg_start + SEG && it.start + it.len > cut
        });
        check_recovers_prefix(dir.path(), &w, first_damaged)?;
    }

    #[test]
    fn flip_any_bit(sizes in sizes(), pos in any::<u64>(), bit in 0u8..8) {
        let dir = tempfile::tempdir().unwrap();
        let w = write_log(dir.path(), &sizes);
        // Anywhere in the written range, plus a little of the zeros after it.
        let y = pos % (w.end + 64).min(w.end.div_ceil(SEG).max(1) * SEG);
        let seg_start = y - y % SEG;
        let path = seg_path(dir.path(), seg_start);
        let mut bytes = fs::read(&path).unwrap();
        bytes[(y - seg_start) as usize] ^= 1 << bit;
        fs::write(&path, &bytes).unwrap();
        let first_damaged = w.items.iter().position(|it| it.start <= y && y < it.start + it.len);
        check_recovers_prefix(dir.path(), &w, first_damaged)?;
    }
}

/// Writes 40 records, stops cleanly, then flips a payload byte of the last
/// record; returns that record's offset.
fn damage_last_record(root: &Path) -> u64 {
    let w = write_log(root, &[500; 40]);
    let last = w.records.last().unwrap().0;
    let path = seg_path(root, last - last % SEG);
    let mut bytes = fs::read(&path).unwrap();
    bytes[(last % SEG) as usize + 40] ^= 0xFF;
    fs::write(&path, &bytes).unwrap();
    last
}

#[test]
fn a_crash_rescans_the_whole_segment_of_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // A record in the checkpoint's segment is damaged behind the scan's back:
    // recovery re-verifies that whole segment, so it is found.
    let last = damage_last_record(dir.path());
    let log = CommitLog::open(dir.path(), &cfg(), true).unwrap();
    assert_eq!(log.max_offset(), last);
    assert_eq!(log.iter_from(0).count(), 39);
}

#[test]
fn damage_after_a_clean_stop_is_refused_unless_marked_as_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let last = damage_last_record(dir.path());
    // A clean stop msynced everything: damage is a disk fault, and cutting
    // could drop records this node acknowledged. The error says what to do.
    let err = CommitLog::open(dir.path(), &cfg(), false).unwrap_err();
    assert!(err.to_string().contains("abort"), "{err}");
    // Declared a crash, recovery cuts at the damaged record.
    let log = CommitLog::open(dir.path(), &cfg(), true).unwrap();
    assert_eq!(log.max_offset(), last);
    assert_eq!(log.iter_from(0).count(), 39);
}

#[test]
fn a_reset_that_died_half_way_is_finished_at_open() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &[500; 40]);
    // `reset` writes the new start to the checkpoint first, then replaces the
    // segments; die in between.
    let (cp, _) = raftmq_store::checkpoint::CheckpointFile::load(dir.path()).unwrap();
    cp.update(|c| {
        c.log_start = 1_000_000;
        c.flushed = 1_000_000;
        c.dispatched = 1_000_000;
    })
    .unwrap();
    let log = CommitLog::open(dir.path(), &cfg(), true).unwrap();
    assert_eq!((log.min_offset(), log.max_offset()), (1_000_000, 1_000_000));
    assert_eq!(log.iter_from(1_000_000).count(), 0);
    let meta = RecordMeta {
        term: 5,
        index: 77,
        kind: 0,
    };
    assert_eq!(
        log.append(&[NewRecord { meta, payload: b"next" }]).unwrap().offsets[0],
        1_000_000
    );
}
