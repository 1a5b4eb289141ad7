//! `raftmq.v1.NameServer` over gRPC, the expiry scan, and `raftmq namesrv`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftmq_raft::tls::PeerInfo;
use tonic::{Request, Response, Status};

use super::config::NamesrvConfig;
use super::metrics::NamesrvMetrics;
use super::registry::{Registry, validate};
use crate::proto::pb;
use crate::proto::pb::name_server_server::{NameServer, NameServerServer};

#[derive(Clone)]
pub struct NamesrvService {
    registry: Arc<Mutex<Registry>>,
    metrics: Arc<NamesrvMetrics>,
    /// With TLS, a broker speaks only for itself: its certificate must
    /// name the group and node it heartbeats or unregisters.
    members_only: bool,
}

impl NamesrvService {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses a call about `group`'s node `node` from anyone but that
    /// node, when TLS is on.
    fn check_caller<T>(&self, r: &Request<T>, group: &str, node: u64) -> Result<(), Status> {
        if !self.members_only {
            return Ok(());
        }
        match PeerInfo::node_of(r).map_err(Status::unauthenticated)? {
            Some(id) if id.group == group && id.node == node => Ok(()),
            Some(id) => Err(Status::permission_denied(format!(
                "the caller's certificate names {id}, not group {group} node {node}"
            ))),
            None => Err(Status::unauthenticated(
                "brokers register with a certificate from the cluster's CA naming their group and node",
            )),
        }
    }
}

#[tonic::async_trait]
impl NameServer for NamesrvService {
    async fn heartbeat(&self, request: Request<pb::BrokerHeartbeat>) -> Result<Response<pb::HeartbeatReply>, Status> {
        let from = PeerInfo::ip(&request);
        self.check_caller(&request, &request.get_ref().group, request.get_ref().node_id)?;
        let hb = request.into_inner();
        validate(&hb).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.metrics.heartbeats.inc();
        let (cluster, group, node, role, term) = (
            hb.cluster.clone(),
            hb.group.clone(),
            hb.node_id,
            hb.role.clone(),
            hb.term,
        );
        let changed = self
            .registry()
            .heartbeat(hb, from, Instant::now())
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        if changed {
            tracing::info!(%cluster, %group, node, %role, term, "broker state changed");
        }
        Ok(Response::new(pb::HeartbeatReply {}))
    }

    async fn unregister(
        &self,
        request: Request<pb::UnregisterRequest>,
    ) -> Result<Response<pb::UnregisterReply>, Status> {
        let from = PeerInfo::ip(&request);
        self.check_caller(&request, &request.get_ref().group, request.get_ref().node_id)?;
        let r = request.into_inner();
        let removed = self
            .registry()
            .unregister(&r.cluster, &r.group, r.node_id, from)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        if removed {
            tracing::info!(cluster = %r.cluster, group = %r.group, node = r.node_id, "broker unregistered");
        }
        Ok(Response::new(pb::UnregisterReply {}))
    }

    async fn get_route(&self, request: Request<pb::RouteRequest>) -> Result<Response<pb::RouteResponse>, Status> {
        let topic = request.into_inner().topic;
        raftmq_store::queue_table::validate_topic(&topic).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.registry()
            .route(&topic)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no broker group serves topic {topic}")))
    }

    async fn get_cluster_info(&self, _: Request<pb::ClusterInfoRequest>) -> Result<Response<pb::ClusterInfo>, Status> {
        Ok(Response::new(self.registry().cluster_info(Instant::now())))
    }

    async fn list_topics(&self, _: Request<pb::ListTopicsRequest>) -> Result<Response<pb::TopicList>, Status> {
        Ok(Response::new(pb::TopicList {
            topics: self.registry().topic_names(),
        }))
    }
}

/// A NameServer serving in the background.
/// Connections the NameServer port holds at once (every broker node keeps
/// one, every client one per NameServer it asks).
pub const MAX_CONNECTIONS: usize = 4096;
/// Of which from one address (clients behind one NAT share one).
pub const MAX_CONNECTIONS_PER_IP: usize = 1024;

pub struct RunningNamesrv {
    pub addr: std::net::SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl RunningNamesrv {
    pub async fn start(cfg: NamesrvConfig) -> anyhow::Result<RunningNamesrv> {
        cfg.validate()?;
        let listener = tokio::net::TcpListener::bind(&cfg.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let tls = match &cfg.tls {
            Some(t) => Some(t.load().map_err(|e| anyhow::anyhow!("[tls]: {e}"))?),
            None => None,
        };
        let registry: Arc<Mutex<Registry>> = Arc::default();
        let service = NamesrvService {
            metrics: Arc::new(NamesrvMetrics::new(registry.clone())),
            registry,
            members_only: tls.is_some(),
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        if let Some(m) = &cfg.metrics_listen {
            let l = tokio::net::TcpListener::bind(m)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on metrics_listen {m}: {e}"))?;
            let metrics = service.metrics.clone();
            let probes = crate::metrics_http::Probes {
                metrics: Arc::new(move || metrics.encode()),
                // Its answers need nothing but its own table.
                ready: Arc::new(|| Ok("serving".into())),
            };
            crate::metrics_http::spawn(l, probes, tls.clone(), stop.subscribe());
        }

        // The expiry scan.
        let scan = service.clone();
        let mut scan_stopped = stop.subscribe();
        let (every, expiry) = (
            Duration::from_millis(cfg.scan_interval_ms),
            Duration::from_millis(cfg.expiry_ms),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = scan_stopped.wait_for(|s| *s) => return,
                    _ = tick.tick() => {}
                }
                for (cluster, group, node) in scan.registry().expire(Instant::now(), expiry) {
                    tracing::warn!(%cluster, %group, node, "broker silent too long; dropped");
                }
            }
        });

        let router = raftmq_raft::serve::builder(128, raftmq_raft::serve::Keepalive::default())
            .add_service(NameServerServer::new(service));
        // Clients and the CLI read routes without a certificate; brokers
        // show theirs (check_caller).
        let tls = tls.map(|material| raftmq_raft::serve::Tls {
            material,
            auth: raftmq_raft::tls::ClientAuth::Optional,
        });
        let server = raftmq_raft::serve::spawn(
            listener,
            router,
            stopped,
            "nameserver",
            raftmq_raft::serve::Capacity {
                total: MAX_CONNECTIONS,
                per_ip: MAX_CONNECTIONS_PER_IP,
                idle_timeout: raftmq_raft::serve::IDLE_TIMEOUT,
            },
            tls,
        );
        tracing::info!(%addr, "nameserver started");
        Ok(RunningNamesrv { addr, stop, server })
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

/// Runs a NameServer until Ctrl-C or SIGTERM.
pub async fn run(cfg: NamesrvConfig) -> anyhow::Result<()> {
    let running = RunningNamesrv::start(cfg).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    running.shutdown().await;
    Ok(())
}
