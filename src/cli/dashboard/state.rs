//! What every request handler of the dashboard shares.

use std::sync::Arc;

use super::{caller, sampler, sessions};
use crate::client::credentials::Credentials;

/// What every request handler shares.
pub struct Dashboard {
    pub namesrv: String,
    pub sessions: sessions::Sessions,
    pub charts: Arc<sampler::Charts>,
    pub channels: Arc<caller::Channels>,
    /// The dashboard's own keys (`--access-key`), if given: the sampler
    /// signs with them (ACL is on, and what it reads is shown only to
    /// those logged in), and a login reads the user's permissions with them.
    pub own: Option<Credentials>,
}

pub type State = Arc<Dashboard>;
