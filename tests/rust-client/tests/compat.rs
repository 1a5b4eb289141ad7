//! The official Rust client (`rocketmq` 5.0.0) against a NameServer and a
//! three-node group of real `raftmq` processes on 127.0.0.1: Producer
//! (single, batch and FIFO sends) and SimpleConsumer (receive, ack), with a
//! follower alone as the access point so every state change is forwarded.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::MessageBuilder;
use rocketmq::{Producer, SimpleConsumer};

fn raftmq_bin() -> PathBuf {
    let bin = std::env::var_os("RAFTMQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/raftmq"));
    assert!(
        bin.exists(),
        "{} does not exist: build raftmq first (cargo build) or set RAFTMQ_BIN",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Child processes, killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Cluster {
    _dir: tempfile::TempDir,
    procs: Procs,
    namesrv: String,
    clients: Vec<String>,
}

fn start() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let bin = raftmq_bin();
    let log = |name: &str| std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
    let namesrv = format!("127.0.0.1:{}", free_port());
    let mut procs = Procs(vec![Command::new(&bin)
        .args(["namesrv", "--listen", &namesrv])
        .stdout(Stdio::null())
        .stderr(log("namesrv"))
        .spawn()
        .unwrap()]);
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let peers: String = ports
        .iter()
        .enumerate()
        .map(|(i, (c, r))| {
            format!(
                "[peers.{}]\nraft_addr = \"127.0.0.1:{r}\"\nclient_addr = \"127.0.0.1:{c}\"\n",
                i + 1
            )
        })
        .collect();
    for (i, (c, r)) in ports.iter().enumerate() {
        let id = i + 1;
        let config = dir.path().join(format!("node{id}.toml"));
        std::fs::write(
            &config,
            format!(
                "group = \"g1\"\nnode_id = {id}\ndata_dir = \"{}\"\nclient_listen = \"127.0.0.1:{c}\"\n\
                 raft_listen = \"127.0.0.1:{r}\"\nbootstrap = {}\nnamesrv_addrs = [\"{namesrv}\"]\n\
                 namesrv_heartbeat_interval_ms = 500\n{peers}\n[store]\nsegment_size = 16777216\n\
                 [store.retention]\ndisk_warn_ratio = 1.0\ndisk_force_ratio = 1.0\ndisk_refuse_ratio = 1.0\n",
                dir.path().join(format!("node{id}")).display(),
                id == 1
            ),
        )
        .unwrap();
        procs.0.push(
            Command::new(&bin)
                .args(["broker", "--config"])
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(log(&format!("node{id}")))
                .spawn()
                .unwrap(),
        );
    }
    Cluster {
        _dir: dir,
        procs,
        namesrv,
        clients: ports.iter().map(|(c, _)| format!("127.0.0.1:{c}")).collect(),
    }
}

impl Cluster {
    /// Runs `raftmq <args> --namesrv N` until it succeeds (brokers register
    /// and elect a leader first).
    fn admin(&self, args: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new(raftmq_bin())
                .args(args)
                .args(["--namesrv", &self.namesrv])
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "raftmq {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn client_option(addr: &str) -> ClientOption {
    let mut o = ClientOption::default();
    o.set_access_url(addr);
    o.set_enable_tls(false);
    o.set_timeout(Duration::from_secs(5));
    o.set_long_polling_timeout(Duration::from_secs(3));
    o
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_and_simple_consumer() {
    let cluster = start();
    cluster.admin(&["topic", "create", "--topic", "RustTopic", "--queues", "4"]);
    cluster.admin(&[
        "topic",
        "create",
        "--topic",
        "RustFifo",
        "--queues",
        "4",
        "--message-type",
        "FIFO",
    ]);
    // Node 3 is a follower (node 1 bootstraps and is elected first; either
    // way, a non-leader forwards what it cannot do).
    let access = cluster.clients[2].clone();

    let mut po = ProducerOption::default();
    po.set_topics(vec!["RustTopic", "RustFifo"]);
    let mut producer = Producer::new(po, client_option(&access)).unwrap();
    producer.start().await.unwrap();
    let mut sent = Vec::new();
    for i in 0..10 {
        let m = MessageBuilder::builder()
            .set_topic("RustTopic")
            .set_tag("TagA")
            .set_keys(vec![format!("k{i}")])
            .set_body(format!("rust-{i}").into_bytes())
            .build()
            .unwrap();
        let r = producer.send(m).await.unwrap();
        assert!(!r.message_id().is_empty());
        sent.push(format!("rust-{i}"));
    }
    let batch: Vec<_> = (0..5)
        .map(|i| {
            MessageBuilder::builder()
                .set_topic("RustTopic")
                .set_tag("TagA")
                .set_body(format!("batch-{i}").into_bytes())
                .build()
                .unwrap()
        })
        .collect();
    let receipts = producer.batch_send(batch).await.unwrap();
    assert_eq!(receipts.len(), 5);
    sent.extend((0..5).map(|i| format!("batch-{i}")));
    for i in 0..6 {
        let m = MessageBuilder::fifo_message_builder("RustFifo", format!("fifo-{i}").into_bytes(), "group-1")
            .build()
            .unwrap();
        producer.send(m).await.unwrap();
    }

    let mut co = SimpleConsumerOption::default();
    co.set_topics(vec!["RustTopic", "RustFifo"]);
    co.set_consumer_group("RustGroup");
    let mut consumer = SimpleConsumer::new(co, client_option(&access)).unwrap();
    consumer.start().await.unwrap();
    let mut got = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < sent.len() && Instant::now() < deadline {
        let msgs = consumer
            .receive_with(
                "RustTopic",
                &FilterExpression::new(FilterType::Tag, "TagA"),
                32,
                Duration::from_secs(15),
            )
            .await
            .unwrap();
        for m in msgs {
            assert_eq!(m.tag(), Some("TagA"));
            assert!(m.delivery_attempt() >= 1);
            consumer.ack(&m).await.unwrap();
            got.insert(String::from_utf8(m.body().to_vec()).unwrap());
        }
    }
    let want: std::collections::BTreeSet<String> = sent.into_iter().collect();
    assert_eq!(got, want);

    let mut fifo = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while fifo.len() < 6 && Instant::now() < deadline {
        let msgs = consumer
            .receive("RustFifo", &FilterExpression::new(FilterType::Tag, "*"))
            .await
            .unwrap();
        for m in msgs {
            assert_eq!(m.message_group(), Some("group-1"));
            consumer.ack(&m).await.unwrap();
            fifo.push(String::from_utf8(m.body().to_vec()).unwrap());
        }
    }
    assert_eq!(fifo, (0..6).map(|i| format!("fifo-{i}")).collect::<Vec<_>>());

    consumer.shutdown().await.unwrap();
    producer.shutdown().await.unwrap();
    drop(cluster.procs);
}
