//! `raftmq dev`: a NameServer and a three-node broker group on 127.0.0.1,
//! each node its own OS process (so killing one is a real crash), ready to
//! use in one command.
//!
//! It writes the configs into `--dir`, starts the processes, waits for a
//! leader, creates `TestTopic` (8 queues), writes `DIR/dev.json` (the
//! NameServer's address and every node's addresses and pid) once all of
//! that is done, and prints what to paste next. Ctrl-C (or SIGTERM) stops
//! every process cleanly and removes `dev.json`. Running it again on the
//! same directory restarts the same cluster with its data.
//!
//! Ports: NameServer 9876 (its metrics 9976), broker clients 8081.., Raft
//! 9091.., broker metrics 9101.., all shifted by `--base-port`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Where configs, data and logs go (reused on the next run).
    #[arg(long, default_value = "data/dev")]
    pub dir: PathBuf,
    /// Nodes in the broker group.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    pub nodes: u64,
    /// Added to every port (NameServer 9876, clients 8081.., Raft 9091.., metrics 9101..).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// When a write is acknowledged: `async` (on a quorum's page cache,
    /// flushed in the background) or `sync` (after msync on each node).
    #[arg(long, default_value = "async", value_parser = ["async", "sync"])]
    pub flush: String,
}

/// `DIR/dev.json`: where everything is, for scripts.
#[derive(Debug, Serialize)]
struct DevInfo {
    namesrv_addr: String,
    namesrv_metrics_addr: String,
    nodes: Vec<DevNode>,
}

#[derive(Debug, Serialize)]
struct DevNode {
    node_id: u64,
    client_addr: String,
    raft_addr: String,
    /// Prometheus `/metrics`.
    metrics_addr: String,
    pid: u32,
}

/// The default topic `raftmq dev` creates.
pub const DEV_TOPIC: &str = "TestTopic";

struct Layout {
    namesrv: String,
    namesrv_metrics: String,
    /// (node id, client, raft, metrics).
    nodes: Vec<(u64, String, String, String)>,
}

fn layout(a: &DevArgs) -> anyhow::Result<Layout> {
    let port = |base: u32| -> anyhow::Result<u16> {
        u16::try_from(base + u32::from(a.base_port)).context("--base-port pushes a port past 65535")
    };
    let nodes = (1..=a.nodes)
        .map(|id| {
            Ok((
                id,
                format!("127.0.0.1:{}", port(8080 + id as u32)?),
                format!("127.0.0.1:{}", port(9090 + id as u32)?),
                format!("127.0.0.1:{}", port(9100 + id as u32)?),
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Layout {
        namesrv: format!("127.0.0.1:{}", port(9876)?),
        namesrv_metrics: format!("127.0.0.1:{}", port(9976)?),
        nodes,
    })
}

fn write_configs(dir: &Path, l: &Layout, flush: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    std::fs::write(
        dir.join("namesrv.toml"),
        format!(
            "# Written by `raftmq dev`.\nlisten = \"{}\"\nmetrics_listen = \"{}\"\n",
            l.namesrv, l.namesrv_metrics
        ),
    )?;
    let peers: String = l
        .nodes
        .iter()
        .map(|(id, c, r, _)| format!("[peers.{id}]\nraft_addr = \"{r}\"\nclient_addr = \"{c}\"\n\n"))
        .collect();
    for (id, c, r, m) in &l.nodes {
        std::fs::write(
            dir.join(format!("node{id}.toml")),
            format!(
                "# Written by `raftmq dev` (rewritten on every start).\nbroker = \"dev\"\nnode_id = {id}\n\
                 data_dir = \"{}\"\nclient_listen = \"{c}\"\nraft_listen = \"{r}\"\nbootstrap = {}\n\
                 namesrv_addrs = [\"{}\"]\nmetrics_listen = \"{m}\"\n\n{peers}[store]\nsegment_size = 67108864\nflush_mode = \"{flush}\"\n",
                dir.join(format!("node{id}")).display(),
                *id == 1,
                l.namesrv
            ),
        )?;
    }
    Ok(())
}

/// Holds `DIR/dev.lock` (an exclusive flock, with the holder's pid in it)
/// for as long as this `raftmq dev` runs, so a second one on the same
/// directory is refused before it touches anything.
struct DirLock {
    _file: std::fs::File,
}

fn lock_dir(dir: &Path) -> anyhow::Result<DirLock> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("dev.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        bail!(
            "{} is in use by another raftmq dev{}; stop it first (Ctrl-C there), or use another --dir",
            dir.display(),
            if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            }
        );
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(DirLock { _file: file })
}

/// A child process and the command line that started it.
struct Proc {
    name: String,
    child: Child,
    command: String,
}

/// The child processes, stopped (SIGTERM, then SIGKILL) when dropped.
struct Children(Vec<Proc>);

impl Children {
    fn spawn(&mut self, name: &str, dir: &Path, args: &[&str]) -> anyhow::Result<u32> {
        let exe = std::env::current_exe().context("cannot find the raftmq executable")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&exe);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        // Its own process group: Ctrl-C in the terminal reaches only `dev`,
        // which stops the nodes in order.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // SAFETY: prctl is async-signal-safe; this runs in the child between
        // fork and exec. If `dev` dies without stopping it, the child gets
        // SIGTERM instead of living on.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("cannot start {name}"))?;
        let pid = child.id();
        let command = format!(
            "{} {} 2>>{}",
            exe.display(),
            args.join(" "),
            dir.join(format!("{name}.log")).display()
        );
        self.0.push(Proc {
            name: name.to_string(),
            child,
            command,
        });
        Ok(pid)
    }

    /// Reports children that exited by themselves (a node killed by hand),
    /// with the command that starts one again.
    fn reap(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        self.0.retain_mut(|c| match c.child.try_wait() {
            Ok(Some(status)) => {
                gone.push(c.name.clone());
                eprintln!(
                    "{} (pid {}) exited: {status}; to start it again (its data is kept):\n  {} &",
                    c.name,
                    c.child.id(),
                    c.command
                );
                false
            }
            _ => true,
        });
        gone
    }

    fn stop(&mut self) {
        for c in &self.0 {
            // SAFETY: plain syscall on a child we own.
            unsafe { libc::kill(c.child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for Proc { name, child: c, .. } in &mut self.0 {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        eprintln!("{name} did not stop in time; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        self.0.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last line of a log that reads like an error (or its last line): why
/// a process exited, in a form that fits a message.
fn last_error_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines
        .iter()
        .rev()
        .find(|l| l.contains("error") || l.contains("ERROR"))
        .or(lines.last())
        .map_or("it wrote no log".to_string(), |l| l.trim().to_string())
}

async fn leader_of(l: &Layout) -> Option<String> {
    for (_, c, _, _) in &l.nodes {
        let Ok(ep) = crate::client::channel::endpoint(c, Duration::from_millis(300)) else {
            continue;
        };
        let Ok(channel) = ep.connect().await else { continue };
        if let Ok(s) = BrokerClient::new(channel)
            .status(pb::StatusRequest { with_digest: false })
            .await
            && s.get_ref().role == "leader"
        {
            return Some(c.clone());
        }
    }
    None
}

pub async fn run(a: DevArgs) -> anyhow::Result<()> {
    let l = layout(&a)?;
    let _lock = lock_dir(&a.dir)?;
    write_configs(&a.dir, &l, &a.flush)?;
    let dir = a.dir.canonicalize()?;
    let info_path = dir.join("dev.json");
    let _ = std::fs::remove_file(&info_path);
    let mut children = Children(Vec::new());
    // Made once, before the loops: a `ctrl_c()` made anew in each turn of a
    // loop misses a SIGINT that arrives between two turns (tokio delivers a
    // signal to the listeners that exist when it comes), and then nothing
    // stops dev. A test once waited 30 s on that.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let namesrv_cfg = dir.join("namesrv.toml");
    children.spawn(
        "namesrv",
        &dir,
        &["namesrv", "--config", &namesrv_cfg.to_string_lossy()],
    )?;
    let mut pids = Vec::new();
    for (id, _, _, _) in &l.nodes {
        let cfg = dir.join(format!("node{id}.toml"));
        pids.push(children.spawn(
            &format!("node{id}"),
            &dir,
            &["broker", "--config", &cfg.to_string_lossy()],
        )?);
    }

    // Ready: a leader, and the default topic.
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if let Some(name) = children.reap().first() {
            let log = dir.join(format!("{name}.log"));
            bail!(
                "{name} exited during start-up: {}\n(its log: {})",
                last_error_line(&log),
                log.display()
            );
        }
        if let Some(addr) = leader_of(&l).await {
            break addr;
        }
        if Instant::now() > deadline {
            bail!("no leader was elected within 60 s; see the logs in {}", dir.display());
        }
    };
    let channel = crate::client::channel::endpoint(&leader, Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?
        .connect()
        .await?;
    BrokerClient::new(channel)
        .put_topic(pb::PutTopicRequest {
            name: DEV_TOPIC.into(),
            read_queues: 8,
            write_queues: 8,
            perm: 6,
            message_type: String::new(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("cannot create {DEV_TOPIC}: {}", s.message()))?;

    let info = DevInfo {
        namesrv_addr: l.namesrv.clone(),
        namesrv_metrics_addr: l.namesrv_metrics.clone(),
        nodes: l
            .nodes
            .iter()
            .zip(&pids)
            .map(|((id, c, r, m), pid)| DevNode {
                node_id: *id,
                client_addr: c.clone(),
                raft_addr: r.clone(),
                metrics_addr: m.clone(),
                pid: *pid,
            })
            .collect(),
    };
    let tmp = dir.join("dev.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&info)?)?;
    std::fs::rename(&tmp, &info_path)?;

    let access = l
        .nodes
        .iter()
        .map(|(_, c, _, _)| c.as_str())
        .collect::<Vec<_>>()
        .join(";");
    println!(
        "raftmq dev: a NameServer and a {}-node broker group on 127.0.0.1",
        l.nodes.len()
    );
    println!();
    println!("  access points   {access}");
    println!(
        "  NameServer      {}  (metrics http://{}/metrics)",
        l.namesrv, l.namesrv_metrics
    );
    println!("  topic           {DEV_TOPIC} (8 queues)");
    println!("  data and logs   {}", dir.display());
    for (n, pid) in info.nodes.iter().zip(&pids) {
        println!(
            "  node {}          client {}  raft {}  metrics http://{}/metrics  pid {pid}",
            n.node_id, n.client_addr, n.raft_addr, n.metrics_addr
        );
    }
    println!();
    println!("Try, from another terminal:");
    println!("  raftmq produce --endpoint '{access}' --topic {DEV_TOPIC} --count 10");
    println!("  raftmq consume --endpoint '{access}' --topic {DEV_TOPIC} --group DevGroup --count 10");
    println!("  raftmq cluster status --namesrv {}", l.namesrv);
    println!();
    println!("Ctrl-C stops everything.");

    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = term.recv() => break,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                children.reap();
            }
        }
    }
    eprintln!("stopping...");
    let _ = std::fs::remove_file(&info_path);
    tokio::task::block_in_place(|| children.stop());
    eprintln!("stopped");
    Ok(())
}
