//! `/metrics` on real broker processes and a NameServer: scraped and parsed
//! the way Prometheus would, after producing N messages and consuming M.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Namesrv, scrape, sum_of};
use raftmq::client::{Client, Outgoing};
use raftmq::proto::pb;

#[tokio::test(flavor = "multi_thread")]
async fn lag_sends_raft_and_store_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, "sync");
    let leader = cluster.leader().await;
    let mut admin = cluster.client(leader).await;
    admin
        .put_topic(pb::PutTopicRequest {
            name: "M".into(),
            read_queues: 2,
            write_queues: 2,
            perm: 6,
            message_type: String::new(),
        })
        .await
        .unwrap();
    let access: Vec<String> = cluster.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let client = Client::connect(&access.join(";")).unwrap();
    const N: usize = 20;
    const M: usize = 8;
    for i in 0..N {
        client.send(Outgoing::new("M", format!("m{i}")).tag("T")).await.unwrap();
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < M && Instant::now() < deadline {
        let max = (M - got.len()) as i32;
        let batch = client
            .receive("G", "M", "*", max, Duration::from_secs(60), Duration::from_secs(2))
            .await
            .unwrap();
        client.ack("G", "M", &batch).await.unwrap();
        got.extend(batch);
    }
    assert_eq!(got.len(), M);

    let s = scrape(&cluster.node(leader).metrics_addr);
    assert_eq!(
        sum_of(&s, "raftmq_consumer_lag", &["group=\"G\"", "topic=\"M\""]),
        (N - M) as f64
    );
    assert_eq!(sum_of(&s, "raftmq_consumer_inflight", &["group=\"G\""]), 0.0);
    assert_eq!(sum_of(&s, "raftmq_messages_sent_total", &["topic=\"M\""]), N as f64);
    assert_eq!(sum_of(&s, "raftmq_bytes_sent_total", &["topic=\"M\""]), 50.0);
    assert_eq!(sum_of(&s, "raftmq_send_latency_seconds_count", &[]), N as f64);
    assert!(sum_of(&s, "raftmq_receive_latency_seconds_count", &[]) >= 1.0);
    assert_eq!(sum_of(&s, "raftmq_raft_role", &["role=\"leader\""]), 1.0);
    assert!(sum_of(&s, "raftmq_raft_term", &[]) >= 1.0);
    assert!(sum_of(&s, "raftmq_raft_applied_index", &[]) >= N as f64);
    assert!(sum_of(&s, "raftmq_store_bytes", &[]) > 0.0);
    assert!(
        sum_of(&s, "raftmq_flush_latency_seconds_count", &[]) >= 1.0,
        "sync mode msyncs"
    );
    assert!(sum_of(&s, "raftmq_leader_changes_total", &[]) >= 1.0);
    assert!(s.iter().any(|(n, _)| n.contains(&format!("node=\"{leader}\""))));

    // A follower reports the same lag from its own applied state.
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = scrape(&cluster.node(follower).metrics_addr);
        if sum_of(&s, "raftmq_consumer_lag", &["group=\"G\""]) == (N - M) as f64 {
            assert_eq!(sum_of(&s, "raftmq_raft_role", &["role=\"follower\""]), 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "the follower's lag never matched");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.check_alive();
}

#[tokio::test(flavor = "multi_thread")]
async fn namesrv_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut ns = Namesrv::start_with(dir.path(), "ns", 120_000, &format!("metrics_listen = \"{metrics}\"\n"));
    let extra = format!(
        "namesrv_addrs = [\"{}\"]\nnamesrv_heartbeat_interval_ms = 200\n",
        ns.addr
    );
    let mut cluster = Cluster::start_with(dir.path(), 3, "async", &extra);
    cluster.leader().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = scrape(&metrics);
        if sum_of(&s, "raftmq_namesrv_nodes", &[]) == 3.0 {
            assert_eq!(sum_of(&s, "raftmq_namesrv_groups", &[]), 1.0);
            assert!(sum_of(&s, "raftmq_namesrv_heartbeats_total", &[]) >= 3.0);
            break;
        }
        assert!(Instant::now() < deadline, "the NameServer never counted 3 nodes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ns.kill();
}
