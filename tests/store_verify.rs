//! `raftmq store verify` and `raftmq store dump` against a real store
//! directory.

use std::process::Command;

use raftmq_store::{NewRecord, RecordMeta, Store, StoreConfig};

fn raftmq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_raftmq"))
}

/// Appends record `index` (term `term`) with `payload`; its offset.
fn append(store: &Store, term: u64, index: u64, payload: &[u8]) -> u64 {
    let meta = RecordMeta { term, index, kind: 1 };
    store
        .commitlog()
        .append(&[NewRecord { meta, payload }])
        .unwrap()
        .offsets[0]
}

#[test]
fn verify_summarizes_a_clean_store_and_refuses_a_crashed_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::small_for_tests();
    let store = Store::open(dir.path(), &cfg).unwrap();
    for i in 0..50u64 {
        append(&store, 3, i + 1, &[i as u8; 700]);
    }
    drop(store); // no close: a crash

    // Verify does not recover a crashed store (the broker does, with its
    // Raft log index); it says so.
    let out = raftmq()
        .args(["store", "verify", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("crash"));
    Store::open(dir.path(), &cfg).unwrap().close().unwrap();

    let summary = verify_json(dir.path());
    assert_eq!(summary["recovered_from_crash"], false);
    assert_eq!(summary["records"], 50);
    assert_eq!(summary["first_index"], 1);
    assert_eq!(summary["last_index"], 50);
    assert_eq!(summary["last_term"], 3);
    assert_eq!(summary["payload_bytes"], 50 * 700);

    // It closed the store cleanly, and the text form reads well.
    let out = raftmq()
        .args(["store", "verify", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("last stop        clean"), "{text}");
    assert!(text.contains("records          50"), "{text}");
    assert!(text.contains("committed index  -"), "{text}");

    // The committed index a broker persisted is reported: as brokers write
    // it (its CRC first, raft_meta's layout), and as older ones did (plain
    // JSON); one whose CRC fails is not believed.
    std::fs::create_dir_all(dir.path().join("raft")).unwrap();
    let json = r#"{"leader_id":3,"index":42}"#;
    let committed_index = |content: String| {
        std::fs::write(dir.path().join("raft/committed.json"), content).unwrap();
        verify_json(dir.path())["committed_index"].clone()
    };
    assert_eq!(
        committed_index(format!("{:08x} {json}", crc32fast::hash(json.as_bytes()))),
        42
    );
    assert_eq!(committed_index(json.to_string()), 42);
    assert_eq!(committed_index(format!("00000000 {json}")), serde_json::Value::Null);

    // Dump: one line per record, oldest first, with the stored CRC.
    let out = raftmq()
        .args(["store", "dump", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 50);
    assert_eq!(lines[0]["index"], 1);
    assert_eq!(lines[49]["index"], 50);
    assert_eq!(lines[7]["term"], 3);
    assert_eq!(lines[7]["kind"], 1);
    assert_eq!(lines[7]["len"], 32 + 700);
    let crcs: std::collections::HashSet<u64> = lines.iter().map(|l| l["crc"].as_u64().unwrap()).collect();
    assert_eq!(crcs.len(), 50, "records with different payloads have different CRCs");
}

/// Verify reads every ConsumeQueue unit, its block's seal checked (a
/// running node checks a block only when it reads it), and refuses a store
/// whose node noted damage while it ran.
#[test]
fn verify_finds_damaged_queues_and_noted_damage() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::small_for_tests();
    let store = Store::open(dir.path(), &cfg).unwrap();
    for i in 0..60u64 {
        let phys = append(&store, 1, i + 1, &[7; 100]) + 32;
        store
            .dispatch(&raftmq_store::Dispatch {
                topic: "T",
                queue_id: 0,
                phys,
                size: 100,
                tag_hash: 0,
                store_timestamp_ms: 0,
                keys: vec![],
            })
            .unwrap();
        store.mark_dispatched(phys + 100);
    }
    store.close().unwrap();
    assert_eq!(verify_json(dir.path())["queues"][0]["max_offset"], 60);

    let verify_err = || {
        let out = raftmq()
            .args(["store", "verify", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    // A bit of unit 30's `phys`, in the second (whole) block.
    let cq = dir.path().join("consumequeue/T/0/00000000000000000000");
    let mut bytes = std::fs::read(&cq).unwrap();
    bytes[512 + 5 * 20] ^= 0x20;
    std::fs::write(&cq, &bytes).unwrap();
    let err = verify_err();
    assert!(err.contains("does not match its seal"), "{err}");
    bytes[512 + 5 * 20] ^= 0x20;
    std::fs::write(&cq, &bytes).unwrap();
    verify_json(dir.path());

    std::fs::write(
        dir.path().join("damaged"),
        "T/0 offset 25: a unit does not lead to its message\n",
    )
    .unwrap();
    let err = verify_err();
    assert!(
        err.contains("damaged while it ran") && err.contains("T/0 offset 25"),
        "{err}"
    );
}

#[test]
fn bad_arguments_give_a_one_line_error() {
    let empty = tempfile::tempdir().unwrap();
    let out = raftmq()
        .args(["store", "verify", "--dir"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: ") && err.contains("holds no store"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !empty.path().join("commitlog").exists(),
        "verify must not create a store"
    );

    let out = raftmq().args(["store", "verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("--dir"));
}

/// `raftmq store verify --json` of `dir`, which must succeed.
fn verify_json(dir: &std::path::Path) -> serde_json::Value {
    let out = raftmq()
        .args(["store", "verify", "--json", "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
