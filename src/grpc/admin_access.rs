//! `raftmq.v1.Broker` under ACL (`[acl]`): the operators' API, so every
//! call needs an action on the cluster (`Cluster:<cluster>`), or a Super
//! user, or a member node's certificate; managing users and policies
//! needs a Super user or a member. Checked in front of the service, by
//! the called method, so that no method can be missed: one not listed
//! here needs a Super user.
//!
//! | methods | action on `Cluster:<cluster>` |
//! |---------|-------------------------------|
//! | `Ping` | none (any authenticated caller) |
//! | `Status`, `GetTopic`, `GetConsumerGroup`, `TopicStatus`, `GroupProgress`, `GetBrokerConfig`, `Read`, `QueryMessages`, `ReadHeld` | `Get` |
//! | `ListConsumerGroups`, `ListClients` | `List` |
//! | `PutTopic`, `PutConsumerGroup` | `Create` or `Update` |
//! | `DeleteTopic`, `DeleteConsumerGroup` | `Delete` |
//! | `Send`, `ResetOffset`, `AddNode`, `RemoveNode`, `TransferLeader`, `SetWritable`, `UpdateBrokerConfig`, `CheckTransaction` | `Update` |
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
use crate::broker::auth::{AuthError, CallInfo};

/// What a method needs.
enum Need {
    Authenticated,
    Cluster(&'static [Action]),
    Admin,
}

fn need(method: &str) -> Need {
    use Action::*;
    match method {
        "Ping" => Need::Authenticated,
        "Status" | "GetTopic" | "GetConsumerGroup" | "TopicStatus" | "GroupProgress" | "GetBrokerConfig" | "Read"
        | "QueryMessages" | "ReadHeld" => Need::Cluster(&[Get]),
        "ListConsumerGroups" | "ListClients" => Need::Cluster(&[List]),
        "PutTopic" | "PutConsumerGroup" => Need::Cluster(&[Create, Update]),
        "DeleteTopic" | "DeleteConsumerGroup" => Need::Cluster(&[Delete]),
        "Send" | "ResetOffset" | "AddNode" | "RemoveNode" | "TransferLeader" | "SetWritable" | "UpdateBrokerConfig"
        | "CheckTransaction" => Need::Cluster(&[Update]),
        _ => Need::Admin,
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

    fn check(&self, req: &http::Request<Body>) -> Result<(), AuthError> {
        let method = req.uri().path().rsplit('/').next().unwrap_or("");
        let metadata = MetadataMap::from_headers(req.headers().clone());
        let call = CallInfo {
            metadata: &metadata,
            peer: req.extensions().get::<PeerInfo>(),
        };
        match need(method) {
            Need::Authenticated => self.broker.authenticate(&call).map(drop),
            Need::Admin => self.broker.require_admin(&call),
            Need::Cluster(actions) => {
                let check = Check {
                    kind: ResourceType::Cluster,
                    name: self.broker.cfg.cluster.clone(),
                    actions,
                };
                self.broker.access(&call, &[check]).map(drop)
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

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if self.broker.acl_enabled()
            && let Err(e) = self.check(&req)
        {
            let refusal = tonic::Status::from(e).into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        Box::pin(self.inner.call(req))
    }
}
