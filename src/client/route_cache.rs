//! Topic routes as a broker looks them up for the client protocol: from a
//! NameServer picked at random (spreading load), moving round-robin to the
//! next one when a call fails, cached and refreshed every 30 s or on demand.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use raftmq_raft::tls::Dialer;
use tonic::transport::Channel;

use crate::proto::pb;
use crate::proto::pb::name_server_client::NameServerClient;

/// RocketMQ refreshes routes every 30 s.
pub const REFRESH: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("topic {0} has no route")]
    NotFound(String),
    #[error("no NameServer answered: {0}")]
    Unavailable(String),
}

pub struct RouteCache {
    namesrvs: Vec<(String, NameServerClient<Channel>)>,
    /// Index of the NameServer to ask first.
    next: Mutex<usize>,
    cache: Mutex<HashMap<String, (Instant, pb::RouteResponse)>>,
    refresh: Duration,
}

impl RouteCache {
    pub fn new(addrs: &[String], refresh: Duration, dialer: &Dialer) -> RouteCache {
        let namesrvs: Vec<_> = addrs
            .iter()
            .filter_map(|a| {
                let ep = crate::client::channel::endpoint(a, Duration::from_secs(2)).ok()?;
                Some((
                    a.clone(),
                    NameServerClient::new(crate::client::channel::lazy(
                        ep.timeout(Duration::from_secs(3)),
                        a,
                        dialer,
                    )),
                ))
            })
            .collect();
        let start = if namesrvs.is_empty() {
            0
        } else {
            rand::random_range(0..namesrvs.len())
        };
        RouteCache {
            namesrvs,
            next: Mutex::new(start),
            cache: Mutex::new(HashMap::new()),
            refresh,
        }
    }

    /// The topic's route, from the cache while it is fresh.
    pub async fn route(&self, topic: &str) -> Result<pb::RouteResponse, RouteError> {
        if let Some((at, r)) = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            && at.elapsed() < self.refresh
        {
            return Ok(r.clone());
        }
        self.refresh(topic).await
    }

    /// Asks the NameServers now, starting with the current one and moving
    /// round-robin past those that fail.
    pub async fn refresh(&self, topic: &str) -> Result<pb::RouteResponse, RouteError> {
        let n = self.namesrvs.len();
        if n == 0 {
            return Err(RouteError::Unavailable("no NameServer is configured".into()));
        }
        let first = *self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut errors = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let (addr, client) = &self.namesrvs[i];
            match client
                .clone()
                .get_route(pb::RouteRequest {
                    topic: topic.to_string(),
                })
                .await
            {
                Ok(r) => {
                    *self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = i;
                    let r = r.into_inner();
                    self.cache
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(topic.to_string(), (Instant::now(), r.clone()));
                    return Ok(r);
                }
                Err(s) if s.code() == tonic::Code::NotFound => {
                    *self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = i;
                    return Err(RouteError::NotFound(topic.to_string()));
                }
                Err(s) => errors.push(format!("{addr}: {}", s.message())),
            }
        }
        // Next time, start after the one that failed first.
        *self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = (first + 1) % n;
        Err(RouteError::Unavailable(errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namesrv::{NamesrvConfig, RunningNamesrv};

    #[tokio::test]
    async fn fails_over_caches_and_refreshes() {
        let ns = RunningNamesrv::start(NamesrvConfig {
            listen: "127.0.0.1:0".into(),
            ..NamesrvConfig::default()
        })
        .await
        .unwrap();
        let addr = ns.addr.to_string();
        let mut client = NameServerClient::connect(format!("http://{addr}")).await.unwrap();
        let hb = |queues: u32| pb::BrokerHeartbeat {
            cluster: "c".into(),
            group: "g".into(),
            node_id: 1,
            role: "leader".into(),
            term: 1,
            client_addr: "127.0.0.1:8081".into(),
            raft_addr: "127.0.0.1:9091".into(),
            topics: vec![pb::TopicData {
                name: "T".into(),
                read_queues: queues,
                write_queues: queues,
                perm: 6,
                message_type: String::new(),
            }],
            ..Default::default()
        };
        client.heartbeat(hb(4)).await.unwrap();

        // A dead NameServer in the list is skipped.
        let cache = RouteCache::new(
            &["127.0.0.1:1".to_string(), addr.clone()],
            Duration::from_secs(3600),
            &Dialer::plain(),
        );
        let r = cache.route("T").await.unwrap();
        assert_eq!(r.groups[0].queues.as_ref().unwrap().write_queues, 4);
        assert_eq!(cache.route("Nope").await, Err(RouteError::NotFound("Nope".into())));

        // Cached until refreshed on demand.
        client.heartbeat(hb(8)).await.unwrap();
        assert_eq!(
            cache.route("T").await.unwrap().groups[0]
                .queues
                .as_ref()
                .unwrap()
                .write_queues,
            4
        );
        assert_eq!(
            cache.refresh("T").await.unwrap().groups[0]
                .queues
                .as_ref()
                .unwrap()
                .write_queues,
            8
        );

        let none = RouteCache::new(&["127.0.0.1:1".to_string()], REFRESH, &Dialer::plain());
        assert!(matches!(none.route("T").await, Err(RouteError::Unavailable(_))));
        ns.shutdown().await;
    }
}
