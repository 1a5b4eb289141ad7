//! `/metrics` on real broker processes and a NameServer: scraped and parsed
//! the way Prometheus would, after producing N messages and consuming M.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Namesrv, http_get, scrape, sum_of, wait_listening};
use raftmq::client::{Client, Outgoing};

#[tokio::test(flavor = "multi_thread")]
async fn lag_sends_raft_and_store_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, "sync");
    let leader = cluster.leader().await;
    let mut admin = cluster.client(leader).await;
    admin.put_topic(common::topic_request("M", 2, "")).await.unwrap();
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
    let g = ["consumer_group=\"G\"", "topic=\"M\""];
    // RocketMQ 5's names and definitions: everything not consumed is lag,
    // none of it was delivered, so all of it is ready.
    assert_eq!(sum_of(&s, "rocketmq_consumer_lag_messages", &g), (N - M) as f64);
    assert_eq!(sum_of(&s, "rocketmq_consumer_ready_messages", &g), (N - M) as f64);
    assert_eq!(sum_of(&s, "rocketmq_consumer_inflight_messages", &g), 0.0);
    assert!(sum_of(&s, "rocketmq_consumer_lag_latency", &g) > 0.0);
    let normal = ["topic=\"M\"", "message_type=\"normal\""];
    assert_eq!(sum_of(&s, "rocketmq_messages_in_total", &normal), N as f64);
    assert_eq!(sum_of(&s, "rocketmq_throughput_in_total", &normal), 50.0);
    assert_eq!(sum_of(&s, "rocketmq_message_size_count", &normal), N as f64);
    assert_eq!(sum_of(&s, "rocketmq_message_size_bucket", &["le=\"1024.0\""]), N as f64);
    assert_eq!(sum_of(&s, "rocketmq_messages_out_total", &g), M as f64);
    assert!(sum_of(&s, "rocketmq_throughput_out_total", &g) >= M as f64);
    // Each RPC is counted once, by the node the client called (a follower
    // forwards sends to the leader, which does not count them again).
    let all: Vec<(String, f64)> = cluster.nodes.iter().flat_map(|n| scrape(&n.metrics_addr)).collect();
    assert_eq!(
        sum_of(
            &all,
            "rocketmq_rpc_latency_count",
            &["request_code=\"SendMessage\"", "response_code=\"OK\""]
        ),
        N as f64
    );
    assert!(sum_of(&all, "rocketmq_rpc_latency_count", &["request_code=\"ReceiveMessage\""]) >= 1.0);
    assert!(sum_of(&s, "rocketmq_storage_size", &[]) > 0.0);
    assert_eq!(sum_of(&s, "rocketmq_topic_number", &[]), 1.0);
    assert_eq!(sum_of(&s, "rocketmq_consumer_group_number", &[]), 1.0);
    let node_labels = ["cluster=\"", "node_type=\"broker\"", "node_id=\""];
    assert!(s.iter().all(|(n, _)| node_labels.iter().all(|l| n.contains(l))));
    assert_eq!(sum_of(&s, "raftmq_send_latency_seconds_count", &[]), N as f64);
    assert!(sum_of(&s, "raftmq_receive_latency_seconds_count", &[]) >= 1.0);
    assert_eq!(sum_of(&s, "raftmq_raft_role", &["role=\"leader\""]), 1.0);
    assert!(sum_of(&s, "raftmq_raft_term", &[]) >= 1.0);
    assert!(sum_of(&s, "raftmq_raft_applied_index", &[]) >= N as f64);
    // The leader sees both followers' replication; both are caught up soon.
    let followers: Vec<_> = s
        .iter()
        .filter(|(n, _)| n.starts_with("raftmq_raft_replication_lag_entries{"))
        .collect();
    assert_eq!(followers.len(), 2, "{followers:?}");
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
        if sum_of(&s, "rocketmq_consumer_lag_messages", &["consumer_group=\"G\""]) == (N - M) as f64 {
            assert!(
                !s.iter()
                    .any(|(n, _)| n.starts_with("raftmq_raft_replication_lag_entries"))
            );
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

/// `/healthz` and `/readyz` as an orchestrator probes them: every node of a
/// working group is ready (the followers once they have applied what is
/// committed); a node left alone loses its leader and says why it is not
/// ready, while still alive; the NameServer is ready once it serves.
#[tokio::test(flavor = "multi_thread")]
async fn health_and_readiness_probes() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut ns = Namesrv::start_with(dir.path(), "ns", 120_000, &format!("metrics_listen = \"{metrics}\"\n"));
    wait_listening(&metrics);
    assert_eq!(http_get(&metrics, "/readyz"), (200, "ready: serving\n".into()));
    assert_eq!(http_get(&metrics, "/healthz").0, 200);
    let mut cluster = Cluster::start(dir.path(), 3, "async");
    let leader = cluster.leader().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in 1..=3u64 {
        let addr = cluster.node(id).metrics_addr.clone();
        assert_eq!(http_get(&addr, "/healthz"), (200, "ok\n".into()));
        loop {
            let (code, body) = http_get(&addr, "/readyz");
            if code == 200 {
                let role = if id == leader {
                    "ready: leader"
                } else {
                    "ready: follower of leader"
                };
                assert!(body.starts_with(role), "node {id}: {body}");
                break;
            }
            assert!(Instant::now() < deadline, "node {id} never became ready: {code} {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(http_get(&cluster.node(leader).metrics_addr, "/nope").0, 404);
    // Alone, the last node cannot keep or elect a leader.
    let last = (1..=3u64).find(|i| *i != leader).unwrap();
    for id in (1..=3u64).filter(|i| *i != last) {
        cluster.kill(id);
    }
    let addr = cluster.node(last).metrics_addr.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = http_get(&addr, "/readyz");
        if code == 503 {
            assert!(body.starts_with("not ready: no known leader"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "a node alone stayed ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(http_get(&addr, "/healthz").0, 200, "not ready, but alive");
    ns.kill();
}

/// The metrics port survives idle and half-sent connections: more than it
/// serves at once are held back, each one that sends no complete request
/// headers is closed after the header timeout, and a scrape still answers.
#[test]
fn idle_connections_do_not_lock_the_metrics_port() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut ns = Namesrv::start_with(dir.path(), "ns", 120_000, &format!("metrics_listen = \"{metrics}\"\n"));
    wait_listening(&metrics);
    // More idle connections than the port serves at once, half of them
    // with a request line and no end of headers (slow loris).
    let mut idle: Vec<std::net::TcpStream> = (0..raftmq::metrics_http::MAX_CONNECTIONS + 16)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(&metrics).unwrap();
            if i % 2 == 0 {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
            }
            s
        })
        .collect();
    let started = Instant::now();
    let samples = scrape(&metrics);
    assert!(!samples.is_empty());
    let waited = started.elapsed();
    assert!(
        waited < raftmq::metrics_http::HEADER_TIMEOUT * 3,
        "a scrape waited {waited:?} behind idle connections"
    );
    // The idle ones are closed by the server (EOF) once their time is up.
    for s in &mut idle[..4] {
        s.set_read_timeout(Some(raftmq::metrics_http::HEADER_TIMEOUT * 3))
            .unwrap();
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                assert!(text.starts_with("HTTP/1.1 408"), "{text}");
            }
            Err(e) => panic!("an idle connection was still open after {:?}: {e}", started.elapsed()),
        }
    }
    ns.kill();
}
