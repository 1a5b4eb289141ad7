//! `raftmq broker`: runs one broker node until Ctrl-C or SIGTERM, then
//! stops cleanly (the store is flushed and its abort marker removed).

use std::sync::Arc;

use anyhow::Context;
use raftmq_raft::RaftNode;

use crate::broker::Broker;
use crate::broker::config::BrokerConfig;
use crate::grpc::h2_authority::LenientAuthority;
use crate::grpc::raftmq::BrokerService;
use crate::grpc::rocketmq::MessagingService;

/// A started node with its client services.
pub struct RunningBroker {
    pub broker: Arc<Broker>,
    pub client_addr: std::net::SocketAddr,
    /// Where `/metrics` is served, if it is.
    pub metrics_addr: Option<std::net::SocketAddr>,
    leader_watch: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    registration: tokio::task::JoinHandle<()>,
}

impl RunningBroker {
    /// Starts the Raft node and serves the client services.
    pub async fn start(mut cfg: BrokerConfig) -> anyhow::Result<RunningBroker> {
        let listener = tokio::net::TcpListener::bind(&cfg.client_listen)
            .await
            .with_context(|| format!("cannot listen on client_listen {}", cfg.client_listen))?;
        let client_addr = listener.local_addr()?;
        if let Some(path) = &cfg.clock_offset_file {
            tracing::warn!(file = %path.display(), "following a clock offset file (fault injection)");
            crate::clock::follow_offset_file(path.clone());
        }
        if cfg.unsafe_ack_before_commit {
            tracing::warn!("unsafe_ack_before_commit is set: this node loses acknowledged messages on faults");
        }
        let tls = match &cfg.tls {
            Some(t) => Some(t.load().map_err(anyhow::Error::msg).context("[tls]")?),
            None => None,
        };
        if cfg.identity.is_some() && cfg.bootstrap {
            // Ordinal 0 of a StatefulSet bootstraps only a group that never
            // was: with a lost disk it waits for the leader instead.
            let me = cfg.client_addr();
            let others: Vec<String> = cfg
                .peers
                .values()
                .map(|p| p.client_addr.clone())
                .filter(|a| *a != me)
                .collect();
            let dialer = raftmq_raft::tls::Dialer::new(tls.clone());
            if crate::broker::identity::group_exists(&others, &dialer).await {
                cfg.bootstrap = false;
            }
        }
        let mut node_cfg = cfg.node_config();
        node_cfg.tls = tls.clone();
        let node = RaftNode::start(node_cfg).await?;
        let broker = Arc::new(Broker::new(node, cfg, tls.clone()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        // Clients multiplex long polls (one per assigned queue) on one
        // connection: room for many, not for unbounded.
        let limits = &broker.cfg.limits;
        let router = raftmq_raft::serve::builder(limits.max_streams_per_connection, limits.keepalive())
            .add_service(crate::grpc::send_gate::SendGate::new(
                crate::grpc::admin_access::AdminGate::new(BrokerService::new(broker.clone()), broker.clone()),
                broker.clone(),
            ))
            .add_service(crate::grpc::send_gate::SendGate::new(
                MessagingService::new(broker.clone()),
                broker.clone(),
            ));
        // Official clients may send a multi-address :authority (see h2_authority).
        let server = raftmq_raft::serve::spawn_wrapped(
            listener,
            router,
            stopped,
            "client",
            raftmq_raft::serve::Capacity {
                total: limits.max_connections,
                per_ip: limits.max_connections_per_ip,
                idle_timeout: std::time::Duration::from_millis(limits.idle_connection_timeout_ms),
            },
            tls.clone().map(|material| raftmq_raft::serve::Tls {
                material,
                auth: raftmq_raft::tls::ClientAuth::Optional,
            }),
            LenientAuthority::new,
        );
        let registration = tokio::spawn(crate::broker::registration::run(broker.clone(), stop.subscribe()));
        // Leader duties; the tasks end with `stop`.
        crate::broker::held::timers::spawn(broker.clone(), stop.subscribe());
        crate::broker::held::transactions::spawn(broker.clone(), stop.subscribe());
        crate::broker::acl_admin::spawn_init_user(broker.clone(), stop.subscribe());
        let metrics_addr = match &broker.cfg.metrics_listen {
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on metrics_listen {addr}"))?;
                let local = l.local_addr()?;
                let (m, b) = (broker.metrics.clone(), broker.clone());
                let probes = crate::metrics_http::Probes {
                    metrics: Arc::new(move || m.encode()),
                    ready: Arc::new(move || crate::broker::health::readiness(&b.node)),
                };
                crate::metrics_http::spawn(l, probes, tls.clone(), stop.subscribe());
                Some(local)
            }
            None => None,
        };
        let leader_watch = broker.metrics.watch_leader(&broker.node);
        tracing::info!(node = broker.node.id, client = %client_addr, raft = %broker.node.raft_addr(), "broker started");
        Ok(RunningBroker {
            broker,
            client_addr,
            metrics_addr,
            leader_watch,
            stop,
            server,
            registration,
        })
    }

    /// Unregisters from the NameServers, stops serving, then stops Raft and
    /// closes the store.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // A leader's planned stop: another node takes over first, while
        // this one still serves (and forwards to it).
        self.broker.node.hand_over(raftmq_raft::node::HAND_OVER_WAIT).await;
        let _ = self.stop.send(true);
        let _ = self.registration.await;
        // Ends within serve::DRAIN_WAIT, open Telemetry streams or not.
        let _ = self.server.await;
        self.leader_watch.abort();
        self.broker.node.shutdown().await?;
        Ok(())
    }
}

/// Runs a broker from its config file until a signal arrives.
pub async fn run(config: &std::path::Path) -> anyhow::Result<()> {
    let cfg = BrokerConfig::load(config)?;
    let running = RunningBroker::start(cfg).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
    running.shutdown().await
}
