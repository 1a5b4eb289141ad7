//! raftmq: a RocketMQ-style message broker in which every broker group is a
//! Raft group.
//!
//! # Module map
//!
//! | module                | what it holds                                                     |
//! |-----------------------|-------------------------------------------------------------------|
//! | [`cli`]               | the `raftmq` command line (clap) and its dispatch                |
//! | [`dev`]               | `raftmq dev`: NameServer + three broker processes, one command    |
//! | [`client`]            | a small Rust client of the RocketMQ 5 protocol                    |
//! | [`client_cli`]        | `raftmq produce`, `raftmq consume`                                |
//! | [`bench_cli`]         | `raftmq bench produce|consume|e2e`: load, progress, report        |
//! | [`bench_plot`]        | the latency plots of `raftmq bench --plot`                        |
//! | [`admin_cli`]         | `raftmq cluster ...`, `raftmq topic ...` via the NameServers      |
//! | [`group_cli`]         | `raftmq group ...`: consumer groups, progress, offset resets      |
//! | [`message_cli`]       | `raftmq message get|find`: by id or key                          |
//! | [`config`]            | the broker's TOML configuration                                  |
//! | [`clock`]             | the broker's wall clock (an offset only for fault injection)     |
//! | [`server`]            | `raftmq broker`: a node and its client services, signals          |
//! | [`broker`]            | the broker core: send, read, topics, groups, status, membership   |
//! | [`batcher`]           | group commit: concurrent sends packed into one Raft entry         |
//! | [`broker_service`]    | `raftmq.v1.Broker` over gRPC, forwarding to the leader            |
//! | [`messaging_service`] | `apache.rocketmq.v2.MessagingService`: the official clients' protocol |
//! | [`v2_message`]        | v2 messages: validation, system properties, digests, timestamps  |
//! | [`client_route`]      | v2 routes: every node of a group as one broker's endpoints        |
//! | [`client_settings`]   | the settings answered on a client's Telemetry stream             |
//! | [`clients`]           | the v2 clients a node knows (heartbeats, Telemetry streams)      |
//! | [`pop`]               | pop consumption at the leader: receive, long polling, ack, DLQ    |
//! | [`held`]              | storing timed and half messages, releasing them into their topics |
//! | [`timers`]            | timed and delay messages: release when due, recall                |
//! | [`transactions`]      | transactional messages: commit, rollback, check-backs             |
//! | [`progress`]          | consumer groups' offsets, lag and in-flight counts per queue      |
//! | [`receipt`]           | receipt handles                                                   |
//! | [`filter`]            | a subscription's filter: tags or SQL92, hash pre-check then match |
//! | [`sql_filter`]        | SQL92 filter expressions (sqlparser): parse, match a message      |
//! | [`h2_authority`]      | makes multi-address `:authority` headers acceptable to h2         |
//! | [`metrics`]           | Prometheus metrics of a broker node (counters, scrape-time state) |
//! | [`metrics_http`]      | the `/metrics` HTTP endpoint (brokers and NameServers)            |
//! | [`channel`]           | how raftmq's clients open gRPC channels                           |
//! | [`error`]             | [`error::BrokerError`] and its mapping to gRPC and v2 status codes |
//! | [`node_cli`]          | `raftmq node status|put-topic|send|read` over raftmq.v1           |
//! | [`inspect`]           | `raftmq store verify`: open a store offline and summarize it      |
//! | [`namesrv`]           | the NameServer: registry, routes, expiry, `raftmq namesrv`        |
//! | [`registration`]      | broker heartbeats to every NameServer, unregister on stop         |
//! | [`route_cache`]       | routes from NameServers: random start, round-robin, 30 s cache    |
//! | `pb`                  | code generated from `proto/raftmq/v1/{broker,namesrv}.proto`      |
//! | `rocketmq::v2`        | code generated from `proto/apache/rocketmq/v2/` (client protocol) |
//!
//! The storage engine is `raftmq-store` (`store/`), the Raft layer
//! `raftmq-raft` (`raft/`).
//!
//! ```text
//!  official client ─► LenientAuthority ─► MessagingService (any node) ─follower─► forwards to the leader
//!  raftmq client ────────────────────────► BrokerService    (any node) ─follower─► forwards to the leader
//!                                               │ leader
//!                                               ▼
//!   send ─► Batcher ─► RaftNode.write ─► replicated, applied ─► queue offsets
//!   receive/ack ─► Popper: plan from applied state ─► RaftNode.write(Pop/Ack) ─► deliveries
//!   pull, offsets, routes ◄── this node's ConsumeQueues, CommitLog and metadata (applied data only)
//! ```

pub mod admin_cli;
pub mod batcher;
pub mod bench_cli;
pub mod bench_plot;
pub mod broker;
pub mod broker_service;
pub mod channel;
pub mod cli;
pub mod client;
pub mod client_cli;
pub mod client_route;
pub mod client_settings;
pub mod clients;
pub mod clock;
pub mod config;
pub mod dev;
pub mod error;
pub mod filter;
pub mod group_cli;
pub mod h2_authority;
pub mod held;
pub mod inspect;
pub mod message_cli;
pub mod messaging_service;
pub mod metrics;
pub mod metrics_http;
pub mod namesrv;
pub mod node_cli;
pub mod pop;
pub mod progress;
pub mod receipt;
pub mod registration;
pub mod route_cache;
pub mod server;
pub mod sql_filter;
pub mod timers;
pub mod transactions;
pub mod v2_message;

pub mod pb {
    //! Generated from `proto/raftmq/v1/broker.proto`.
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raftmq.v1");
}

pub mod rocketmq {
    //! The Apache RocketMQ 5 client protocol, `apache.rocketmq.v2`, generated
    //! from `proto/apache/rocketmq/v2/` (written for this project to match the
    //! public rocketmq-apis v2.1.2 on the wire; checked field by field against
    //! its descriptors). Served by [`crate::messaging_service`].
    pub mod v2 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("apache.rocketmq.v2");
    }
}

/// Upper bound of one client message, each way.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;
