//! Throughput and latency of a three-node group, in one process over
//! loopback gRPC: `cargo bench -p raftmq --bench cluster`.
//!
//! For 1 KiB messages with 1, 16 and 64 concurrent senders, in async and in
//! sync flush mode, it prints messages/s and p50/p99 latency of `Send`
//! through the leader, and, in the same run, the rate of a no-op unary call
//! (`Ping` with the same payload) at the same concurrency: the transport's
//! ceiling, with the ratio.
//!
//! Then the same through the RocketMQ client protocol (`apache.rocketmq.v2`):
//! `SendMessage` at 1, 16 and 64 producers (with the ratio to raftmq's own
//! `Send` measured above), the rate at which 4 consumers drain what was sent
//! (`ReceiveMessage` + `AckMessage`), and end-to-end latency (send to
//! receive) with producers and long-polling consumers running together.
//!
//! Environment: `RAFTMQ_BENCH_SECS` (per case, default 3), `RAFTMQ_BENCH_DIR`.

use std::time::{Duration, Instant};

use raftmq::broker::config::{BrokerConfig, PeerConfig};
use raftmq::proto::pb;
use raftmq::proto::pb::broker_client::BrokerClient;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use raftmq::server::RunningBroker;
use raftmq_store::{FlushMode, StoreConfig};

const PAYLOAD: usize = 1024;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_group(dir: &std::path::Path, flush: FlushMode) -> Vec<RunningBroker> {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let peers: std::collections::BTreeMap<u64, PeerConfig> = (1..=3u64)
        .map(|id| {
            let (c, r) = ports[id as usize - 1];
            (
                id,
                PeerConfig {
                    raft_addr: format!("127.0.0.1:{r}"),
                    client_addr: format!("127.0.0.1:{c}"),
                },
            )
        })
        .collect();
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let (c, r) = ports[id as usize - 1];
        let cfg = BrokerConfig {
            group: "bench".into(),
            node_id: id,
            data_dir: dir.join(format!("node{id}")),
            client_listen: format!("127.0.0.1:{c}"),
            raft_listen: format!("127.0.0.1:{r}"),
            advertise_client_addr: None,
            advertise_raft_addr: None,
            peers: peers.clone(),
            bootstrap: id == 1,
            election_timeout_min_ms: 1000,
            election_timeout_max_ms: 2000,
            heartbeat_interval_ms: 100,
            snapshot_every: 100_000,
            preferred_leader: Some(1),
            max_body_bytes: 4 << 20,
            retention_check_interval_ms: 10_000,
            cluster: "bench".into(),
            namesrv_addrs: vec![],
            namesrv_heartbeat_interval_ms: 30_000,
            auto_create_groups: true,
            metrics_listen: None,
            auto_create_topics: false,
            auto_create_topic_queues: 8,
            max_delivery_attempts: 16,
            default_invisible_ms: 60_000,
            min_invisible_ms: 10_000,
            long_polling_timeout_ms: 20_000,
            unsafe_ack_before_commit: false,
            clock_offset_file: None,
            timer: Default::default(),
            transaction: Default::default(),
            limits: Default::default(),
            identity: None,
            tls: None,
            acl: Default::default(),
            store: StoreConfig {
                flush_mode: flush,
                segment_size: 256 << 20,
                // The host's disk use must not decide a benchmark (as
                // benches/bench-node.toml for the scripts).
                retention: raftmq_store::RetentionConfig {
                    disk_warn_ratio: 1.0,
                    disk_force_ratio: 1.0,
                    disk_refuse_ratio: 1.0,
                    ..Default::default()
                },
                ..StoreConfig::default()
            },
        };
        nodes.push(RunningBroker::start(cfg).await.unwrap());
    }
    nodes
}

/// A client channel as a real client should open it: without Nagle's
/// algorithm, which with delayed ACKs stalls small requests for 40 ms.
async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(addr.to_string())
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap()
}

async fn connect(addr: &str) -> BrokerClient<tonic::transport::Channel> {
    BrokerClient::new(channel(addr).await)
}

async fn leader_client(nodes: &[RunningBroker]) -> String {
    for _ in 0..500 {
        if let Some(n) = nodes.iter().find(|n| n.broker.node.is_leader()) {
            return format!("http://{}", n.client_addr);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no leader");
}

struct Result {
    ok: u64,
    errors: u64,
    secs: f64,
    latencies_us: Vec<u64>,
}

impl Result {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.secs
    }
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
    }
}

/// Runs `concurrency` tasks calling `op` in a loop for `secs`.
async fn drive<F, Fut>(concurrency: usize, secs: u64, op: F) -> Result
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let start = Instant::now();
    let stop = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut errors, mut lat) = (0u64, 0u64, Vec::new());
            let mut i = t as u64;
            while Instant::now() < stop {
                let s = Instant::now();
                if op(i).await {
                    ok += 1;
                    lat.push(s.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
                i += concurrency as u64;
            }
            (ok, errors, lat)
        }));
    }
    let mut r = Result {
        ok: 0,
        errors: 0,
        secs: 0.0,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        let (ok, errors, lat) = t.await.unwrap();
        r.ok += ok;
        r.errors += errors;
        r.latencies_us.extend(lat);
    }
    r.secs = start.elapsed().as_secs_f64();
    r.latencies_us.sort_unstable();
    r
}

fn main() {
    let secs: u64 = std::env::var("RAFTMQ_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base = std::env::var_os("RAFTMQ_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        println!("raftmq three-node group, in process on loopback; {PAYLOAD}-byte messages, {secs} s per case");
        println!(
            "{:<6} {:>5} {:>12} {:>9} {:>9} {:>7} {:>10} {:>14} {:>8}",
            "flush", "conc", "msgs/s", "p50 ms", "p99 ms", "errors", "msgs/entry", "no-op calls/s", "ratio"
        );
        for flush in [FlushMode::Async, FlushMode::Sync] {
            let dir = tempfile::Builder::new()
                .prefix("raftmq-bench")
                .tempdir_in(&base)
                .unwrap();
            let nodes = start_group(dir.path(), flush).await;
            let addr = leader_client(&nodes).await;
            let mut admin = connect(&addr).await;
            admin
                .put_topic(pb::PutTopicRequest {
                    name: "Bench".into(),
                    read_queues: 8,
                    write_queues: 8,
                    perm: 6,
                    message_type: String::new(),
                })
                .await
                .unwrap();
            let body = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
            let mut v1_rates = Vec::new();
            for concurrency in [1usize, 16, 64] {
                // One channel per 8 tasks, as real clients would share them.
                let mut clients = Vec::new();
                for _ in 0..concurrency.div_ceil(8) {
                    clients.push(connect(&addr).await);
                }
                let leader = nodes.iter().find(|n| n.broker.node.is_leader()).expect("leader");
                let entries_before = leader.broker.node.log.bounds().1;
                let (c2, b2) = (clients.clone(), body.clone());
                let sends = drive(concurrency, secs, move |i| {
                    let mut client = c2[(i as usize) % c2.len()].clone();
                    let body = b2.clone();
                    async move {
                        client
                            .send(pb::SendRequest {
                                topic: "Bench".into(),
                                queue_id: (i % 8) as u32,
                                messages: vec![pb::Message {
                                    message_id: format!("m{i}"),
                                    body,
                                    ..Default::default()
                                }],
                            })
                            .await
                            .is_ok()
                    }
                })
                .await;
                let entries = leader.broker.node.log.bounds().1 - entries_before;
                let (c3, b3) = (clients.clone(), body.clone());
                let pings = drive(concurrency, secs, move |i| {
                    let mut client = c3[(i as usize) % c3.len()].clone();
                    let payload = b3.clone();
                    async move { client.ping(pb::PingRequest { payload }).await.is_ok() }
                })
                .await;
                v1_rates.push(sends.rate());
                println!(
                    "{:<6} {:>5} {:>12.0} {:>9.2} {:>9.2} {:>7} {:>10.1} {:>14.0} {:>7.0}%",
                    format!("{flush:?}").to_lowercase(),
                    concurrency,
                    sends.rate(),
                    sends.pct(0.5),
                    sends.pct(0.99),
                    sends.errors,
                    sends.ok as f64 / entries.max(1) as f64,
                    pings.rate(),
                    100.0 * sends.rate() / pings.rate()
                );
            }
            client_protocol(&addr, flush, secs, &v1_rates).await;
            for n in nodes {
                n.shutdown().await.unwrap();
            }
        }
    });
}

fn v2_message(i: u64, body: &bytes::Bytes) -> v2::Message {
    let sent_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    v2::Message {
        topic: Some(v2::Resource {
            resource_namespace: String::new(),
            name: "Bench".into(),
        }),
        user_properties: [("sent_us".to_string(), sent_us.to_string())].into(),
        system_properties: Some(v2::SystemProperties {
            message_id: format!("bench-{i}"),
            message_type: v2::MessageType::Normal as i32,
            ..Default::default()
        }),
        body: body.clone(),
    }
}

async fn v2_connect(addr: &str) -> MessagingServiceClient<tonic::transport::Channel> {
    MessagingServiceClient::new(channel(addr).await)
}

/// One receive (long-polling up to `wait_ms`) and the ack of what came;
/// returns how many came and the end-to-end latencies (µs) of those sent
/// through the v2 protocol (the messages of the `Send` rounds have none).
async fn receive_and_ack(
    c: &mut MessagingServiceClient<tonic::transport::Channel>,
    wait_ms: i32,
) -> Option<(usize, Vec<u64>)> {
    let group = Some(v2::Resource {
        resource_namespace: String::new(),
        name: "BenchGroup".into(),
    });
    let topic = Some(v2::Resource {
        resource_namespace: String::new(),
        name: "Bench".into(),
    });
    let req = v2::ReceiveMessageRequest {
        group: group.clone(),
        message_queue: Some(v2::MessageQueue {
            topic: topic.clone(),
            ..Default::default()
        }),
        filter_expression: None,
        batch_size: 32,
        invisible_duration: Some(prost_types::Duration { seconds: 60, nanos: 0 }),
        auto_renew: false,
        long_polling_timeout: Some(prost_types::Duration {
            seconds: 0,
            nanos: wait_ms * 1_000_000,
        }),
        attempt_id: None,
    };
    let mut stream = match c.receive_message(req).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            eprintln!("receive failed: {e}");
            return None;
        }
    };
    let (mut entries, mut lat) = (Vec::new(), Vec::new());
    while let Ok(Some(r)) = stream.message().await {
        if let Some(v2::receive_message_response::Content::Status(s)) = &r.content
            && s.code != v2::Code::Ok as i32
            && s.code != v2::Code::MessageNotFound as i32
        {
            eprintln!("receive: {s:?}");
        }
        if let Some(v2::receive_message_response::Content::Message(m)) = r.content {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64;
            if let Some(t) = m.user_properties.get("sent_us").and_then(|t| t.parse::<u64>().ok()) {
                lat.push(now.saturating_sub(t));
            }
            let sp = m.system_properties.unwrap_or_default();
            entries.push(v2::AckMessageEntry {
                message_id: sp.message_id,
                receipt_handle: sp.receipt_handle.unwrap_or_default(),
                lite_topic: None,
            });
        }
    }
    let n = entries.len();
    if n > 0 {
        c.ack_message(v2::AckMessageRequest { group, topic, entries })
            .await
            .ok()?;
    }
    Some((n, lat))
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

/// SendMessage, ReceiveMessage and end-to-end latency through the v2 protocol.
async fn client_protocol(addr: &str, flush: FlushMode, secs: u64, v1_rates: &[f64]) {
    const CONSUMERS: usize = 4;
    let body = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    println!(
        "{:<6} {:>5} {:>12} {:>9} {:>9} {:>7} {:>9} {:>13} {:>9} {:>9}",
        "v2", "prod", "send/s", "p50 ms", "p99 ms", "errors", "vs Send", "drain msgs/s", "e2e p50", "e2e p99"
    );
    let mut consumer_clients = Vec::new();
    for _ in 0..CONSUMERS {
        consumer_clients.push(v2_connect(addr).await);
    }
    for (k, concurrency) in [1usize, 16, 64].into_iter().enumerate() {
        let mut clients = Vec::new();
        for _ in 0..concurrency.div_ceil(8) {
            clients.push(v2_connect(addr).await);
        }
        let (c2, b2) = (clients.clone(), body.clone());
        let sends = drive(concurrency, secs, move |i| {
            let mut client = c2[(i as usize) % c2.len()].clone();
            let m = v2_message(i, &b2);
            async move {
                client
                    .send_message(v2::SendMessageRequest { messages: vec![m] })
                    .await
                    .is_ok_and(|r| r.into_inner().status.is_some_and(|s| s.code == v2::Code::Ok as i32))
            }
        })
        .await;
        // Drain what was sent with CONSUMERS receivers.
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in &consumer_clients {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut n = 0usize;
                while let Some((got, _)) = receive_and_ack(&mut c, 200).await {
                    if got == 0 {
                        break;
                    }
                    n += got;
                }
                n
            }));
        }
        let mut drained = 0;
        for t in tasks {
            drained += t.await.unwrap();
        }
        // The last empty long poll of each consumer is not drain time.
        let drain_secs = (start.elapsed().as_secs_f64() - 0.2).max(0.001);
        // End to end: producers and long-polling consumers together.
        let stop = Instant::now() + Duration::from_secs(secs);
        let mut consumers = Vec::new();
        for c in &consumer_clients {
            let mut c = c.clone();
            consumers.push(tokio::spawn(async move {
                let mut all = Vec::new();
                while Instant::now() < stop + Duration::from_millis(500) {
                    match receive_and_ack(&mut c, 300).await {
                        Some((_, lat)) => all.extend(lat),
                        None => break,
                    }
                }
                all
            }));
        }
        let (c3, b3) = (clients.clone(), body.clone());
        drive(concurrency, secs, move |i| {
            let mut client = c3[(i as usize) % c3.len()].clone();
            let m = v2_message(1 << 40 | i, &b3);
            async move {
                client
                    .send_message(v2::SendMessageRequest { messages: vec![m] })
                    .await
                    .is_ok()
            }
        })
        .await;
        let mut e2e = Vec::new();
        for t in consumers {
            e2e.extend(t.await.unwrap());
        }
        e2e.sort_unstable();
        println!(
            "{:<6} {:>5} {:>12.0} {:>9.2} {:>9.2} {:>7} {:>8.0}% {:>13.0} {:>9.2} {:>9.2}",
            format!("{flush:?}").to_lowercase(),
            concurrency,
            sends.rate(),
            sends.pct(0.5),
            sends.pct(0.99),
            sends.errors,
            100.0 * sends.rate() / v1_rates.get(k).copied().unwrap_or(f64::NAN),
            drained as f64 / drain_secs,
            pct(&e2e, 0.5),
            pct(&e2e, 0.99),
        );
    }
}
