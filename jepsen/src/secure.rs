//! `--secure`: the run with TLS on every port and ACL on, as a careful
//! operator deploys it.
//!
//! The run's CA and every process's certificate are made with the
//! `raftmq cert` command under `<run>/certs/`; each node's names its
//! address and its member URI. The nodes' first Super user
//! ([`ADMIN`]) is the harness's own, for the `raftmq` commands it runs;
//! the workload runs as a Normal user ([`USER`]) whose policy allows
//! `Pub` and `Sub` on every topic and group. Users and policies are the
//! group's replicated state, so faults put them to the test as well: a
//! call refused for want of them (`UNAUTHORIZED`) is an anomaly of the
//! `access` check.
//!
//! The workload's calls are signed as RocketMQ 5's ACL 2.0 asks of gRPC
//! clients: `authorization: MQv2-HMAC-SHA1 Credential=<access key>,
//! SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the
//! x-mq-date-time value, keyed by the secret key>`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, bail};
use hmac::{Hmac, Mac};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// The Super user the harness administers the cluster as.
pub const ADMIN: &str = "jepsen-admin";
/// The Normal user the workload runs as.
pub const USER: &str = "jepsen";

/// An access key and its secret key.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl Credentials {
    /// A user with a fresh random secret.
    fn fresh(access_key: &str) -> Credentials {
        Credentials {
            access_key: access_key.to_string(),
            secret_key: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// The `authorization` and `x-mq-date-time` header values for now.
    pub fn sign(&self) -> (String, String) {
        let date_time = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        (self.authorization(&date_time), date_time)
    }

    /// The `authorization` header value for `date_time`.
    fn authorization(&self, date_time: &str) -> String {
        // HMAC takes a key of any length.
        let mut mac = Hmac::<sha1::Sha1>::new_from_slice(self.secret_key.as_bytes()).expect("any key length");
        mac.update(date_time.as_bytes());
        let signature: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02X}")).collect();
        format!(
            "MQv2-HMAC-SHA1 Credential={}, SignedHeaders=x-mq-date-time, Signature={signature}",
            self.access_key
        )
    }
}

/// The run's CA, certificates and users.
pub struct Security {
    dir: PathBuf,
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    pub admin: Credentials,
    pub user: Credentials,
    /// For HTTPS scrapes of the nodes' metrics ports.
    metrics: TlsConnector,
}

impl Security {
    /// Makes the CA and a certificate for each of `processes` (file name,
    /// address, and the broker node id for a member of `group`) with
    /// `bin cert`, under `run_dir/certs`.
    pub fn make(
        bin: &Path,
        run_dir: &Path,
        group: &str,
        processes: &[(String, IpAddr, Option<u64>)],
    ) -> anyhow::Result<Security> {
        let dir = run_dir.join("certs");
        let d = dir.to_str().context("the run directory's path is not UTF-8")?;
        cert(bin, &["ca", "--dir", d, "--name", "raftmq-jepsen CA"])?;
        for (name, ip, node) in processes {
            let ip = ip.to_string();
            let member = node.map(|n| format!("{group}/{n}"));
            let mut args = vec!["issue", "--dir", d, "--name", name, "--host", &ip];
            if let Some(m) = &member {
                args.extend(["--member", m]);
            }
            cert(bin, &args)?;
        }
        let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).context("reading the run's CA")?;
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.context("the run's CA")?)?;
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Security {
            dir,
            ca_pem,
            admin: Credentials::fresh(ADMIN),
            user: Credentials::fresh(USER),
            metrics: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The CA's file (for `--ca-cert`).
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The `[tls]` table of process `name`'s config.
    pub fn tls_table(&self, name: &str) -> String {
        format!(
            "\n[tls]\ncert = {:?}\nkey = {:?}\nca_cert = {:?}\n",
            self.dir.join(format!("{name}.pem")).display().to_string(),
            self.dir.join(format!("{name}.key")).display().to_string(),
            self.ca_cert().display().to_string(),
        )
    }

    /// The `[acl]` table of a broker node's config: on, with the
    /// harness's Super user as the first user.
    pub fn acl_table(&self) -> String {
        format!(
            "\n[acl]\nenabled = true\ninit_access_key = {:?}\ninit_secret_key = {:?}\n",
            self.admin.access_key, self.admin.secret_key
        )
    }

    /// The environment under which `raftmq` commands reach the cluster as
    /// the Super user.
    pub fn cli_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RAFTMQ_CA_CERT", self.ca_cert().display().to_string()),
            ("RAFTMQ_ACCESS_KEY", self.admin.access_key.clone()),
            ("RAFTMQ_SECRET_KEY", self.admin.secret_key.clone()),
        ]
    }

    /// A TLS session with the metrics port at `ip`, over `tcp`.
    pub async fn metrics_tls(
        &self,
        ip: IpAddr,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.metrics.connect(ServerName::IpAddress(ip.into()), tcp).await
    }
}

/// Runs `bin cert <args>`.
fn cert(bin: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .arg("cert")
        .args(args)
        .output()
        .with_context(|| format!("running {} cert", bin.display()))?;
    if !out.status.success() {
        bail!(
            "raftmq cert {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hex_hmac_sha1_of_the_date_time() {
        // RFC 2202's second HMAC-SHA1 test case, as key and "date-time".
        let c = Credentials {
            access_key: "ak".into(),
            secret_key: "Jefe".into(),
        };
        assert_eq!(
            c.authorization("what do ya want for nothing?"),
            "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, \
             Signature=EFFCDF6AE5EB2FA2D27416D5F184DF9C259A7C79"
        );
        let (_, date_time) = c.sign();
        assert_eq!(date_time.len(), "yyyyMMddTHHmmssZ".len());
        assert!(date_time.ends_with('Z') && date_time.as_bytes()[8] == b'T');
    }
}
