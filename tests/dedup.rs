//! Exactly-once sends through the deduplication window, with real broker
//! processes speaking `apache.rocketmq.v2`: a producer's retry of a send
//! (same message id, as the official clients retry) is stored once, also
//! when the leader that stored the first copy was killed before the retry,
//! and `raftmq cluster dedup` shows and changes the window.

mod common;

use std::time::{Duration, Instant};

use common::v2::*;
use common::{Cluster, Namesrv, raftmq_cli, raftmq_cli_ok, read_queue, scrape, sum_of};
use raftmq::proto::rocketmq::v2::{self, Code};

/// `raftmq cluster dedup` on group `test` with `settings`, until it
/// succeeds; its stdout.
fn dedup_cli(namesrv: &str, settings: &[&str]) -> String {
    let mut args = vec!["cluster", "dedup", "--namesrv", namesrv, "--broker", "test"];
    args.extend_from_slice(settings);
    raftmq_cli_ok(&args)
}

/// Every message id in topic T's two queues, as node `id` reads them, by
/// (queue, offset).
async fn stored(c: &Cluster, id: u64) -> Vec<(u32, u64, String)> {
    let mut out = Vec::new();
    for q in 0..2 {
        for (offset, message_id) in read_queue(c, id, q).await {
            out.push((q, offset, message_id));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_the_leader_died_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let ns = Namesrv::start(dir.path(), "ns", 120_000);
    let extra = format!(
        "namesrv_addrs = [\"{}\"]\nnamesrv_heartbeat_interval_ms = 200\n",
        ns.addr
    );
    let mut cluster = Cluster::start_with(dir.path(), 3, "async", &extra);
    let leader = cluster.leader().await;
    cluster.create_topic("T", 2, "").await;

    let r = send(
        &mut client(&cluster, leader).await,
        vec![msg("T", "X-1", b"one"), msg("T", "X-2", b"two")],
    )
    .await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    let first: Vec<i64> = r.entries.iter().map(|e| e.offset).collect();

    // The leader dies; the producer, which (as far as it knows) never got
    // an answer, sends X-2 again, with a new message, to another node.
    cluster.kill(leader);
    let next = cluster.leader().await;
    let r = send(
        &mut client(&cluster, next).await,
        vec![msg("T", "X-2", b"two"), msg("T", "X-3", b"three")],
    )
    .await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    assert_eq!(r.entries[0].message_id, "X-2");
    assert_eq!(
        r.entries[0].offset, first[1],
        "the retry is answered with the first copy's offset"
    );
    let x3 = r.entries[1].offset;

    // X-2 is stored once, on every node that runs.
    let ids = |s: &[(u32, u64, String)]| {
        let mut ids: Vec<String> = s.iter().map(|(_, _, id)| id.clone()).collect();
        ids.sort();
        ids
    };
    let survivors: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
    let want = vec!["X-1".to_string(), "X-2".into(), "X-3".into()];
    let deadline = Instant::now() + Duration::from_secs(10);
    for &id in &survivors {
        loop {
            let got = ids(&stored(&cluster, id).await);
            if got == want {
                break;
            }
            assert!(Instant::now() < deadline, "node {id} holds {got:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let node = cluster.node(next);
    let duplicates = sum_of(&scrape(&node.metrics_addr), "raftmq_send_duplicates_total", &[]);
    assert_eq!(duplicates, 1.0);

    // The window as the CLI shows it, then turned off: the same retry is
    // stored again (at-least-once), and back on.
    let n = ns.addr.as_str();
    let out = dedup_cli(n, &[]);
    assert!(out.contains("within 120000 ms and 1000000 ids (holds 3 now)"), "{out}");
    let out = dedup_cli(n, &["--window-ms", "0"]);
    assert!(out.contains("no deduplication"), "{out}");
    let r = send(&mut client(&cluster, next).await, vec![msg("T", "X-1", b"one")]).await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    assert_eq!(stored(&cluster, next).await.len(), 4);
    let too_many = ["--window-ms", "60000", "--max-ids", "3000000"];
    let (accepted, _, err) = raftmq_cli(
        &[
            ["cluster", "dedup", "--namesrv", n, "--broker", "test"].as_slice(),
            &too_many,
        ]
        .concat(),
    );
    assert!(!accepted && err.contains("at most 2000000 ids"), "{err}");
    let out = dedup_cli(n, &["--window-ms", "60000"]);
    assert!(out.contains("within 60000 ms"), "{out}");
    let r = send(&mut client(&cluster, next).await, vec![msg("T", "X-3", b"three")]).await;
    assert_eq!(
        r.entries[0].offset, x3,
        "ids stored before it was off are still known: {r:?}"
    );
    assert_eq!(stored(&cluster, next).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_timed_or_transactional_send_is_held_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, "async");
    let leader = cluster.leader().await;
    cluster.create_topic("T", 1, "MIXED").await;
    let mut c = client(&cluster, leader).await;

    // A timed message, due in 1.5 s, sent twice (its producer never saw the
    // first answer): the retry gets the first copy's recall handle.
    let due = std::time::SystemTime::now() + Duration::from_millis(1500);
    let timed = timed_msg("T", "D-1", b"timed", due);
    let first = send(&mut c, vec![timed.clone()]).await;
    assert_eq!(code(&first.status), Code::Ok, "{first:?}");
    let again = send(&mut c, vec![timed.clone()]).await;
    assert_eq!(code(&again.status), Code::Ok, "{again:?}");
    assert!(!first.entries[0].recall_handle.is_empty());
    assert_eq!(again.entries[0].recall_handle, first.entries[0].recall_handle);
    let recall_handle = first.entries[0].recall_handle.clone();

    // A half message sent twice: the retry gets the same transaction id,
    // and one commit ends the one transaction.
    let mut half = msg("T", "H-1", b"half");
    half.system_properties.as_mut().unwrap().message_type = v2::MessageType::Transaction as i32;
    let first = send(&mut c, vec![half.clone()]).await;
    assert_eq!(code(&first.status), Code::Ok, "{first:?}");
    let again = send(&mut c, vec![half]).await;
    assert_eq!(code(&again.status), Code::Ok, "{again:?}");
    let txn = first.entries[0].transaction_id.clone();
    assert!(!txn.is_empty());
    assert_eq!(again.entries[0].transaction_id, txn);
    assert_eq!(commit(&mut c, "T", "H-1", &txn).await, Code::Ok);

    // A third try of the timed send, arriving once its time has passed: it
    // is still the held message's retry, not a new message due at once.
    let wait = due.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    let late = send(&mut c, vec![timed]).await;
    assert_eq!(code(&late.status), Code::Ok, "{late:?}");
    assert_eq!(late.entries[0].recall_handle, recall_handle);

    // A message due an hour ago is held too, and released at once.
    let overdue = timed_msg(
        "T",
        "D-2",
        b"overdue",
        std::time::SystemTime::now() - Duration::from_secs(3600),
    );
    let sent = Instant::now();
    let r = send(&mut c, vec![overdue]).await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    while !read_queue(&cluster, leader, 0).await.values().any(|id| id == "D-2") {
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "the overdue message was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Each is released into T once, on every node: a second timer or half
    // would have come out by now too (2 s past the due time).
    let deadline = Instant::now() + Duration::from_secs(15);
    for id in 1..=3 {
        loop {
            let mut got: Vec<String> = read_queue(&cluster, id, 0).await.into_values().collect();
            got.sort();
            let settled = std::time::SystemTime::now() > due + Duration::from_secs(2);
            if got == ["D-1", "D-2", "H-1"] && settled {
                break;
            }
            assert!(got.len() <= 3, "node {id} holds {got:?}");
            assert!(Instant::now() < deadline, "node {id} holds {got:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let node = cluster.node(leader);
    let duplicates = sum_of(&scrape(&node.metrics_addr), "raftmq_send_duplicates_total", &[]);
    assert_eq!(duplicates, 3.0);
}
