//! A small client of the RocketMQ 5 protocol (`apache.rocketmq.v2`), for
//! Rust programs and for raftmq's own CLI (`raftmq produce`, `consume`,
//! `bench`), with how raftmq opens channels ([`channel`]), signs calls
//! ([`credentials`], ACL 2.0) and caches routes from the NameServers
//! ([`route_cache`]). It speaks the same protocol the official clients do, so it
//! works against any raftmq node (followers forward to the leader).
//!
//! ```no_run
//! # async fn demo() -> Result<(), raftmq::client::ClientError> {
//! use raftmq::client::{Client, Outgoing};
//! let client = Client::connect("127.0.0.1:8081;127.0.0.1:8082")?;
//! let receipt = client.send(Outgoing::new("TestTopic", "hello").tag("TagA")).await?;
//! let got = client
//!     .receive("MyGroup", "TestTopic", "*", 16, std::time::Duration::from_secs(30), std::time::Duration::from_secs(5))
//!     .await?;
//! client.ack("MyGroup", "TestTopic", &got).await?;
//! # let _ = receipt; Ok(()) }
//! ```
//!
//! Access points are `host:port` separated by `;` (or `,`). A call that
//! cannot connect moves on to the next access point; anything else is the
//! caller's to retry (a send whose outcome is unknown may have been stored).

pub mod channel;
pub mod credentials;
pub mod route_cache;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use raftmq_raft::tls::Dialer;
use tonic::transport::Channel;

use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;
use crate::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;

/// Why a call failed.
/// What the client expects at an access point, as errors name it.
const BROKER: &str = "a raftmq broker's client port (apache.rocketmq.v2)";

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The call did not complete (no node reachable, deadline, connection
    /// lost). Whether a send happened is unknown.
    #[error("transport: {0}")]
    Transport(String),
    /// The broker answered with a refusal.
    #[error("{code:?} ({}): {message}", *code as i32)]
    Refused { code: Code, message: String },
    /// Bad arguments (no access point, bad address).
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    /// Worth trying again (after a moment): the cluster is between leaders
    /// or a node is unreachable.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Refused { code, .. } => matches!(
                code,
                Code::HaNotAvailable | Code::ProxyTimeout | Code::InternalServerError | Code::TooManyRequests
            ),
            ClientError::Invalid(_) => false,
        }
    }

    fn from_status(s: Option<v2::Status>) -> Result<(), ClientError> {
        let s = s.unwrap_or_default();
        match Code::try_from(s.code).unwrap_or(Code::Unspecified) {
            Code::Ok | Code::MultipleResults | Code::MessageNotFound => Ok(()),
            code => Err(ClientError::Refused {
                code,
                message: s.message,
            }),
        }
    }
}

/// A message to send.
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    pub topic: String,
    pub body: Bytes,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    /// FIFO messages: the message group.
    pub message_group: Option<String>,
    pub properties: Vec<(String, String)>,
    /// Timed messages: when to deliver (ms since the epoch).
    pub delivery_timestamp_ms: Option<u64>,
    /// A transaction's half message: visible once committed.
    pub transactional: bool,
}

impl Outgoing {
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Outgoing {
        Outgoing {
            topic: topic.into(),
            body: body.into(),
            ..Default::default()
        }
    }

    pub fn tag(mut self, tag: impl Into<String>) -> Outgoing {
        self.tag = Some(tag.into());
        self
    }

    pub fn key(mut self, key: impl Into<String>) -> Outgoing {
        self.keys.push(key.into());
        self
    }

    pub fn message_group(mut self, group: impl Into<String>) -> Outgoing {
        self.message_group = Some(group.into());
        self
    }

    pub fn property(mut self, k: impl Into<String>, v: impl Into<String>) -> Outgoing {
        self.properties.push((k.into(), v.into()));
        self
    }

    /// Delivered at this time (ms since the epoch), not before.
    pub fn deliver_at(mut self, ms: u64) -> Outgoing {
        self.delivery_timestamp_ms = Some(ms);
        self
    }

    /// Sent as a transaction's half message ([`Client::end_transaction`]).
    pub fn transactional(mut self) -> Outgoing {
        self.transactional = true;
        self
    }

    fn to_v2(&self) -> v2::Message {
        let kind = if self.transactional {
            v2::MessageType::Transaction
        } else if self.message_group.is_some() {
            v2::MessageType::Fifo
        } else if self.delivery_timestamp_ms.is_some() {
            v2::MessageType::Delay
        } else {
            v2::MessageType::Normal
        };
        v2::Message {
            topic: Some(v2::Resource {
                resource_namespace: String::new(),
                name: self.topic.clone(),
            }),
            user_properties: self.properties.iter().cloned().collect(),
            system_properties: Some(v2::SystemProperties {
                tag: self.tag.clone(),
                keys: self.keys.clone(),
                message_id: new_message_id(),
                message_type: kind as i32,
                born_timestamp: Some(crate::proto::v2_message::timestamp(crate::clock::now_ms())),
                body_encoding: v2::Encoding::Identity as i32,
                message_group: self.message_group.clone(),
                delivery_timestamp: self.delivery_timestamp_ms.map(crate::proto::v2_message::timestamp),
                ..Default::default()
            }),
            body: self.body.clone(),
        }
    }
}

/// A client-made message id: "01" and 32 random hex digits (the length of
/// RocketMQ's).
pub fn new_message_id() -> String {
    format!("01{:032X}", rand::random::<u128>())
}

/// What a send returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    pub message_id: String,
    /// Queue offset (0 for timed and half messages: not in a queue yet).
    pub offset: i64,
    /// Half messages: what [`Client::end_transaction`] names.
    pub transaction_id: String,
    /// Timed messages: what [`Client::recall`] names.
    pub recall_handle: String,
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub message_id: String,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    pub message_group: Option<String>,
    pub properties: Vec<(String, String)>,
    pub body: Bytes,
    pub queue_id: i32,
    pub offset: i64,
    pub delivery_attempt: i32,
    pub born_timestamp_ms: u64,
    pub store_timestamp_ms: u64,
    pub receipt_handle: String,
}

impl Received {
    fn from_v2(m: v2::Message) -> Received {
        let sp = m.system_properties.unwrap_or_default();
        let mut properties: Vec<(String, String)> = m.user_properties.into_iter().collect();
        properties.sort();
        Received {
            topic: m.topic.map(|t| t.name).unwrap_or_default(),
            message_id: sp.message_id,
            tag: sp.tag,
            keys: sp.keys,
            message_group: sp.message_group,
            properties,
            body: m.body,
            queue_id: sp.queue_id,
            offset: sp.queue_offset.unwrap_or(-1),
            delivery_attempt: sp.delivery_attempt.unwrap_or(0),
            born_timestamp_ms: sp
                .born_timestamp
                .as_ref()
                .map_or(0, crate::proto::v2_message::millis_of),
            store_timestamp_ms: sp
                .store_timestamp
                .as_ref()
                .map_or(0, crate::proto::v2_message::millis_of),
            receipt_handle: sp.receipt_handle.unwrap_or_default(),
        }
    }
}

/// A connection to a raftmq cluster (any of its nodes).
#[derive(Clone)]
pub struct Client {
    nodes: std::sync::Arc<Vec<(String, Channel)>>,
    current: std::sync::Arc<AtomicUsize>,
    client_id: String,
    timeout: Duration,
    /// Signs every call (ACL 2.0) when set.
    credentials: Option<credentials::Credentials>,
}

impl Client {
    /// A client over `access_points` (`host:port`, separated by `;` or `,`).
    /// Connections are made on first use.
    pub fn connect(access_points: &str) -> Result<Client, ClientError> {
        Client::connect_with(access_points, &Dialer::plain())
    }

    /// [`Client::connect`] through `dialer`: TLS with
    /// `Dialer::tls(Arc::new(Material::load(Files::client(ca_cert))?))`.
    pub fn connect_with(access_points: &str, dialer: &Dialer) -> Result<Client, ClientError> {
        let mut nodes = Vec::new();
        for a in access_points.split([';', ',']).map(str::trim).filter(|a| !a.is_empty()) {
            let ep = crate::client::channel::endpoint(a, Duration::from_secs(2)).map_err(ClientError::Invalid)?;
            nodes.push((a.to_string(), crate::client::channel::lazy(ep, a, dialer)));
        }
        if nodes.is_empty() {
            return Err(ClientError::Invalid(
                "no access point given (host:port[;host:port...])".into(),
            ));
        }
        Ok(Client {
            current: std::sync::Arc::new(AtomicUsize::new(rand::random_range(0..nodes.len()))),
            nodes: std::sync::Arc::new(nodes),
            client_id: format!("raftmq-client@{}@{:08x}", std::process::id(), rand::random::<u32>()),
            timeout: Duration::from_secs(10),
            credentials: None,
        })
    }

    /// Signs every call with `c`, for a cluster with `[acl]` on.
    pub fn with_credentials(mut self, c: Option<credentials::Credentials>) -> Client {
        self.credentials = c;
        self
    }

    /// The timeout of unary calls (default 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    fn request<T>(&self, msg: T, timeout: Duration) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(timeout);
        let m = r.metadata_mut();
        if let Ok(v) = self.client_id.parse() {
            m.insert("x-mq-client-id", v);
        }
        m.insert("x-mq-language", tonic::metadata::MetadataValue::from_static("RUST"));
        m.insert("x-mq-protocol", tonic::metadata::MetadataValue::from_static("v2"));
        if let Some(c) = &self.credentials {
            c.sign_into(m);
        }
        r
    }

    /// Runs `call` on the current node; on a connect failure, on each other
    /// node in turn.
    async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(MessagingServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.nodes.len();
        let mut last = None;
        for _ in 0..n {
            let i = self.current.load(Ordering::Relaxed) % n;
            let stub = MessagingServiceClient::new(self.nodes[i].1.clone())
                .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
                .max_encoding_message_size(crate::MAX_MESSAGE_SIZE);
            match call(stub).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if channel::not_delivered(&s) => {
                    last = Some(channel::explain(&self.nodes[i].0, &s, BROKER));
                    let _ = self
                        .current
                        .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
                }
                Err(s) => return Err(ClientError::Transport(channel::explain(&self.nodes[i].0, &s, BROKER))),
            }
        }
        Err(ClientError::Transport(format!(
            "no node could be reached ({})",
            last.unwrap_or_default()
        )))
    }

    /// A no-op round trip to the current node (`raftmq.v1.Broker/Ping`,
    /// which echoes `payload`): what a call costs with nothing behind it.
    pub async fn ping(&self, payload: Bytes) -> Result<(), ClientError> {
        let i = self.current.load(Ordering::Relaxed) % self.nodes.len();
        let (addr, channel) = &self.nodes[i];
        let mut stub = crate::proto::pb::broker_client::BrokerClient::new(channel.clone())
            .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::MAX_MESSAGE_SIZE);
        stub.ping(self.request(crate::proto::pb::PingRequest { payload }, self.timeout))
            .await
            .map(|_| ())
            .map_err(|s| ClientError::Transport(channel::explain(addr, &s, BROKER)))
    }

    /// The topic's queues.
    pub async fn route(&self, topic: &str) -> Result<Vec<v2::MessageQueue>, ClientError> {
        let req = v2::QueryRouteRequest {
            topic: Some(resource(topic)),
            endpoints: None,
        };
        let r = self
            .call(|mut c| {
                let req = self.request(req.clone(), self.timeout);
                async move { c.query_route(req).await }
            })
            .await?;
        ClientError::from_status(r.status)?;
        self.prefer_first_of(&r.message_queues);
        Ok(r.message_queues)
    }

    /// Routes list a group's leader first: when this client knows that
    /// node, it talks to it from now on, so its writes are not forwarded.
    fn prefer_first_of(&self, queues: &[v2::MessageQueue]) {
        let first = queues
            .iter()
            .filter_map(|q| q.broker.as_ref()?.endpoints.as_ref()?.addresses.first())
            .next();
        if let Some(a) = first {
            let addr = format!("{}:{}", a.host, a.port);
            if let Some(i) = self.nodes.iter().position(|(n, _)| *n == addr) {
                self.current.store(i, Ordering::Relaxed);
            }
        }
    }

    pub async fn send(&self, m: Outgoing) -> Result<SendReceipt, ClientError> {
        let mut r = self.send_batch(vec![m]).await?;
        r.pop()
            .ok_or_else(|| ClientError::Transport("the broker returned no result".into()))
    }

    /// Sends messages in one request (a batch: one queue, one Raft entry).
    pub async fn send_batch(&self, messages: Vec<Outgoing>) -> Result<Vec<SendReceipt>, ClientError> {
        let req = v2::SendMessageRequest {
            messages: messages.iter().map(Outgoing::to_v2).collect(),
        };
        let r = self
            .call(|mut c| {
                let req = self.request(req.clone(), self.timeout);
                async move { c.send_message(req).await }
            })
            .await?;
        ClientError::from_status(r.status)?;
        Ok(r.entries
            .into_iter()
            .map(|e| SendReceipt {
                message_id: e.message_id,
                offset: e.offset,
                transaction_id: e.transaction_id,
                recall_handle: e.recall_handle,
            })
            .collect())
    }

    /// Commits (or rolls back) a transaction's half message.
    pub async fn end_transaction(&self, topic: &str, sent: &SendReceipt, commit: bool) -> Result<(), ClientError> {
        let resolution = if commit {
            v2::TransactionResolution::Commit
        } else {
            v2::TransactionResolution::Rollback
        };
        let req = v2::EndTransactionRequest {
            topic: Some(resource(topic)),
            message_id: sent.message_id.clone(),
            transaction_id: sent.transaction_id.clone(),
            resolution: resolution as i32,
            source: v2::TransactionSource::SourceClient as i32,
            trace_context: String::new(),
        };
        let r = self
            .call(|mut c| {
                let req = self.request(req.clone(), self.timeout);
                async move { c.end_transaction(req).await }
            })
            .await?;
        ClientError::from_status(r.status)
    }

    /// Cancels a timed message that is not due yet; returns its message id.
    pub async fn recall(&self, topic: &str, recall_handle: &str) -> Result<String, ClientError> {
        let req = v2::RecallMessageRequest {
            topic: Some(resource(topic)),
            recall_handle: recall_handle.to_string(),
        };
        let r = self
            .call(|mut c| {
                let req = self.request(req.clone(), self.timeout);
                async move { c.recall_message(req).await }
            })
            .await?;
        ClientError::from_status(r.status)?;
        Ok(r.message_id)
    }

    /// Receives up to `max` messages for `group` (a tag expression: `*` or
    /// `a || b`), waiting up to `wait` for one to arrive. Each stays
    /// invisible to the group for `invisible` unless acknowledged.
    pub async fn receive(
        &self,
        group: &str,
        topic: &str,
        filter: &str,
        max: i32,
        invisible: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, ClientError> {
        let req = v2::ReceiveMessageRequest {
            group: Some(resource(group)),
            message_queue: Some(v2::MessageQueue {
                topic: Some(resource(topic)),
                ..Default::default()
            }),
            filter_expression: Some(v2::FilterExpression {
                r#type: v2::FilterType::Tag as i32,
                expression: filter.to_string(),
            }),
            batch_size: max,
            invisible_duration: Some(crate::proto::v2_message::duration(invisible)),
            auto_renew: false,
            long_polling_timeout: Some(crate::proto::v2_message::duration(wait)),
            attempt_id: None,
        };
        let items = self
            .call(|mut c| {
                let req = self.request(req.clone(), wait + self.timeout);
                async move {
                    let mut s = c.receive_message(req).await?.into_inner();
                    let mut items = Vec::new();
                    while let Some(i) = s.message().await? {
                        items.push(i);
                    }
                    Ok(tonic::Response::new(items))
                }
            })
            .await?;
        let mut out = Vec::new();
        for i in items {
            match i.content {
                Some(v2::receive_message_response::Content::Status(s)) => ClientError::from_status(Some(s))?,
                Some(v2::receive_message_response::Content::Message(m)) => out.push(Received::from_v2(m)),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Acknowledges received messages.
    pub async fn ack(&self, group: &str, topic: &str, messages: &[Received]) -> Result<(), ClientError> {
        if messages.is_empty() {
            return Ok(());
        }
        let req = v2::AckMessageRequest {
            group: Some(resource(group)),
            topic: Some(resource(topic)),
            entries: messages
                .iter()
                .map(|m| v2::AckMessageEntry {
                    message_id: m.message_id.clone(),
                    receipt_handle: m.receipt_handle.clone(),
                    lite_topic: None,
                })
                .collect(),
        };
        let r = self
            .call(|mut c| {
                let req = self.request(req.clone(), self.timeout);
                async move { c.ack_message(req).await }
            })
            .await?;
        ClientError::from_status(r.status)
    }
}

fn resource(name: &str) -> v2::Resource {
    v2::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    }
}
