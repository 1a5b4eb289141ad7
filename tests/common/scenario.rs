//! The driver of the official clients' scenario scripts
//! (`tests/python/compat.py`, `tests/node/compat.js`): a NameServer and
//! broker groups of real processes, the admin commands a scenario needs,
//! and the script's requests ("@@kill-leader", "@@rolling-restart")
//! carried out while it runs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Cluster, Namesrv, raftmq_cli};

/// Installs an official client into `dir` (under cargo's target tmp
/// directory) unless an earlier test did: one installer at a time across
/// test threads and binaries (a lock file beside `dir`), and `dir/.installed`
/// written only once `install` succeeded.
pub fn install_once(dir: &std::path::Path, what: &str, install: impl FnOnce()) {
    let lock = std::fs::File::create(dir.with_extension("lock")).unwrap();
    // SAFETY: flock on a file descriptor we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    let ready = dir.join(".installed");
    if !ready.exists() {
        install();
        std::fs::write(&ready, what).unwrap();
    }
}

/// The Python of a virtualenv named `name` under cargo's target tmp
/// directory with `package` (a pip requirement) installed, made on first
/// use.
pub fn python_venv(name: &str, package: &str) -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    install_once(&venv, package, || {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv failed: Python 3 with venv is needed");
        let ok = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", package])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install {package} failed (is PyPI reachable?)");
    });
    venv.join("bin/python")
}

/// `program script <scenario> --endpoints E --topic T --group G`: how both
/// clients' scripts are run (`script` relative to the repository).
pub fn script_command(program: impl AsRef<std::ffi::OsStr>, script: &str, args: [&str; 4]) -> Command {
    let [name, endpoints, topic, group] = args;
    let mut c = Command::new(program);
    c.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .args([name, "--endpoints", endpoints, "--topic", topic, "--group", group]);
    c
}

/// Starts one scenario of an official client's script: (scenario,
/// endpoints, topic, consumer group) to the command, stdio left to the
/// driver.
pub type Runner = fn(&str, &str, &str, &str) -> Command;

pub struct Env {
    pub dir: tempfile::TempDir,
    pub namesrv: Namesrv,
    /// The broker group `test`, the one scenarios may ask to crash.
    pub cluster: Cluster,
    /// Further groups (`test-2`..), each its own three processes.
    pub others: Vec<Cluster>,
    /// The client's name in log file names ("python", "node").
    client: &'static str,
    runner: Runner,
}

impl Env {
    pub async fn start(client: &'static str, runner: Runner) -> Env {
        Env::start_groups(client, runner, 1).await
    }

    /// A NameServer and `groups` broker groups of three nodes.
    pub async fn start_groups(client: &'static str, runner: Runner, groups: usize) -> Env {
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
            client,
            runner,
        }
    }

    /// Runs a raftmq admin command until it succeeds (the brokers may not
    /// have registered with the NameServer yet).
    pub fn admin(&self, args: &[&str]) {
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
    pub async fn rolling_restart(&mut self) {
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

    /// Runs a connections command with `--json` and sums it up in one line:
    /// `count=N types=.. languages=.. versions=..` (each sorted, distinct).
    fn connections(&self, args: &[&str]) -> String {
        let mut all = args.to_vec();
        all.extend(["--json", "--namesrv", &self.namesrv.addr]);
        let (ok, out, err) = raftmq_cli(&all);
        assert!(ok, "raftmq {args:?} failed: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let conns = v["connections"].as_array().unwrap();
        let distinct = |key: &str| {
            let mut vals: Vec<&str> = conns.iter().filter_map(|c| c[key].as_str()).collect();
            vals.sort();
            vals.dedup();
            vals.join(",")
        };
        format!(
            "count={} types={} languages={} versions={}",
            conns.len(),
            distinct("client_type"),
            distinct("language"),
            distinct("version")
        )
    }

    /// `raftmq group status --json` summed up in one line:
    /// `clients=N subscriptions=topic:TYPE:expr,.. received=R acked=A
    /// consistent=B` (subscriptions sorted, distinct; counts summed over
    /// the nodes).
    fn consumer_status(&self, group: &str) -> String {
        let (ok, out, err) = raftmq_cli(&[
            "group",
            "status",
            "--group",
            group,
            "--json",
            "--namesrv",
            &self.namesrv.addr,
        ]);
        assert!(ok, "raftmq group status failed: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let clients = v["clients"].as_array().unwrap();
        let mut subs: Vec<String> = clients
            .iter()
            .flat_map(|c| c["subscriptions"].as_array().unwrap().iter())
            .map(|s| {
                format!(
                    "{}:{}:{}",
                    s[0].as_str().unwrap(),
                    s[1].as_str().unwrap(),
                    s[2].as_str().unwrap()
                )
            })
            .collect();
        subs.sort();
        subs.dedup();
        let sum = |key: &str| clients.iter().map(|c| c[key].as_u64().unwrap()).sum::<u64>();
        let mut ids: Vec<&str> = clients.iter().filter_map(|c| c["client_id"].as_str()).collect();
        ids.sort();
        ids.dedup();
        format!(
            "clients={} subscriptions={} received={} acked={} consistent={}",
            ids.len(),
            subs.join(","),
            sum("received"),
            sum("acked"),
            v["subscriptions_consistent"]
        )
    }

    /// A follower's client address in group `test`: an access point that
    /// forwards what it cannot do itself, and outlives a leader crash.
    pub async fn follower(&mut self) -> String {
        let leader = self.cluster.leader().await;
        let f = self.cluster.nodes.iter().find(|n| n.id != leader).unwrap();
        f.client_addr.clone()
    }

    /// Every node of every group as one access point list.
    pub fn endpoints(&self) -> String {
        std::iter::once(&self.cluster)
            .chain(&self.others)
            .flat_map(|c| &c.nodes)
            .map(|n| n.client_addr.clone())
            .collect::<Vec<_>>()
            .join(";")
    }

    /// Runs one scenario; panics with its output if it fails.
    pub async fn scenario(&mut self, name: &str, endpoints: &str, topic: &str, group: &str) -> String {
        let log = self.dir.path().join(format!("{}-{name}.log", self.client));
        let mut child = (self.runner)(name, endpoints, topic, group)
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
                // "@@connections <group>" / "@@producers <topic>": what
                // `raftmq group connections` / `topic producers` list.
                other if other.starts_with("@@connections ") || other.starts_with("@@producers ") => {
                    let (what, name) = other[2..].split_once(' ').unwrap();
                    let args: &[&str] = if what == "connections" {
                        &["group", "connections", "--group", name]
                    } else {
                        &["topic", "producers", "--topic", name]
                    };
                    let reply = self.connections(args);
                    writeln!(stdin, "{reply}").unwrap();
                    stdin.flush().unwrap();
                }
                // "@@status <group>": what `raftmq group status` says.
                other if other.starts_with("@@status ") => {
                    let reply = self.consumer_status(&other["@@status ".len()..]);
                    writeln!(stdin, "{reply}").unwrap();
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
