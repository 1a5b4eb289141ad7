//! `raftmq dev --secure`: a CA of its own and a certificate per process,
//! under `DIR/certs/`, and the `[tls]` table each config gets.
//!
//! The CA is made once and kept (so a client's `--ca-cert` stays good
//! across restarts of the same directory); every leaf names `127.0.0.1`
//! and `localhost`, which is where dev's processes are dialled, and a
//! node's also names its group and node id (see `raftmq_raft::tls::identity`).
//! The CA's key is written with mode 0600 beside it, for issuing more.

use std::path::{Path, PathBuf};

use anyhow::Context;
use raftmq_raft::tls::issue::{Ca, Pem};

/// The names every dev certificate is valid for.
const HOSTS: &[&str] = &["127.0.0.1", "localhost"];

/// Where a process's certificate and key are.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA file and each process's leaf, by name (`namesrv`, `node1`, ..).
pub struct Certs {
    pub ca_cert: PathBuf,
    dir: PathBuf,
}

impl Certs {
    /// The leaf of process `name`.
    pub fn leaf(&self, name: &str) -> Leaf {
        Leaf {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
        }
    }

    /// The `[tls]` table of process `name`'s config.
    pub fn tls_table(&self, name: &str) -> String {
        let leaf = self.leaf(name);
        format!(
            "\n[tls]\ncert = {:?}\nkey = {:?}\nca_cert = {:?}\n",
            leaf.cert.display().to_string(),
            leaf.key.display().to_string(),
            self.ca_cert.display().to_string()
        )
    }
}

/// Makes (or keeps) the CA in `dir/certs`, and a leaf for each of
/// `processes`: `(name, Some((group, node id)))` for a broker node, `None`
/// for the NameServer.
pub fn ensure(dir: &Path, processes: &[(String, Option<(String, u64)>)]) -> anyhow::Result<Certs> {
    let certs_dir = dir.join("certs");
    std::fs::create_dir_all(&certs_dir).with_context(|| format!("cannot create {}", certs_dir.display()))?;
    let certs = Certs {
        ca_cert: certs_dir.join("ca.pem"),
        dir: certs_dir.clone(),
    };
    let complete = certs.ca_cert.exists()
        && processes.iter().all(|(name, _)| {
            let l = certs.leaf(name);
            l.cert.exists() && l.key.exists()
        });
    if complete {
        return Ok(certs);
    }
    // A new CA and new leaves for everything: leaves signed by a CA whose
    // key is gone could not be added to.
    let ca = Ca::new("raftmq dev CA").map_err(anyhow::Error::msg)?;
    for (name, member) in processes {
        let pem = ca
            .leaf(
                &format!("raftmq dev {name}"),
                HOSTS,
                member.as_ref().map(|(g, n)| (g.as_str(), *n)),
            )
            .map_err(anyhow::Error::msg)?;
        write_pair(&certs.leaf(name), &pem)?;
    }
    write_pair(
        &Leaf {
            cert: certs.ca_cert.clone(),
            key: certs_dir.join("ca.key"),
        },
        ca.pem(),
    )?;
    Ok(certs)
}

/// Writes a certificate (readable) and its key (owner only).
fn write_pair(leaf: &Leaf, pem: &Pem) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::write(&leaf.cert, &pem.cert).with_context(|| format!("cannot write {}", leaf.cert.display()))?;
    let _ = std::fs::remove_file(&leaf.key);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&leaf.key)
        .with_context(|| format!("cannot write {}", leaf.key.display()))?;
    f.write_all(pem.key.as_bytes())?;
    Ok(())
}
