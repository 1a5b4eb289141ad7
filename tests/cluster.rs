//! A three-node group of real `raftmq broker` processes on 127.0.0.1.

mod common;

use std::collections::BTreeMap;

use common::{Cluster, check_reads, message, send_retrying, wait_applied_equal};
use raftmq::proto::pb;

/// Sends `count` single-message batches from `tasks` concurrent tasks
/// spread over all nodes; returns (queue, offset) -> message number for
/// every acknowledged send.
async fn send_many(c: &Cluster, from: u64, count: u64, tasks: u64, queues: u32) -> BTreeMap<(u32, u64), u64> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut client = c.client(1 + t % c.nodes.len() as u64).await;
        handles.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = from + t;
            while i < from + count {
                let q = (i % u64::from(queues)) as u32;
                let r = client
                    .send(pb::SendRequest {
                        topic: "T".into(),
                        queue_id: q,
                        messages: vec![message(i)],
                    })
                    .await;
                if let Ok(r) = r {
                    acked.push(((q, r.into_inner().first_queue_offset), i));
                }
                i += tasks;
            }
            acked
        }));
    }
    let mut all = BTreeMap::new();
    for h in handles {
        for (k, v) in h.await.unwrap() {
            assert!(all.insert(k, v).is_none(), "two acknowledged sends got {k:?}");
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_get_dense_offsets_and_read_back_on_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    c.leader().await;
    c.create_topic("T", 4, "").await;
    let acked = send_many(&c, 0, 10_000, 32, 4).await;
    assert_eq!(acked.len(), 10_000, "every send to a healthy group succeeds");
    for id in 1..=3 {
        check_reads(&c, id, &acked, 4).await;
    }
    let st = wait_applied_equal(&c, &[1, 2, 3]).await;
    assert!(
        st.windows(2)
            .all(|w| w[0].applied_log_digest == w[1].applied_log_digest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_nothing_and_the_old_leader_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "sync");
    let old = c.leader().await;
    c.create_topic("T", 2, "").await;
    let mut acked = send_many(&c, 0, 500, 8, 2).await;
    c.kill(old);
    // Sends continue at once through a survivor: it forwards to the new
    // leader as soon as one is elected; the client does not retry.
    let survivors: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
    let mut client = c.client(survivors[0]).await;
    for i in 500..1000u64 {
        let q = (i % 2) as u32;
        let offset = send_retrying(&mut client, q, i).await;
        assert!(acked.insert((q, offset), i).is_none());
    }
    assert_ne!(c.leader().await, old);
    for &id in &survivors {
        check_reads(&c, id, &acked, 2).await;
    }
    // The old leader restarts from its files, recovers and catches up; the
    // applied prefix of all three logs is byte-identical.
    c.spawn(old);
    let st = wait_applied_equal(&c, &[1, 2, 3]).await;
    assert!(
        st.windows(2)
            .all(|w| w[0].applied_log_digest == w[1].applied_log_digest),
        "digests differ: {st:?}"
    );
    check_reads(&c, old, &acked, 2).await;
}

/// A leader stopped with SIGTERM (a planned stop: systemd, Kubernetes, a
/// rolling restart) hands leadership over before it exits, so when its
/// process is gone another node already leads, with a higher term, and has
/// everything that was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_before_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    let old = c.leader().await;
    let term = c.status(old, false).await.unwrap().term;
    c.create_topic("T", 2, "").await;
    let acked = send_many(&c, 0, 200, 4, 2).await;
    assert!(c.stop(old).success());
    let mut leaders = Vec::new();
    for id in (1..=3).filter(|&i| i != old) {
        let s = c.status(id, false).await.unwrap();
        if s.role == "leader" {
            leaders.push((id, s.term));
        }
    }
    assert_eq!(
        leaders.len(),
        1,
        "one leader the moment the old one is gone: {leaders:?}"
    );
    assert!(leaders[0].1 > term);
    check_reads(&c, leaders[0].0, &acked, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    c.leader().await;
    c.create_topic("T", 2, "").await;
    let mut client = c.client(2).await;
    let send = |topic: &str, queue_id: u32, body: usize| pb::SendRequest {
        topic: topic.into(),
        queue_id,
        messages: vec![pb::Message {
            body: vec![b'x'; body].into(),
            ..Default::default()
        }],
    };
    let e = client.send(send("Nope", 0, 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let e = client.send(send("T", 7, 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = client.send(send("T", 0, 5 << 20)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = client
        .put_topic(common::topic_request("bad/name", 1, ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = client
        .read(pb::ReadRequest {
            topic: "Nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    // A send whose messages together exceed the largest record is refused
    // up front: the log would refuse the entry, and openraft would stop.
    let three_big = pb::SendRequest {
        topic: "T".into(),
        queue_id: 0,
        messages: (0..3)
            .map(|_| pb::Message {
                body: vec![b'y'; 400_000].into(),
                ..Default::default()
            })
            .collect(),
    };
    let e = client.send(three_big).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    client
        .send(send("T", 1, 10))
        .await
        .expect("Raft still runs on the leader");
    // A frame above the transport's limit is refused by gRPC itself.
    let huge = pb::SendRequest {
        topic: "T".into(),
        queue_id: 0,
        messages: vec![pb::Message {
            body: vec![0u8; raftmq::MAX_MESSAGE_SIZE + 1].into(),
            ..Default::default()
        }],
    };
    let mut big_client = c.client(2).await.max_encoding_message_size(usize::MAX);
    let e = big_client.send(huge).await.unwrap_err();
    assert!(
        matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted),
        "{e}"
    );
    // The node is fine afterwards.
    client.send(send("T", 0, 10)).await.unwrap();
    // A clean stop exits 0.
    for id in 1..=3 {
        assert!(c.stop(id).success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_cli_creates_sends_reads_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    c.leader().await;
    let run = common::raftmq_cli;
    let (n1, n3) = (c.node(1).client_addr.clone(), c.node(3).client_addr.clone());
    let (ok, out, err) = run(&[
        "node",
        "put-topic",
        "--endpoint",
        &n3,
        "--topic",
        "Cli",
        "--queues",
        "2",
    ]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run(&["node", "send", "--endpoint", &n3, "--topic", "Cli", "--count", "3"]);
    assert!(ok && out.contains("offset 2"), "{out}{err}");
    let (ok, out, err) = run(&["node", "read", "--endpoint", &n1, "--topic", "Cli"]);
    assert!(ok && out.contains("3 messages"), "{out}{err}");
    let (ok, out, err) = run(&["node", "status", "--endpoint", &n1]);
    assert!(ok && out.contains("role") && out.contains("voter"), "{out}{err}");
    // Bad arguments and unknown topics: one line on stderr, non-zero exit.
    let (ok, _, err) = run(&["node", "send", "--endpoint", &n1, "--topic", "Nope"]);
    assert!(
        !ok && err.trim().lines().count() == 1 && err.contains("does not exist"),
        "{err}"
    );
    let (ok, _, err) = run(&["node", "status", "--endpoint", "127.0.0.1:1"]);
    assert!(!ok && err.contains("cannot reach"), "{err}");
}
