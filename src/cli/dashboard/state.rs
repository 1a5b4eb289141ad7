//! What every request handler of the dashboard shares.

use std::sync::Arc;

use super::{sampler, sessions};

/// What every request handler shares.
pub struct Dashboard {
    pub namesrv: String,
    pub sessions: sessions::Sessions,
    pub charts: Arc<sampler::Charts>,
}

pub type State = Arc<Dashboard>;
