//! The ConsumeQueue against its contract: units, rolls, truncation,
//! recovery of torn tails, and the on-disk format.

use std::io::{Seek, SeekFrom, Write};

use proptest::prelude::*;

use super::*;

const OPTS: MapOptions = MapOptions {
    warm_up: false,
    mlock: false,
};

fn unit(i: u64) -> CqUnit {
    CqUnit {
        phys: i * 100,
        size: (i % 7 + 1) as u32,
        tag_hash: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    }
}

fn fill(cq: &ConsumeQueue, range: std::ops::Range<u64>) {
    for i in range {
        assert_eq!(cq.append(unit(i)).unwrap(), i);
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn assert_units(cq: &ConsumeQueue, range: std::ops::Range<u64>) {
    assert_eq!((cq.min_offset(), cq.max_offset()), (range.start, range.end));
    for i in range {
        assert_eq!(cq.get(i).unwrap(), unit(i), "queue offset {i}");
    }
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ConsumeQueue>();
}

#[test]
fn append_get_across_files_and_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cq/T/0");
    let cq = ConsumeQueue::open(&dir, 25, OPTS, false).unwrap();
    assert_eq!((cq.min_offset(), cq.max_offset()), (0, 0));
    assert!(matches!(cq.get(0), Err(StoreError::OutOfRange { .. })));
    fill(&cq, 0..80);
    assert_units(&cq, 0..80);
    assert!(matches!(
        cq.get(80),
        Err(StoreError::OutOfRange {
            offset: 80,
            min: 0,
            max: 80
        })
    ));
    assert_eq!(
        files_in(&dir),
        [
            "00000000000000000000",
            "00000000000000000025",
            "00000000000000000050",
            "00000000000000000075"
        ]
    );
    assert_eq!(
        fs::metadata(dir.join("00000000000000000000")).unwrap().len(),
        packed::file_len(25)
    );
    cq.flush().unwrap();
    cq.flush().unwrap();
    drop(cq);
    for crashed in [false, true] {
        let cq = ConsumeQueue::open(&dir, 25, OPTS, crashed).unwrap();
        assert_units(&cq, 0..80);
    }
    // Exactly full last file.
    let cq = ConsumeQueue::open(&dir, 25, OPTS, false).unwrap();
    fill(&cq, 80..100);
    drop(cq);
    for crashed in [false, true] {
        let cq = ConsumeQueue::open(&dir, 25, OPTS, crashed).unwrap();
        assert_units(&cq, 0..100);
    }
    let cq = ConsumeQueue::open(&dir, 25, OPTS, false).unwrap();
    fill(&cq, 100..101);
    assert_units(&cq, 0..101);
}

#[test]
fn append_rejects_empty_and_backwards_units() {
    let tmp = tempfile::tempdir().unwrap();
    let cq = ConsumeQueue::open(tmp.path(), 25, OPTS, false).unwrap();
    let empty = CqUnit { size: 0, ..unit(1) };
    assert!(matches!(cq.append(empty), Err(StoreError::BadArgument(_))));
    cq.append(unit(5)).unwrap();
    assert!(matches!(cq.append(unit(4)), Err(StoreError::BadArgument(_))));
    cq.append(unit(5)).unwrap();
    assert_eq!(cq.max_offset(), 2);
    assert!(matches!(
        ConsumeQueue::open(tmp.path(), 0, OPTS, false),
        Err(StoreError::BadArgument(_))
    ));
}

#[test]
fn truncate_inside_at_boundary_and_at_max() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    fill(&cq, 0..80);
    cq.flush().unwrap();

    cq.truncate(80).unwrap();
    cq.truncate(1000).unwrap();
    assert_units(&cq, 0..80);

    // Inside a file: later files go, the rest of this one is zeroed.
    cq.truncate(60).unwrap();
    assert_units(&cq, 0..60);
    assert_eq!(files_in(dir).len(), 3);
    fill(&cq, 60..70);
    assert_units(&cq, 0..70);

    // At a file boundary: the file starting there goes.
    cq.truncate(50).unwrap();
    assert_units(&cq, 0..50);
    assert_eq!(files_in(dir), ["00000000000000000000", "00000000000000000025"]);
    drop(cq);
    for crashed in [false, true] {
        let cq = ConsumeQueue::open(dir, 25, OPTS, crashed).unwrap();
        assert_units(&cq, 0..50);
    }
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    fill(&cq, 50..55);
    assert_units(&cq, 0..55);

    cq.truncate(3).unwrap();
    assert_eq!(files_in(dir), ["00000000000000000000"]);
    cq.truncate(0).unwrap();
    assert_units(&cq, 0..0);
    fill(&cq, 0..30);
    drop(cq);
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    assert_units(&cq, 0..30);
}

#[test]
fn reset_continues_at_a_given_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cq = ConsumeQueue::open_dir(dir, 25, false).unwrap();
    fill(&cq, 0..60);
    cq.reset(1000).unwrap();
    assert_eq!((cq.min_offset(), cq.max_offset()), (1000, 1000));
    assert!(matches!(cq.get(5), Err(StoreError::OutOfRange { .. })));
    assert_eq!(cq.append(unit(7)).unwrap(), 1000);
    drop(cq);
    for crashed in [false, true] {
        let cq = ConsumeQueue::open_dir(dir, 25, crashed).unwrap();
        assert_eq!((cq.min_offset(), cq.max_offset()), (1000, 1001));
        assert_eq!(cq.get(1000).unwrap(), unit(7));
    }
}

#[test]
fn truncate_phys_and_purge_below_phys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    fill(&cq, 0..120);

    cq.truncate_phys(10_050).unwrap(); // phys = 100 i: keeps 0..=100
    assert_units(&cq, 0..101);
    cq.truncate_phys(10_100).unwrap(); // units with phys >= 10100 -> i >= 101: none
    assert_units(&cq, 0..101);
    cq.truncate_phys(u64::MAX).unwrap();
    assert_units(&cq, 0..101);

    cq.purge_below_phys(0).unwrap();
    assert_eq!(cq.min_offset(), 0);
    cq.purge_below_phys(5_500).unwrap(); // first kept: 55
    assert_units(&cq, 55..101);
    assert!(matches!(
        cq.get(54),
        Err(StoreError::OutOfRange {
            offset: 54,
            min: 55,
            max: 101
        })
    ));
    assert_eq!(
        files_in(dir),
        ["00000000000000000050", "00000000000000000075", "00000000000000000100"]
    );
    cq.purge_below_phys(100).unwrap(); // never goes back
    assert_eq!(cq.min_offset(), 55);

    // Truncating below min drops everything readable.
    cq.truncate_phys(0).unwrap();
    assert_units(&cq, 55..55);
    assert_eq!(files_in(dir), ["00000000000000000050"]);
    fill(&cq, 55..60);
    assert_units(&cq, 55..60);

    // Purging everything keeps the last file.
    fill(&cq, 60..90);
    cq.purge_below_phys(u64::MAX).unwrap();
    assert_units(&cq, 90..90);
    assert_eq!(files_in(dir), ["00000000000000000075"]);
    fill(&cq, 90..110);
    assert_units(&cq, 90..110);
    drop(cq);
    // min is not persisted: it restarts at the first file.
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    assert_units(&cq, 75..110);
}

#[test]
fn find_by_timestamp_binary_search() {
    let tmp = tempfile::tempdir().unwrap();
    let cq = ConsumeQueue::open(tmp.path(), 25, OPTS, false).unwrap();
    let ts = |u: &CqUnit| Ok(u.phys / 10);
    assert_eq!(cq.find_by_timestamp(5, ts).unwrap(), 0);
    // phys = 100, 100, 200, 200, 300, ... (duplicates): ts = 10, 10, 20, 20, ...
    for i in 0..60u64 {
        let u = CqUnit {
            phys: (i / 2 + 1) * 100,
            size: 1,
            tag_hash: 0,
        };
        cq.append(u).unwrap();
    }
    assert_eq!(cq.find_by_timestamp(0, ts).unwrap(), 0);
    assert_eq!(cq.find_by_timestamp(10, ts).unwrap(), 0);
    assert_eq!(cq.find_by_timestamp(11, ts).unwrap(), 2);
    assert_eq!(cq.find_by_timestamp(20, ts).unwrap(), 2);
    assert_eq!(cq.find_by_timestamp(150, ts).unwrap(), 28);
    assert_eq!(cq.find_by_timestamp(300, ts).unwrap(), 58);
    assert_eq!(cq.find_by_timestamp(301, ts).unwrap(), 60);
    cq.purge_below_phys(1_000).unwrap();
    assert_eq!(cq.min_offset(), 18);
    assert_eq!(cq.find_by_timestamp(0, ts).unwrap(), 18);
    let failing = |_: &CqUnit| Err(StoreError::Closed);
    assert!(matches!(cq.find_by_timestamp(0, failing), Err(StoreError::Closed)));
}

#[test]
fn offset_of_phys_finds_only_units_this_queue_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let cq = ConsumeQueue::open(tmp.path(), 25, OPTS, false).unwrap();
    assert_eq!(cq.offset_of_phys(0).unwrap(), None);
    fill(&cq, 0..60);
    for i in [0, 1, 24, 25, 59] {
        assert_eq!(cq.offset_of_phys(i * 100).unwrap(), Some(i), "unit {i}");
    }
    // Between units, past the last one: another queue's message.
    for phys in [50, 2_401, 6_000, u64::MAX] {
        assert_eq!(cq.offset_of_phys(phys).unwrap(), None, "phys {phys}");
    }
    cq.purge_below_phys(3_000).unwrap();
    assert_eq!(cq.offset_of_phys(100).unwrap(), None, "purged");
    assert_eq!(cq.offset_of_phys(3_000).unwrap(), Some(30));
}

/// Overwrites unit `idx` of `path` with `bytes` through std::fs.
fn poke(path: &Path, idx: u64, bytes: &[u8; 20]) {
    let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(packed::unit_pos(idx))).unwrap();
    f.write_all(bytes).unwrap();
}

/// Rolls the block holding unit `idx` of `path` back to how it was when
/// only the units before `idx` were written: what a crash leaves when the
/// block's last writes did not reach the disk.
fn roll_back(path: &Path, idx: u64) {
    let block = packed::block_pos(idx);
    let mut bytes = fs::read(path).unwrap();
    let units = &mut bytes[block as usize..(block + packed::UNIT_BYTES) as usize];
    let kept = ((idx % packed::UNITS_PER_BLOCK) * UNIT_SIZE) as usize;
    units[kept..].fill(0);
    let seal = packed::seal_of_prefix(units, packed::UNITS_PER_BLOCK);
    let at = (block + packed::UNIT_BYTES) as usize;
    bytes[at..at + seal.len()].copy_from_slice(&seal);
    fs::write(path, bytes).unwrap();
}

/// Flips bit `bit` of byte `at` of `path`.
fn flip(path: &Path, at: u64, bit: u8) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at as usize] ^= 1 << bit;
    fs::write(path, bytes).unwrap();
}

#[test]
fn crash_recovery_cuts_at_the_first_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    fill(&cq, 0..70);
    drop(cq);
    // Gap at queue offset 60 (file 50, unit 10): that block as it was
    // before unit 10 was written.
    let file50 = dir.join("00000000000000000050");
    roll_back(&file50, 10);
    let cq = ConsumeQueue::open(dir, 25, OPTS, true).unwrap();
    assert_units(&cq, 0..60);
    fill(&cq, 60..62);
    drop(cq);
    let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
    assert_units(&cq, 0..62); // 62..70 were zeroed, not resurrected

    // A gap in an earlier file (unit 30) with a later, full file: the
    // later file is deleted.
    fill(&cq, 62..80);
    drop(cq);
    roll_back(&dir.join("00000000000000000025"), 5);
    let cq = ConsumeQueue::open(dir, 25, OPTS, true).unwrap();
    assert_units(&cq, 0..30);
    assert_eq!(files_in(dir), ["00000000000000000000", "00000000000000000025"]);
    fill(&cq, 30..35);
    drop(cq);
    let cq = ConsumeQueue::open(dir, 25, OPTS, true).unwrap();
    assert_units(&cq, 0..35);

    // A gap at the very start of a far-back file (outside the last three)
    // is found through that file's empty last unit.
    fill(&cq, 35..150);
    drop(cq);
    roll_back(&dir.join("00000000000000000025"), 24);
    let cq = ConsumeQueue::open(dir, 25, OPTS, true).unwrap();
    assert_units(&cq, 0..49);
    drop(cq);
    // Without the crash flag that state is refused, not misread.
    fill(&ConsumeQueue::open(dir, 25, OPTS, false).unwrap(), 49..80);
    roll_back(&dir.join("00000000000000000025"), 24);
    let err = ConsumeQueue::open(dir, 25, OPTS, false).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { ref file, .. } if file.ends_with("00000000000000000025")));
}

/// Found by a jepsen campaign: two flipped bits in a queue file moved a
/// unit's `phys` 32 bytes, which still fit between its neighbours, and the
/// node served a gap. Every flipped bit is now found by a block's seal.
#[test]
fn a_flipped_bit_anywhere_is_corrupt_not_a_unit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fill(&ConsumeQueue::open(dir, 100, OPTS, false).unwrap(), 0..90);
    let file = dir.join(offset_name(0));
    // Every bit of a whole block's unit (offset 30) and of its seal.
    for at in (packed::unit_pos(30)..packed::unit_pos(30) + UNIT_SIZE)
        .chain(packed::block_pos(30) + packed::UNIT_BYTES..packed::block_pos(30) + packed::BLOCK_SIZE)
    {
        for bit in 0..8 {
            flip(&file, at, bit);
            for crashed in [false, true] {
                let opened = ConsumeQueue::open(dir, 100, OPTS, crashed);
                let err = match opened {
                    Ok(cq) => cq.get(30).map(|_| ()).unwrap_err(),
                    Err(e) => e,
                };
                assert!(matches!(err, StoreError::Corrupt { .. }), "byte {at} bit {bit}: {err}");
                if crashed {
                    let cq = ConsumeQueue::open(dir, 100, OPTS, false).unwrap();
                    let err = cq.check_units(0, u64::MAX).unwrap_err();
                    assert!(matches!(err, StoreError::Corrupt { .. }));
                }
            }
            flip(&file, at, bit);
        }
    }
    // In the last, growing block (units 75..90), a flip is found at open.
    for at in [packed::unit_pos(80), packed::unit_pos(89) + 3, packed::unit_pos(89) + 8] {
        flip(&file, at, 2);
        for crashed in [false, true] {
            let err = ConsumeQueue::open(dir, 100, OPTS, crashed).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "byte {at}: {err}");
        }
        flip(&file, at, 2);
    }
    // A unit emptied (all its bytes) is damage, not the end of the queue,
    // wherever it lies.
    for q in [10, 25, 50, 75, 80] {
        let before = fs::read(&file).unwrap();
        poke(&file, q, &[0; 20]);
        for crashed in [false, true] {
            let found = ConsumeQueue::open(dir, 100, OPTS, crashed).and_then(|cq| cq.check_units(0, u64::MAX));
            assert!(
                matches!(found, Err(StoreError::Corrupt { .. })),
                "unit {q} crashed {crashed}: {found:?}"
            );
        }
        fs::write(&file, before).unwrap();
    }
    let cq = ConsumeQueue::open(dir, 100, OPTS, true).unwrap();
    assert_units(&cq, 0..90);
}

/// Cut blocks keep seals of their own; blocks written before seals
/// existed are read unchecked and sealed by the next write.
#[test]
fn truncation_and_old_blocks_keep_seals_right() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cq = ConsumeQueue::open(dir, 100, OPTS, false).unwrap();
    fill(&cq, 0..60);
    cq.truncate(37).unwrap();
    fill(&cq, 37..52);
    drop(cq);
    // Unseal every block, as a store written before seals would be.
    let file = dir.join(offset_name(0));
    let mut bytes = fs::read(&file).unwrap();
    for b in 0..4 {
        let at = (b * packed::BLOCK_SIZE + packed::UNIT_BYTES) as usize;
        bytes[at..at + packed::SEAL_LEN as usize].fill(0);
    }
    fs::write(&file, bytes).unwrap();
    let cq = ConsumeQueue::open(dir, 100, OPTS, false).unwrap();
    assert_units(&cq, 0..52);
    cq.check_units(0, u64::MAX).unwrap();
    fill(&cq, 52..60);
    drop(cq);
    for crashed in [false, true] {
        let cq = ConsumeQueue::open(dir, 100, OPTS, crashed).unwrap();
        assert_units(&cq, 0..60);
    }
    // The block the new units went to is sealed now: a flip in it is found.
    flip(&file, packed::unit_pos(51) + 1, 0);
    let found = ConsumeQueue::open(dir, 100, OPTS, false).and_then(|cq| cq.get(51));
    assert!(matches!(found, Err(StoreError::Corrupt { .. })), "{found:?}");
}

#[test]
fn bad_directory_contents_are_corrupt_or_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = |dir: &Path| {
        let cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
        fill(&cq, 0..60);
    };
    let is_corrupt = |dir: &Path, name: &str| {
        for crashed in [false, true] {
            match ConsumeQueue::open(dir, 25, OPTS, crashed) {
                Err(StoreError::Corrupt { file, .. }) => assert!(file.ends_with(name), "{file:?} vs {name}"),
                other => panic!("expected Corrupt naming {name}, got {other:?}"),
            }
        }
    };
    for garbage in [
        "junk",
        "0000000000000000000x",
        "000000000000000000025",
        "99999999999999999999",
    ] {
        // Stray files are ignored (and logged), as in the other directories.
        let dir = tmp.path().join(format!("g-{garbage}"));
        ok(&dir);
        fs::write(dir.join(garbage), b"x").unwrap();
        for crashed in [false, true] {
            let cq = ConsumeQueue::open(&dir, 25, OPTS, crashed).unwrap();
            assert_eq!(cq.max_offset(), 60, "{garbage}");
        }
    }
    // A subdirectory with a valid name.
    let dir = tmp.path().join("subdir");
    ok(&dir);
    fs::create_dir(dir.join("00000000000000000075")).unwrap();
    is_corrupt(&dir, "00000000000000000075");
    // Too long.
    let dir = tmp.path().join("long");
    ok(&dir);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("00000000000000000025"))
        .unwrap();
    f.set_len(packed::file_len(25) + 1).unwrap();
    is_corrupt(&dir, "00000000000000000025");
    // Non-contiguous (file 25 missing).
    let dir = tmp.path().join("hole");
    ok(&dir);
    fs::remove_file(dir.join("00000000000000000025")).unwrap();
    is_corrupt(&dir, "00000000000000000050");
    // Misaligned start.
    let dir = tmp.path().join("misaligned");
    ok(&dir);
    fs::rename(dir.join("00000000000000000050"), dir.join("00000000000000000051")).unwrap();
    is_corrupt(&dir, "00000000000000000051");
    // A units-per-file change: files too long, or not contiguous.
    let dir = tmp.path().join("resized");
    ConsumeQueue::open(&dir, 50, OPTS, false)
        .map(|cq| fill(&cq, 0..60))
        .unwrap();
    assert!(matches!(
        ConsumeQueue::open(&dir, 25, OPTS, false),
        Err(StoreError::Corrupt { .. })
    ));
    let dir = tmp.path().join("resized2");
    ok(&dir);
    // (Files of 25 units are shorter than 50 units' worth.)
    match ConsumeQueue::open(&dir, 50, OPTS, false) {
        Err(StoreError::Corrupt { reason, .. }) => assert!(reason.contains("shorter"), "{reason}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A short file was cut short: the units it lost would shift every
    // queue offset after them, so it is damage, not an earlier end.
    let dir = tmp.path().join("short");
    ok(&dir);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("00000000000000000050"))
        .unwrap();
    f.set_len(packed::unit_pos(3)).unwrap();
    is_corrupt(&dir, "00000000000000000050");
    // One that died before its first byte was written is only empty.
    f.set_len(0).unwrap();
    let cq = ConsumeQueue::open(&dir, 25, OPTS, false).unwrap();
    assert_units(&cq, 0..50);
}

#[test]
fn concurrent_readers_during_appends_and_truncates() {
    let tmp = tempfile::tempdir().unwrap();
    let cq = Arc::new(ConsumeQueue::open(tmp.path(), 25, OPTS, false).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (cq, stop) = (Arc::clone(&cq), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let max = cq.max_offset();
                    for q in max.saturating_sub(30)..max {
                        match cq.get(q) {
                            Ok(u) => {
                                assert_eq!(u, unit(q));
                                seen += 1;
                            }
                            Err(StoreError::OutOfRange { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                seen
            })
        })
        .collect();
    for round in 0..20u64 {
        let start = cq.max_offset();
        fill(&cq, start..start + 60);
        cq.truncate(start + 60 - round % 40).unwrap();
        cq.flush().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}

#[derive(Debug, Clone)]
enum Op {
    Append(u8),
    Truncate(u16),
    Purge(u16),
    Reopen(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..40).prop_map(Op::Append),
        1 => (0u16..200).prop_map(Op::Truncate),
        1 => (0u16..200).prop_map(Op::Purge),
        1 => any::<bool>().prop_map(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn matches_a_model(ops in proptest::collection::vec(op(), 1..25)) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut cq = ConsumeQueue::open(dir, 25, OPTS, false).unwrap();
        // Model: unit(i) for i in min..max; phys = 100 i.
        let (mut min, mut max) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Append(n) => {
                    for _ in 0..n {
                        prop_assert_eq!(cq.append(unit(max)).unwrap(), max);
                        max += 1;
                    }
                }
                Op::Truncate(q) => {
                    cq.truncate(q as u64).unwrap();
                    max = max.min((q as u64).max(min));
                }
                Op::Purge(q) => {
                    cq.purge_below_phys(q as u64 * 100).unwrap();
                    min = min.max((q as u64).min(max));
                }
                Op::Reopen(crashed) => {
                    drop(cq);
                    cq = ConsumeQueue::open(dir, 25, OPTS, crashed).unwrap();
                    // min restarts at the first file's first unit.
                    let reopened = cq.min_offset();
                    prop_assert!(reopened <= min && min - reopened <= 25);
                    min = reopened;
                }
            }
            prop_assert_eq!((cq.min_offset(), cq.max_offset()), (min, max));
            for q in min.saturating_sub(1)..max + 1 {
                match cq.get(q) {
                    Ok(u) => { prop_assert!(q >= min && q < max); prop_assert_eq!(u, unit(q)); }
                    Err(StoreError::OutOfRange { .. }) => prop_assert!(q < min || q >= max),
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
        }
    }
}

/// A unit of a new last file whose size was flipped to zero would make a
/// clean open end the queue before it, and the next append write over it.
#[test]
fn an_emptied_first_unit_of_the_last_file_is_found() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fill(&ConsumeQueue::open(dir, 25, OPTS, false).unwrap(), 0..26);
    // Unit 25 (the only one of file 25) has size 7 = 0b111: zero it whole.
    let file = dir.join(offset_name(25));
    let mut bytes = fs::read(&file).unwrap();
    bytes[8..12].fill(0);
    fs::write(&file, &bytes).unwrap();
    for crashed in [false, true] {
        let err = ConsumeQueue::open(dir, 25, OPTS, crashed).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "crashed {crashed}: {err}");
    }
}

/// Truncation seals the units it keeps before it zeroes the rest, so a
/// kill between the two leaves a state open accepts (the caller cuts
/// again: open cuts to the dispatch mark, the Raft log to its records).
#[test]
fn a_truncation_cut_short_by_a_kill_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fill(&ConsumeQueue::open(dir, 100, OPTS, false).unwrap(), 0..40);
    // As truncate(30) leaves block 1 (units 25-49) before it zeroes.
    let file = dir.join(offset_name(0));
    let mut bytes = fs::read(&file).unwrap();
    let block = packed::block_pos(25) as usize;
    let seal = packed::seal_of_prefix(&bytes[block..block + packed::UNIT_BYTES as usize], 5);
    bytes[block + packed::UNIT_BYTES as usize..block + packed::BLOCK_SIZE as usize].copy_from_slice(&seal);
    fs::write(&file, &bytes).unwrap();
    let cq = ConsumeQueue::open(dir, 100, OPTS, true).unwrap();
    assert_units(&cq, 0..40);
    cq.truncate(30).unwrap();
    drop(cq);
    assert_units(&ConsumeQueue::open(dir, 100, OPTS, false).unwrap(), 0..30);
}
