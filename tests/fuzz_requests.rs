//! Every request a broker's client port takes, mutated, against a running
//! cluster: valid `apache.rocketmq.v2` and `raftmq.v1` requests (one seed per
//! method) with bits flipped, bytes set, cut short or grown, sent as raw
//! bytes. Whatever arrives, the node answers with a status or a response:
//! no handler panics, no call breaks mid-way, no unary call hangs, and
//! afterwards every node is up and sends and receives work.
//!
//! The cases come from proptest's deterministic runner (the same every run);
//! `FUZZ_REQUEST_CASES` sets how many per method (16 unless told). A failure
//! prints the method and the bytes, which reproduce it.
//!
//! Left out: the v1 calls that change membership, leadership or writability
//! or delete (`AddNode`, `RemoveNode`, `TransferLeader`, `SetWritable`,
//! `UpdateBrokerConfig`, `DeleteTopic`, `DeleteConsumerGroup`), which an
//! admin may make and a mutation could make validly; their requests decode
//! through the same prost path as the rest.

mod common;

use std::time::Duration;

use bytes::{Buf, BufMut};
use common::v2::*;
use common::{Cluster, send_retrying};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use raftmq::proto::pb;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// Sends and takes messages as the bytes they are.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// How a method is called.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Unary,
    /// Answers with a stream, and may wait (long polling) before it ends.
    ServerStream,
    /// Telemetry: a stream each way, kept open by the server.
    Bidi,
}

struct Seed {
    path: &'static str,
    kind: Kind,
    bytes: Vec<u8>,
}

fn seed(path: &'static str, kind: Kind, m: impl prost::Message) -> Seed {
    Seed {
        path,
        kind,
        bytes: m.encode_to_vec(),
    }
}

fn duration_ms(ms: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: ms / 1000,
        nanos: (ms % 1000) as i32 * 1_000_000,
    })
}

fn queue(topic: &str, id: i32) -> Option<v2::MessageQueue> {
    Some(v2::MessageQueue {
        topic: resource(topic),
        id,
        ..Default::default()
    })
}

/// One valid request per method; `handle` is a real receipt handle.
fn seeds(handle: &str) -> Vec<Seed> {
    let filter = Some(v2::FilterExpression {
        r#type: v2::FilterType::Tag as i32,
        expression: "TagA || TagB".into(),
    });
    vec![
        seed(
            "/apache.rocketmq.v2.MessagingService/QueryRoute",
            Kind::Unary,
            v2::QueryRouteRequest {
                topic: resource("T"),
                endpoints: None,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/Heartbeat",
            Kind::Unary,
            v2::HeartbeatRequest {
                group: resource("G"),
                client_type: v2::ClientType::SimpleConsumer as i32,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            Kind::Unary,
            v2::SendMessageRequest {
                messages: vec![msg("T", "fuzz-send", b"body")],
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/QueryAssignment",
            Kind::Unary,
            v2::QueryAssignmentRequest {
                topic: resource("T"),
                group: resource("G"),
                endpoints: None,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/ReceiveMessage",
            Kind::ServerStream,
            v2::ReceiveMessageRequest {
                group: resource("G"),
                message_queue: queue("T", 0),
                filter_expression: filter.clone(),
                batch_size: 4,
                invisible_duration: duration_ms(30_000),
                auto_renew: false,
                long_polling_timeout: duration_ms(100),
                attempt_id: None,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/AckMessage",
            Kind::Unary,
            v2::AckMessageRequest {
                group: resource("G"),
                topic: resource("T"),
                entries: vec![v2::AckMessageEntry {
                    message_id: "fuzz".into(),
                    receipt_handle: handle.into(),
                    lite_topic: None,
                }],
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/ForwardMessageToDeadLetterQueue",
            Kind::Unary,
            v2::ForwardMessageToDeadLetterQueueRequest {
                group: resource("G"),
                topic: resource("T"),
                receipt_handle: handle.into(),
                message_id: "fuzz".into(),
                delivery_attempt: 1,
                max_delivery_attempts: 16,
                lite_topic: None,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/PullMessage",
            Kind::ServerStream,
            v2::PullMessageRequest {
                group: resource("G"),
                message_queue: queue("T", 1),
                offset: 0,
                batch_size: 4,
                filter_expression: filter,
                long_polling_timeout: duration_ms(100),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/UpdateOffset",
            Kind::Unary,
            v2::UpdateOffsetRequest {
                group: resource("P"),
                message_queue: queue("T", 1),
                offset: 1,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/GetOffset",
            Kind::Unary,
            v2::GetOffsetRequest {
                group: resource("P"),
                message_queue: queue("T", 1),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/QueryOffset",
            Kind::Unary,
            v2::QueryOffsetRequest {
                message_queue: queue("T", 0),
                query_offset_policy: v2::QueryOffsetPolicy::Timestamp as i32,
                timestamp: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 0,
                }),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/EndTransaction",
            Kind::Unary,
            v2::EndTransactionRequest {
                topic: resource("T"),
                message_id: "fuzz".into(),
                transaction_id: "0123456789ABCDEF".into(),
                resolution: v2::TransactionResolution::Commit as i32,
                source: v2::TransactionSource::SourceClient as i32,
                trace_context: String::new(),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/Telemetry",
            Kind::Bidi,
            v2::TelemetryCommand {
                status: None,
                command: Some(v2::telemetry_command::Command::Settings(v2::Settings {
                    client_type: Some(v2::ClientType::Producer as i32),
                    request_timeout: duration_ms(3000),
                    pub_sub: Some(v2::settings::PubSub::Publishing(v2::Publishing {
                        topics: vec![v2::Resource {
                            resource_namespace: String::new(),
                            name: "T".into(),
                        }],
                        max_body_size: 4 << 20,
                        validate_message_type: true,
                    })),
                    ..Default::default()
                })),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/NotifyClientTermination",
            Kind::Unary,
            v2::NotifyClientTerminationRequest { group: resource("G") },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/ChangeInvisibleDuration",
            Kind::Unary,
            v2::ChangeInvisibleDurationRequest {
                group: resource("G"),
                topic: resource("T"),
                receipt_handle: handle.into(),
                invisible_duration: duration_ms(20_000),
                message_id: "fuzz".into(),
                lite_topic: None,
                suspend: None,
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/RecallMessage",
            Kind::Unary,
            v2::RecallMessageRequest {
                topic: resource("T"),
                recall_handle: "bm90IGEgaGFuZGxl".into(),
            },
        ),
        seed(
            "/apache.rocketmq.v2.MessagingService/SyncLiteSubscription",
            Kind::Unary,
            v2::SyncLiteSubscriptionRequest {
                topic: resource("T"),
                group: resource("G"),
                lite_topic_set: vec!["a".into()],
                ..Default::default()
            },
        ),
        seed(
            "/raftmq.v1.Broker/Send",
            Kind::Unary,
            pb::SendRequest {
                topic: "T".into(),
                queue_id: 1,
                messages: vec![common::message(7)],
            },
        ),
        seed(
            "/raftmq.v1.Broker/Read",
            Kind::Unary,
            pb::ReadRequest {
                topic: "T".into(),
                queue_id: 0,
                offset: 0,
                max_count: 8,
            },
        ),
        seed(
            "/raftmq.v1.Broker/PutTopic",
            Kind::Unary,
            pb::PutTopicRequest {
                name: "Fuzzed".into(),
                read_queues: 2,
                write_queues: 2,
                perm: 6,
                message_type: "NORMAL".into(),
            },
        ),
        seed(
            "/raftmq.v1.Broker/GetTopic",
            Kind::Unary,
            pb::GetTopicRequest { name: "T".into() },
        ),
        seed(
            "/raftmq.v1.Broker/PutConsumerGroup",
            Kind::Unary,
            pb::PutConsumerGroupRequest {
                name: "FuzzGroup".into(),
                fifo: false,
                max_delivery_attempts: 16,
            },
        ),
        seed(
            "/raftmq.v1.Broker/ListConsumerGroups",
            Kind::Unary,
            pb::ListConsumerGroupsRequest {},
        ),
        seed(
            "/raftmq.v1.Broker/GetConsumerGroup",
            Kind::Unary,
            pb::GetConsumerGroupRequest { name: "G".into() },
        ),
        seed(
            "/raftmq.v1.Broker/TopicStatus",
            Kind::Unary,
            pb::GetTopicRequest { name: "T".into() },
        ),
        seed(
            "/raftmq.v1.Broker/GroupProgress",
            Kind::Unary,
            pb::GroupProgressRequest { group: "G".into() },
        ),
        seed(
            "/raftmq.v1.Broker/ResetOffset",
            Kind::Unary,
            pb::ResetOffsetRequest {
                group: "P".into(),
                topic: "T".into(),
                timestamp_ms: 0,
                offsets: vec![pb::QueueOffset { queue: 1, offset: 0 }],
                to_end: false,
            },
        ),
        seed(
            "/raftmq.v1.Broker/QueryMessages",
            Kind::Unary,
            pb::QueryMessagesRequest {
                topic: "T".into(),
                by: Some(pb::query_messages_request::By::Key("key1".into())),
                max: 8,
            },
        ),
        seed(
            "/raftmq.v1.Broker/Status",
            Kind::Unary,
            pb::StatusRequest { with_digest: false },
        ),
        seed(
            "/raftmq.v1.Broker/Ping",
            Kind::Unary,
            pb::PingRequest {
                payload: b"ping".to_vec().into(),
            },
        ),
        seed(
            "/raftmq.v1.Broker/ListClients",
            Kind::Unary,
            pb::ListClientsRequest {
                group: "G".into(),
                topic: "T".into(),
            },
        ),
        seed(
            "/raftmq.v1.Broker/CheckTransaction",
            Kind::Unary,
            pb::CheckTransactionRequest {
                topic: "T".into(),
                log_index: 3,
                ordinal: 0,
                message: b"not a message".to_vec(),
            },
        ),
        seed(
            "/raftmq.v1.Broker/ReadHeld",
            Kind::Unary,
            pb::ReadHeldRequest {
                log_index: 3,
                ordinal: 0,
            },
        ),
        seed(
            "/raftmq.v1.Broker/GetBrokerConfig",
            Kind::Unary,
            pb::GetBrokerConfigRequest {},
        ),
        seed(
            "/raftmq.v1.Broker/ChangeAcl",
            Kind::Unary,
            pb::ChangeAclRequest {
                command_json: r#"{"CreateUser":{"name":"u","password":"p","user_type":"Normal","status":"Enable"}}"#
                    .into(),
            },
        ),
        seed("/raftmq.v1.Broker/ReadAcl", Kind::Unary, pb::ReadAclRequest {}),
    ]
}

/// One change to a request's bytes; positions wrap around its length.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
    /// A top-level field appended: a varint, or bytes (printable, so that
    /// string fields stay UTF-8). Protobuf lets the last value of a field
    /// win and merges messages, so this sets known fields to values the
    /// seed never had while the request still decodes.
    Varint(u32, u64),
    Bytes(u32, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => (any::<usize>(), 0..8u8).prop_map(|(i, bit)| Mutation::Flip(i, bit)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => any::<usize>().prop_map(Mutation::Cut),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..12)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        4 => (1..12u32, prop_oneof![Just(0), Just(1), Just(u64::MAX), Just(i64::MAX as u64), Just(u32::MAX as u64), any::<u64>()])
            .prop_map(|(f, v)| Mutation::Varint(f, v)),
        4 => (1..12u32, "[ -~]{0,40}").prop_map(|(f, v)| Mutation::Bytes(f, v)),
    ]
}

fn mutate(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in mutations {
        match m {
            Mutation::Flip(i, bit) if !b.is_empty() => {
                let i = i % b.len();
                b[i] ^= 1 << bit;
            }
            Mutation::Set(i, v) if !b.is_empty() => {
                let i = i % b.len();
                b[i] = *v;
            }
            Mutation::Cut(i) => b.truncate(i % (b.len() + 1)),
            Mutation::Insert(i, v) => {
                let i = i % (b.len() + 1);
                b.splice(i..i, v.iter().copied());
            }
            Mutation::Varint(field, v) => {
                prost::encoding::encode_key(*field, prost::encoding::WireType::Varint, &mut b);
                prost::encoding::encode_varint(*v, &mut b);
            }
            Mutation::Bytes(field, v) => {
                prost::encoding::encode_key(*field, prost::encoding::WireType::LengthDelimited, &mut b);
                prost::encoding::encode_varint(v.len() as u64, &mut b);
                b.extend_from_slice(v.as_bytes());
            }
            _ => {}
        }
    }
    b
}

/// What a call came to ("ok", a gRPC code, or "waiting" for a stream still
/// open); `Err` names what is wrong with it.
async fn call(channel: &Channel, seed: &Seed, body: Vec<u8>) -> Result<String, String> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.map_err(|e| format!("channel not ready: {e}"))?;
    let path = PathAndQuery::from_static(seed.path);
    let mut request = tonic::Request::new(body.clone());
    let meta = request.metadata_mut();
    meta.insert("x-mq-client-id", "fuzz-client".parse().unwrap());
    meta.insert("x-mq-language", "RUST".parse().unwrap());
    meta.insert("x-mq-protocol", "v2".parse().unwrap());
    let answer = match seed.kind {
        Kind::Unary => tokio::time::timeout(Duration::from_secs(10), grpc.unary(request, path, Raw))
            .await
            .map(|r| r.map(drop)),
        Kind::ServerStream => {
            // Long polling may wait; reading the first answer within the
            // time is enough.
            let go = async {
                let mut s = grpc.server_streaming(request, path, Raw).await?.into_inner();
                s.message().await.map(drop)
            };
            match tokio::time::timeout(Duration::from_secs(10), go).await {
                Err(_) => return Ok("waiting".into()),
                done => done,
            }
        }
        Kind::Bidi => {
            let (metadata, extensions, _) = request.into_parts();
            let stream = tonic::Request::from_parts(metadata, extensions, futures::stream::iter([body]));
            let go = async {
                let mut s = grpc.streaming(stream, path, Raw).await?.into_inner();
                s.message().await.map(drop)
            };
            match tokio::time::timeout(Duration::from_secs(3), go).await {
                // The server keeps a telemetry stream open after settings.
                Err(_) => return Ok("waiting".into()),
                done => done,
            }
        }
    };
    match answer {
        Err(_) => Err("no answer within 10 s".into()),
        Ok(Ok(())) => Ok("ok".into()),
        Ok(Err(s)) => {
            let m = s.message();
            // A handler that panicked resets its stream (the client sees
            // CANCELLED, "h2 protocol error"); a torn-down connection shows
            // as a transport error. INTERNAL is for bodies that did not
            // decode; any other is the broker failing at a request it should
            // have refused.
            let broke = matches!(s.code(), tonic::Code::Unknown | tonic::Code::Cancelled)
                || m.contains("transport error")
                || m.contains("protocol error")
                || (s.code() == tonic::Code::Internal && !m.starts_with("failed to decode"));
            match broke {
                true => Err(format!("the call broke: {s:?}")),
                false => Ok(format!("{:?}", s.code())),
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn mutated_requests_to_every_method_get_an_answer_and_harm_nothing() {
    let cases: usize = std::env::var("FUZZ_REQUEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    let leader = c.leader().await;
    c.create_topic("T", 2, "").await;
    let mut v = client(&c, leader).await;
    send_ok(&mut v, "T", "seed", 4).await;
    // A real receipt handle, for the seeds that carry one.
    let (s, got) = receive(&mut v, "G", "T", tags("*"), 60, 1000).await;
    assert_eq!(s, Code::Ok);
    let handle = got[0]
        .system_properties
        .as_ref()
        .unwrap()
        .receipt_handle
        .clone()
        .unwrap();

    let seeds = seeds(&handle);
    let channel = c.channel(leader).await;
    let follower = c.channel(if leader == 1 { 2 } else { 1 }).await;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(mutation(), 1..4);
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for s in &seeds {
        // The seed itself is valid: it must be answered too.
        if let Err(e) = call(&channel, s, s.bytes.clone()).await {
            panic!("{} (unchanged seed {}): {e}", s.path, hex(&s.bytes));
        }
        for case in 0..cases {
            let ms = strategy.new_tree(&mut runner).unwrap().current();
            let body = mutate(&s.bytes, &ms);
            // Every other case through a follower, which forwards.
            let via = if case % 2 == 0 { &channel } else { &follower };
            match call(via, s, body.clone()).await {
                Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
                Err(e) => panic!("{} with {}: {e}", s.path, hex(&body)),
            }
        }
    }
    // Answers (gRPC level; v2 handlers put their refusals in an OK
    // response's status) by kind, to see the cases reach the handlers.
    eprintln!("mutated requests over {} methods: {outcomes:?}", seeds.len());

    c.check_alive();
    for n in &c.nodes {
        let log = std::fs::read_to_string(dir.path().join(format!("node{}.log", n.id))).unwrap();
        assert!(!log.contains("panicked"), "node {} panicked:\n{log}", n.id);
    }
    // Sends and receives still work, through the leader of the moment.
    let leader = c.leader().await;
    let mut b = c.client(leader).await;
    let offset = send_retrying(&mut b, 0, 99).await;
    let mut v = client(&c, leader).await;
    let (s, got) = receive(&mut v, "After", "T", tags("*"), 60, 1000).await;
    // A new group starts at the oldest message kept.
    assert_eq!(s, Code::Ok, "a receive after the fuzzing (a send landed at {offset})");
    assert!(!got.is_empty());
}
