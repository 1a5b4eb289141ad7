//! How the commands reach a cluster: a channel to an address, the first
//! NameServer of a list that answers, and each broker group's address
//! (its leader's, as the NameServers know it).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::bail;
use raftmq_raft::tls::material::Files;
use raftmq_raft::tls::{Dialer, Material};
use tonic::transport::Channel;

use crate::client::credentials::Credentials;
use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;
use crate::proto::pb::name_server_client::NameServerClient;

/// How every command dials: plain unless `--ca-cert` was given.
static DIALER: OnceLock<Dialer> = OnceLock::new();
/// What every command signs its calls with (`--access-key`/`--secret-key`).
static CREDENTIALS: OnceLock<Credentials> = OnceLock::new();

/// Signs every call of this process with `c` (ACL 2.0).
pub fn use_credentials(c: Credentials) {
    let _ = CREDENTIALS.set(c);
}

/// The credentials every command signs with, if any.
pub fn credentials() -> Option<Credentials> {
    CREDENTIALS.get().cloned()
}

/// Signs each call a client makes through it, when credentials were given.
#[derive(Clone)]
pub struct Signer(Option<Credentials>);

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = &self.0 {
            c.sign_into(r.metadata_mut());
        }
        Ok(r)
    }
}

/// A channel whose calls are signed.
pub type Signed = tonic::service::interceptor::InterceptedService<Channel, Signer>;

/// A `raftmq.v1.Broker` client for the node at `addr`, signing its calls.
pub fn broker(addr: &str) -> anyhow::Result<BrokerClient<Signed>> {
    Ok(broker_on(channel(addr)?))
}

/// A `raftmq.v1.Broker` client over `channel`, signing its calls.
pub fn broker_on(channel: Channel) -> BrokerClient<Signed> {
    broker_as(channel, credentials())
}

/// A `raftmq.v1.Broker` client over `channel` whose calls are signed as
/// `who` (unsigned for `None`), whatever this process was given: the
/// dashboard calls as the user logged in.
pub fn broker_as(channel: Channel, who: Option<Credentials>) -> BrokerClient<Signed> {
    BrokerClient::with_interceptor(channel, Signer(who))
        .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
}

/// Makes every connection of this process TLS, trusting the CA in `ca_cert`.
pub fn use_tls(ca_cert: &Path) -> anyhow::Result<()> {
    let material = Material::load(Files::client(ca_cert)).map_err(anyhow::Error::msg)?;
    let _ = DIALER.set(Dialer::tls(Arc::new(material)));
    Ok(())
}

/// The dialer every command uses.
pub fn dialer() -> Dialer {
    DIALER.get().cloned().unwrap_or_default()
}

/// A lazily connected channel to `addr`, with a bounded connect and call
/// time.
pub fn channel(addr: &str) -> anyhow::Result<Channel> {
    let ep = crate::client::channel::endpoint(addr, Duration::from_secs(3))
        .map_err(anyhow::Error::msg)?
        .timeout(Duration::from_secs(10));
    Ok(crate::client::channel::lazy(ep, addr, &dialer()))
}

/// How long a node has to answer before it counts as unreachable.
const NODE_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// A node's own view of its group (`raftmq.v1.Broker/Status`), or `None`
/// when it does not answer within [`NODE_STATUS_TIMEOUT`].
pub async fn node_status(addr: &str) -> Option<pb::StatusResponse> {
    let mut c = broker(addr).ok()?;
    let call = c.status(pb::StatusRequest { with_digest: false });
    match tokio::time::timeout(NODE_STATUS_TIMEOUT, call).await {
        Ok(Ok(s)) => Some(s.into_inner()),
        _ => None,
    }
}

/// Calls the first NameServer of the list that answers.
pub async fn ask<T, F, Fut>(namesrv: &str, call: F) -> anyhow::Result<T>
where
    F: Fn(NameServerClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut last = None;
    for addr in namesrv.split([',', ';']).map(str::trim).filter(|a| !a.is_empty()) {
        match call(NameServerClient::new(channel(addr)?)).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if matches!(s.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument) => {
                bail!("{}", s.message())
            }
            Err(s) => last = Some(crate::client::channel::explain(addr, &s, "a NameServer")),
        }
    }
    bail!(
        "no NameServer answered: {}",
        last.unwrap_or_else(|| "--namesrv names none".into())
    )
}

/// The client address of each group's leader (or any node: followers
/// forward), optionally only `only`.
pub async fn group_endpoints(namesrv: &str, only: Option<&str>) -> anyhow::Result<Vec<(String, String)>> {
    let info = ask(namesrv, |mut c| async move {
        c.get_cluster_info(pb::ClusterInfoRequest {}).await
    })
    .await?;
    let groups = group_addresses(info.nodes.into_iter().filter(|n| only.is_none_or(|g| g == n.group)));
    if groups.is_empty() {
        bail!(
            "no broker group{} is registered with the NameServer",
            only.map(|g| format!(" named {g}")).unwrap_or_default()
        );
    }
    Ok(groups)
}

/// Each group of `nodes` with the client address of its leader as the
/// NameServers name it (or of any node, which forwards), by group name.
pub fn group_addresses(nodes: impl IntoIterator<Item = pb::NodeInfo>) -> Vec<(String, String)> {
    let mut groups: std::collections::BTreeMap<String, String> = Default::default();
    for n in nodes {
        if n.is_group_leader || !groups.contains_key(&n.group) {
            groups.insert(n.group, n.client_addr);
        }
    }
    groups.into_iter().collect()
}

/// A `raftmq.v1.Broker` client for a broker group (any node; followers
/// forward to the leader).
pub async fn broker_client(namesrv: &str, group: &str) -> anyhow::Result<BrokerClient<Signed>> {
    let (_, addr) = group_endpoints(namesrv, Some(group))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no broker group named {group}"))?;
    broker(&addr)
}
