//! The system under test: a NameServer and one broker group of `n` nodes,
//! each a real `raftmq` process in its host's namespace, with its config,
//! data directory and log under the run's directory:
//!
//! ```text
//! <run>/namesrv.log
//! <run>/n<i>/config.toml  n<i>/data/  n<i>/broker.log (every start appends)
//! <run>/n<i>/clock-offset (the node's clock skew in ms, see the clock nemesis)
//! <run>/n<i>/backing/ (with the power nemesis: what n<i>/data serves, via LazyFs)
//! with the disk-full nemesis, n<i>/backing (or n<i>/data) is a small tmpfs (see `disk`)
//! <run>/namesrv.toml, <run>/certs/ (with --secure: see `secure`)
//! ```
//!
//! Ports are the same on every host (each has its own address): clients
//! 8081, Raft 9091, metrics 9101, the NameServer 9876.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::corrupt::Damage;
use crate::disk::{Filled, Tmpfs};
use crate::lazyfs::{LazyFs, LossReport};
use crate::netns::{Host, Network};
use crate::secure::Security;

pub const CLIENT_PORT: u16 = 8081;
pub const RAFT_PORT: u16 = 9091;
pub const METRICS_PORT: u16 = 9101;
pub const NAMESRV_PORT: u16 = 9876;
/// Each node's clock offset in milliseconds (`clock_offset_file`), written
/// by the clock nemesis.
pub const CLOCK_OFFSET_FILE: &str = "clock-offset";

/// How the brokers are configured.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// `async` or `sync` (the store's flush_mode).
    pub flush: String,
    /// The self-test's deliberate bug (`unsafe_ack_before_commit`).
    pub ack_before_commit: bool,
    /// Serve each node's data directory through a `LazyFs` (for the power
    /// nemesis), backed by `n<i>/backing`.
    pub lazyfs: bool,
    /// TLS on every port and ACL on (`--secure`).
    pub secure: bool,
    /// Each node's data on a tmpfs of this many bytes, with the brokers'
    /// disk watermarks on (for the disk-full nemesis).
    pub disk_bytes: Option<u64>,
    /// Raft's timing in milliseconds, when not the brokers' defaults:
    /// election timeout bounds and heartbeat period (`--raft-timing`).
    pub raft_timing: Option<RaftTiming>,
}

/// Raft's election timeout bounds and heartbeat period, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTiming {
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    pub heartbeat_ms: u64,
}

impl std::str::FromStr for RaftTiming {
    type Err = String;

    /// `MIN:MAX:HEARTBEAT`, in milliseconds, HEARTBEAT < MIN <= MAX.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<u64> = s
            .split(':')
            .map(|p| p.trim().parse::<u64>().map_err(|e| format!("{p:?}: {e}")))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [min, max, hb] if hb > 0 && hb < min && min <= max => Ok(RaftTiming {
                election_min_ms: min,
                election_max_ms: max,
                heartbeat_ms: hb,
            }),
            _ => Err(format!(
                "{s:?}: expected MIN:MAX:HEARTBEAT in milliseconds, with HEARTBEAT < MIN <= MAX"
            )),
        }
    }
}

/// The group's name, in every node's config and certificate.
pub const GROUP: &str = "jepsen";

/// A node's metrics port, and how to speak to it.
#[derive(Clone)]
pub struct MetricsAddr {
    pub addr: String,
    /// HTTPS with the run's CA (`--secure`), else plain HTTP.
    security: Option<Arc<Security>>,
}

/// How the harness runs the `raftmq` command: the binary, and with
/// `--secure` the CA and the Super user's keys in its environment.
#[derive(Clone)]
pub struct Cli {
    pub bin: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Cli {
    /// `raftmq <args>`, not yet started.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

pub struct Node {
    pub id: u64,
    pub host: Host,
    dir: PathBuf,
    child: Option<Child>,
    /// Counts starts: 0 for the first.
    pub incarnation: u32,
    pub paused: bool,
    /// The data directory's filesystem, when it loses un-fsynced writes.
    fs: Option<LazyFs>,
    /// The node's own small filesystem (disk-full nemesis), under `fs`:
    /// declared after it, so dropped after its unmount.
    disk: Option<Tmpfs>,
    /// A power loss (or the corrupt nemesis's damage, which may cost the
    /// node its log just the same) happened since the last start.
    power_lost: bool,
    /// The current incarnation began after a power loss or damage: its
    /// commit index may start lower (the checker reports that apart).
    pub after_power_loss: bool,
    security: Option<Arc<Security>>,
}

impl Node {
    pub fn client_addr(&self) -> String {
        format!("{}:{CLIENT_PORT}", self.host.ip)
    }
    pub fn metrics_addr(&self) -> MetricsAddr {
        MetricsAddr {
            addr: format!("{}:{METRICS_PORT}", self.host.ip),
            security: self.security.clone(),
        }
    }
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
}

pub struct Cluster {
    bin: PathBuf,
    pub net: Network,
    namesrv: Option<Child>,
    pub nodes: Vec<Node>,
    /// With `--secure`: the CA, certificates and users.
    pub security: Option<Arc<Security>>,
    /// Dropped last, after the nodes' LazyFs mounts beneath it.
    _shared: Option<SharedMount>,
}

/// The run directory bind-mounted onto itself and made shared, so that
/// mounts beneath it (LazyFs) propagate into the nodes' mount namespaces
/// (`ip netns exec` makes each a slave of the harness's) and so do their
/// unmounts. Without it, on a host whose `/` is private, a node's copy of
/// another node's LazyFs mount would keep that filesystem alive after the
/// harness unmounts it.
struct SharedMount(PathBuf);

impl SharedMount {
    fn new(dir: &Path) -> anyhow::Result<SharedMount> {
        let d = dir.to_str().context("the run directory's path is not UTF-8")?;
        crate::netns::run(&["mount", "--bind", d, d])?;
        crate::netns::run(&["mount", "--make-rshared", d])?;
        Ok(SharedMount(dir.to_path_buf()))
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

/// Runs `cmd` in `ns`, its output appended to `log`, killed if the harness
/// dies (PR_SET_PDEATHSIG survives `ip netns exec`'s exec).
fn spawn_in(ns: &str, bin: &Path, args: &[&str], log: &Path) -> anyhow::Result<Child> {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(out, "==== start {:?} {}", std::time::SystemTime::now(), args.join(" "))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(bin)
        .args(args)
        .env("RUST_LOG", "info,openraft=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: prctl is async-signal-safe and touches only this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {} in {ns}", bin.display()))
}

impl Cluster {
    /// Writes the configs and starts the NameServer and every node.
    pub fn start(bin: &Path, net: Network, run_dir: &Path, settings: &BrokerSettings) -> anyhow::Result<Cluster> {
        let ns_addr = format!("{}:{NAMESRV_PORT}", net.namesrv.ip);
        let security = if settings.secure {
            let ip = |h: &Host| h.ip.parse().with_context(|| format!("host address {}", h.ip));
            let mut processes = vec![("namesrv".to_string(), ip(&net.namesrv)?, None)];
            for (i, h) in net.nodes.iter().enumerate() {
                processes.push((h.name.clone(), ip(h)?, Some(i as u64 + 1)));
            }
            Some(Arc::new(Security::make(bin, run_dir, GROUP, &processes)?))
        } else {
            None
        };
        let namesrv_config = run_dir.join("namesrv.toml");
        std::fs::write(
            &namesrv_config,
            format!(
                "# Written by raftmq-jepsen.\nlisten = \"{ns_addr}\"\n{}",
                security.as_ref().map_or(String::new(), |s| s.tls_table("namesrv"))
            ),
        )?;
        let namesrv = spawn_in(
            &net.namesrv.ns,
            bin,
            &["namesrv", "--config", &namesrv_config.display().to_string()],
            &run_dir.join("namesrv.log"),
        )?;
        let mut peers = String::new();
        for h in &net.nodes {
            let id = &h.name[1..];
            peers.push_str(&format!(
                "\n[peers.{id}]\nraft_addr = \"{ip}:{RAFT_PORT}\"\nclient_addr = \"{ip}:{CLIENT_PORT}\"\n",
                ip = h.ip
            ));
        }
        let shared = if settings.lazyfs || settings.disk_bytes.is_some() {
            Some(SharedMount::new(run_dir)?)
        } else {
            None
        };
        let mut nodes = Vec::new();
        for (i, h) in net.nodes.iter().enumerate() {
            let id = i as u64 + 1;
            let dir = run_dir.join(&h.name);
            std::fs::create_dir_all(dir.join("data"))?;
            // The files themselves go to `backing` under LazyFs.
            let files = dir.join(if settings.lazyfs { "backing" } else { "data" });
            std::fs::create_dir_all(&files)?;
            let disk = match settings.disk_bytes {
                Some(bytes) => Some(Tmpfs::mount(&files, bytes)?),
                None => None,
            };
            let fs = if settings.lazyfs {
                Some(LazyFs::mount(&files, &dir.join("data"))?)
            } else {
                None
            };
            let mut config = format!(
                "# Written by raftmq-jepsen.\n\
                 cluster = \"JepsenCluster\"\n\
                 group = \"{GROUP}\"\n\
                 node_id = {id}\n\
                 data_dir = \"{data}\"\n\
                 client_listen = \"{ip}:{CLIENT_PORT}\"\n\
                 raft_listen = \"{ip}:{RAFT_PORT}\"\n\
                 metrics_listen = \"{ip}:{METRICS_PORT}\"\n\
                 bootstrap = {bootstrap}\n\
                 namesrv_addrs = [\"{ns_addr}\"]\n\
                 unsafe_ack_before_commit = {bug}\n\
                 clock_offset_file = \"{clock}\"\n\
                 {peers}\n\
                 [store]\n\
                 flush_mode = \"{flush}\"\n\
                 segment_size = 67108864\n\
                 # Small preallocated files: a run keeps every node's data.\n\
                 cq_units_per_file = 30000\n\
                 index_slots = 100000\n\
                 index_entries = 400000\n\
                 {retention}\
                 # Unresolved transactions are checked back within a second\n\
                 # or two, and never given up during a run.\n\
                 [transaction]\n\
                 check_immunity_ms = 1000\n\
                 check_interval_ms = 1000\n\
                 max_checks = 1000\n",
                data = dir.join("data").display(),
                ip = h.ip,
                bootstrap = id == 1,
                bug = settings.ack_before_commit,
                clock = dir.join(CLOCK_OFFSET_FILE).display(),
                flush = settings.flush,
                retention = if settings.disk_bytes.is_some() {
                    // The node's own disk: writes are refused at 90 %, as by
                    // default; nothing is deleted for room (the checker
                    // reads every message back at the end; expired segments
                    // could go, but none is 72 h old).
                    "[store.retention]\n\
                     disk_warn_ratio = 0.75\n\
                     disk_force_ratio = 1.0\n\
                     disk_refuse_ratio = 0.9\n"
                } else {
                    "# The host's disk use must not decide a test.\n\
                     [store.retention]\n\
                     disk_warn_ratio = 1.0\n\
                     disk_force_ratio = 1.0\n\
                     disk_refuse_ratio = 1.0\n"
                },
            );
            if let Some(t) = settings.raft_timing {
                // Top-level keys: before the first table (`[peers.N]`).
                let at = config.find("\n[").map_or(config.len(), |i| i + 1);
                config.insert_str(
                    at,
                    &format!(
                        "election_timeout_min_ms = {}\nelection_timeout_max_ms = {}\nheartbeat_interval_ms = {}\n",
                        t.election_min_ms, t.election_max_ms, t.heartbeat_ms
                    ),
                );
            }
            if let Some(sec) = &security {
                config.push_str(&sec.tls_table(&h.name));
                config.push_str(&sec.acl_table());
            }
            std::fs::write(dir.join("config.toml"), config)?;
            nodes.push(Node {
                id,
                host: h.clone(),
                dir,
                child: None,
                incarnation: 0,
                paused: false,
                fs,
                disk,
                power_lost: false,
                after_power_loss: false,
                security: security.clone(),
            });
        }
        let mut c = Cluster {
            bin: bin.to_path_buf(),
            net,
            namesrv: Some(namesrv),
            nodes,
            security,
            _shared: shared,
        };
        for id in 1..=c.nodes.len() as u64 {
            c.spawn(id)?;
        }
        Ok(c)
    }

    pub fn namesrv_addr(&self) -> String {
        format!("{}:{NAMESRV_PORT}", self.net.namesrv.ip)
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let bin = self.bin.clone();
        let n = &mut self.nodes[id as usize - 1];
        let config = n.dir.join("config.toml");
        let child = spawn_in(
            &n.host.ns,
            &bin,
            &["broker", "--config", &config.display().to_string()],
            &n.dir.join("broker.log"),
        )?;
        n.child = Some(child);
        n.paused = false;
        Ok(())
    }

    /// `kill -9` (a no-op on a node already down).
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let n = &mut self.nodes[id as usize - 1];
        if let Some(mut child) = n.child.take() {
            let _ = child.kill();
            child.wait()?;
        }
        n.paused = false;
        Ok(())
    }

    /// `kill -9`, then drops every write the node had not fsynced, as a
    /// power loss of its host would.
    pub fn power_loss(&mut self, id: u64) -> anyhow::Result<LossReport> {
        self.kill(id)?;
        let n = &mut self.nodes[id as usize - 1];
        let Some(fs) = n.fs.as_mut() else {
            bail!("node {id}'s data directory is not on LazyFs (the power nemesis mounts it)");
        };
        n.power_lost = true;
        fs.lose_unsynced()
    }

    /// `kill -9`, then damages one of the node's data files (see
    /// [`crate::corrupt`]); `None` when it has none with data yet.
    pub fn corrupt(&mut self, id: u64, rng: &mut rand::rngs::StdRng) -> anyhow::Result<Option<Damage>> {
        self.kill(id)?;
        let n = &mut self.nodes[id as usize - 1];
        n.power_lost = true;
        // Through the LazyFs mount, if there is one: the damage is fsynced.
        crate::corrupt::corrupt(rng, &n.data_dir())
    }

    /// Fills node `id`'s filesystem (see [`crate::disk`]).
    pub fn fill_disk(&self, id: u64, to_the_last_byte: bool) -> anyhow::Result<Filled> {
        let Some(disk) = &self.nodes[id as usize - 1].disk else {
            bail!("node {id} has no filesystem of its own (the disk-full nemesis mounts one)");
        };
        crate::disk::fill(disk.root(), to_the_last_byte)
    }

    /// Frees what [`Cluster::fill_disk`] took (a no-op when nothing is filled).
    pub fn free_disk(&self, id: u64) -> anyhow::Result<()> {
        match &self.nodes[id as usize - 1].disk {
            Some(disk) => crate::disk::free(disk.root()),
            None => Ok(()),
        }
    }

    /// Empties the data directory of node `id` (which must be down), as a
    /// replaced disk would be, and makes sure it never bootstraps a group
    /// of its own on it: it waits to be added back.
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        let n = &mut self.nodes[id as usize - 1];
        if n.running() {
            bail!("node {id} must be down to have its disk emptied");
        }
        let data = n.data_dir();
        // The contents only: the directory may be a mount point.
        for entry in std::fs::read_dir(&data).with_context(|| format!("reading {}", data.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .with_context(|| format!("removing {}", path.display()))?;
        }
        let config = n.dir.join("config.toml");
        let text = std::fs::read_to_string(&config)?;
        std::fs::write(&config, text.replace("bootstrap = true", "bootstrap = false"))?;
        // Its commit index starts again from nothing.
        n.power_lost = true;
        Ok(())
    }

    /// Starts a node that is down (a no-op on a running one).
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.nodes[id as usize - 1].running() {
            return Ok(());
        }
        let n = &mut self.nodes[id as usize - 1];
        n.incarnation += 1;
        n.after_power_loss = std::mem::take(&mut n.power_lost);
        self.spawn(id)
    }

    fn signal(&mut self, id: u64, sig: i32, paused: bool) -> anyhow::Result<()> {
        let n = &mut self.nodes[id as usize - 1];
        if let Some(pid) = n.pid() {
            // SAFETY: a plain kill(2) on our own child.
            if unsafe { libc::kill(pid, sig) } != 0 {
                bail!("signal {sig} to node {id}: {}", std::io::Error::last_os_error());
            }
            n.paused = paused;
        }
        Ok(())
    }

    /// Skews node `id`'s wall clock by `ms` (0 puts it back).
    pub fn set_clock_offset(&self, id: u64, ms: i64) -> anyhow::Result<()> {
        let path = self.nodes[id as usize - 1].dir.join(CLOCK_OFFSET_FILE);
        std::fs::write(&path, format!("{ms}\n")).with_context(|| format!("writing {}", path.display()))
    }

    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, libc::SIGSTOP, true)
    }

    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, libc::SIGCONT, false)
    }

    /// Stops every node cleanly (SIGTERM, then SIGKILL after 20 s), so
    /// their stores can be read afterwards. Paused nodes are resumed first.
    pub fn stop_all(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            let _ = self.resume(id);
            let _ = self.signal(id, libc::SIGTERM, false);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            if !status.success() {
                                eprintln!("warning: node {} stopped with {status}", n.id);
                            }
                            break;
                        }
                        Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                        _ => {
                            eprintln!("node {} did not stop in 20 s; killing it", n.id);
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                    }
                }
            }
        }
        if let Some(mut ns) = self.namesrv.take() {
            let _ = ns.kill();
            let _ = ns.wait();
        }
    }

    /// How to run `raftmq` commands against this cluster.
    pub fn cli(&self) -> Cli {
        Cli {
            bin: self.bin.clone(),
            env: self.security.as_ref().map_or_else(Vec::new, |s| s.cli_env()),
        }
    }

    /// Runs a `raftmq` command from the harness's namespace.
    pub fn raftmq(&self, args: &[&str]) -> anyhow::Result<String> {
        crate::netns::output(self.cli().command(args), &format!("raftmq {}", args.join(" ")))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Some(mut ns) = self.namesrv.take() {
            let _ = ns.kill();
            let _ = ns.wait();
        }
    }
}

/// `GET /metrics` over `s`, the answer read to its end.
async fn get_metrics<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) -> Option<Vec<u8>> {
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: raftmq\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    // A metrics page is a few kB; 4 MiB bounds a misbehaving peer.
    s.take(4 << 20).read_to_end(&mut buf).await.ok()?;
    Some(buf)
}

/// What one scrape of a node's `/metrics` tells.
#[derive(Debug, Clone, Default)]
pub struct NodeMetrics {
    pub role: String,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Timed messages not yet released, in the node's applied state.
    pub timers_pending: u64,
    /// Half messages neither committed nor rolled back.
    pub transactions_pending: u64,
}

/// Scrapes a node's `/metrics` with an HTTP/1.0 request (over TLS with
/// `--secure`), bounded by `timeout`; `None` when the node does not answer.
pub async fn scrape(at: &MetricsAddr, timeout: Duration) -> Option<NodeMetrics> {
    let body = tokio::time::timeout(timeout, async {
        let tcp = tokio::net::TcpStream::connect(&at.addr).await.ok()?;
        let buf = match &at.security {
            None => get_metrics(tcp).await?,
            Some(sec) => {
                let ip = tcp.peer_addr().ok()?.ip();
                get_metrics(sec.metrics_tls(ip, tcp).await.ok()?).await?
            }
        };
        Some(String::from_utf8_lossy(&buf).into_owned())
    })
    .await
    .ok()??;
    // A node killed mid-answer leaves a cut-off page: only a complete
    // answer counts (status 200, and the metrics every page has).
    if !body.starts_with("HTTP/1.") || body.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    let (mut seen_commit, mut seen_applied) = (false, false);
    let mut m = NodeMetrics::default();
    for line in body.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = name.split('{').next().unwrap_or("");
        let v = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        match metric {
            "raftmq_raft_term" => m.term = v,
            "raftmq_raft_commit_index" => {
                m.commit_index = v;
                seen_commit = true;
            }
            "raftmq_raft_applied_index" => {
                m.applied_index = v;
                seen_applied = true;
            }
            "rocketmq_timing_messages" => m.timers_pending += v,
            // One series per topic.
            "rocketmq_half_messages" => m.transactions_pending += v,
            "raftmq_raft_role" if v == 1 => {
                if let Some(role) = name.split("role=\"").nth(1).and_then(|r| r.split('"').next()) {
                    m.role = role.to_string();
                }
            }
            _ => {}
        }
    }
    (seen_commit && seen_applied && body.contains("# EOF")).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::RaftTiming;

    #[test]
    fn raft_timing_parses_and_refuses_nonsense() {
        let t: RaftTiming = "500:1000:100".parse().unwrap();
        assert_eq!((t.election_min_ms, t.election_max_ms, t.heartbeat_ms), (500, 1000, 100));
        for bad in [
            "",
            "500:1000",
            "500:400:100",
            "500:1000:500",
            "500:1000:0",
            "a:b:c",
            "1:2:3:4",
        ] {
            assert!(bad.parse::<RaftTiming>().is_err(), "{bad:?}");
        }
    }
}
