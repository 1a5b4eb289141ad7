//! `raftmq.v1.Broker` under ACL (`[acl]`): the operators' API. A call on
//! one topic or group needs the matching action on that `Topic:<name>` or
//! `Group:<name>`, as RocketMQ 5's ACL 2.0 asks of its admin requests; a
//! call on the node or the whole group needs it on `Cluster:<cluster>`.
//! Super users and member nodes (by certificate) pass; managing users and
//! policies needs one of them.
//!
//! Checked in two places. The gate in front of the service goes by the
//! called method, so that no method can be missed (one not listed here
//! needs a Super user); it authenticates every call and, for the cluster
//! rows, authorizes it too. The topic and group rows need the decoded
//! request, so their handlers call `BrokerService::allow` with the
//! request's [`Named::checks`], against the caller the gate left in the
//! request's extensions (authenticated once).
//!
//! | methods | needs |
//! |---------|-------|
//! | `Ping` | any authenticated caller |
//! | `Send` | `Pub` on the topic |
//! | `Read`, `QueryMessages`, `GetTopic`, `TopicStatus` | `Get` on the topic |
//! | `PutTopic` | `Create` or `Update` on the topic |
//! | `DeleteTopic` | `Delete` on the topic |
//! | `GetConsumerGroup`, `GroupProgress` of one group | `Get` on the group |
//! | `PutConsumerGroup` | `Create` or `Update` on the group |
//! | `DeleteConsumerGroup` | `Delete` on the group |
//! | `ResetOffset` | `Update` on the group, and `Get` on the topic when one is named |
//! | `Status`, `GetBrokerConfig`, `ReadHeld` | `Get` on the cluster |
//! | `ListConsumerGroups`, `ListClients`, `GroupProgress` of every group | `List` on the cluster |
//! | `AddNode`, `RemoveNode`, `TransferLeader`, `SetWritable`, `UpdateBrokerConfig`, `CheckTransaction` | `Update` on the cluster |
//! | `ChangeAcl`, `ReadAcl` | Super users and members only |

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use raftmq_raft::acl::{Action, Check, ResourceType};
use raftmq_raft::tls::PeerInfo;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;

use crate::broker::Broker;
use crate::broker::auth::{AuthError, CallInfo, Caller};
use crate::proto::pb;

/// What a method needs of its caller, as far as the gate can tell.
#[derive(Debug, PartialEq)]
enum Need {
    /// Authentication here; the handler checks the topic or group the
    /// request names ([`Named`]).
    Authenticated,
    Cluster(&'static [Action]),
    Admin,
}

fn need(method: &str) -> Need {
    use Action::*;
    match method {
        "Ping"
        | "Send"
        | "Read"
        | "QueryMessages"
        | "GetTopic"
        | "TopicStatus"
        | "PutTopic"
        | "DeleteTopic"
        | "GetConsumerGroup"
        | "GroupProgress"
        | "PutConsumerGroup"
        | "DeleteConsumerGroup"
        | "ResetOffset" => Need::Authenticated,
        "Status" | "GetBrokerConfig" | "ReadHeld" => Need::Cluster(&[Get]),
        "ListConsumerGroups" | "ListClients" => Need::Cluster(&[List]),
        "AddNode" | "RemoveNode" | "TransferLeader" | "SetWritable" | "SetDedup" | "UpdateBrokerConfig"
        | "CheckTransaction" => Need::Cluster(&[Update]),
        _ => Need::Admin,
    }
}

/// A request that names the topic or group it acts on, and what it needs
/// there (the table above).
pub trait Named {
    fn checks(&self, cluster: &str) -> Vec<Check>;
}

fn on(kind: ResourceType, name: &str, actions: &'static [Action]) -> Check {
    Check {
        kind,
        name: name.to_string(),
        actions,
    }
}

pub const GET: &[Action] = &[Action::Get];
const CREATE_OR_UPDATE: &[Action] = &[Action::Create, Action::Update];
pub const DELETE: &[Action] = &[Action::Delete];

impl Named for pb::SendRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.topic, &[Action::Pub])]
    }
}

impl Named for pb::ReadRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.topic, GET)]
    }
}

impl Named for pb::QueryMessagesRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.topic, GET)]
    }
}

/// `GetTopic` and `TopicStatus`.
impl Named for pb::GetTopicRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.name, GET)]
    }
}

impl Named for pb::PutTopicRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.name, CREATE_OR_UPDATE)]
    }
}

impl Named for pb::DeleteTopicRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Topic, &self.name, DELETE)]
    }
}

/// `GetConsumerGroup` (`Get`) and `DeleteConsumerGroup` (`Delete`) share
/// a request type, so the handler says which ([`GET`] or [`DELETE`]).
pub fn group_checks(req: &pb::GetConsumerGroupRequest, actions: &'static [Action]) -> Vec<Check> {
    vec![on(ResourceType::Group, &req.name, actions)]
}

impl Named for pb::GroupProgressRequest {
    fn checks(&self, cluster: &str) -> Vec<Check> {
        if self.group.is_empty() {
            vec![on(ResourceType::Cluster, cluster, &[Action::List])]
        } else {
            vec![on(ResourceType::Group, &self.group, GET)]
        }
    }
}

impl Named for pb::PutConsumerGroupRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        vec![on(ResourceType::Group, &self.name, CREATE_OR_UPDATE)]
    }
}

impl Named for pb::ResetOffsetRequest {
    fn checks(&self, _: &str) -> Vec<Check> {
        let mut out = vec![on(ResourceType::Group, &self.group, &[Action::Update])];
        if !self.topic.is_empty() {
            out.push(on(ResourceType::Topic, &self.topic, GET));
        }
        out
    }
}

/// The service `S` (`raftmq.v1.Broker`) behind the check.
#[derive(Clone)]
pub struct AdminGate<S> {
    inner: S,
    broker: Arc<Broker>,
}

impl<S> AdminGate<S> {
    pub fn new(inner: S, broker: Arc<Broker>) -> AdminGate<S> {
        AdminGate { inner, broker }
    }
}

/// What the gate checks of a call, taken from it before the check awaits
/// (a node that has not caught up waits for it, see [`Broker::checked`]).
struct Gated {
    need: Need,
    metadata: MetadataMap,
    peer: Option<PeerInfo>,
}

impl Gated {
    fn of(req: &http::Request<Body>) -> Gated {
        Gated {
            need: need(req.uri().path().rsplit('/').next().unwrap_or("")),
            metadata: MetadataMap::from_headers(req.headers().clone()),
            peer: req.extensions().get::<PeerInfo>().cloned(),
        }
    }

    /// The caller, when the method is let through; its handler then
    /// authorizes what the request names against it (no second
    /// authentication).
    async fn check(&self, broker: &Broker) -> Result<Option<Caller>, AuthError> {
        let call = CallInfo {
            metadata: &self.metadata,
            peer: self.peer.as_ref(),
        };
        match &self.need {
            Need::Authenticated => broker.checked(|| broker.authenticate(&call)).await.map(Some),
            Need::Admin => broker.checked(|| broker.require_admin(&call)).await.map(|()| None),
            Need::Cluster(actions) => {
                let check = [Check {
                    kind: ResourceType::Cluster,
                    name: broker.cfg.cluster.clone(),
                    actions,
                }];
                broker.checked(|| broker.access(&call, &check)).await.map(Some)
            }
        }
    }
}

impl<S: NamedService> NamedService for AdminGate<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for AdminGate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if !self.broker.acl_enabled() {
            return Box::pin(self.inner.call(req));
        }
        // The clone that was made ready goes with this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let broker = self.broker.clone();
        let gated = Gated::of(&req);
        Box::pin(async move {
            match gated.check(&broker).await {
                Ok(caller) => {
                    if let Some(c) = caller {
                        req.extensions_mut().insert(c);
                    }
                    inner.call(req).await
                }
                Err(e) => Ok(tonic::Status::from(e).into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(checks: Vec<Check>) -> Vec<String> {
        checks.into_iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn topic_and_group_calls_are_checked_on_what_they_name() {
        let put = pb::PutTopicRequest {
            name: "orders".into(),
            ..Default::default()
        };
        assert_eq!(names(put.checks("c")), ["Create or Update on Topic:orders"]);
        let reset = pb::ResetOffsetRequest {
            group: "g".into(),
            topic: "t".into(),
            ..Default::default()
        };
        assert_eq!(names(reset.checks("c")), ["Update on Group:g", "Get on Topic:t"]);
        let every = pb::GroupProgressRequest { group: String::new() };
        assert_eq!(names(every.checks("c")), ["List on Cluster:c"]);
        // The gate leaves these to their handlers, and keeps the cluster's.
        assert_eq!(need("PutTopic"), Need::Authenticated);
        assert_eq!(need("AddNode"), Need::Cluster(&[Action::Update]));
        assert_eq!(need("SomethingNew"), Need::Admin);
    }
}
