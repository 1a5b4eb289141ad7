//! One test, start to end: build the network and the cluster, run the
//! workload under the nemesis, heal, wait for held messages to settle,
//! drain, stop, collect the replicas' logs, check, and write the artifacts
//! into the run's directory:
//!
//! | file | what |
//! |---|---|
//! | `history.jsonl`, `history.edn` | every operation (see `history`, `edn`) |
//! | `replicas.json`, `commits.jsonl`, `membership.json` | replica logs, commit-index samples and each node's members after healing (see `observations`) |
//! | `results.json` | the verdict and every anomaly |
//! | `timeline.html`, `latency.png`, `rate.png` | the run at a glance, faults shaded |
//! | `namesrv.log`, `n<i>/` | each process's log, config and data |

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::task::JoinHandle;

use crate::checker::Inputs;
use crate::client::Client;
use crate::cluster::{BrokerSettings, Cluster, MetricsAddr, scrape};
use crate::history::{self, Call, Op, OpType, Process, SETTLE_PROCESS};
use crate::nemesis::{self, Fault, Nemesis};
use crate::observations::{CommitSample, LogRecord, MemberView, ReplicaLog};
use crate::recorder::Recorder;
use crate::workload::{self, Workload};
use crate::{checker, edn, membership, netns, plots, producer, report};

#[derive(Debug, Clone)]
pub struct TestOpts {
    pub name: String,
    pub nodes: usize,
    pub time_limit: Duration,
    pub faults: Vec<Fault>,
    pub interval: Duration,
    pub rate: f64,
    pub concurrency: usize,
    pub keys: usize,
    pub seed: u64,
    pub flush: String,
    pub raftmq: Option<PathBuf>,
    pub store: PathBuf,
    pub self_test: bool,
    pub secure: bool,
    /// Membership moves overlap the other faults.
    pub overlap: bool,
    /// Raft's timing in the brokers' configs (`--raft-timing`), if not the
    /// defaults.
    pub raft_timing: Option<crate::cluster::RaftTiming>,
}

/// The `raftmq` binary: the one given, or a release build of this
/// repository's.
fn binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        if !p.is_file() {
            bail!("no raftmq binary at {}", p.display());
        }
        return Ok(p.canonicalize()?);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the harness lives in the repository's jepsen/")?;
    eprintln!("building raftmq (release) in {}", repo.display());
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--bin", "raftmq", "--manifest-path"])
        .arg(repo.join("Cargo.toml"))
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("building raftmq failed");
    }
    Ok(repo.join("target/release/raftmq"))
}

/// `YYYYMMDDTHHMMSS` in UTC, for run directories.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Points `dir/latest` at `target` (a relative link, replaced if present).
fn link_latest(dir: &Path, target: &Path) {
    let link = dir.join("latest");
    let _ = std::fs::remove_file(&link);
    if let Some(name) = target.file_name() {
        let _ = std::os::unix::fs::symlink(name, &link);
    }
}

/// Runs a test; returns whether the checker found the history valid.
pub async fn run(opts: TestOpts) -> anyhow::Result<bool> {
    let bin = binary(opts.raftmq.as_deref())?;
    let test_dir = opts.store.join(&opts.name);
    let run_dir = test_dir.join(timestamp());
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let run_dir = run_dir.canonicalize()?;
    link_latest(&test_dir, &run_dir);
    eprintln!("run directory {}", run_dir.display());
    std::fs::write(run_dir.join("test.txt"), format!("{opts:#?}\n"))?;

    let net = netns::Network::create(std::process::id(), opts.nodes)?;
    if opts.faults.contains(&Fault::Loss) && !net.iptables {
        bail!("the loss nemesis needs iptables (apt-get install iptables)");
    }
    let settings = BrokerSettings {
        flush: opts.flush.clone(),
        ack_before_commit: opts.self_test,
        lazyfs: opts.faults.contains(&Fault::Power),
        secure: opts.secure,
        disk_bytes: opts
            .faults
            .contains(&Fault::DiskFull)
            .then_some(crate::disk::DISK_BYTES),
        raft_timing: opts.raft_timing,
    };
    let cluster = Arc::new(Mutex::new(Cluster::start(&bin, net, &run_dir, &settings)?));
    // Ctrl-C or SIGTERM (from `timeout`, say) still stops the processes and
    // removes the namespaces.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        out = test(&opts, &cluster) => out,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    // Whatever happened, stop the processes and remove the namespaces.
    let mut c = cluster.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    c.stop_all();
    let replicas = match &outcome {
        Ok(_) => collect_replicas(&c),
        Err(_) => Vec::new(),
    };
    c.net.teardown();
    drop(c);
    let (ops, commits, members) = outcome?;
    let observed = Inputs {
        ops: &ops,
        replicas: &replicas,
        commits: &commits,
        members: &members,
    };
    finish(&opts, &run_dir, &observed)
}

/// From a started cluster to a drained history.
async fn test(
    opts: &TestOpts,
    cluster: &Arc<Mutex<Cluster>>,
) -> anyhow::Result<(Vec<Op>, Vec<CommitSample>, Vec<MemberView>)> {
    let (namesrv, client_addrs, security) = {
        let c = cluster.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (
            c.namesrv_addr(),
            c.nodes.iter().map(|n| n.client_addr()).collect::<Vec<_>>(),
            c.security.clone(),
        )
    };
    wait_for_leader(cluster, Duration::from_secs(60)).await?;
    let keys: Vec<String> = (0..opts.keys).map(workload::key_name).collect();
    let held_keys: Vec<String> = (0..workload::HELD_KEYS).map(workload::held_key_name).collect();
    for key in &keys {
        create_topic(cluster, &namesrv, key, "NORMAL").await?;
    }
    // Timed and transactional messages need topics that take them.
    for key in &held_keys {
        create_topic(cluster, &namesrv, key, "MIXED").await?;
    }
    eprintln!(
        "cluster ready; running {} s with nemesis [{}]",
        opts.time_limit.as_secs(),
        opts.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(",")
    );

    let clients: Vec<Client> = client_addrs
        .iter()
        .map(|a| Client::new(a, security.as_deref()))
        .collect::<anyhow::Result<_>>()?;
    if security.is_some() {
        grant_workload_user(cluster, &namesrv, &clients, &keys[0]).await?;
    }
    let recorder = Recorder::new();
    let until = Instant::now() + opts.time_limit;
    let producers = producer::spawn(&clients, &held_keys, &recorder);
    let workload = Arc::new(Workload {
        clients,
        keys,
        held_keys,
        concurrency: opts.concurrency,
        rate: opts.rate,
        seed: opts.seed,
        recorder: recorder.clone(),
        avoided: workload::Avoided::new(),
    });
    let samples = Arc::new(Mutex::new(Vec::new()));
    // Aborted however the test ends (an error, Ctrl-C dropping this
    // future): it holds the cluster, whose drop unmounts the nodes' disks.
    let _sampler = AbortOnDrop(tokio::spawn(sample_commits(
        cluster.clone(),
        recorder.clone(),
        samples.clone(),
    )));
    let nemesis = Nemesis {
        cluster: cluster.clone(),
        faults: opts.faults.clone(),
        interval: opts.interval,
        seed: opts.seed,
        overlap: opts.overlap,
        recorder: recorder.clone(),
    };
    let (nemesis_out, ()) = tokio::join!(nemesis.run(until), workload.clone().run(until));
    let healed = nemesis::heal_all(cluster);
    nemesis_out?;
    healed?;

    eprintln!("healed; waiting for the replicas to converge");
    if let Err(e) = converge(cluster, Duration::from_secs(60)).await {
        eprintln!("warning: {e:#}");
    }
    let members = membership::read_members(cluster).await;
    eprintln!("waiting for every timed and transactional message to be released or ended");
    settle(cluster, &recorder, Duration::from_secs(60)).await;
    eprintln!("draining every key from every node");
    let drained = workload.drain().await;
    producers.iter().for_each(JoinHandle::abort);
    if let Err(e) = drained {
        eprintln!("warning: the drain failed: {e:#}");
    }
    let commits = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok((recorder.ops(), commits, members))
}

/// A task stopped when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Creates `topic` (one queue, taking `message_type` messages), retrying
/// while the group is still finding its feet.
async fn create_topic(cluster: &Mutex<Cluster>, namesrv: &str, topic: &str, message_type: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .raftmq(&[
                "topic",
                "create",
                "--namesrv",
                namesrv,
                "--topic",
                topic,
                "--queues",
                "1",
                "--message-type",
                message_type,
            ]);
        match out {
            Ok(_) => return Ok(()),
            // An earlier attempt created it, though its answer was lost.
            Err(e) if e.to_string().contains("exists in group") => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e.context(format!("creating topic {topic}"))),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `--secure`: makes the workload's Normal user, allowed `Pub` and `Sub`
/// on every topic and group (through the leader, as the Super user), and
/// waits until every node lets it read `key`'s committed offset.
async fn grant_workload_user(
    cluster: &Mutex<Cluster>,
    namesrv: &str,
    clients: &[Client],
    key: &str,
) -> anyhow::Result<()> {
    let user = cluster
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .security
        .as_ref()
        .map(|s| s.user.clone())
        .context("a secure run has its users")?;
    let subject = format!("User:{}", user.access_key);
    let steps: [(&[&str], &str); 2] = [
        (
            &[
                "user",
                "create",
                "--namesrv",
                namesrv,
                "-u",
                &user.access_key,
                "-p",
                &user.secret_key,
            ],
            "exists",
        ),
        (
            &[
                "acl",
                "create",
                "--namesrv",
                namesrv,
                "-s",
                &subject,
                "-r",
                "Topic:*,Group:*",
                "-a",
                "Pub,Sub",
                "-d",
                "Allow",
            ],
            // Creating a policy again replaces it.
            "",
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    for (args, done_before) in steps {
        loop {
            let out = cluster
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .raftmq(args);
            match out {
                Ok(_) => break,
                // An earlier attempt did it, though its answer was lost.
                Err(e) if !done_before.is_empty() && e.to_string().contains(done_before) => break,
                Err(e) if Instant::now() > deadline => return Err(e.context("making the workload's user")),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    for (i, c) in clients.iter().enumerate() {
        loop {
            match c.committed("jepsen-g0", key).await {
                crate::client::Outcome::Ok(_) => break,
                out if Instant::now() > deadline => {
                    bail!("node {} does not let the workload's user in: {out:?}", i + 1)
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    eprintln!("TLS on every port; the workload runs as ACL user {}", user.access_key);
    Ok(())
}

async fn wait_for_leader(cluster: &Mutex<Cluster>, within: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(l) = nemesis::leader(cluster).await {
            return Ok(l);
        }
        if Instant::now() > deadline {
            bail!("no leader within {} s (see the node logs)", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every node's `/metrics` address.
fn metrics_addrs(cluster: &Mutex<Cluster>) -> Vec<MetricsAddr> {
    cluster
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .nodes
        .iter()
        .map(|n| n.metrics_addr())
        .collect()
}

/// Waits until a leader exists and every node has applied all it has
/// committed, up to the leader's commit index.
async fn converge(cluster: &Mutex<Cluster>, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let addrs = metrics_addrs(cluster);
    loop {
        let mut ms = Vec::new();
        for a in &addrs {
            ms.push(scrape(a, Duration::from_millis(500)).await);
        }
        let leader_commit = ms
            .iter()
            .flatten()
            .filter(|m| m.role == "leader")
            .map(|m| m.commit_index)
            .max();
        if let Some(lc) = leader_commit
            && ms.iter().all(|m| m.as_ref().is_some_and(|m| m.applied_index >= lc))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the replicas did not converge within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits, up to `within`, until the last timed message is due and no node
/// holds a timed or half message any more (every node's applied state, so
/// each has the released copies to drain). Recorded as a `settle`: the
/// checker judges the transactions left to check-backs only after an ok one.
async fn settle(cluster: &Mutex<Cluster>, recorder: &Recorder, within: Duration) {
    let last_due = recorder
        .ops()
        .iter()
        .filter_map(|op| match op.call {
            Call::TimedSend { due, .. } => Some(due),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let addrs = metrics_addrs(cluster);
    let p = Process::Client(SETTLE_PROCESS);
    recorder.record(p, OpType::Invoke, Call::Settle {}, None, None);
    let deadline = Instant::now() + within;
    loop {
        let mut held = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            match scrape(a, Duration::from_millis(500)).await {
                Some(m) if m.timers_pending == 0 && m.transactions_pending == 0 => {}
                Some(m) => held.push(format!(
                    "node {} holds {} timed and {} half messages",
                    i + 1,
                    m.timers_pending,
                    m.transactions_pending
                )),
                None => held.push(format!("node {} does not answer", i + 1)),
            }
        }
        if held.is_empty() && recorder.now() >= last_due {
            recorder.record(p, OpType::Ok, Call::Settle {}, None, None);
            return;
        }
        if Instant::now() > deadline {
            let why = format!("after {} s: {}", within.as_secs(), held.join("; "));
            eprintln!("warning: held messages did not settle {why}");
            recorder.record(p, OpType::Fail, Call::Settle {}, None, Some(why));
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Samples every running node's commit index four times a second.
async fn sample_commits(cluster: Arc<Mutex<Cluster>>, recorder: Recorder, out: Arc<Mutex<Vec<CommitSample>>>) {
    loop {
        let nodes: Vec<(u64, u32, bool, MetricsAddr)> = cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .nodes
            .iter()
            .filter(|n| n.running() && !n.paused)
            .map(|n| (n.id, n.incarnation, n.after_power_loss, n.metrics_addr()))
            .collect();
        for (node, incarnation, after_power_loss, addr) in nodes {
            if let Some(m) = scrape(&addr, Duration::from_millis(300)).await {
                out.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(CommitSample {
                        time: recorder.now(),
                        node,
                        incarnation,
                        after_power_loss,
                        commit_index: m.commit_index,
                    });
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads each stopped node's log with `raftmq store verify` and `dump`.
fn collect_replicas(c: &Cluster) -> Vec<ReplicaLog> {
    let mut out = Vec::new();
    for n in &c.nodes {
        let dir = n.data_dir().display().to_string();
        let committed = c
            .raftmq(&["store", "verify", "--dir", &dir, "--json"])
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v.get("committed_index").and_then(serde_json::Value::as_u64));
        match c.raftmq(&["store", "dump", "--dir", &dir]) {
            Ok(text) => {
                let records = text
                    .lines()
                    .filter_map(|l| serde_json::from_str::<LogRecord>(l).ok())
                    .collect();
                out.push(ReplicaLog {
                    node: n.id,
                    committed,
                    records,
                });
            }
            Err(e) => eprintln!("warning: node {}'s log could not be read: {e:#}", n.id),
        }
    }
    out
}

/// Writes the history and observations, checks them, writes the results
/// and pictures; returns the verdict.
fn finish(opts: &TestOpts, run_dir: &Path, observed: &Inputs) -> anyhow::Result<bool> {
    history::write_jsonl(&run_dir.join("history.jsonl"), observed.ops)?;
    std::fs::write(run_dir.join("replicas.json"), serde_json::to_vec(observed.replicas)?)?;
    std::fs::write(run_dir.join("membership.json"), serde_json::to_vec(observed.members)?)?;
    let mut lines = String::new();
    for s in observed.commits {
        lines.push_str(&serde_json::to_string(s)?);
        lines.push('\n');
    }
    std::fs::write(run_dir.join("commits.jsonl"), lines)?;
    edn::write_edn(&run_dir.join("history.edn"), observed.ops)?;
    let valid = check_and_report(run_dir, observed, &opts.name)?;
    if opts.self_test {
        if valid {
            eprintln!("self-test FAILED: the nodes acknowledged before commit, yet the checker found nothing");
            return Ok(false);
        }
        eprintln!("self-test passed: the checker caught the nodes that acknowledge before commit");
        return Ok(true);
    }
    Ok(valid)
}

/// Checks a history and writes results.json, timeline.html and the plots.
pub fn check_and_report(run_dir: &Path, observed: &Inputs, title: &str) -> anyhow::Result<bool> {
    let results = checker::check(observed);
    let ops = observed.ops;
    std::fs::write(run_dir.join("results.json"), serde_json::to_vec_pretty(&results)?)?;
    report::write_timeline(&run_dir.join("timeline.html"), ops, title)?;
    let faults = report::fault_periods(ops);
    if let Err(e) = plots::write_latency_png(&run_dir.join("latency.png"), ops, &faults) {
        eprintln!("warning: latency.png: {e:#}");
    }
    if let Err(e) = plots::write_rate_png(&run_dir.join("rate.png"), ops, &faults) {
        eprintln!("warning: rate.png: {e:#}");
    }
    println!("{}", checker::summary(&results));
    println!("artifacts in {}", run_dir.display());
    Ok(results.valid)
}

/// `raftmq-jepsen check DIR`: re-checks a stored run.
pub fn recheck(dir: &Path) -> anyhow::Result<bool> {
    let ops = history::read_jsonl(&dir.join("history.jsonl"))?;
    let replicas: Vec<ReplicaLog> = match std::fs::read(dir.join("replicas.json")) {
        Ok(b) => serde_json::from_slice(&b).context("parsing replicas.json")?,
        Err(_) => Vec::new(),
    };
    let mut commits = Vec::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("commits.jsonl")) {
        for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            commits.push(serde_json::from_str(l).with_context(|| format!("commits.jsonl line {}", i + 1))?);
        }
    }
    // Runs from before the membership check have no membership.json.
    let members: Vec<MemberView> = match std::fs::read(dir.join("membership.json")) {
        Ok(b) => serde_json::from_slice(&b).context("parsing membership.json")?,
        Err(_) => Vec::new(),
    };
    let title = dir.display().to_string();
    let observed = Inputs {
        ops: &ops,
        replicas: &replicas,
        commits: &commits,
        members: &members,
    };
    check_and_report(dir, &observed, &title)
}
