//! What every request handler of the dashboard shares.

use std::sync::Arc;

use super::{caller, sampler, sessions};

/// What every request handler shares.
pub struct Dashboard {
    pub namesrv: String,
    pub sessions: sessions::Sessions,
    pub charts: Arc<sampler::Charts>,
    pub channels: Arc<caller::Channels>,
    /// The sampler signs with keys of its own (`--access-key`): ACL is on,
    /// and what it reads is shown only to those logged in.
    pub sampler_signed: bool,
}

pub type State = Arc<Dashboard>;
