//! Helpers for tests that speak `apache.rocketmq.v2` with the generated
//! client to real broker processes.
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use tonic::transport::Channel;

use super::Cluster;

pub async fn client(c: &Cluster, id: u64) -> MessagingServiceClient<Channel> {
    MessagingServiceClient::new(c.channel(id).await)
}

pub fn resource(name: &str) -> Option<v2::Resource> {
    Some(v2::Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

pub fn msg(topic: &str, id: &str, body: &[u8]) -> v2::Message {
    v2::Message {
        topic: resource(topic),
        user_properties: Default::default(),
        system_properties: Some(v2::SystemProperties {
            message_id: id.into(),
            tag: Some("TagA".into()),
            keys: vec!["key1".into()],
            message_type: v2::MessageType::Normal as i32,
            ..Default::default()
        }),
        body: body.to_vec().into(),
    }
}

/// A DELAY message of `topic` due at `due`.
pub fn timed_msg(topic: &str, id: &str, body: &[u8], due: std::time::SystemTime) -> v2::Message {
    let since = due.duration_since(std::time::UNIX_EPOCH).unwrap();
    let mut m = msg(topic, id, body);
    let sp = m.system_properties.as_mut().unwrap();
    sp.message_type = v2::MessageType::Delay as i32;
    sp.delivery_timestamp = Some(prost_types::Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    });
    m
}

pub fn code(s: &Option<v2::Status>) -> Code {
    Code::try_from(s.as_ref().map_or(0, |s| s.code)).unwrap_or(Code::Unspecified)
}

pub async fn send(c: &mut MessagingServiceClient<Channel>, messages: Vec<v2::Message>) -> v2::SendMessageResponse {
    c.send_message(v2::SendMessageRequest { messages })
        .await
        .unwrap()
        .into_inner()
}

/// Sends `n` messages to `topic` one by one (ids `<prefix>-<i>`), each of
/// which must be stored.
pub async fn send_ok(c: &mut MessagingServiceClient<Channel>, topic: &str, prefix: &str, n: usize) {
    for i in 0..n {
        let r = send(c, vec![msg(topic, &format!("{prefix}-{i}"), b"x")]).await;
        assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    }
}

/// Receives with a short long-poll; returns (status code, messages).
pub async fn receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    filter: v2::FilterExpression,
    invisible_s: i64,
    wait_ms: i32,
) -> (Code, Vec<v2::Message>) {
    let mut req = receive_req(group, topic, 32, wait_ms);
    req.filter_expression = Some(filter);
    req.invisible_duration = Some(prost_types::Duration {
        seconds: invisible_s,
        nanos: 0,
    });
    let (status, messages, delivery_ts) = collect(c.receive_message(req).await.unwrap().into_inner(), true).await;
    if matches!(status, Code::Ok | Code::MessageNotFound) {
        assert!(delivery_ts, "a receive ends with the delivery timestamp");
    }
    (status, messages)
}

pub fn tags(expr: &str) -> v2::FilterExpression {
    v2::FilterExpression {
        r#type: v2::FilterType::Tag as i32,
        expression: expr.into(),
    }
}

/// Commits a transaction as its producer would; the answer's code.
pub async fn commit(
    c: &mut MessagingServiceClient<Channel>,
    topic: &str,
    message_id: &str,
    transaction_id: &str,
) -> Code {
    let r = c
        .end_transaction(v2::EndTransactionRequest {
            topic: resource(topic),
            message_id: message_id.into(),
            transaction_id: transaction_id.into(),
            resolution: v2::TransactionResolution::Commit as i32,
            source: v2::TransactionSource::SourceClient as i32,
            trace_context: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    code(&r.status)
}

/// A request with the client id the official clients put in its metadata.
pub fn with_id<T>(msg: T, client_id: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("x-mq-client-id", client_id.parse().unwrap());
    r
}

/// A receive of up to `batch` messages of any tag, invisible for 30 s,
/// waiting up to `wait_ms` for them.
pub fn receive_req(group: &str, topic: &str, batch: i32, wait_ms: i32) -> v2::ReceiveMessageRequest {
    v2::ReceiveMessageRequest {
        group: resource(group),
        message_queue: Some(v2::MessageQueue {
            topic: resource(topic),
            ..Default::default()
        }),
        filter_expression: Some(tags("*")),
        batch_size: batch,
        invisible_duration: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
        auto_renew: false,
        long_polling_timeout: Some(prost_types::Duration {
            seconds: i64::from(wait_ms / 1000),
            nanos: (wait_ms % 1000) * 1_000_000,
        }),
        attempt_id: None,
    }
}

/// A receive with a client id: (status, messages with their receipts).
pub async fn receive_as(
    c: &mut MessagingServiceClient<Channel>,
    client_id: &str,
    req: v2::ReceiveMessageRequest,
) -> (Code, Vec<v2::Message>) {
    let (status, messages, _) = collect(
        c.receive_message(with_id(req, client_id)).await.unwrap().into_inner(),
        false,
    )
    .await;
    (status, messages)
}

/// A receive's answer: its status, its messages, and whether it ended with
/// the delivery timestamp; `strict`: an empty item fails the test.
async fn collect(
    mut stream: tonic::Streaming<v2::ReceiveMessageResponse>,
    strict: bool,
) -> (Code, Vec<v2::Message>, bool) {
    let (mut status, mut messages, mut delivery_ts) = (Code::Unspecified, Vec::new(), false);
    while let Some(r) = stream.message().await.unwrap() {
        match r.content {
            Some(v2::receive_message_response::Content::Status(s)) => status = Code::try_from(s.code).unwrap(),
            Some(v2::receive_message_response::Content::Message(m)) => messages.push(m),
            Some(v2::receive_message_response::Content::DeliveryTimestamp(_)) => delivery_ts = true,
            None => assert!(!strict, "empty response item"),
        }
    }
    (status, messages, delivery_ts)
}

pub fn receipt_of(m: &v2::Message) -> String {
    m.system_properties.as_ref().unwrap().receipt_handle.clone().unwrap()
}

pub fn ack_req(group: &str, topic: &str, handles: &[String]) -> v2::AckMessageRequest {
    v2::AckMessageRequest {
        group: resource(group),
        topic: resource(topic),
        entries: handles
            .iter()
            .map(|h| v2::AckMessageEntry {
                message_id: String::new(),
                receipt_handle: h.clone(),
                lite_topic: None,
            })
            .collect(),
    }
}

/// A producer's heartbeat (no group).
pub fn heartbeat() -> v2::HeartbeatRequest {
    v2::HeartbeatRequest {
        group: None,
        client_type: v2::ClientType::Producer as i32,
    }
}
