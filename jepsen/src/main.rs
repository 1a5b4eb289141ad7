//! raftmq-jepsen: starts a raftmq cluster in network namespaces, runs a
//! queue workload against it through the RocketMQ 5 protocol while injecting
//! faults, and checks that no acknowledged message was lost or moved, and
//! that timed and transactional messages appear once, or never when rolled
//! back.
//!
//! Modules:
//! - `run`: one test from start to artifacts.
//! - `netns`: the namespaces, the bridge, and packet drops.
//! - `campaign`: many runs, seed after seed, and their table (campaign.json, index.html).
//! - `cluster`: the NameServer and broker processes; metrics scrapes.
//! - `nemesis`: the fault schedule (kill, pause, partition, loss, clock, power, corrupt, membership, disk-full).
//! - `corrupt`: the damage the corrupt nemesis does to a stopped node's files.
//! - `disk`: the disk-full nemesis's small filesystems, filled and freed.
//! - `membership`: the membership nemesis's moves (remove, add back, transfer) and the final members.
//! - `lazyfs`: a FUSE pass-through filesystem that loses un-fsynced writes (power loss).
//! - `workload`: the clients' operations (plain, timed and transactional
//!   sends, consumers) and the final drain.
//! - `producer`: the Telemetry sessions that answer the broker's
//!   transaction check-backs.
//! - `client`: the `apache.rocketmq.v2` calls and how their outcomes sort.
//! - `recorder`: appends operations to the history as they happen.
//! - `history`: operations as invocations and completions; history.jsonl.
//! - `observations`: replica logs and commit-index samples for the checker.
//! - `checker`: the nine checks over a history.
//! - `edn`: history.edn in the shapes of Jepsen's Kafka workload.
//! - `report`: timeline.html and fault periods.
//! - `plots`: latency.png and rate.png.
//! - `secure`: `--secure`: the run's CA, certificates and users, and signing.

mod campaign;
mod checker;
mod client;
mod cluster;
mod corrupt;
mod disk;
mod edn;
mod history;
mod lazyfs;
mod membership;
mod nemesis;
mod netns;
mod observations;
mod plots;
mod producer;
mod recorder;
mod report;
mod run;
mod secure;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "raftmq-jepsen", about = "Fault-injection tests of raftmq clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one test: a cluster in network namespaces (needs root), a workload,
    /// faults, a drain and the checker. Exits 1 when the history is invalid.
    Test(TestArgs),
    /// Run tests seed after seed (from --seed) and write a table of them:
    /// STORE/NAME/campaign-<ts>/campaign.json, index.html and
    /// unavailability.png. Exits 1 unless every run is valid.
    Campaign {
        /// How many runs.
        #[arg(long, default_value_t = 20)]
        runs: u64,
        #[command(flatten)]
        test: TestArgs,
    },
    /// Check a stored run again (its directory, e.g. jepsen/store/<test>/latest).
    Check { dir: PathBuf },
    /// Remove network namespaces and interfaces that runs left behind (a
    /// running test's are kept).
    Clean,
}

#[derive(clap::Args)]
struct TestArgs {
    /// The test's name: runs go to STORE/NAME/<timestamp>/.
    #[arg(long, default_value = "queue")]
    name: String,
    /// Broker nodes in the group.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Seconds of workload (the heal, drain and check come after).
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Faults: a comma-separated list of kill, pause, partition, loss, clock, power, corrupt, membership, disk-full; or all, or none.
    #[arg(long, default_value = "kill,pause,partition")]
    nemesis: String,
    /// Mean seconds between faults (each lasts half to all of it).
    #[arg(long, default_value_t = 10)]
    nemesis_interval: u64,
    /// Target client operations per second.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Client worker slots.
    #[arg(long, default_value_t = 10)]
    concurrency: usize,
    /// Keys (topics of one queue each).
    #[arg(long, default_value_t = 4)]
    keys: usize,
    /// Seeds the fault schedule and the workload's choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The brokers' flush mode: async or sync.
    #[arg(long, default_value = "async")]
    flush: String,
    /// The raftmq binary to test (default: build this repository's in release mode).
    #[arg(long)]
    raftmq: Option<PathBuf>,
    /// Where runs are stored.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/store"))]
    store: PathBuf,
    /// Run nodes that acknowledge sends before they commit (a deliberate
    /// bug) and pass only if the checker catches it.
    #[arg(long)]
    self_test: bool,
    /// TLS on every port (a CA and certificates made with `raftmq cert`)
    /// and ACL on: the harness administers as a Super user, the workload
    /// runs as a Normal user allowed Pub and Sub on every topic and group.
    #[arg(long)]
    secure: bool,
    /// Membership moves on a schedule of their own, overlapping the other
    /// faults (never on the node another fault holds).
    #[arg(long)]
    overlap: bool,
    /// Raft's timing in the brokers' configs, MIN:MAX:HEARTBEAT in
    /// milliseconds (election timeout bounds, heartbeat period); the
    /// brokers' defaults (150:300:50) without it.
    #[arg(long)]
    raft_timing: Option<cluster::RaftTiming>,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Test(a) => test(a, None),
        Command::Campaign { runs, test: a } => test(a, Some(runs)),
        Command::Check { dir } => run::recheck(&dir),
        Command::Clean => netns::clean_all().map(|n| {
            println!("removed {n} namespaces and interfaces");
            true
        }),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

/// One test, or with `campaign` that many, seed after seed.
fn test(a: TestArgs, campaign: Option<u64>) -> anyhow::Result<bool> {
    if !(1..=9).contains(&a.nodes) {
        anyhow::bail!("--nodes must be between 1 and 9");
    }
    if a.concurrency == 0 || a.keys == 0 || a.rate.is_nan() || a.rate <= 0.0 {
        anyhow::bail!("--concurrency, --keys and --rate must be positive");
    }
    if a.flush != "async" && a.flush != "sync" {
        anyhow::bail!("--flush is async or sync");
    }
    let opts = run::TestOpts {
        name: a.name,
        nodes: a.nodes,
        time_limit: Duration::from_secs(a.time_limit),
        faults: nemesis::Fault::parse_list(&a.nemesis)?,
        interval: Duration::from_secs(a.nemesis_interval.max(1)),
        rate: a.rate,
        concurrency: a.concurrency,
        keys: a.keys,
        seed: a.seed,
        flush: a.flush,
        raftmq: a.raftmq,
        store: a.store,
        self_test: a.self_test,
        secure: a.secure,
        overlap: a.overlap,
        raft_timing: a.raft_timing,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            match campaign {
                Some(runs) => campaign::campaign(opts, runs).await,
                None => run::run(opts).await,
            }
        })
}
