//! raftmq: a RocketMQ-style message broker in which every broker group is a
//! Raft group.
//!
//! # Module map
//!
//! | module      | what it holds                                                |
//! |-------------|--------------------------------------------------------------|
//! | [`cli`]     | the `raftmq` command line (clap) and its dispatch           |
//! | [`inspect`] | `raftmq store verify`: open a store offline and summarize it |
//!
//! The storage engine is the `raftmq-store` crate (`store/`). The Raft
//! layer, broker, NameServer and client protocol arrive in later changes.

pub mod cli;
pub mod inspect;
