//! The key index against its contract: lookups, collisions, rolls,
//! truncation and recovery, and the on-disk format.

use super::*;
use std::os::unix::fs::FileExt;

use proptest::prelude::*;

fn open(root: &Path, slots: u64, entries: u64, crashed: bool, valid_below: u64) -> KeyIndex {
    KeyIndex::open(root, slots, entries, MapOptions::default(), crashed, valid_below).unwrap()
}

fn all(ki: &KeyIndex, key: &[u8]) -> Vec<u64> {
    ki.query(key, 0, u64::MAX, usize::MAX).unwrap()
}

fn index_files(root: &Path) -> Vec<u64> {
    list_files(&root.join(INDEX_DIR))
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

fn keys_with_distinct_crcs(n: usize) -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    (0..)
        .map(|i| format!("key-{i}").into_bytes())
        .filter(|k| seen.insert(key_hash(k)))
        .take(n)
        .collect()
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<KeyIndex>();
}

#[test]
fn put_and_query_basic() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 64, 200, false, u64::MAX);
    assert!(all(&ki, b"a").is_empty());
    ki.put(b"a", 0, 1_000).unwrap();
    ki.put(b"b", 100, 2_000).unwrap();
    ki.put(b"a", 200, 3_000).unwrap();
    assert_eq!(all(&ki, b"a"), vec![200, 0]);
    assert_eq!(all(&ki, b"b"), vec![100]);
    assert!(all(&ki, b"c").is_empty());
    assert!(ki.query(b"a", 5_000, 1_000, 10).unwrap().is_empty());
    assert!(ki.query(b"a", 0, u64::MAX, 0).unwrap().is_empty());
    assert!(matches!(ki.put(b"a", 199, 4_000), Err(StoreError::BadArgument(_))));
    ki.flush().unwrap();
    assert_eq!(index_files(dir.path()), vec![0]);
    assert_eq!(
        fs::metadata(dir.path().join("index").join(format!("{:020}", 0)))
            .unwrap()
            .len(),
        index_file_len(64, 200)
    );
}

#[test]
fn default_file_size_matches_the_docs() {
    assert_eq!(index_file_len(5_000_000, 20_000_000), 429_600_768);
    assert_eq!(entries_pos(1), 1024);
    assert_eq!(entries_pos(128), 1024);
    assert_eq!(entries_pos(129), 1536);
}

#[test]
fn many_keys() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 97, 10_000, false, u64::MAX);
    let keys = keys_with_distinct_crcs(500);
    let mut phys = 0;
    for round in 0..3u64 {
        for k in &keys {
            ki.put(k, phys, 1_000 * round).unwrap();
            phys += 10;
        }
    }
    for (i, k) in keys.iter().enumerate() {
        let i = i as u64 * 10;
        assert_eq!(all(&ki, k), vec![i + 10_000, i + 5_000, i]);
        assert_eq!(ki.query(k, 1_000, 1_999, 10).unwrap(), vec![i + 5_000]);
    }
}

#[test]
fn collisions_with_tiny_slot_counts() {
    let keys = keys_with_distinct_crcs(12);
    for slots in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        let ki = open(dir.path(), slots, 1_000, false, u64::MAX);
        let mut expected: Vec<Vec<u64>> = vec![Vec::new(); keys.len()];
        for n in 0..200u64 {
            let k = ((n * 7) % keys.len() as u64) as usize;
            ki.put(&keys[k], n * 3, 1_000 + n).unwrap();
            expected[k].insert(0, n * 3);
        }
        for (k, key) in keys.iter().enumerate() {
            assert_eq!(all(&ki, key), expected[k], "slots {slots}, key {k}");
        }
        assert!(all(&ki, b"absent").is_empty());
    }
}

#[test]
fn time_range_max_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 4, 1_000, false, u64::MAX);
    // One put per second, t = 10 s .. 29 s, plus noise under other keys.
    for s in 0..20u64 {
        ki.put(b"k", s * 100, (10 + s) * 1_000 + 500).unwrap();
        ki.put(b"other", s * 100 + 50, (10 + s) * 1_000 + 600).unwrap();
    }
    // [15 s, 17 s] at second granularity, whatever the milliseconds.
    assert_eq!(ki.query(b"k", 15_999, 17_001, 100).unwrap(), vec![700, 600, 500]);
    assert_eq!(ki.query(b"k", 15_000, 17_999, 2).unwrap(), vec![700, 600]);
    assert_eq!(ki.query(b"k", 0, 9_999, 100).unwrap(), Vec::<u64>::new());
    assert_eq!(ki.query(b"k", 30_000, 99_999, 100).unwrap(), Vec::<u64>::new());
    assert_eq!(ki.query(b"k", 0, u64::MAX, 3).unwrap(), vec![1_900, 1_800, 1_700]);
    let got = all(&ki, b"k");
    assert_eq!(got.len(), 20);
    assert!(got.windows(2).all(|w| w[0] > w[1]), "newest first: {got:?}");
}

#[test]
fn out_of_order_timestamps_are_clamped_to_the_file_start() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 4, 1_000, false, u64::MAX);
    ki.put(b"k", 0, 50_000).unwrap();
    ki.put(b"k", 10, 20_000).unwrap();
    assert_eq!(ki.query(b"k", 50_000, 50_999, 10).unwrap(), vec![10, 0]);
}

#[test]
fn rolls_over_files_and_reopens_identically() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_with_distinct_crcs(7);
    let ki = open(dir.path(), 3, 10, false, u64::MAX);
    for n in 0..95u64 {
        ki.put(&keys[n as usize % 7], n * 16, n * 1_000).unwrap();
    }
    let files = index_files(dir.path());
    assert_eq!(files.len(), 10);
    assert_eq!(files[..3], [0, 160, 320]);
    let snapshot = |ki: &KeyIndex| -> Vec<Vec<u64>> {
        let mut v: Vec<_> = keys.iter().map(|k| all(ki, k)).collect();
        v.extend(keys.iter().map(|k| ki.query(k, 25_000, 61_999, 4).unwrap()));
        v
    };
    let before = snapshot(&ki);
    assert_eq!(
        before[0],
        (0..95).rev().filter(|n| n % 7 == 0).map(|n| n * 16).collect::<Vec<_>>()
    );
    // A window spanning files 2..=6, limited to 4 results.
    assert_eq!(before[7 + 3], vec![59 * 16, 52 * 16, 45 * 16, 38 * 16]);
    ki.flush().unwrap();
    drop(ki);
    let ki = open(dir.path(), 3, 10, false, u64::MAX);
    assert_eq!(snapshot(&ki), before);
    // The reopened index continues the newest file.
    ki.put(&keys[0], 95 * 16, 95_000).unwrap();
    assert_eq!(all(&ki, &keys[0])[0], 95 * 16);
    assert_eq!(index_files(dir.path()).len(), 10);
    assert!(matches!(ki.put(&keys[0], 0, 95_000), Err(StoreError::BadArgument(_))));
}

#[test]
fn too_many_keys_at_one_offset_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 3, 2, false, u64::MAX);
    ki.put(b"a", 5, 0).unwrap();
    ki.put(b"b", 5, 0).unwrap();
    assert!(matches!(ki.put(b"c", 5, 0), Err(StoreError::BadArgument(_))));
    ki.put(b"c", 6, 0).unwrap();
    assert_eq!(all(&ki, b"a"), vec![5]);
    assert_eq!(all(&ki, b"c"), vec![6]);
}

#[test]
fn crash_recovery_cuts_back_to_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_with_distinct_crcs(5);
    let ki = open(dir.path(), 2, 10, false, u64::MAX);
    // 100 entries at phys 0, 10, ..., 990: files start at 0, 100, ..., 900.
    for n in 0..100u64 {
        ki.put(&keys[n as usize % 5], n * 10, 1_000 + n).unwrap();
    }
    drop(ki); // no flush: a crash

    // valid_below 555 is inside the file starting at 500.
    let ki = open(dir.path(), 2, 10, true, 555);
    assert_eq!(index_files(dir.path()), vec![0, 100, 200, 300, 400, 500]);
    let expect = |below: u64, k: usize| -> Vec<u64> {
        (0..100u64)
            .rev()
            .filter(|n| n % 5 == k as u64 && n * 10 < below)
            .map(|n| n * 10)
            .collect()
    };
    for (k, key) in keys.iter().enumerate() {
        assert_eq!(all(&ki, key), expect(555, k));
    }
    // New puts after recovery land after the kept entries (fewer than were cut).
    ki.put(&keys[0], 560, 5_000).unwrap();
    ki.put(&keys[1], 570, 5_000).unwrap();
    ki.put(b"new", 580, 5_000).unwrap();
    assert_eq!(all(&ki, &keys[0])[..2], [560, 550]);
    assert_eq!(all(&ki, b"new"), vec![580]);
    drop(ki);

    // A second crash with everything valid must not bring back the cut entries.
    let ki = open(dir.path(), 2, 10, true, u64::MAX);
    let mut k0 = expect(555, 0);
    k0.insert(0, 560);
    assert_eq!(all(&ki, &keys[0]), k0);
    let mut k1 = expect(555, 1);
    k1.insert(0, 570);
    assert_eq!(all(&ki, &keys[1]), k1);
    for (k, key) in keys.iter().enumerate().skip(2) {
        assert_eq!(all(&ki, key), expect(555, k));
    }
    assert_eq!(all(&ki, b"new"), vec![580]);

    // Cutting a whole file away and reopening cleanly afterwards.
    drop(ki);
    let ki = open(dir.path(), 2, 10, true, 500);
    assert_eq!(index_files(dir.path()), vec![0, 100, 200, 300, 400]);
    assert_eq!(all(&ki, &keys[0]), expect(500, 0));
    ki.put(&keys[0], 500, 9_000).unwrap();
    ki.flush().unwrap();
    drop(ki);
    let ki = open(dir.path(), 2, 10, false, u64::MAX);
    assert_eq!(index_files(dir.path()), vec![0, 100, 200, 300, 400, 500]);
    assert_eq!(all(&ki, &keys[0])[..2], [500, 450]);
}

#[test]
fn crash_recovery_deletes_a_file_with_an_unwritten_header() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 2, 10, false, u64::MAX);
    ki.put(b"a", 0, 0).unwrap();
    drop(ki);
    let stray = dir.path().join("index").join(format!("{:020}", 50));
    fs::write(&stray, vec![0u8; 4096]).unwrap();
    assert!(matches!(
        KeyIndex::open(dir.path(), 2, 10, MapOptions::default(), false, u64::MAX),
        Err(StoreError::Corrupt { .. })
    ));
    let ki = open(dir.path(), 2, 10, true, 100);
    assert!(!stray.exists());
    assert_eq!(all(&ki, b"a"), vec![0]);
}

/// Byte position of entry `i` in a file with `slots` slots.
fn entry_byte(slots: u64, i: u64) -> u64 {
    entries_pos(slots) + packed::unit_pos(i)
}

/// Writes the seal of the block holding entry `i` anew, as if the damage
/// made to it had been written by the index: what the seal cannot catch,
/// the structural checks must.
fn reseal(file: &fs::File, slots: u64, i: u64) {
    let mut units = vec![0u8; packed::UNIT_BYTES as usize];
    let block = entries_pos(slots) + packed::block_pos(i);
    file.read_exact_at(&mut units, block).unwrap();
    let seal = packed::seal_of_prefix(&units, packed::UNITS_PER_BLOCK);
    file.write_at(&seal, block + packed::UNIT_BYTES).unwrap();
}

/// A flipped bit anywhere in an entry is found by its block's seal; a slot
/// that leads into another slot's chain, by the chain walk.
#[test]
fn damaged_entries_and_slots_are_errors_not_misses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index").join(format!("{:020}", 0));
    let ki = open(dir.path(), 4, 100, false, u64::MAX);
    for n in 0..40 {
        ki.put(format!("k{}", n % 8).as_bytes(), n * 10, 0).unwrap();
    }
    ki.flush().unwrap();
    drop(ki);
    let file = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let expected = all(&open(dir.path(), 4, 100, false, u64::MAX), b"k3");
    assert_eq!(expected.len(), 5);
    let byte = |at: u64| {
        let mut b = [0u8];
        file.read_exact_at(&mut b, at).unwrap();
        b[0]
    };
    // Every bit of entry 27 (in the second block, k3's chain).
    for at in entry_byte(4, 27)..entry_byte(4, 27) + ENTRY_SIZE {
        let good = byte(at);
        for bit in 0..8 {
            file.write_at(&[good ^ (1 << bit)], at).unwrap();
            let ki = open(dir.path(), 4, 100, false, u64::MAX);
            match ki.query(b"k3", 0, u64::MAX, 10) {
                Err(StoreError::Corrupt { .. }) => {}
                other => panic!("byte {at} bit {bit}: {other:?}"),
            }
        }
        file.write_at(&[good], at).unwrap();
    }
    // Slot of k3 moved onto an entry of another key's chain (entry 4: k4).
    let slot = u64::from(key_hash(b"k3")) % 4;
    let mut was = [0u8; 4];
    file.read_exact_at(&mut was, SLOTS_POS + slot * SLOT_SIZE).unwrap();
    let other = (0..40u64)
        .find(|&i| u64::from(key_hash(format!("k{}", i % 8).as_bytes())) % 4 != slot)
        .unwrap();
    file.write_at(&(other as u32 + 1).to_le_bytes(), SLOTS_POS + slot * SLOT_SIZE)
        .unwrap();
    let err = open(dir.path(), 4, 100, false, u64::MAX)
        .query(b"k3", 0, u64::MAX, 10)
        .unwrap_err();
    assert!(err.to_string().contains("not its own"), "{err}");
    file.write_at(&was, SLOTS_POS + slot * SLOT_SIZE).unwrap();
    assert_eq!(all(&open(dir.path(), 4, 100, false, u64::MAX), b"k3"), expected);

    // Recovery after a crash checks the seals of the entries it keeps.
    let good = byte(entry_byte(4, 3) + 5);
    file.write_at(&[good ^ 4], entry_byte(4, 3) + 5).unwrap();
    let err = KeyIndex::open(dir.path(), 4, 100, MapOptions::default(), true, u64::MAX).unwrap_err();
    assert!(err.to_string().contains("does not match its seal"), "{err}");
    file.write_at(&[good], entry_byte(4, 3) + 5).unwrap();
    assert_eq!(all(&open(dir.path(), 4, 100, true, u64::MAX), b"k3"), expected);
}

#[test]
fn corrupt_links_are_errors_not_panics_or_loops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index").join(format!("{:020}", 0));
    let ki = open(dir.path(), 1, 10, false, u64::MAX);
    for n in 0..3 {
        ki.put(b"k", n, 0).unwrap();
    }
    ki.flush().unwrap();
    drop(ki);
    let file = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();

    // Slot 0 points far beyond the entries.
    file.write_at(&u32::MAX.to_le_bytes(), SLOTS_POS).unwrap();
    let ki = open(dir.path(), 1, 10, false, u64::MAX);
    assert!(matches!(
        ki.query(b"k", 0, u64::MAX, 10),
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(ki.put(b"k", 3, 0), Err(StoreError::Corrupt { .. })));
    drop(ki);

    // Entry 1 links to itself (entry number + 1 = 2).
    file.write_at(&3u32.to_le_bytes(), SLOTS_POS).unwrap();
    file.write_at(&2u32.to_le_bytes(), entry_byte(1, 1) + E_PREV as u64)
        .unwrap();
    reseal(&file, 1, 1);
    let ki = open(dir.path(), 1, 10, false, u64::MAX);
    let err = ki.query(b"k", 0, u64::MAX, 10).unwrap_err();
    assert!(err.to_string().contains("not older"), "{err}");
    // A limit reached before the bad link stops the walk first.
    assert_eq!(ki.query(b"k", 0, u64::MAX, 2).unwrap(), vec![2, 1]);
    drop(ki);

    // Entry 1 links forward, past the entry count.
    file.write_at(&u32::MAX.to_le_bytes(), entry_byte(1, 1) + E_PREV as u64)
        .unwrap();
    reseal(&file, 1, 1);
    let ki = open(dir.path(), 1, 10, false, u64::MAX);
    assert!(ki.query(b"k", 0, u64::MAX, 10).is_err());
    drop(ki);

    // Crash recovery cuts at the bad link and rebuilds a sound chain.
    let ki = open(dir.path(), 1, 10, true, u64::MAX);
    assert_eq!(all(&ki, b"k"), vec![0]);
}

#[test]
fn bad_headers_are_corrupt_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index").join(format!("{:020}", 0));
    let ki = open(dir.path(), 4, 10, false, u64::MAX);
    ki.put(b"k", 0, 0).unwrap();
    ki.flush().unwrap();
    drop(ki);
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let expect_corrupt = |what: &str| {
        for crashed in [false, true] {
            match KeyIndex::open(dir.path(), 4, 10, MapOptions::default(), crashed, u64::MAX) {
                Err(StoreError::Corrupt { file, .. }) => assert_eq!(file, path, "{what}"),
                other => panic!("{what}: expected a corrupt error, got {other:?}"),
            }
        }
    };
    let good = fs::read(&path).unwrap();
    file.write_at(&(INDEX_MAGIC + 1).to_le_bytes(), 0).unwrap();
    expect_corrupt("version");
    file.write_at(&0xDEAD_BEEFu32.to_le_bytes(), 0).unwrap();
    expect_corrupt("magic");
    file.write_at(&good, 0).unwrap();
    file.write_at(&1_000u32.to_le_bytes(), H_ENTRY_COUNT as u64).unwrap();
    expect_corrupt("entry count");
    file.write_at(&good, 0).unwrap();
    file.write_at(&u32::MAX.to_le_bytes(), H_SLOT_COUNT as u64).unwrap();
    expect_corrupt("slot count");
    file.write_at(&good, 0).unwrap();
    file.write_at(&7u64.to_le_bytes(), H_BEGIN_PHYS as u64).unwrap();
    expect_corrupt("begin_phys");
    file.write_at(&good, 0).unwrap();
    file.set_len(700).unwrap();
    expect_corrupt("length");
}

#[test]
fn purge_below_phys_deletes_old_files_but_never_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 2, 10, false, u64::MAX);
    for n in 0..35u64 {
        ki.put(b"k", n * 10, 0).unwrap();
    }
    assert_eq!(index_files(dir.path()), vec![0, 100, 200, 300]);
    ki.purge_below_phys(90).unwrap(); // file 0 ends at 90: kept
    assert_eq!(index_files(dir.path()), vec![0, 100, 200, 300]);
    ki.purge_below_phys(91).unwrap();
    assert_eq!(index_files(dir.path()), vec![100, 200, 300]);
    assert_eq!(all(&ki, b"k").len(), 25);
    ki.purge_below_phys(u64::MAX).unwrap();
    assert_eq!(index_files(dir.path()), vec![300]);
    assert_eq!(all(&ki, b"k"), vec![340, 330, 320, 310, 300]);
    ki.put(b"k", 350, 0).unwrap();
    assert_eq!(all(&ki, b"k")[0], 350);
    drop(ki);
    let ki = open(dir.path(), 2, 10, false, u64::MAX);
    assert_eq!(all(&ki, b"k").len(), 6);
}

#[test]
fn concurrent_queries_during_puts() {
    let dir = tempfile::tempdir().unwrap();
    let ki = open(dir.path(), 3, 50, false, u64::MAX);
    std::thread::scope(|s| {
        s.spawn(|| {
            for n in 0..2_000u64 {
                ki.put(if n % 2 == 0 { b"even" } else { b"odd!" }, n, n).unwrap();
            }
        });
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..200 {
                    let got = all(&ki, b"even");
                    assert!(got.windows(2).all(|w| w[0] > w[1]));
                    assert!(got.iter().all(|p| p % 2 == 0));
                    if let Some(&top) = got.first() {
                        assert_eq!(got.len() as u64, top / 2 + 1);
                    }
                }
            });
        }
    });
    assert_eq!(all(&ki, b"odd!").len(), 1_000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_a_model(
        slots in 1u64..5,
        entries in 1u64..12,
        puts in proptest::collection::vec((0usize..6, 1u64..4, 0u64..3_000), 1..80),
        queries in proptest::collection::vec((0usize..7, 0u64..300_000, 0u64..300_000, 1usize..8), 1..10),
        valid_below in 0u64..300,
    ) {
        let keys = keys_with_distinct_crcs(7); // key 6 is never put
        let dir = tempfile::tempdir().unwrap();
        let ki = open(dir.path(), slots, entries, false, u64::MAX);
        let (mut phys, mut ts) = (0u64, 0u64);
        let mut model = Vec::new(); // (key, phys, ts) in put order
        for (k, dp, dt) in puts {
            phys += dp;
            ts += dt;
            ki.put(&keys[k], phys, ts).unwrap();
            model.push((k, phys, ts));
        }
        let check = |ki: &KeyIndex, below: u64| -> Result<(), TestCaseError> {
            for &(k, a, b, max) in &queries {
                let (a, b) = (a.min(b), a.max(b));
                let expected: Vec<u64> = model
                    .iter()
                    .rev()
                    .filter(|&&(mk, p, t)| mk == k && p < below && (a / 1000..=b / 1000).contains(&(t / 1000)))
                    .map(|&(_, p, _)| p)
                    .take(max)
                    .collect();
                prop_assert_eq!(ki.query(&keys[k], a, b, max).unwrap(), expected);
            }
            Ok(())
        };
        check(&ki, u64::MAX)?;
        drop(ki);
        check(&open(dir.path(), slots, entries, false, u64::MAX), u64::MAX)?;
        check(&open(dir.path(), slots, entries, true, valid_below), valid_below)?;
    }
}
