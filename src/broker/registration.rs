//! The broker side of the NameServer protocol: every node heartbeats to
//! every configured NameServer on a timer, and at once when its role, term
//! or topic configs change; it unregisters when it stops cleanly.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::Channel;

use crate::broker::Broker;
use crate::proto::pb;
use crate::proto::pb::name_server_client::NameServerClient;

/// How often the node looks for a change worth an immediate heartbeat.
const CHANGE_POLL: Duration = Duration::from_millis(50);
/// Per-call deadline towards a NameServer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

fn clients(addrs: &[String], dialer: &raftmq_raft::tls::Dialer) -> Vec<(String, NameServerClient<Channel>)> {
    addrs
        .iter()
        .filter_map(|a| {
            let ep = crate::client::channel::endpoint(a, CALL_TIMEOUT).ok()?;
            Some((
                a.clone(),
                NameServerClient::new(crate::client::channel::lazy(ep, a, dialer)),
            ))
        })
        .collect()
}

/// This node's heartbeat, from its Raft metrics and replicated metadata.
pub fn heartbeat(broker: &Broker) -> Option<pb::BrokerHeartbeat> {
    let s = broker.status(false).ok()?;
    let mask = broker.route_perm_mask();
    let topics = broker
        .node
        .sm
        .topics()
        .into_iter()
        // Clients may not use the held-message topics: no routes to them.
        .filter(|t| !raftmq_raft::held::is_system_topic(&t.name))
        .map(|t| pb::TopicData {
            perm: t.perm & mask,
            name: t.name,
            read_queues: t.read_queues,
            write_queues: t.write_queues,
            message_type: t.message_type.as_str().to_string(),
        })
        .collect();
    Some(pb::BrokerHeartbeat {
        cluster: broker.cfg.cluster.clone(),
        group: broker.cfg.group.clone(),
        node_id: s.node_id,
        role: s.role.to_string(),
        term: s.term,
        client_addr: broker.cfg.client_addr(),
        raft_addr: broker.cfg.raft_addr(),
        commit_index: s.commit_index,
        applied_index: s.applied_index,
        pid: std::process::id(),
        topics,
    })
}

/// Runs until `stop` turns true, then unregisters.
pub async fn run(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let targets = clients(&broker.cfg.namesrv_addrs, &broker.dialer);
    if targets.is_empty() {
        return;
    }
    let every = Duration::from_millis(broker.cfg.namesrv_heartbeat_interval_ms);
    let mut last_sent = tokio::time::Instant::now() - every;
    let mut last_shape = None;
    let mut poll = tokio::time::interval(CHANGE_POLL.min(every));
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = poll.tick() => {}
        }
        let Some(hb) = heartbeat(&broker) else { continue };
        let shape = (hb.role.clone(), hb.term, hb.topics.clone());
        if last_shape.as_ref() == Some(&shape) && last_sent.elapsed() < every {
            continue;
        }
        let sends = targets.iter().map(|(addr, client)| {
            let (mut client, hb) = (client.clone(), hb.clone());
            async move {
                match tokio::time::timeout(CALL_TIMEOUT, client.heartbeat(hb)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(namesrv = %addr, error = %e.message(), "heartbeat refused"),
                    Err(_) => tracing::debug!(namesrv = %addr, "heartbeat timed out"),
                }
            }
        });
        futures::future::join_all(sends).await;
        last_sent = tokio::time::Instant::now();
        last_shape = Some(shape);
    }
    let req = pb::UnregisterRequest {
        cluster: broker.cfg.cluster.clone(),
        group: broker.cfg.group.clone(),
        node_id: broker.node.id,
    };
    let leaves = targets.iter().map(|(_, client)| {
        let (mut client, req) = (client.clone(), req.clone());
        async move {
            let _ = tokio::time::timeout(CALL_TIMEOUT, client.unregister(req)).await;
        }
    });
    futures::future::join_all(leaves).await;
}
