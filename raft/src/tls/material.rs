//! The PEM files of a TLS setup, and the rustls configs built from them.
//!
//! [`Material::current`] looks at the files' modification times at most
//! once per `reload_check` and rebuilds every config when one changed, so
//! a renewed certificate is used by the next handshake without a restart.
//! A rebuild that fails (a half-written file, a key that does not match)
//! keeps the previous configs and says why; the next change is tried again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A PEM file larger than this is refused (a chain of a few certificates
/// is a few KiB).
pub const MAX_PEM_BYTES: u64 = 1 << 20;
/// At most this many certificates are read from one file.
pub const MAX_CERTS_PER_FILE: usize = 64;

/// ALPN names: gRPC is HTTP/2 (its clients insist on `h2`), `/metrics` is
/// HTTP/1.1.
const ALPN_H2: &[u8] = b"h2";
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Where the material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// This process's certificate chain, leaf first; with `key`, needed to
    /// serve or to be a member, not to be a client.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The CA that every certificate we accept must chain to.
    pub ca_cert: PathBuf,
    pub reload_check: Duration,
}

impl Files {
    /// A client that trusts `ca_cert` and shows no certificate.
    pub fn client(ca_cert: &Path) -> Files {
        Files {
            cert: None,
            key: None,
            ca_cert: ca_cert.to_path_buf(),
            reload_check: Duration::from_secs(10),
        }
    }

    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        self.cert.iter().chain(&self.key).chain(std::iter::once(&self.ca_cert))
    }
}

/// Which client certificates a server asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A certificate from the CA, or no connection (the Raft port).
    Required,
    /// None, or one from the CA (the client and NameServer ports).
    Optional,
    /// None asked for; HTTP/1.1 (the metrics port).
    None,
}

/// The rustls configs of one version of the files.
pub struct Built {
    required: Option<Arc<ServerConfig>>,
    optional: Option<Arc<ServerConfig>>,
    http: Option<Arc<ServerConfig>>,
    client: Arc<ClientConfig>,
}

impl Built {
    /// The server config for `auth`; none when no certificate and key were
    /// given.
    pub fn server(&self, auth: ClientAuth) -> Option<Arc<ServerConfig>> {
        match auth {
            ClientAuth::Required => self.required.clone(),
            ClientAuth::Optional => self.optional.clone(),
            ClientAuth::None => self.http.clone(),
        }
    }

    pub fn client(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

/// The loaded files and the configs built from them, rebuilt on change.
pub struct Material {
    files: Files,
    state: Mutex<State>,
}

struct State {
    checked_at: Instant,
    stamps: Vec<Option<SystemTime>>,
    built: Arc<Built>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material").field("files", &self.files).finish()
    }
}

impl Material {
    /// Loads and checks the files: every one must parse, the key must
    /// match the certificate, and the CA must hold at least one certificate.
    pub fn load(files: Files) -> Result<Material, String> {
        if files.cert.is_some() != files.key.is_some() {
            return Err("a TLS certificate needs its key, and a key its certificate".into());
        }
        let stamps = stamps(&files);
        let built = build(&files)?;
        Ok(Material {
            state: Mutex::new(State {
                checked_at: Instant::now(),
                stamps,
                built: Arc::new(built),
            }),
            files,
        })
    }

    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Whether this process has a certificate to show.
    pub fn has_identity(&self) -> bool {
        self.files.cert.is_some()
    }

    /// The configs of the files as they are now (looked at no more often
    /// than every `reload_check`).
    pub fn current(&self) -> Arc<Built> {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.checked_at.elapsed() >= self.files.reload_check {
            s.checked_at = Instant::now();
            let now = stamps(&self.files);
            if now != s.stamps {
                s.stamps = now;
                match build(&self.files) {
                    Ok(b) => {
                        tracing::info!(ca = %self.files.ca_cert.display(), "TLS files changed; new handshakes use them");
                        s.built = Arc::new(b);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS files changed but do not load; the previous ones stay in use")
                    }
                }
            }
        }
        s.built.clone()
    }
}

fn stamps(files: &Files) -> Vec<Option<SystemTime>> {
    files
        .paths()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// The crypto rustls uses here: ring, named explicitly so that no
/// process-wide default has to be installed first.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open the TLS {what} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the TLS {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "the TLS {what} {} is larger than {MAX_PEM_BYTES} bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path, what)?;
    let mut certs = Vec::new();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| format!("the TLS {what} {} is not PEM: {e}", path.display()))?;
        if certs.len() == MAX_CERTS_PER_FILE {
            return Err(format!(
                "the TLS {what} {} holds more than {MAX_CERTS_PER_FILE} certificates",
                path.display()
            ));
        }
        certs.push(c);
    }
    if certs.is_empty() {
        return Err(format!("the TLS {what} {} holds no certificate", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read_pem(path, "key")?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("the TLS key {} is not a PEM private key: {e}", path.display()))
}

fn build(files: &Files) -> Result<Built, String> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for c in read_certs(&files.ca_cert, "CA certificate")? {
        roots
            .add(c)
            .map_err(|e| format!("the CA certificate {} is not usable: {e}", files.ca_cert.display()))?;
    }
    let roots = Arc::new(roots);
    let identity = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => Some((read_certs(c, "certificate")?, read_key(k)?)),
        _ => None,
    };
    let versions = |b: rustls::ConfigBuilder<ServerConfig, rustls::WantsVersions>| {
        b.with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))
    };
    let server = |auth: ClientAuth| -> Result<Option<Arc<ServerConfig>>, String> {
        let Some((chain, key)) = &identity else { return Ok(None) };
        let b = versions(ServerConfig::builder_with_provider(provider.clone()))?;
        let b = match auth {
            ClientAuth::None => b.with_no_client_auth(),
            ClientAuth::Required | ClientAuth::Optional => {
                let v = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
                let v = if auth == ClientAuth::Optional {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                b.with_client_cert_verifier(v.build().map_err(|e| format!("client certificate check: {e}"))?)
            }
        };
        let mut cfg = b
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
        cfg.alpn_protocols = vec![if auth == ClientAuth::None { ALPN_HTTP1 } else { ALPN_H2 }.to_vec()];
        Ok(Some(Arc::new(cfg)))
    };
    let b = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots.clone());
    let mut client = match &identity {
        Some((chain, key)) => b
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?,
        None => b.with_no_client_auth(),
    };
    client.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Built {
        required: server(ClientAuth::Required)?,
        optional: server(ClientAuth::Optional)?,
        http: server(ClientAuth::None)?,
        client: Arc::new(client),
    })
}
