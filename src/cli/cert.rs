//! `raftmq cert ca|issue`: a small CA for clusters that have no PKI of
//! their own (and for `raftmq dev --secure` and the jepsen harness), and
//! the certificates it signs, with the names raftmq's `[tls]` needs.
//!
//! Files, all PEM, in one directory:
//!
//! ```text
//! ca.pem  ca.key          the CA (`cert ca`); ca.key is mode 0600
//! <name>.pem <name>.key   a process's leaf (`cert issue --name <name>`)
//! ```
//!
//! A broker node's leaf names its member URI (`--member group/node`,
//! `raftmq://group/<g>/node/<n>`): that is how peers and NameServers know
//! which member it is. Every leaf names the hosts it is dialled at.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use raftmq_raft::tls::issue::{Ca, Pem};

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Make a CA: DIR/ca.pem (what clients and peers trust, `[tls] ca_cert`)
    /// and DIR/ca.key (owner-only). Refuses to replace one.
    Ca {
        /// The directory to write to (made if missing).
        #[arg(long)]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "raftmq CA")]
        name: String,
        /// Days the CA is valid for (the leaves it signs end with it at the
        /// latest).
        #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
    },
    /// Sign a leaf with DIR/ca.pem and DIR/ca.key: DIR/NAME.pem (`[tls]
    /// cert`) and DIR/NAME.key (`[tls] key`, owner-only).
    Issue {
        /// The directory holding the CA, where the leaf goes.
        #[arg(long)]
        dir: PathBuf,
        /// The leaf's file name (and common name): namesrv, node1, ...
        #[arg(long)]
        name: String,
        /// A DNS name or IP address the process is dialled at (repeat, or
        /// separate with commas).
        #[arg(long = "host", required = true, value_delimiter = ',')]
        hosts: Vec<String>,
        /// For a broker node: GROUP/NODE_ID (its broker group and node_id).
        #[arg(long)]
        member: Option<String>,
        /// Days the certificate is valid for; `[tls]` picks up a renewed
        /// file without a restart (reload_check_ms).
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
    },
}

pub fn run(cmd: CertCommand) -> anyhow::Result<()> {
    match cmd {
        CertCommand::Ca { dir, name, days } => {
            let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
            if cert.exists() || key.exists() {
                anyhow::bail!(
                    "{} already has a CA: leaves it signed would no longer verify if it were replaced",
                    dir.display()
                );
            }
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let ca = Ca::valid_for(&name, Some(days)).map_err(anyhow::Error::msg)?;
            write_pair(&cert, &key, ca.pem())?;
            println!("wrote {} and {}", cert.display(), key.display());
        }
        CertCommand::Issue {
            dir,
            name,
            hosts,
            member,
            days,
        } => {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) || name == "ca"
            {
                anyhow::bail!("--name {name:?}: letters, digits, '-', '_' and '.', and not \"ca\"");
            }
            let member = member.as_deref().map(parse_member).transpose()?;
            let ca = load_ca(&dir)?;
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            let pem = ca
                .leaf_valid_for(
                    &name,
                    &hosts,
                    member.as_ref().map(|(g, n)| (g.as_str(), *n)),
                    Some(days),
                )
                .map_err(anyhow::Error::msg)?;
            let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
            write_pair(&cert, &key, &pem)?;
            println!("wrote {} and {}", cert.display(), key.display());
        }
    }
    Ok(())
}

/// `group/node_id`.
fn parse_member(s: &str) -> anyhow::Result<(String, u64)> {
    let bad = || anyhow::anyhow!("--member {s:?}: expected GROUP/NODE_ID, e.g. broker-a/1");
    let (group, node) = s.split_once('/').ok_or_else(bad)?;
    let node = node.parse::<u64>().map_err(|_| bad())?;
    if group.is_empty() || node == 0 {
        return Err(bad());
    }
    Ok((group.to_string(), node))
}

/// The CA in `dir` (ca.pem, ca.key).
pub fn load_ca(dir: &Path) -> anyhow::Result<Ca> {
    let read = |f: &str| {
        let p = dir.join(f);
        std::fs::read_to_string(&p)
            .with_context(|| format!("cannot read {} (make one with raftmq cert ca)", p.display()))
    };
    Ca::load(Pem {
        cert: read("ca.pem")?,
        key: read("ca.key")?,
    })
    .map_err(anyhow::Error::msg)
}

/// Writes a certificate (readable) and its key (owner only).
pub fn write_pair(cert: &Path, key: &Path, pem: &Pem) -> anyhow::Result<()> {
    std::fs::write(cert, &pem.cert).with_context(|| format!("cannot write {}", cert.display()))?;
    write_private(key, &pem.key)
}

/// Writes a file only its owner may read.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_leaf_names_its_node_and_chains_to_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        run(CertCommand::Ca {
            dir: d.clone(),
            name: "test CA".into(),
            days: 10,
        })
        .unwrap();
        assert!(
            run(CertCommand::Ca {
                dir: d.clone(),
                name: "again".into(),
                days: 10,
            })
            .is_err(),
            "a second CA would orphan the first one's leaves"
        );
        run(CertCommand::Issue {
            dir: d.clone(),
            name: "node1".into(),
            hosts: vec!["127.0.0.1".into(), "localhost".into()],
            member: Some("broker-a/1".into()),
            days: 2,
        })
        .unwrap();
        let material = raftmq_raft::tls::TlsConfig {
            cert: d.join("node1.pem"),
            key: d.join("node1.key"),
            ca_cert: d.join("ca.pem"),
            reload_check_ms: 10_000,
        }
        .load();
        assert!(material.is_ok(), "{:?}", material.err());
        let pem = std::fs::read(d.join("node1.pem")).unwrap();
        let cert = first_cert(&pem);
        let id = raftmq_raft::tls::identity::of_cert(&cert).unwrap();
        // Valid from a day ago for the days asked.
        let (_, x509) = x509_parser::parse_x509_certificate(&cert).unwrap();
        let days = (x509.validity().not_after.timestamp() - x509.validity().not_before.timestamp()) / 86_400;
        assert_eq!(days, 3);
        // A leaf asked to outlive its CA ends with it.
        run(CertCommand::Issue {
            dir: d.clone(),
            name: "node2".into(),
            hosts: vec!["127.0.0.1".into()],
            member: Some("broker-a/2".into()),
            days: 365,
        })
        .unwrap();
        let end = |name: &str| {
            let cert = first_cert(&std::fs::read(d.join(name)).unwrap());
            let (_, x509) = x509_parser::parse_x509_certificate(&cert).unwrap();
            x509.validity().not_after.timestamp()
        };
        assert_eq!(end("node2.pem"), end("ca.pem"));
        assert_eq!(id.map(|m| (m.group, m.node)), Some(("broker-a".to_string(), 1)));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join("node1.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key is the owner's alone");
        for bad in ["broker-a", "broker-a/x", "/1", "broker-a/0"] {
            assert!(parse_member(bad).is_err(), "{bad}");
        }
    }

    /// The first certificate of a PEM file.
    fn first_cert(pem: &[u8]) -> rustls::pki_types::CertificateDer<'static> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        CertificateDer::pem_slice_iter(pem).next().unwrap().unwrap()
    }
}
