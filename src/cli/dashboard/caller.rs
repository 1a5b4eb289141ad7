//! Who a page's calls are made as, and the calls the pages share: the
//! NameServers' view, each broker group's address, a node's client. A
//! refusal is turned into a sentence that says what to do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;

use super::permissions::Permissions;
use crate::cli::connect::{Signed, ask, broker_as, channel, group_addresses};
use crate::client::credentials::Credentials;
use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;

/// How long one node has to answer a page's call before the page says so.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The NameServers, the user a page's calls are signed as (`None`: not
/// logged in, unsigned), and the channels the dashboard keeps.
#[derive(Clone)]
pub struct Caller {
    pub namesrv: String,
    pub who: Option<Credentials>,
    /// What `who` may do: the pages offer only that.
    pub may: Arc<Permissions>,
    pub channels: Arc<Channels>,
}

/// Most node addresses a dashboard keeps channels to; past it they are all
/// dropped and made again (addresses come from the NameServers).
const MAX_CHANNELS: usize = 512;

/// One HTTP/2 channel per node address, shared by every page and the
/// sampler (calls are signed one by one, so users can share a channel):
/// a page refreshed every 2 s does not connect anew each time.
#[derive(Default)]
pub struct Channels(Mutex<HashMap<String, Channel>>);

impl Channels {
    fn get(&self, addr: &str) -> anyhow::Result<Channel> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        if map.len() >= MAX_CHANNELS {
            map.clear();
        }
        let c = channel(addr)?;
        map.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl Caller {
    /// The access key logged in, if any.
    pub fn user(&self) -> Option<&str> {
        self.who.as_ref().map(|c| c.access_key.as_str())
    }

    /// A `raftmq.v1.Broker` client for the node at `addr`, signing as the
    /// caller.
    pub fn broker(&self, addr: &str) -> anyhow::Result<BrokerClient<Signed>> {
        Ok(broker_as(self.channels.get(addr)?, self.who.clone()))
    }

    /// Every node the NameServers know.
    pub async fn cluster(&self) -> anyhow::Result<pb::ClusterInfo> {
        ask(&self.namesrv, |mut c| async move {
            c.get_cluster_info(pb::ClusterInfoRequest {}).await
        })
        .await
    }

    /// Each broker group and the address of its leader (as the NameServers
    /// name it; followers forward), by group name.
    pub async fn groups(&self) -> anyhow::Result<Vec<(String, String)>> {
        Ok(group_addresses(self.cluster().await?.nodes))
    }

    /// Every topic the NameServers know, sorted.
    pub async fn topic_names(&self) -> anyhow::Result<Vec<String>> {
        let mut t = ask(&self.namesrv, |mut c| async move {
            c.list_topics(pb::ListTopicsRequest {}).await
        })
        .await?
        .topics;
        t.sort();
        t.dedup();
        Ok(t)
    }
}

impl Caller {
    /// Each broker group's progress of consumer group `group` ("": every
    /// group), with the broker group's name; and what failed, in words.
    pub async fn progress(&self, group: &str) -> (Vec<(String, pb::QueueProgress)>, Vec<String>) {
        let (mut out, mut errors) = (Vec::new(), Vec::new());
        let groups = match self.groups().await {
            Ok(g) => g,
            Err(e) => return (out, vec![e.to_string()]),
        };
        for (g, addr) in groups {
            let reply = match self.broker(&addr) {
                Ok(mut c) => {
                    call(
                        "progress",
                        c.group_progress(pb::GroupProgressRequest { group: group.into() }),
                    )
                    .await
                }
                Err(e) => Err(e.to_string()),
            };
            match reply {
                Ok(p) => out.extend(p.queues.into_iter().map(|q| (g.clone(), q))),
                Err(e) => errors.push(format!("group {g}: {e}")),
            }
        }
        (out, errors)
    }

    /// Waits (a few seconds at most) until the NameServers list `topic`,
    /// or no longer do: a broker heartbeats a topic change at once, and
    /// the page the operator is sent to next should show it.
    pub async fn await_listed(&self, topic: &str, listed: bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            if self
                .topic_names()
                .await
                .is_ok_and(|t| t.iter().any(|t| t == topic) == listed)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs one call with [`CALL_TIMEOUT`], the failure explained.
pub async fn call<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{what}: {}", refusal(&s))),
        Err(_) => Err(format!("{what}: no answer within {} s", CALL_TIMEOUT.as_secs())),
    }
}

/// [`call`] for a lookup: `None` when the node answers that there is no
/// such thing.
pub async fn find<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<Option<T>, String> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(r)) => Ok(Some(r.into_inner())),
        Ok(Err(s)) if s.code() == tonic::Code::NotFound => Ok(None),
        Ok(Err(s)) => Err(format!("{what}: {}", refusal(&s))),
        Err(_) => Err(format!("{what}: no answer within {} s", CALL_TIMEOUT.as_secs())),
    }
}

/// A call's failure in words an operator can act on.
pub fn refusal(s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::Unauthenticated => format!(
            "the cluster does not know this caller ({}): log in with an access key and secret key",
            s.message()
        ),
        tonic::Code::PermissionDenied => format!("not allowed for this user ({})", s.message()),
        tonic::Code::Unavailable => format!("unavailable, try again ({})", s.message()),
        _ => s.message().to_string(),
    }
}
