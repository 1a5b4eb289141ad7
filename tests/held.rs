//! Timed and half messages on a three-node group of real `raftmq broker`
//! processes: the schedule and open transactions survive a restart of
//! every node (through a snapshot and the log after it), and each message
//! is delivered once, not before it is due; and the held messages a group
//! keeps are bounded.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Cluster, scrape, sum_of};
use raftmq::client::{Client, Outgoing};

/// Receives from `topic` until `want` bodies arrived or `within` passed;
/// returns body -> store times of every delivery (duplicates included).
async fn receive_all(client: &Client, topic: &str, want: usize, within: Duration) -> BTreeMap<String, Vec<u64>> {
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + within;
    while got.values().map(Vec::len).sum::<usize>() < want && tokio::time::Instant::now() < deadline {
        let msgs = match client
            .receive("G", topic, "*", 32, Duration::from_secs(30), Duration::from_secs(1))
            .await
        {
            Ok(m) => m,
            Err(e) => {
                eprintln!("receive: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        for m in &msgs {
            got.entry(String::from_utf8_lossy(&m.body).into_owned())
                .or_default()
                .push(m.store_timestamp_ms);
        }
        client.ack("G", topic, &msgs).await.unwrap();
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_and_transactions_survive_a_restart_of_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", "snapshot_every = 20");
    c.leader().await;
    c.create_topic("Timed", 2, "DELAY").await;
    c.create_topic("Txn", 2, "TRANSACTION").await;
    c.create_topic("Filler", 2, "").await;
    let endpoints: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let client = Client::connect(&endpoints.join(";")).unwrap();

    let due = raftmq::clock::now_ms() + 6_000;
    let timed: Vec<Outgoing> = (0..30)
        .map(|i| Outgoing::new("Timed", format!("t{i}")).deliver_at(due + i * 10))
        .collect();
    let sent = client.send_batch(timed).await.unwrap();
    assert!(sent.iter().all(|r| r.recall_handle.starts_with("t2.")));
    // One recalled before the restart: it must stay recalled.
    assert_eq!(
        client.recall("Timed", &sent[29].recall_handle).await.unwrap(),
        sent[29].message_id
    );
    // Concurrent timed sends share entries (the batcher packs them): each
    // recall handle still names its own message.
    let concurrent = futures::future::join_all(
        (0..20).map(|i| client.send(Outgoing::new("Timed", format!("c{i}")).deliver_at(due + i))),
    )
    .await;
    let concurrent: Vec<_> = concurrent.into_iter().map(Result::unwrap).collect();
    for r in concurrent.iter().step_by(4) {
        assert_eq!(client.recall("Timed", &r.recall_handle).await.unwrap(), r.message_id);
    }
    let mut halves = Vec::new();
    for i in 0..10 {
        let r = client
            .send(Outgoing::new("Txn", format!("x{i}")).transactional())
            .await
            .unwrap();
        assert!(r.transaction_id.starts_with("x2."), "{r:?}");
        halves.push(r);
    }
    // Enough entries for a snapshot (every 20) on every node: the held
    // state comes back from the snapshot, the rest from the log after it.
    for i in 0..30 {
        client.send(Outgoing::new("Filler", format!("f{i}"))).await.unwrap();
    }
    for id in 1..=3 {
        assert!(c.stop(id).success());
        let snapshot = dir.path().join(format!("node{id}/raft/snapshot.json"));
        let text = std::fs::read_to_string(&snapshot).unwrap();
        assert!(text.contains("\"timers\":[["), "node {id}'s snapshot holds the timers");
    }
    for id in 1..=3 {
        c.spawn(id);
    }
    c.leader().await;
    assert!(
        raftmq::clock::now_ms() < due,
        "the restart took longer than the timers' delay"
    );
    // Transactions resolved after the restart.
    for (i, r) in halves.iter().enumerate() {
        client.end_transaction("Txn", r, i % 2 == 0).await.unwrap();
    }
    // A second verdict finds nothing pending.
    assert!(client.end_transaction("Txn", &halves[0], true).await.is_err());

    let timed = receive_all(&client, "Timed", 29 + 15, Duration::from_secs(40)).await;
    let mut want: Vec<String> = (0..29).map(|i| format!("t{i}")).collect();
    want.extend((0..20).filter(|i| i % 4 != 0).map(|i| format!("c{i}")));
    want.sort();
    assert_eq!(
        timed.keys().cloned().collect::<Vec<_>>(),
        want,
        "every timed message but the recalled ones"
    );
    for (body, stores) in &timed {
        assert_eq!(stores.len(), 1, "{body} delivered {} times", stores.len());
        let i: u64 = body[1..].parse().unwrap();
        let at = if body.starts_with('t') { due + i * 10 } else { due + i };
        assert!(stores[0] >= at, "{body} released before it was due");
    }
    let txn = receive_all(&client, "Txn", 5, Duration::from_secs(20)).await;
    let want: Vec<String> = (0..10).step_by(2).map(|i| format!("x{i}")).collect();
    assert_eq!(txn.keys().cloned().collect::<Vec<_>>(), want);
    assert!(txn.values().all(|v| v.len() == 1));
    // Nothing else arrives: no duplicate, no rolled-back message.
    assert!(
        receive_all(&client, "Timed", 1, Duration::from_secs(2))
            .await
            .is_empty()
    );
    assert!(receive_all(&client, "Txn", 1, Duration::from_secs(2)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_timed_messages_are_rolled_and_still_recalled_and_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    // Copies older than a second are stored again (every half second).
    let c = Cluster::start_with(dir.path(), 3, "async", "[timer]\nroll_after_ms = 1000\n");
    c.create_topic("Timed", 2, "DELAY").await;
    let endpoints: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let client = Client::connect(&endpoints.join(";")).unwrap();
    let due = raftmq::clock::now_ms() + 5_000;
    let batch = (0..10)
        .map(|i| Outgoing::new("Timed", format!("r{i}")).deliver_at(due + i))
        .collect();
    let sent = client.send_batch(batch).await.unwrap();
    // Rolled at least once (and so out of the entries they were sent in).
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    let rolled = loop {
        let rolled: f64 = c
            .nodes
            .iter()
            .map(|n| sum_of(&scrape(&n.metrics_addr), "raftmq_timers_rolled_total", &[]))
            .sum();
        if rolled >= 10.0 || std::time::Instant::now() > deadline {
            break rolled;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(rolled >= 10.0, "rolled {rolled} timed messages, not all 10");
    // The handle from the send still recalls its message.
    assert_eq!(
        client.recall("Timed", &sent[3].recall_handle).await.unwrap(),
        sent[3].message_id
    );
    let got = receive_all(&client, "Timed", 9, Duration::from_secs(20)).await;
    let mut want: Vec<String> = (0..10).filter(|i| *i != 3).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);
    for (body, stores) in &got {
        assert_eq!(stores.len(), 1, "{body} delivered {} times", stores.len());
        assert!(stores[0] >= due, "{body} released before it was due");
    }
    assert!(
        receive_all(&client, "Timed", 1, Duration::from_secs(2))
            .await
            .is_empty()
    );
}

/// Held messages live in replicated state, and so in every snapshot, until
/// they are released: `limits.max_held_messages` bounds them over the
/// group. Past it a timed or transactional send is refused with
/// `TOO_MANY_REQUESTS` (retryable), plain sends go on, and room comes back
/// when a timer falls due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_are_bounded_and_room_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", "[limits]\nmax_held_messages = 3\n");
    c.leader().await;
    c.create_topic("Timed", 1, "DELAY").await;
    c.create_topic("Txn", 1, "TRANSACTION").await;
    c.create_topic("Plain", 1, "").await;
    let endpoints: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let client = Client::connect(&endpoints.join(";")).unwrap();

    let now = raftmq::clock::now_ms();
    let far = now + 600_000;
    // Two batches of two at once: the second is refused whether or not the
    // first was applied yet (admitted sends count until they are over).
    let batch = |tag: &str| {
        (0..2)
            .map(|i| Outgoing::new("Timed", format!("{tag}{i}")).deliver_at(far))
            .collect::<Vec<_>>()
    };
    let (a, b) = tokio::join!(client.send_batch(batch("a")), client.send_batch(batch("b")));
    assert_eq!(
        [a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count(),
        1,
        "four past a bound of three: {a:?} {b:?}"
    );
    client
        .send(Outgoing::new("Timed", "soon").deliver_at(now + 8_000))
        .await
        .unwrap();
    for (what, m) in [
        ("timed", Outgoing::new("Timed", "over").deliver_at(far)),
        ("transactional", Outgoing::new("Txn", "over").transactional()),
    ] {
        let e = client.send(m).await.unwrap_err();
        assert!(e.retryable(), "a {what} send past the bound: {e}");
        assert!(e.to_string().contains("limits.max_held_messages"), "{e}");
    }
    client.send(Outgoing::new("Plain", "p")).await.unwrap();

    // "soon" falls due and is released: room for one more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.send(Outgoing::new("Timed", "later").deliver_at(far)).await {
            Ok(_) => break,
            Err(e) if e.retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no room came back: {e}"),
        }
    }
    let got = receive_all(&client, "Timed", 1, Duration::from_secs(10)).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["soon"], "{got:?}");
    c.check_alive();
}
