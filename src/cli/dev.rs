//! `raftmq dev`: a NameServer and one or more three-node broker groups on
//! 127.0.0.1, each node its own OS process (so killing one is a real
//! crash), ready to use in one command.
//!
//! It writes the configs into `--dir`, starts the processes, waits for a
//! leader in every group, creates `TestTopic` (8 queues in every group),
//! serves the web dashboard ([`crate::cli::dashboard`]) from its own
//! process, writes `DIR/dev.json` (the NameServer's and the dashboard's
//! addresses, every node's group, addresses and pid) once all of that is
//! done, and prints what to paste
//! next. Ctrl-C (or SIGTERM) stops every process cleanly and removes
//! `dev.json`. Running it again on the same directory restarts the same
//! cluster with its data.
//!
//! Groups are named `dev`, `dev-2`, `dev-3`..; the first group's files are
//! `node<i>.toml`, `node<i>/` and `node<i>.log`, the others' carry the
//! group's name in front (`dev-2-node1.toml`).
//!
//! Ports: NameServer 9876 (its metrics 9976), the dashboard 8080; node `i` of group `g`
//! (both from 1): client 8080 + 100(g-1) + i, Raft 9090 + 100(g-1) + i,
//! metrics 9100 + 100(g-1) + i; all shifted by `--base-port`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::signal::unix::Signal;

use crate::proto::pb;

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Where configs, data and logs go (reused on the next run).
    #[arg(long, default_value = "data/dev")]
    pub dir: PathBuf,
    /// Nodes in each broker group.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    pub nodes: u64,
    /// Broker groups (Raft groups), each of `--nodes` nodes; `TestTopic`
    /// has queues on all of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=9))]
    pub groups: u64,
    /// Added to every port (NameServer 9876, clients 8081.., Raft 9091.., metrics 9101..;
    /// each further group 100 higher).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// When a write is acknowledged: `async` (on a quorum's page cache,
    /// flushed in the background) or `sync` (after msync on each node).
    #[arg(long, default_value = "async", value_parser = ["async", "sync"])]
    pub flush: String,
    /// A TOML file merged into every node's generated config, its keys
    /// winning (for example `[store.retention]` or `[limits]`
    /// settings); see deploy/CONFIG.md for the keys.
    #[arg(long, value_name = "FILE")]
    pub node_config: Option<PathBuf>,
    /// TLS on every port, with a CA and certificates made under DIR/certs
    /// (kept for the next run), and ACL on with a Super user; `dev.json`
    /// names the CA file (`ca_cert`, which clients pass as `--ca-cert`) and
    /// the user (`admin_access_key`, `admin_secret_key`).
    #[arg(long)]
    pub secure: bool,
}

/// `DIR/dev.json`: where everything is, for scripts.
#[derive(Debug, Serialize)]
struct DevInfo {
    namesrv_addr: String,
    namesrv_metrics_addr: String,
    /// The web dashboard (`raftmq dashboard`), served by dev itself.
    dashboard_addr: String,
    nodes: Vec<DevNode>,
    /// With `--secure`: the CA's PEM, what clients must trust.
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_cert: Option<PathBuf>,
    /// With `--secure`: the Super user's credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_access_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_secret_key: Option<String>,
}

#[derive(Debug, Serialize)]
struct DevNode {
    /// The node's broker group.
    group: String,
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
    dashboard: String,
    /// Every group's nodes, group by group.
    nodes: Vec<NodeLayout>,
}

struct NodeLayout {
    group: String,
    id: u64,
    /// Its config, data directory and log carry this name.
    name: String,
    client: String,
    raft: String,
    metrics: String,
}

impl Layout {
    fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = self.nodes.iter().map(|n| n.group.as_str()).collect();
        groups.dedup();
        groups
    }

    fn group(&self, group: &str) -> impl Iterator<Item = &NodeLayout> {
        self.nodes.iter().filter(move |n| n.group == group)
    }
}

/// Group `g`'s name (from 0): the first is `dev`, as it was before there
/// could be more.
fn group_name(g: u64) -> String {
    if g == 0 { "dev".into() } else { format!("dev-{}", g + 1) }
}

fn layout(a: &DevArgs) -> anyhow::Result<Layout> {
    let port = |base: u64| -> anyhow::Result<u16> {
        u16::try_from(base + u64::from(a.base_port)).context("--base-port pushes a port past 65535")
    };
    let mut nodes = Vec::new();
    for g in 0..a.groups {
        let group = group_name(g);
        for id in 1..=a.nodes {
            let shift = 100 * g + id;
            nodes.push(NodeLayout {
                name: if g == 0 {
                    format!("node{id}")
                } else {
                    format!("{group}-node{id}")
                },
                group: group.clone(),
                id,
                client: format!("127.0.0.1:{}", port(8080 + shift)?),
                raft: format!("127.0.0.1:{}", port(9090 + shift)?),
                metrics: format!("127.0.0.1:{}", port(9100 + shift)?),
            });
        }
    }
    Ok(Layout {
        namesrv: format!("127.0.0.1:{}", port(9876)?),
        namesrv_metrics: format!("127.0.0.1:{}", port(9976)?),
        dashboard: format!("127.0.0.1:{}", port(8080)?),
        nodes,
    })
}

fn write_configs(
    dir: &Path,
    l: &Layout,
    flush: &str,
    overlay: Option<&Path>,
    certs: Option<&crate::cli::dev_secure::Certs>,
) -> anyhow::Result<()> {
    let overlay = overlay.map(read_overlay).transpose()?;
    let dir = dir.canonicalize()?;
    let tls = |name: &str| certs.map(|c| c.tls_table(name)).unwrap_or_default();
    std::fs::write(
        dir.join("namesrv.toml"),
        format!(
            "# Written by `raftmq dev`.\nlisten = \"{}\"\nmetrics_listen = \"{}\"\n{}",
            l.namesrv,
            l.namesrv_metrics,
            tls("namesrv")
        ),
    )?;
    for n in &l.nodes {
        let peers: String = l
            .group(&n.group)
            .map(|p| {
                format!(
                    "[peers.{}]\nraft_addr = \"{}\"\nclient_addr = \"{}\"\n\n",
                    p.id, p.raft, p.client
                )
            })
            .collect();
        let generated = format!(
            "broker = \"{}\"\nnode_id = {}\n\
                 data_dir = \"{}\"\nclient_listen = \"{}\"\nraft_listen = \"{}\"\nbootstrap = {}\n\
                 namesrv_addrs = [\"{}\"]\nmetrics_listen = \"{}\"\n\n{peers}[store]\nsegment_size = 67108864\nflush_mode = \"{flush}\"\n{}",
            n.group,
            n.id,
            dir.join(&n.name).display(),
            n.client,
            n.raft,
            n.id == 1,
            l.namesrv,
            n.metrics,
            tls(&n.name) + &certs.map(|c| c.acl_table()).unwrap_or_default(),
        );
        let body = match &overlay {
            None => generated,
            Some(extra) => {
                let mut table: toml::Table = generated.parse().context("raftmq dev wrote an unreadable config")?;
                merge(&mut table, extra);
                toml::to_string(&table)?
            }
        };
        let path = dir.join(format!("{}.toml", n.name));
        std::fs::write(
            &path,
            format!("# Written by `raftmq dev` (rewritten on every start).\n{body}"),
        )?;
        // A bad key in --node-config is reported here, by name, rather than
        // as three nodes exiting at start.
        crate::broker::config::BrokerConfig::load(&path)
            .map_err(|e| anyhow::anyhow!("{} (with --node-config merged in): {e}", path.display()))?;
    }
    Ok(())
}

fn read_overlay(path: &Path) -> anyhow::Result<toml::Table> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.parse().with_context(|| format!("{} is not TOML", path.display()))
}

/// Merges `extra` into `base`: tables merge key by key, anything else in
/// `extra` replaces what `base` has.
fn merge(base: &mut toml::Table, extra: &toml::Table) {
    for (k, v) in extra {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge(b, e),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
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

/// The client address of `group`'s leader, if it has one now.
async fn leader_of(l: &Layout, group: &str) -> Option<String> {
    for n in l.group(group) {
        let c = &n.client;
        let Ok(ep) = crate::client::channel::endpoint(c, Duration::from_millis(300)) else {
            continue;
        };
        let channel = crate::client::channel::lazy(ep, c, &crate::cli::connect::dialer());
        if let Ok(s) = crate::cli::connect::broker_on(channel)
            .status(pb::StatusRequest { with_digest: false })
            .await
            && s.get_ref().role == "leader"
        {
            return Some(c.clone());
        }
    }
    None
}

/// Waits for `group` to elect a leader: `Ok(None)` if dev was told to stop
/// meanwhile, an error if a node exited or the deadline passed.
async fn wait_for_leader(
    l: &Layout,
    group: &str,
    dir: &Path,
    children: &mut Children,
    interrupt: &mut Signal,
    term: &mut Signal,
    deadline: Instant,
) -> anyhow::Result<Option<String>> {
    loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(None),
            _ = term.recv() => return Ok(None),
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
        if let Some(addr) = leader_of(l, group).await {
            return Ok(Some(addr));
        }
        if Instant::now() > deadline {
            bail!(
                "group {group} elected no leader within 60 s; see the logs in {}",
                dir.display()
            );
        }
    }
}

/// Creates (or keeps) `TestTopic` in `group`, through its leader.
async fn create_dev_topic(group: &str, leader: &str) -> anyhow::Result<()> {
    crate::cli::connect::broker(leader)?
        .put_topic(pb::PutTopicRequest {
            name: DEV_TOPIC.into(),
            read_queues: 8,
            write_queues: 8,
            perm: 6,
            message_type: String::new(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("cannot create {DEV_TOPIC} in group {group}: {}", s.message()))?;
    Ok(())
}

pub async fn run(a: DevArgs) -> anyhow::Result<()> {
    let l = layout(&a)?;
    let _lock = lock_dir(&a.dir)?;
    let dir = a.dir.canonicalize()?;
    let certs = if a.secure {
        let mut processes = vec![("namesrv".to_string(), None)];
        processes.extend(l.nodes.iter().map(|n| (n.name.clone(), Some((n.group.clone(), n.id)))));
        let certs = crate::cli::dev_secure::ensure(&dir, &processes)?;
        // dev's own calls (leaders, the topic) go over TLS too, signed.
        crate::cli::connect::use_tls(&certs.ca_cert)?;
        crate::cli::connect::use_credentials(certs.admin.clone());
        Some(certs)
    } else {
        None
    };
    // The dashboard, in this process (it stops with dev), on its port
    // before anything starts: a port in use fails dev at once.
    let dashboard = tokio::net::TcpListener::bind(&l.dashboard).await.with_context(|| {
        format!(
            "the dashboard cannot listen on {} (--base-port moves every port)",
            l.dashboard
        )
    })?;
    let (stop_dashboard, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = crate::cli::dashboard::Options {
        namesrv: l.namesrv.clone(),
        allowed_hosts: Vec::new(),
        sample_every: Duration::from_secs(2),
    };
    let dashboard = tokio::spawn(crate::cli::dashboard::serve(dashboard, options, async move {
        let _ = stopped.await;
    }));
    write_configs(&dir, &l, &a.flush, a.node_config.as_deref(), certs.as_ref())?;
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
    for n in &l.nodes {
        let cfg = dir.join(format!("{}.toml", n.name));
        pids.push(children.spawn(&n.name, &dir, &["broker", "--config", &cfg.to_string_lossy()])?);
    }

    // Ready: a leader in every group, and the default topic on each.
    let deadline = Instant::now() + Duration::from_secs(60);
    for group in l.groups() {
        let leader = wait_for_leader(&l, group, &dir, &mut children, &mut interrupt, &mut term, deadline).await?;
        let Some(leader) = leader else { return Ok(()) };
        create_dev_topic(group, &leader).await?;
    }

    let info = DevInfo {
        namesrv_addr: l.namesrv.clone(),
        dashboard_addr: l.dashboard.clone(),
        namesrv_metrics_addr: l.namesrv_metrics.clone(),
        nodes: l
            .nodes
            .iter()
            .zip(&pids)
            .map(|(n, pid)| DevNode {
                group: n.group.clone(),
                node_id: n.id,
                client_addr: n.client.clone(),
                raft_addr: n.raft.clone(),
                metrics_addr: n.metrics.clone(),
                pid: *pid,
            })
            .collect(),
        ca_cert: certs.as_ref().map(|c| c.ca_cert.clone()),
        admin_access_key: certs.as_ref().map(|c| c.admin.access_key.clone()),
        admin_secret_key: certs.as_ref().map(|c| c.admin.secret_key.clone()),
    };
    let tmp = dir.join("dev.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&info)?)?;
    std::fs::rename(&tmp, &info_path)?;

    // Any node of any group is an access point: each answers routes for
    // every group it hears of from the NameServer.
    let access = l.nodes.iter().map(|n| n.client.as_str()).collect::<Vec<_>>().join(";");
    let groups = l.groups();
    if groups.len() == 1 {
        println!(
            "raftmq dev: a NameServer and a {}-node broker group on 127.0.0.1",
            a.nodes
        );
    } else {
        println!(
            "raftmq dev: a NameServer and {} broker groups of {} nodes on 127.0.0.1 ({})",
            groups.len(),
            a.nodes,
            groups.join(", ")
        );
    }
    let http = if a.secure { "https" } else { "http" };
    println!();
    println!("  access points   {access}");
    println!(
        "  NameServer      {}  (metrics {http}://{}/metrics)",
        l.namesrv, l.namesrv_metrics
    );
    if let Some(ca) = &info.ca_cert {
        println!("  TLS             every port; clients trust {}", ca.display());
        println!(
            "  ACL             on; Super user {} (secret in dev.json)",
            crate::cli::dev_secure::ADMIN
        );
    }
    println!("  dashboard       http://{}/", l.dashboard);
    println!("  topic           {DEV_TOPIC} (8 queues in each group)");
    println!("  data and logs   {}", dir.display());
    for n in &info.nodes {
        let who = if groups.len() == 1 {
            format!("node {}", n.node_id)
        } else {
            format!("{} node {}", n.group, n.node_id)
        };
        println!(
            "  {who:<15} client {}  raft {}  metrics {http}://{}/metrics  pid {}",
            n.client_addr, n.raft_addr, n.metrics_addr, n.pid
        );
    }
    println!();
    println!("Try, from another terminal:");
    if let (Some(ca), Some(c)) = (&info.ca_cert, &certs) {
        println!("  export RAFTMQ_CA_CERT={}", ca.display());
        println!(
            "  export RAFTMQ_ACCESS_KEY={} RAFTMQ_SECRET_KEY={}   # the Super user; `raftmq user create` makes others",
            c.admin.access_key, c.admin.secret_key
        );
    }
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
    let _ = stop_dashboard.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), dashboard).await;
    tokio::task::block_in_place(|| children.stop());
    eprintln!("stopped");
    Ok(())
}
