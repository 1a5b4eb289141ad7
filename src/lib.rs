//! raftmq: a RocketMQ-style message broker in which every broker group is a
//! Raft group. The storage engine is `raftmq-store` (`store/`), the Raft
//! layer `raftmq-raft` (`raft/`); this crate is the broker around them.
//!
//! # Module map
//!
//! | module           | the room for                                                       |
//! |------------------|--------------------------------------------------------------------|
//! | [`cli`]          | the `raftmq` commands: dev, produce/consume, bench, admin, inspect  |
//! | [`server`]       | composition root: `raftmq broker` wires a node, its services, signals |
//! | `fuzz_tests`     | property tests of the decoders and validators callers reach (tests only) |
//! | [`grpc`]         | the transports onto the core: `apache.rocketmq.v2`, `raftmq.v1`, the h2 shim, leader forwarding |
//! | [`broker`]       | the core at one node: send, read, topics, pop consumption, held messages, registration, metrics |
//! | [`filter`]       | subscription filters: tags and SQL92                               |
//! | [`proto`]        | generated protobuf code and its conversions                        |
//! | [`client`]       | a small Rust client of the RocketMQ 5 protocol, channels, routes    |
//! | [`namesrv`]      | the NameServer: registry, routes, expiry                           |
//! | [`metrics_http`] | the HTTP port: `/metrics`, `/healthz`, `/readyz` (brokers, NameServers) |
//! | [`config`], [`error`], [`clock`] | TOML loading, [`error::BrokerError`] and its status codes, the wall clock |
//! | [`hosts`]        | `RAFTMQ_HOSTS`: names dialled at fixed addresses (several hosts on one machine) |
//!
//! Dependencies run one way: `cli -> server -> grpc -> broker -> (proto,
//! raft, store)`; `client` and `filter` sit beside `broker` and use only
//! `proto`.
//!
//! ```text
//!  official client ─► LenientAuthority ─► grpc::rocketmq (any node) ─follower─► forwards to the leader
//!  raftmq client ────────────────────────► grpc::raftmq   (any node) ─follower─► forwards to the leader
//!                                               │ leader
//!                                               ▼
//!   send ─► Batcher ─► RaftNode.write ─► replicated, applied ─► queue offsets
//!   receive/ack ─► Popper: plan from applied state ─► RaftNode.write(Pop/Ack) ─► deliveries
//!   pull, offsets, routes ◄── this node's ConsumeQueues, CommitLog and metadata (applied data only)
//! ```

pub mod broker;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod filter;
pub mod grpc;
pub mod hosts;
pub mod metrics_http;
pub mod namesrv;
pub mod proto;
pub mod server;

#[cfg(test)]
mod fuzz_tests;

/// Upper bound of one client message, each way.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;
