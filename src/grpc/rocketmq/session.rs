//! A client's session with a node: heartbeats, the Telemetry stream
//! (settings in, server commands such as transaction check-backs out), and
//! termination.

use std::sync::atomic::{AtomicU64, Ordering};

use raftmq_raft::acl::ResourceType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::{Request, Response, Status};

use super::service::*;
use crate::broker::Broker;
use crate::broker::auth::{AuthError, Caller};
use crate::broker::clients::{MAX_CLIENT_TOPICS, Owner, Subscription};
use crate::broker::pop;
use crate::error::BrokerError;
use crate::grpc::header;
use crate::grpc::rocketmq::access::Guarded;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::v2_message::{ok, status};

pub(super) async fn heartbeat(
    svc: &MessagingService,
    request: Request<v2::HeartbeatRequest>,
) -> Result<Response<v2::HeartbeatResponse>, Status> {
    let id = header(request.metadata(), CLIENT_ID).to_string();
    let language = header(request.metadata(), LANGUAGE).to_string();
    let version = header(request.metadata(), CLIENT_VERSION).to_string();
    let owner = crate::broker::auth::owner_of(&request);
    let req = request.into_inner();
    let group = req.group.map(|g| g.name);
    let client_type = v2::ClientType::try_from(req.client_type).unwrap_or(v2::ClientType::Unspecified);
    let seen = match group.as_deref().filter(|g| !g.is_empty()) {
        Some(g) => pop::validate_group(g),
        None => Ok(()),
    }
    .and_then(|()| {
        svc.broker
            .clients
            .seen(&id, &owner, client_type, group, &language, &version)
    });
    Ok(Response::new(v2::HeartbeatResponse {
        status: Some(seen.map_or_else(|e| e.v2_status(), |()| ok())),
    }))
}

pub(super) async fn telemetry(
    svc: &MessagingService,
    request: Request<Streaming<v2::TelemetryCommand>>,
) -> Result<Response<ReceiverStream<Result<v2::TelemetryCommand, Status>>>, Status> {
    let id = header(request.metadata(), CLIENT_ID).to_string();
    let header_language = header(request.metadata(), LANGUAGE).to_string();
    let header_version = header(request.metadata(), CLIENT_VERSION).to_string();
    let peer = raftmq_raft::tls::PeerInfo::ip(&request);
    // Refused before the stream opens: the client sees why at once.
    crate::broker::clients::validate_id(&id).map_err(|e| Status::invalid_argument(e.to_string()))?;
    // Who may hold a stream: any authenticated caller. The topics and
    // group its settings name are checked as each settings command comes.
    let call = crate::broker::auth::CallInfo::of(&request);
    let caller = svc
        .broker
        .checked(|| svc.broker.authenticate(&call))
        .await
        .map_err(Status::from)?;
    let owner = Owner {
        ip: peer,
        user: caller.user(),
    };
    let mut inbound = request.into_inner();
    let (tx, rx) = mpsc::channel(16);
    let broker = svc.broker.clone();
    static STREAMS: AtomicU64 = AtomicU64::new(0);
    let stream_id = STREAMS.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        loop {
            let cmd = match inbound.message().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(client = id, "telemetry stream ended: {e}");
                    break;
                }
            };
            let Some(v2::telemetry_command::Command::Settings(s)) = cmd.command else {
                // Answers to server commands (a check-back is answered
                // with EndTransaction instead).
                continue;
            };
            let client_type = s
                .client_type
                .and_then(|t| v2::ClientType::try_from(t).ok())
                .unwrap_or(v2::ClientType::Unspecified);
            let group = match &s.pub_sub {
                Some(v2::settings::PubSub::Subscription(sub)) => sub.group.as_ref().map(|g| g.name.clone()),
                _ => None,
            };
            let published: Option<Vec<String>> = match &s.pub_sub {
                Some(v2::settings::PubSub::Publishing(p)) => Some(p.topics.iter().map(|t| t.name.clone()).collect()),
                _ => None,
            };
            let subscribed: Option<Vec<Subscription>> = match &s.pub_sub {
                Some(v2::settings::PubSub::Subscription(sub)) => Some(
                    sub.subscriptions
                        .iter()
                        .take(MAX_CLIENT_TOPICS)
                        .map(|e| {
                            let sql = e
                                .expression
                                .as_ref()
                                .is_some_and(|x| x.r#type == v2::FilterType::Sql as i32);
                            Subscription {
                                topic: e.topic.as_ref().map(|t| t.name.clone()).unwrap_or_default(),
                                expression_type: if sql { "SQL" } else { "TAG" }.to_string(),
                                expression: e.expression.as_ref().map(|x| x.expression.clone()).unwrap_or_default(),
                            }
                        })
                        .collect(),
                ),
                _ => None,
            };
            let config = group.as_deref().map(|g| broker.popper.group_or_default(g));
            let reply = crate::grpc::rocketmq::settings::effective(&s, &broker.live(), config.as_ref());
            // The settings' user agent names the library better than the
            // header does (the Node.js client's header says HTTP).
            let (language, version) = match &s.user_agent {
                Some(ua) => (
                    v2::Language::try_from(ua.language)
                        .map(|l| l.as_str_name().to_string())
                        .unwrap_or_else(|_| header_language.clone()),
                    ua.version.clone(),
                ),
                None => (header_language.clone(), header_version.clone()),
            };
            let clients = &broker.clients;
            let known = async {
                let (published, subscribed) = permitted(&broker, &caller, &s, peer, published, subscribed).await?;
                clients.seen(&id, &owner, client_type, group, &language, &version)?;
                if let Some(topics) = published {
                    clients.publishes(&id, &owner, topics)?;
                }
                if let Some(subs) = subscribed {
                    clients.subscribes(&id, &owner, subs)?;
                }
                clients.attach(&id, &owner, stream_id, tx.clone())
            }
            .await;
            let cmd = match known {
                Ok(()) => v2::TelemetryCommand {
                    status: Some(ok()),
                    command: Some(v2::telemetry_command::Command::Settings(reply)),
                },
                Err(e) => {
                    // Said once, then the stream ends: it carries nothing for this caller.
                    let _ = tx
                        .send(Ok(v2::TelemetryCommand {
                            status: Some(e.v2_status()),
                            command: None,
                        }))
                        .await;
                    break;
                }
            };
            if tx.send(Ok(cmd)).await.is_err() {
                break;
            }
        }
        broker.clients.detach(&id, stream_id);
    });
    Ok(Response::new(ReceiverStream::new(rx)))
}

/// What of a client's settings its caller may have, under ACL: the
/// topics a producer may `Pub` to (it is sent the check-backs of their
/// transactions, bodies included) and the subscriptions a consumer may
/// `Sub`; the rest is left out, not refused, since clients name topics
/// they may not use (the Java producer names every topic it ever tried to
/// send to, allowed or not). A consumer whose group it may not `Sub` is
/// refused, as its receives would be.
async fn permitted(
    broker: &Broker,
    caller: &Caller,
    settings: &v2::Settings,
    peer: Option<std::net::IpAddr>,
    mut published: Option<Vec<String>>,
    mut subscribed: Option<Vec<Subscription>>,
) -> Result<(Option<Vec<String>>, Option<Vec<Subscription>>), BrokerError> {
    let all = settings.checks();
    match broker.checked(|| broker.authorize(caller, &all, peer)).await {
        Ok(()) => return Ok((published, subscribed)),
        Err(e @ AuthError::Behind(_)) => return Err(e.into()),
        // Some of it, then: the node is as current as its group now.
        Err(_) => {}
    }
    // The settings' own checks, one by one: the group's must pass, the
    // topics that fail are left out.
    let mut denied = std::collections::HashSet::new();
    for check in &all {
        if let Err(e) = broker.authorize(caller, std::slice::from_ref(check), peer) {
            match check.kind {
                ResourceType::Topic => drop(denied.insert(check.name.as_str())),
                _ => return Err(e.into()),
            }
        }
    }
    if let Some(topics) = &mut published {
        topics.retain(|t| !denied.contains(t.as_str()));
    }
    if let Some(subs) = &mut subscribed {
        subs.retain(|s| !denied.contains(s.topic.as_str()));
    }
    Ok((published, subscribed))
}

pub(super) async fn notify_client_termination(
    svc: &MessagingService,
    request: Request<v2::NotifyClientTerminationRequest>,
) -> Result<Response<v2::NotifyClientTerminationResponse>, Status> {
    let id = header(request.metadata(), CLIENT_ID).to_string();
    let gone = svc.broker.clients.remove(&id, &crate::broker::auth::owner_of(&request));
    Ok(Response::new(v2::NotifyClientTerminationResponse {
        status: Some(gone.map_or_else(|e| e.v2_status(), |()| ok())),
    }))
}

pub(super) async fn sync_lite_subscription(
    _svc: &MessagingService,
    _request: Request<v2::SyncLiteSubscriptionRequest>,
) -> Result<Response<v2::SyncLiteSubscriptionResponse>, Status> {
    Ok(Response::new(v2::SyncLiteSubscriptionResponse {
        status: Some(status(Code::Unsupported, "lite topics are not supported")),
    }))
}
