//! `raftmq dev --secure`: a CA of its own and a certificate per process,
//! under `DIR/certs/`, and the `[tls]` table each config gets.
//!
//! The CA is made once and kept (so a client's `--ca-cert` stays good
//! across restarts of the same directory); every leaf names `127.0.0.1`
//! and `localhost`, which is where dev's processes are dialled, and a
//! node's also names its group and node id (see `raftmq_raft::tls::identity`).
//! The CA's key is written with mode 0600 beside it, for issuing more.
//!
//! ACL is on too, with a Super user made once (`admin.secret`, mode 0600)
//! and handed to every node as its `[acl]` initial user; `dev.json` names
//! it (`admin_access_key`, `admin_secret_key`), and dev signs its own
//! calls with it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use raftmq_raft::tls::issue::Ca;

use crate::cli::cert::{write_pair, write_private};

/// The access key of dev's Super user.
pub const ADMIN: &str = "raftmq-admin";

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
    /// The Super user's credentials.
    pub admin: crate::client::credentials::Credentials,
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

    /// The `[acl]` table of a node's config.
    pub fn acl_table(&self) -> String {
        format!(
            "\n[acl]\nenabled = true\ninit_access_key = {:?}\ninit_secret_key = {:?}\n",
            self.admin.access_key, self.admin.secret_key
        )
    }
}

/// The Super user's secret key, made once under `certs_dir`.
fn admin_secret(certs_dir: &Path) -> anyhow::Result<String> {
    let path = certs_dir.join("admin.secret");
    if let Ok(s) = std::fs::read_to_string(&path) {
        let s = s.trim().to_string();
        if raftmq_raft::acl::check_password(&s).is_ok() {
            return Ok(s);
        }
    }
    let secret = format!("{:032x}", rand::random::<u128>());
    write_private(&path, &secret)?;
    Ok(secret)
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
        admin: crate::client::credentials::Credentials {
            access_key: ADMIN.into(),
            secret_key: admin_secret(&certs_dir)?,
        },
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
        let leaf = certs.leaf(name);
        write_pair(&leaf.cert, &leaf.key, &pem)?;
    }
    write_pair(&certs.ca_cert, &certs_dir.join("ca.key"), ca.pem())?;
    Ok(certs)
}
