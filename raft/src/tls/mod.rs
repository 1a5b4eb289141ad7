//! TLS on every raftmq port, with rustls (ring) and certificates read from
//! PEM files that are read again when they change.
//!
//! | module       | what it holds                                                         |
//! |--------------|-----------------------------------------------------------------------|
//! | [`material`] | the PEM files, loaded and checked; the rustls configs built from them, rebuilt when the files change |
//! | [`identity`] | the group and node a certificate names (a URI SAN), and the check of a peer against them |
//! | [`conn`]     | an accepted connection, plain or TLS, and what tonic's handlers learn of its peer ([`PeerInfo`]) |
//! | [`dial`]     | the client side: a tonic channel whose connections are TLS to the cluster's CA |
//! | [`issue`]    | a small CA for `raftmq dev --secure` and the tests (rcgen)              |
//!
//! Why not tonic's own TLS: it fixes the certificates when the server
//! starts, and it wraps the socket itself, beneath any wrapper of ours; the
//! client port rewrites HTTP/2 header bytes (`h2_authority`), which must
//! see the decrypted stream. So the handshake is done here, and tonic is
//! handed a stream that is already plaintext.
//!
//! Who must show a certificate:
//! - the Raft port: every caller, issued by the cluster's CA and naming a
//!   node of this group ([`ClientAuth::Required`]);
//! - the client and NameServer ports: nobody (applications authenticate by
//!   access key), but one offered must chain to the CA, and then names the
//!   member node the call comes from ([`ClientAuth::Optional`]); a broker's
//!   heartbeat must carry one;
//! - the metrics port: nobody ([`ClientAuth::None`], HTTP/1.1).

pub mod conn;
pub mod dial;
pub mod identity;
pub mod issue;
pub mod material;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use conn::{HANDSHAKE_TIMEOUT, PeerInfo};
pub use dial::Dialer;
pub use identity::NodeIdentity;
pub use material::{ClientAuth, Material};

/// The `[tls]` table of a broker's or NameServer's config.
///
/// ```toml
/// [tls]
/// cert = "certs/broker-a-1.pem"   # this node's certificate chain, leaf first
/// key = "certs/broker-a-1.key"    # its private key (PKCS#8, PKCS#1 or SEC1 PEM)
/// ca_cert = "certs/ca.pem"        # the cluster's CA
/// reload_check_ms = 10000         # how often the files are looked at for a change
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_cert: PathBuf,
    #[serde(default = "default_reload_check_ms")]
    pub reload_check_ms: u64,
}

fn default_reload_check_ms() -> u64 {
    10_000
}

impl TlsConfig {
    /// The files as [`Material`] loads them.
    pub fn files(&self) -> material::Files {
        material::Files {
            cert: Some(self.cert.clone()),
            key: Some(self.key.clone()),
            ca_cert: self.ca_cert.clone(),
            reload_check: Duration::from_millis(self.reload_check_ms),
        }
    }

    /// Loads the files once, so that a bad path or PEM stops the start.
    pub fn load(&self) -> Result<std::sync::Arc<Material>, String> {
        Material::load(self.files()).map(std::sync::Arc::new)
    }
}
