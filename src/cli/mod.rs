//! The `raftmq` command line: the clap tree and its dispatch here, one file
//! per command family below. Commands talk to a cluster only through its
//! public protocols (the NameServers, `raftmq.v1`, `apache.rocketmq.v2`).
//!
//! | module      | commands                                                        |
//! |-------------|-----------------------------------------------------------------|
//! | [`acl`]     | `raftmq user`, `raftmq acl`: ACL 2.0 users and policies         |
//! | [`cert`]    | `raftmq cert ca|issue`: a CA and the certificates `[tls]` needs  |
//! | [`dev`]     | `raftmq dev`: a NameServer and three-node groups, one command    |
//! | [`dashboard`] | `raftmq dashboard`: the web console (started by `raftmq dev` too) |
//! | [`dev_secure`] | `raftmq dev --secure`: its CA, certificates and `[tls]` tables |
//! | [`produce`] | `raftmq produce`, `consume`, `recall`                           |
//! | [`bench`]   | `raftmq bench produce|consume|e2e`, with plots                  |
//! | [`connect`] | how commands reach a cluster: NameServers, broker groups, channels |
//! | [`connections`] | `raftmq group connections|status`, `topic producers`: clients per node |
//! | [`admin`]   | `raftmq cluster ...`, `raftmq topic ...` via the NameServers     |
//! | [`status`]  | `raftmq cluster status`: every node, live, with its last heartbeat |
//! | [`rolling`] | `raftmq cluster rolling-restart`: one node at a time, leader last |
//! | [`broker_config`] | `raftmq cluster get-config|update-config|wipe-write-perm|add-write-perm|dedup` |
//! | [`group`]   | `raftmq group ...`: create, update, list, delete consumer groups |
//! | [`progress`] | `raftmq group progress|reset-offset|skip-backlog|clone-offsets` |
//! | [`topic_status`] | `raftmq topic status`: each queue's offsets and last store time |
//! | [`message`] | `raftmq message get|find|range|at`                              |
//! | [`node`]    | `raftmq node status|put-topic|send|read` on one node            |
//! | [`inspect`] | `raftmq store verify`: a store opened offline                   |
//! | [`display`] | local date-times and ages as the commands print them             |
//! | [`logging`] | every process's logging, with repeated openraft warnings limited |

pub mod acl;
pub mod admin;
pub mod bench;
pub mod broker_config;
pub mod cert;
pub mod connect;
pub mod connections;
pub mod dashboard;
pub mod dev;
pub mod dev_secure;
pub mod display;
pub mod group;
pub mod inspect;
pub mod logging;
pub mod message;
pub mod node;
pub mod produce;
pub mod progress;
pub mod rolling;
pub mod status;
pub mod topic_status;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "raftmq",
    version,
    about = "A RocketMQ-style message broker whose broker groups are Raft groups"
)]
pub struct Cli {
    /// Log format on stderr. The filter comes from RUST_LOG (default: info,openraft=warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Speak TLS to the cluster, trusting the CA in this PEM file (the
    /// `ca_cert` that `raftmq dev --secure` prints).
    #[arg(long, env = "RAFTMQ_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Sign every call as this user (ACL 2.0), with --secret-key.
    #[arg(long, env = "RAFTMQ_ACCESS_KEY", global = true)]
    pub access_key: Option<String>,
    /// The secret key that signs with --access-key.
    #[arg(long, env = "RAFTMQ_SECRET_KEY", global = true, hide_env_values = true)]
    pub secret_key: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a NameServer and a three-node broker group on 127.0.0.1, each
    /// node its own process, with a TestTopic; Ctrl-C stops them all.
    Dev(crate::cli::dev::DevArgs),
    /// Serve the web dashboard: cluster, topics, consumer groups, messages
    /// and charts, through the same protocols as these commands.
    Dashboard(crate::cli::dashboard::DashboardArgs),
    /// Send messages through the RocketMQ 5 protocol.
    Produce(crate::cli::produce::ProduceArgs),
    /// Receive (and acknowledge) messages through the RocketMQ 5 protocol.
    Consume(crate::cli::produce::ConsumeArgs),
    /// Cancel a timed message that is not due yet, by the recall handle
    /// `produce --delay` printed.
    Recall(crate::cli::produce::RecallArgs),
    /// Load a cluster: produce, consume or both; msgs/s, MiB/s, latency.
    #[command(subcommand)]
    Bench(crate::cli::bench::BenchCommand),
    /// Run one broker node (a member of a three-node Raft group).
    Broker {
        /// The node's TOML config (see deploy/local/ for examples).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a NameServer (brokers register with it; clients ask it for routes).
    Namesrv {
        /// TOML config (listen, scan_interval_ms, expiry_ms).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (overrides the config).
        #[arg(long)]
        listen: Option<String>,
    },
    /// ACL users: create, update, delete, get, list (mqadmin's *User).
    #[command(subcommand)]
    User(crate::cli::acl::UserCommand),
    /// ACL policies: create, update, delete, get, list (mqadmin's *Acl).
    #[command(subcommand)]
    Acl(crate::cli::acl::AclCommandLine),
    /// Cluster administration through the NameServers.
    #[command(subcommand)]
    Cluster(crate::cli::admin::ClusterCommand),
    /// Create, update, delete, list topics and show their routes.
    #[command(subcommand)]
    Topic(crate::cli::admin::TopicCommand),
    /// Consumer groups: create, update, list, progress (lag), reset-offset.
    #[command(subcommand)]
    Group(crate::cli::group::GroupCommand),
    /// Look messages up by id or key.
    #[command(subcommand)]
    Message(crate::cli::message::MessageCommand),
    /// Talk to one broker node over raftmq's own protocol (status, topics,
    /// send, read).
    #[command(subcommand)]
    Node(crate::cli::node::NodeCommand),
    /// Work with a node's store directory offline.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Make a CA and sign the certificates `[tls]` needs (node identities
    /// included), for clusters without a PKI of their own.
    #[command(subcommand)]
    Cert(crate::cli::cert::CertCommand),
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Open a store the way a broker does (recovering it if the last stop was
    /// a crash), verify the CRC of every record and every ConsumeQueue
    /// unit against its block's seal, and print a summary. A store whose
    /// node noted damage while it ran is refused.
    /// The broker owning the directory must be stopped.
    Verify {
        /// The store directory (a broker's data_dir).
        #[arg(long)]
        dir: PathBuf,
        /// Segment size the store was written with, in bytes (default: the
        /// size recorded in the store's checkpoint).
        #[arg(long)]
        segment_size: Option<u64>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print every record's Raft index, term, kind, CRC and length, one JSON
    /// object per line, oldest first (to compare replicas' logs). The broker
    /// owning the directory must be stopped.
    Dump {
        /// The store directory (a broker's data_dir).
        #[arg(long)]
        dir: PathBuf,
        /// Segment size the store was written with, in bytes (default: the
        /// size recorded in the store's checkpoint).
        #[arg(long)]
        segment_size: Option<u64>,
    },
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(ca) = &cli.ca_cert {
        crate::cli::connect::use_tls(ca)?;
    }
    match (cli.access_key, cli.secret_key) {
        (Some(access_key), Some(secret_key)) => {
            crate::cli::connect::use_credentials(crate::client::credentials::Credentials { access_key, secret_key })
        }
        (None, None) => {}
        _ => anyhow::bail!("--access-key and --secret-key (RAFTMQ_ACCESS_KEY, RAFTMQ_SECRET_KEY) go together"),
    }
    match cli.command {
        Command::Dev(a) => runtime()?.block_on(crate::cli::dev::run(a)),
        Command::Dashboard(a) => runtime()?.block_on(crate::cli::dashboard::run(a)),
        Command::Produce(a) => runtime()?.block_on(crate::cli::produce::produce(a)),
        Command::Consume(a) => runtime()?.block_on(crate::cli::produce::consume(a)),
        Command::Recall(a) => runtime()?.block_on(crate::cli::produce::recall(a)),
        Command::Bench(cmd) => runtime()?.block_on(crate::cli::bench::run(cmd)),
        Command::Broker { config } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(crate::server::run(&config)),
        Command::Namesrv { config, listen } => {
            let mut cfg = match config {
                Some(path) => crate::namesrv::NamesrvConfig::load(&path)?,
                None => crate::namesrv::NamesrvConfig::default(),
            };
            if let Some(l) = listen {
                cfg.listen = l;
            }
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(crate::namesrv::run(cfg))
        }
        Command::Cert(cmd) => crate::cli::cert::run(cmd),
        Command::User(cmd) => runtime()?.block_on(crate::cli::acl::run_user(cmd)),
        Command::Acl(cmd) => runtime()?.block_on(crate::cli::acl::run_acl(cmd)),
        Command::Cluster(cmd) => runtime()?.block_on(crate::cli::admin::run_cluster(cmd)),
        Command::Topic(cmd) => runtime()?.block_on(crate::cli::admin::run_topic(cmd)),
        Command::Group(cmd) => runtime()?.block_on(crate::cli::group::run(cmd)),
        Command::Message(cmd) => runtime()?.block_on(crate::cli::message::run(cmd)),
        Command::Node(cmd) => runtime()?.block_on(crate::cli::node::run(cmd)),
        Command::Store(StoreCommand::Verify {
            dir,
            segment_size,
            json,
        }) => {
            let summary = crate::cli::inspect::verify(&dir, segment_size)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{summary}");
            }
            Ok(())
        }
        Command::Store(StoreCommand::Dump { dir, segment_size }) => {
            let stdout = std::io::stdout();
            crate::cli::inspect::dump(&dir, segment_size, &mut std::io::BufWriter::new(stdout.lock()))?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every flag of every command says what it is for in `--help`.
    #[test]
    fn every_flag_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "raftmq", &mut missing);
        assert!(
            missing.is_empty(),
            "flags without a description:\n{}",
            missing.join("\n")
        );
    }
}
