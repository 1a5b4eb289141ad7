//! The official RocketMQ 5 Python client (`rocketmq-python-client` 5.1.2,
//! unmodified) against a NameServer and a three-node group of real
//! `raftmq` processes. The scenarios live in `tests/python/compat.py`;
//! this file starts the cluster, runs them, and acts on their requests
//! (such as killing the leader mid-run).
//!
//! The client is installed into a virtualenv under cargo's target tmp
//! directory on first use (`.ci/run` does it up front), or taken from
//! `RAFTMQ_PYTHON` (a Python with the client installed).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Namesrv, raftmq_cli};

const CLIENT: &str = "rocketmq-python-client==5.1.2";

/// A Python interpreter with the official client, installing it if needed.
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("RAFTMQ_PYTHON") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let venv = root.join("python-venv");
    let py = venv.join("bin/python");
    let ready = venv.join(".installed");
    // One installer at a time (tests run in parallel threads and binaries).
    let lock = std::fs::File::create(root.join("python-venv.lock")).unwrap();
    // SAFETY: flock on a file descriptor we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    if !ready.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv failed: Python 3 with venv is needed");
        let ok = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", CLIENT])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install {CLIENT} failed (is PyPI reachable?)");
        std::fs::write(&ready, CLIENT).unwrap();
    }
    py
}

struct Env {
    dir: tempfile::TempDir,
    namesrv: Namesrv,
    /// The broker group `test`, the one scenarios may ask to crash.
    cluster: Cluster,
    /// Further groups (`test-2`..), each its own three processes.
    others: Vec<Cluster>,
}

impl Env {
    async fn start() -> Env {
        Env::start_groups(1).await
    }

    /// A NameServer and `groups` broker groups of three nodes.
    async fn start_groups(groups: usize) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let namesrv = Namesrv::start(dir.path(), "namesrv", 120_000);
        // Transactions are checked back after 2 s, then every 2 s.
        let extra = format!(
            "namesrv_addrs = [\"{}\"]\nnamesrv_heartbeat_interval_ms = 500\nmax_delivery_attempts = 3\n\
             min_invisible_ms = 1000\n[transaction]\ncheck_immunity_ms = 2000\ncheck_interval_ms = 2000\n",
            namesrv.addr
        );
        let mut cluster = Cluster::start_with(dir.path(), 3, "async", &extra);
        let mut others: Vec<Cluster> = (2..=groups)
            .map(|g| {
                let name = format!("test-{g}");
                Cluster::start_group(&dir.path().join(&name), &name, 3, "async", &extra)
            })
            .collect();
        cluster.leader().await;
        for c in &mut others {
            c.leader().await;
        }
        Env {
            dir,
            namesrv,
            cluster,
            others,
        }
    }

    /// Runs a raftmq admin command until it succeeds (the brokers may not
    /// have registered with the NameServer yet).
    fn admin(&self, args: &[&str]) {
        let mut all = args.to_vec();
        all.extend(["--namesrv", &self.namesrv.addr]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, out, err) = raftmq_cli(&all);
            if ok {
                eprint!("{out}");
                return;
            }
            assert!(Instant::now() < deadline, "raftmq {args:?} failed: {err}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `raftmq cluster rolling-restart` on group `test`, with this test as
    /// the service manager: the CLI's `--exec` asks for a restart through a
    /// file and waits; the test stops the node with SIGTERM, starts it
    /// again and removes the file.
    async fn rolling_restart(&mut self) {
        let request = self.dir.path().join("restart-request");
        let exec = format!(
            "echo {{node}} > {0}.tmp && mv {0}.tmp {0} && while [ -e {0} ]; do sleep 0.05; done",
            request.display()
        );
        let mut cli = Command::new(env!("CARGO_BIN_EXE_raftmq"))
            .args([
                "cluster",
                "rolling-restart",
                "--namesrv",
                &self.namesrv.addr,
                "--broker",
                "test",
            ])
            .args(["--exec", &exec, "--timeout", "60s"])
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut restarted = Vec::new();
        let status = loop {
            if let Some(s) = cli.try_wait().unwrap() {
                break s;
            }
            if let Ok(id) = std::fs::read_to_string(&request) {
                let id: u64 = id.trim().parse().unwrap();
                let stopped = self.cluster.stop(id);
                assert!(stopped.success(), "node {id} stopped with {stopped}");
                self.cluster.spawn(id);
                restarted.push(id);
                std::fs::remove_file(&request).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "rolling-restart failed ({status})");
        restarted.sort();
        assert_eq!(restarted, [1, 2, 3], "every node restarted once");
    }

    /// Every node of every group as one access point list.
    fn endpoints(&self) -> String {
        std::iter::once(&self.cluster)
            .chain(&self.others)
            .flat_map(|c| &c.nodes)
            .map(|n| n.client_addr.clone())
            .collect::<Vec<_>>()
            .join(";")
    }

    /// Runs one scenario; panics with its output if it fails.
    async fn scenario(&mut self, name: &str, endpoints: &str, topic: &str, group: &str) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/compat.py");
        let log = self.dir.path().join(format!("python-{name}.log"));
        let mut child = Command::new(python())
            .arg(script)
            .args([name, "--endpoints", endpoints, "--topic", topic, "--group", group])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut output = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        loop {
            let line = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "scenario {name} timed out:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            };
            match line.as_str() {
                "@@kill-leader" => {
                    let leader = self.cluster.leader().await;
                    eprintln!("scenario {name}: killing leader node {leader}");
                    self.cluster.kill(leader);
                    writeln!(stdin, "killed node {leader} of {}", self.cluster.group).unwrap();
                    stdin.flush().unwrap();
                }
                "@@rolling-restart" => {
                    self.rolling_restart().await;
                    writeln!(stdin, "restarted every node of {}", self.cluster.group).unwrap();
                    stdin.flush().unwrap();
                }
                other => {
                    output.push_str(other);
                    output.push('\n');
                }
            }
        }
        let status = child.wait().unwrap();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        eprintln!("--- scenario {name}:\n{log}");
        assert!(status.success(), "scenario {name} failed ({status})");
        output
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_simple_fifo_and_push_consumers() {
    let mut env = Env::start().await;
    env.admin(&["topic", "create", "--topic", "Normal", "--queues", "4"]);
    env.admin(&[
        "topic",
        "create",
        "--topic",
        "Ordered",
        "--queues",
        "4",
        "--message-type",
        "FIFO",
    ]);
    env.admin(&["group", "create", "--group", "Fifo", "--fifo"]);
    // A follower alone as the access point: everything it cannot do itself
    // it forwards to the leader.
    let leader = env.cluster.leader().await;
    let follower = env
        .cluster
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .unwrap()
        .client_addr
        .clone();
    env.scenario("simple", &follower, "Normal", "Simple").await;
    let all = env.endpoints();
    env.scenario("fifo", &all, "Ordered", "Fifo").await;
    env.admin(&["topic", "create", "--topic", "Pushed", "--queues", "4"]);
    env.scenario("push", &all, "Pushed", "Push").await;
    env.admin(&["topic", "create", "--topic", "Filtered", "--queues", "4"]);
    env.scenario("sql92", &follower, "Filtered", "Sql").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_messages_survive_a_leader_crash() {
    let mut env = Env::start().await;
    env.admin(&["topic", "create", "--topic", "Failover", "--queues", "4"]);
    let all = env.endpoints();
    let out = env.scenario("failover", &all, "Failover", "Survivor").await;
    eprintln!("{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn timed_messages_recall_delay_levels_and_transactions() {
    let mut env = Env::start().await;
    let typed = |name: &str, kind: &str| {
        vec![
            "topic".to_string(),
            "create".into(),
            "--topic".into(),
            name.into(),
            "--queues".into(),
            "4".into(),
            "--message-type".into(),
            kind.into(),
        ]
    };
    let run = |env: &Env, args: Vec<String>| env.admin(&args.iter().map(String::as_str).collect::<Vec<_>>());
    run(&env, typed("Timed", "DELAY"));
    run(&env, typed("TimedLevels", "NORMAL"));
    run(&env, typed("Txn", "TRANSACTION"));
    let all = env.endpoints();
    env.scenario("timed", &all, "Timed", "TimedGroup").await;
    env.scenario("transactions", &all, "Txn", "TxnGroup").await;
    // The held-message system topics exist now, but are not routed.
    let (ok, out, err) = raftmq_cli(&["topic", "list", "--namesrv", &env.namesrv.addr]);
    assert!(ok, "{err}");
    assert!(out.contains("Timed") && out.contains("Txn"), "{out}");
    assert!(
        !out.contains("rmq_sys_wheel_timer") && !out.contains("RMQ_SYS_TRANS_HALF_TOPIC"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn timed_messages_survive_a_leader_crash() {
    let mut env = Env::start().await;
    env.admin(&[
        "topic",
        "create",
        "--topic",
        "TimedFailover",
        "--queues",
        "4",
        "--message-type",
        "DELAY",
    ]);
    let all = env.endpoints();
    env.scenario("timed-failover", &all, "TimedFailover", "TimedSurvivor")
        .await;
}

/// `raftmq cluster rolling-restart` while the official client sends.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_loses_nothing_and_never_pauses_two_seconds() {
    let mut env = Env::start().await;
    env.admin(&["topic", "create", "--topic", "Rolling", "--queues", "4"]);
    let all = env.endpoints();
    let out = env.scenario("rolling", &all, "Rolling", "RollingGroup").await;
    eprintln!("{out}");
}

/// A topic spread over two broker groups, as RocketMQ users scale out:
/// the official client writes to queues of both and receives everything;
/// one group's leader crashes mid-run and the other never stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_over_two_groups_survives_one_groups_leader_crash() {
    let mut env = Env::start_groups(2).await;
    // One group at a time: each create waits until that group registered.
    env.admin(&[
        "topic", "create", "--topic", "Spread", "--queues", "4", "--broker", "test",
    ]);
    env.admin(&[
        "topic", "create", "--topic", "Spread", "--queues", "4", "--broker", "test-2",
    ]);
    // The NameServer knows both groups' queues before any client asks a
    // broker for the route (brokers cache a route for 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, _) = raftmq_cli(&[
            "topic",
            "route",
            "--topic",
            "Spread",
            "--json",
            "--namesrv",
            &env.namesrv.addr,
        ]);
        if ok && route_groups(&out) == ["test", "test-2"] {
            break;
        }
        assert!(Instant::now() < deadline, "the route never named both groups: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let all = env.endpoints();
    let out = env.scenario("two-groups", &all, "Spread", "SpreadGroup").await;
    eprintln!("{out}");
}

/// The groups a `raftmq topic route --json` answer names, sorted.
fn route_groups(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut groups: Vec<String> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["group"].as_str().map(String::from))
        .collect();
    groups.sort();
    groups
}
