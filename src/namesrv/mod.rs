//! The NameServer: brokers heartbeat to it, clients ask it for routes.
//!
//! | module       | what it holds                                            |
//! |--------------|----------------------------------------------------------|
//! | [`registry`] | the soft state and its rules (expiry, leader by term)    |
//! | [`service`]  | `raftmq.v1.NameServer` over gRPC, and the expiry scan     |
//! | [`config`]   | `raftmq namesrv`'s TOML configuration                     |
//! | [`metrics`]  | its Prometheus metrics                                    |

pub mod config;
pub mod metrics;
pub mod registry;
pub mod service;

pub use config::NamesrvConfig;
pub use service::{RunningNamesrv, run};
