//! Real broker processes on 127.0.0.1 for the cluster tests: each node is a
//! `raftmq broker` process with its own config, so killing one is a crash.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raftmq::proto::pb;
use raftmq::proto::pb::broker_client::BrokerClient;
use tonic::transport::Channel;

pub mod dev;
pub mod scenario;
pub mod v2;

/// A read-write topic of `queues` queues (`message_type` "" is NORMAL).
pub fn topic_request(name: &str, queues: u32, message_type: &str) -> pb::PutTopicRequest {
    pb::PutTopicRequest {
        name: name.into(),
        read_queues: queues,
        write_queues: queues,
        perm: 6,
        message_type: message_type.into(),
    }
}

/// A port nothing listens on, below the OS's ephemeral range: a port picked
/// there cannot be taken by an outgoing connection's local end between the
/// pick and the server's bind (which port 0 allows). Never the same twice in
/// one process, nor one of its `raftmq dev` clusters' ports; the start is
/// spread by process id.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Below 30000 too: Kubernetes NodePorts (30000-32767) may answer on
    // 127.0.0.1 with no socket bound.
    let top = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(2_048, 30_000);
    let bottom = top.saturating_sub(20_000).max(1_024);
    let span = top - bottom;
    let start = std::process::id().wrapping_mul(7_919);
    // The ports this process's `raftmq dev` clusters lay out (dev.rs).
    let dev = dev::base_port() + 8_000..dev::base_port().saturating_add(11_000);
    for _ in 0..span {
        let port = (bottom + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if !dev.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {bottom}..{top}");
}

pub struct Node {
    pub id: u64,
    pub client_addr: String,
    pub raft_addr: String,
    /// Where the node serves Prometheus `/metrics`.
    pub metrics_addr: String,
    pub config: PathBuf,
    pub child: Option<Child>,
}

pub struct Cluster {
    /// The broker group's name.
    pub group: String,
    pub dir: PathBuf,
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Writes configs for `n` nodes and starts them.
    pub fn start(dir: &Path, n: u64, flush_mode: &str) -> Cluster {
        Cluster::start_with(dir, n, flush_mode, "")
    }

    /// As [`Cluster::start`], with `extra` top-level config lines.
    pub fn start_with(dir: &Path, n: u64, flush_mode: &str, extra: &str) -> Cluster {
        Cluster::start_group(dir, "test", n, flush_mode, extra)
    }

    /// As [`Cluster::start_with`], for the broker group `group`. Two groups
    /// need two directories (their nodes' files have the same names).
    pub fn start_group(dir: &Path, group: &str, n: u64, flush_mode: &str, extra: &str) -> Cluster {
        std::fs::create_dir_all(dir).unwrap();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let peers: String = (1..=n)
            .map(|id| {
                let (c, r) = ports[(id - 1) as usize];
                format!("[peers.{id}]\nraft_addr = \"127.0.0.1:{r}\"\nclient_addr = \"127.0.0.1:{c}\"\n")
            })
            .collect();
        // `extra` may set its own snapshot interval.
        let snapshot = if extra.contains("snapshot_every") {
            ""
        } else {
            "snapshot_every = 1000\n"
        };
        let mut nodes = Vec::new();
        for id in 1..=n {
            let (c, r) = ports[(id - 1) as usize];
            let m = free_port();
            let config = dir.join(format!("node{id}.toml"));
            let text = format!(
                "group = \"{group}\"\nnode_id = {id}\ndata_dir = \"{}\"\nclient_listen = \"127.0.0.1:{c}\"\n\
                 raft_listen = \"127.0.0.1:{r}\"\nbootstrap = {}\n{snapshot}max_body_bytes = 524288\n\
                 metrics_listen = \"127.0.0.1:{m}\"\n{extra}\n{peers}\n\
                 [store]\nflush_mode = \"{flush_mode}\"\nsegment_size = 1048576\nmax_record_size = 1000000\n\
                 cq_units_per_file = 1000\nindex_slots = 1000\nindex_entries = 10000\n\
                 # The host's disk use must not decide a test (retention has its own tests).\n\
                 [store.retention]\ndisk_warn_ratio = 1.0\ndisk_force_ratio = 1.0\ndisk_refuse_ratio = 1.0\n",
                dir.join(format!("node{id}")).display(),
                id == 1
            );
            std::fs::write(&config, text).unwrap();
            nodes.push(Node {
                id,
                client_addr: format!("127.0.0.1:{c}"),
                raft_addr: format!("127.0.0.1:{r}"),
                metrics_addr: format!("127.0.0.1:{m}"),
                config,
                child: None,
            });
        }
        let mut cluster = Cluster {
            group: group.to_string(),
            dir: dir.to_path_buf(),
            nodes,
        };
        for id in 1..=n {
            cluster.spawn(id);
        }
        cluster
    }

    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    /// Starts (or restarts) node `id`'s process.
    pub fn spawn(&mut self, id: u64) {
        let dir = self.dir.clone();
        let node = &mut self.nodes[(id - 1) as usize];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("node{id}.log")))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_raftmq"))
            .args(["broker", "--config"])
            .arg(&node.config)
            .env("RUST_LOG", "warn,raftmq=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        node.child = Some(child);
    }

    /// SIGKILL: a crash, no cleanup.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.nodes[(id - 1) as usize].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: a clean stop.
    pub fn stop(&mut self, id: u64) -> std::process::ExitStatus {
        let mut c = self.nodes[(id - 1) as usize].child.take().expect("node running");
        // SAFETY: plain syscall on a child we own.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }

    /// Creates a topic through node 1 (forwarded to the leader), retrying
    /// while the group elects one. `message_type` "" is NORMAL.
    pub async fn create_topic(&self, name: &str, queues: u32, message_type: &str) {
        let mut admin = self.client(1).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = admin.put_topic(topic_request(name, queues, message_type)).await;
            match r {
                Ok(_) => return,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("put_topic: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("put_topic: {e}"),
            }
        }
    }

    /// A client taking answers as large as the broker sends (the CLI's
    /// limit): tonic's 4 MiB default would fail reads of big messages.
    pub async fn client(&self, id: u64) -> BrokerClient<Channel> {
        BrokerClient::new(self.channel(id).await).max_decoding_message_size(raftmq::MAX_MESSAGE_SIZE)
    }

    /// A channel to node `id`'s client port, retried for 20 s while the
    /// node starts.
    pub async fn channel(&self, id: u64) -> Channel {
        let addr = format!("http://{}", self.node(id).client_addr);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Channel::from_shared(addr.clone()).unwrap().connect().await {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("node {id} never listened: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    pub async fn status(&self, id: u64, digest: bool) -> Option<pb::StatusResponse> {
        let addr = format!("http://{}", self.node(id).client_addr);
        let mut c = BrokerClient::connect(addr).await.ok()?;
        c.status(pb::StatusRequest { with_digest: digest })
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    /// Panics with the node's log if its process has exited.
    pub fn check_alive(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                let log = std::fs::read_to_string(self.dir.join(format!("node{}.log", n.id))).unwrap_or_default();
                panic!("node {} exited with {status}:\n{log}", n.id);
            }
        }
    }

    /// Waits until some running node reports itself leader; returns its id.
    pub async fn leader(&mut self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.check_alive();
            for n in &self.nodes {
                if n.child.is_some()
                    && let Some(s) = self.status(n.id, false).await
                    && s.role == "leader"
                {
                    return n.id;
                }
            }
            assert!(Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

pub fn message(i: u64) -> pb::Message {
    pb::Message {
        message_id: format!("msg-{i}"),
        tag: "TagA".into(),
        keys: vec![format!("key-{i}")],
        body: format!("body-{i}").into_bytes().into(),
        born_timestamp_ms: i,
        ..Default::default()
    }
}

/// A `raftmq namesrv` process.
pub struct Namesrv {
    pub addr: String,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Namesrv {
    /// Starts a NameServer with shrunk intervals (100 ms scan, `expiry_ms`).
    pub fn start(dir: &Path, name: &str, expiry_ms: u64) -> Namesrv {
        Namesrv::start_with(dir, name, expiry_ms, "")
    }

    /// As [`Namesrv::start`], with `extra` config lines.
    pub fn start_with(dir: &Path, name: &str, expiry_ms: u64, extra: &str) -> Namesrv {
        let addr = format!("127.0.0.1:{}", free_port());
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!("listen = \"{addr}\"\nscan_interval_ms = 100\nexpiry_ms = {expiry_ms}\n{extra}"),
        )
        .unwrap();
        let mut n = Namesrv {
            addr,
            config,
            log: dir.join(format!("{name}.log")),
            child: None,
        };
        n.spawn();
        n
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            Command::new(env!("CARGO_BIN_EXE_raftmq"))
                .args(["namesrv", "--config"])
                .arg(&self.config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn client(&self) -> raftmq::proto::pb::name_server_client::NameServerClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match raftmq::proto::pb::name_server_client::NameServerClient::connect(format!("http://{}", self.addr))
                .await
            {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("namesrv never listened: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Namesrv {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGINT, as a person stops a program, then SIGKILL if it is still
/// there after `patience`; returns once it has exited.
pub fn interrupt(child: &mut std::process::Child, patience: Duration) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    // SAFETY: signalling a child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + patience;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs the `raftmq` binary; returns (success, stdout, stderr).
pub fn raftmq_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_raftmq")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `raftmq args` until it succeeds (30 s at most: brokers may not be
/// registered with the NameServer yet); its stdout.
pub fn raftmq_cli_ok(args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, err) = raftmq_cli(args);
        if ok {
            return out;
        }
        assert!(Instant::now() < deadline, "raftmq {args:?}: {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET /metrics` from `addr`; the samples as (name with labels, value).
/// Waits for the port first: a node opens it just after its gRPC port,
/// which is all start-up waits for (a loaded CI machine once scraped in
/// between and was refused).
pub fn scrape(addr: &str) -> Vec<(String, f64)> {
    wait_listening(addr);
    let (code, body) = http_get(addr, "/metrics");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name value");
            (name.to_string(), value.parse().unwrap_or(f64::NAN))
        })
        .collect()
}

/// Waits (at most 20 s) until something listens on `addr`: a process's
/// HTTP port opens just after its gRPC port, which is what start-up waits for.
pub fn wait_listening(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One GET on an HTTP port (a node's metrics port): the status code and
/// the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_get_as(addr, path, "HTTP/1.1")
}

/// [`http_get`] in `version`: "HTTP/1.0" where a server (Prometheus) would
/// chunk a long answer to an HTTP/1.1 request.
pub fn http_get_as(addr: &str, path: &str, version: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} {version}\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (code, body.to_string())
}

/// Sum of the samples whose name starts with `metric` and whose labels
/// include every one of `labels` (`key="value"`).
pub fn sum_of(samples: &[(String, f64)], metric: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(n, _)| n.split('{').next() == Some(metric) && labels.iter().all(|l| n.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

/// Sends message `i` to queue `q` of topic T and returns its offset. Like
/// the official clients, retries a send whose outcome is unknown (a forward
/// that died with the old leader's connection, an election): a retry may
/// duplicate the message, never lose it.
pub async fn send_retrying(client: &mut BrokerClient<Channel>, q: u32, i: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = client
            .send(pb::SendRequest {
                topic: "T".into(),
                queue_id: q,
                messages: vec![message(i)],
            })
            .await;
        match r {
            Ok(r) => return r.into_inner().first_queue_offset,
            Err(e) if std::time::Instant::now() < deadline => {
                // ResourceExhausted: a busy leader refused it, nothing stored.
                assert!(
                    matches!(
                        e.code(),
                        tonic::Code::Unavailable | tonic::Code::Aborted | tonic::Code::ResourceExhausted
                    ),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("send {i} kept failing: {e}"),
        }
    }
}

/// Every message id in queue `q` of topic T on node `id`, by queue offset.
pub async fn read_queue(c: &Cluster, id: u64, q: u32) -> BTreeMap<u64, String> {
    let mut client = c.client(id).await;
    let mut offset = 0;
    let mut got = BTreeMap::new();
    loop {
        let r = client
            .read(pb::ReadRequest {
                topic: "T".into(),
                queue_id: q,
                offset,
                max_count: 500,
            })
            .await
            .unwrap()
            .into_inner();
        for m in r.messages {
            got.insert(m.queue_offset, m.message_id);
        }
        if r.next_offset >= r.max_offset {
            return got;
        }
        offset = r.next_offset;
    }
}

/// Reads every queue of topic T from node `id` and checks each acknowledged
/// message is at its offset.
pub async fn check_reads(c: &Cluster, id: u64, acked: &BTreeMap<(u32, u64), u64>, queues: u32) {
    for q in 0..queues {
        let got = read_queue(c, id, q).await;
        // Offsets are dense.
        assert!(
            got.keys().copied().eq(0..got.len() as u64),
            "node {id} queue {q} has holes"
        );
        for ((qq, off), i) in acked.range((q, 0)..(q + 1, 0)) {
            assert_eq!(*qq, q);
            assert_eq!(
                got.get(off),
                Some(&format!("msg-{i}")),
                "node {id} queue {q} offset {off}"
            );
        }
    }
}

pub async fn wait_applied_equal(c: &Cluster, ids: &[u64]) -> Vec<pb::StatusResponse> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut st = Vec::new();
        for &id in ids {
            if let Some(s) = c.status(id, false).await {
                st.push(s);
            }
        }
        if st.len() == ids.len() && st.windows(2).all(|w| w[0].applied_index == w[1].applied_index) {
            let mut with_digest = Vec::new();
            for &id in ids {
                with_digest.push(c.status(id, true).await.unwrap());
            }
            if with_digest.windows(2).all(|w| w[0].applied_index == w[1].applied_index) {
                return with_digest;
            }
        }
        assert!(std::time::Instant::now() < deadline, "nodes never converged: {st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The three nodes applied the same log (equal digests), and each serves
/// every acknowledged message of T's queue 0 at its offset.
pub async fn replicas_whole(c: &Cluster, acked: &BTreeMap<(u32, u64), u64>, what: &str) {
    let st = wait_applied_equal(c, &[1, 2, 3]).await;
    assert!(
        st.windows(2)
            .all(|w| w[0].applied_log_digest == w[1].applied_log_digest),
        "after {what}: replicas differ: {st:?}"
    );
    for id in 1..=3 {
        check_reads(c, id, acked, 1).await;
    }
}

/// Resident memory of a process, from /proc.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// What must hold after every hostile input: all nodes up and small, the
/// acknowledged messages where they were on every node, a new send and
/// read working, the replicas identical.
pub async fn still_whole(c: &mut Cluster, acked: &mut BTreeMap<(u32, u64), u64>, what: &str) {
    c.check_alive();
    for n in &c.nodes {
        let rss = rss_bytes(n.child.as_ref().unwrap().id());
        assert!(rss < 600 << 20, "after {what}: node {} uses {} MiB", n.id, rss >> 20);
    }
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let i = acked.len() as u64 + 1_000_000;
    let offset = send_retrying(&mut client, 0, i).await;
    acked.insert((0, offset), i);
    replicas_whole(c, acked, what).await;
}
