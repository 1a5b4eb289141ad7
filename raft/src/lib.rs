//! raftmq-raft: every broker group is a Raft group (openraft 0.10), and its
//! Raft log is the store's CommitLog.
//!
//! # Module map
//!
//! | module            | what it holds                                                     |
//! |-------------------|-------------------------------------------------------------------|
//! | [`types`]         | the openraft type configuration, node addresses, aliases ([`Raft`] is here, at the root) |
//! | [`message`]       | the stored layout of one message                                   |
//! | [`command`]       | state-machine commands (a Raft entry's data) and their responses    |
//! | [`consumption`]   | pop-style consumption state: in-flight deliveries, acks, redelivery |
//! | [`dedup`]         | the deduplication window: message ids stored recently, so a retried send is stored once |
//! | [`held`]          | timed and half messages held until due or resolved (state only)     |
//! | [`secret`]        | the group's secret, which keys the MACs of the tokens clients hold  |
//! | [`acl`]           | users and access policies (ACL 2.0), replicated; the allow/deny decision |
//! | [`entry`]         | entries as CommitLog records and as wire messages                  |
//! | [`raft_meta`]     | vote, purged and committed log ids beside the log (CRC-checked, the vote and purged id twice) |
//! | [`quarantine`]    | a store damaged beyond what recovery cuts is set aside; the node starts empty |
//! | [`catching_up`]   | a node whose log lost committed entries to damage: no vote until it has them again |
//! | [`log_store`]     | openraft's log storage on the CommitLog, with the log index; reads an entry's messages |
//! | [`room`]          | a log append, vote or purge that ran out of disk space waits for room instead of failing |
//! | [`state_machine`] | applies entries: queue offsets, ConsumeQueues, keys, metadata; snapshots |
//! | [`network`]       | the gRPC client side of the Raft transport                         |
//! | [`service`]       | the gRPC server side, feeding requests into openraft               |
//! | [`serve`]         | serving gRPC on a bound listener: connection places, keepalive, TCP_NODELAY, shutdown |
//! | [`idle`]          | the calls open on each connection, so an idle one can be closed     |
//! | [`tls`]           | TLS on every port: certificates that reload, member identities, the dialer |
//! | [`node`]          | one node: store, log, state machine, Raft, transport, bootstrap     |
//! | `wire`            | openraft messages <-> protobuf                                      |
//! | [`error`]         | [`RaftError`]: retryable (not leader, unavailable) vs final; storage errors as `io::Error` |
//! | `pb`              | code generated from `proto/raftmq/v1/raft.proto`                    |
//!
//! # Data flow
//!
//! ```text
//!  client_write(Command) ─► openraft ─► LogStore.append ─► CommitLog record (+ log index unit)
//!                              │  ▲            └─ on_durable ─► IOFlushed
//!                              │  └── network (gRPC Append stream) ◄─► service on followers
//!                              ▼
//!                      StateMachine.apply ─► Store.dispatch (ConsumeQueue unit, key index)
//!                                          └► Metadata (topics, groups, offsets, consumption)
//! ```

pub mod acl;
pub mod catching_up;
pub mod command;
pub mod consumption;
pub mod dedup;
pub mod entry;
pub mod error;
pub mod held;
pub mod idle;
pub mod log_store;
pub mod message;
pub mod network;
pub mod node;
pub mod quarantine;
pub mod raft_meta;
pub mod room;
pub mod secret;
pub mod serve;
pub mod service;
pub mod state_machine;
pub mod tls;
pub mod types;
mod wire;

#[cfg(test)]
mod fuzz_tests;

pub mod pb {
    //! Generated from `proto/raftmq/v1/raft.proto`.
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raftmq.v1");
}

pub use command::{AdminCommand, BatchOutcome, Command, Response, SendBatch, TopicConfig};
pub use error::RaftError;
pub use log_store::LogStore;
pub use message::Message;
pub use node::{NodeConfig, RaftNode};
pub use state_machine::{Metadata, StateMachine};
pub use types::{NodeAddr, NodeId, TypeConfig};
pub use wire::{MAX_INDEX, MAX_TERM};

/// A Raft node of a broker group.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;
