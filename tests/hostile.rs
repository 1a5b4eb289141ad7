//! Hostile and greedy callers against a real three-node group (processes
//! on 127.0.0.1, small `[limits]`): each finding of the hostile-input
//! review sends its input, gets its refusal code, and then the group must
//! still be whole: every node alive and below a memory bound, a normal send
//! and receive working, every acknowledged message readable where it was,
//! and the replicas' logs identical.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use common::v2::*;
use common::{Cluster, still_whole};
use raftmq::proto::pb;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint, Uri};

const LIMITS: &str = "[limits]\nmax_connections = 64\nmax_long_polls_per_client = 2\nmax_groups = 4\n\
                      max_inflight_per_queue = 5\nmax_inflight_per_group = 8\nmax_response_bytes = 1048576\n\
                      max_requests_per_client_per_s = 50\n";

/// Sends message `msg-<i>` to T through v2 and records it as acknowledged;
/// its offset.
async fn sent_v2(
    v: &mut MessagingServiceClient<Channel>,
    acked: &mut BTreeMap<(u32, u64), u64>,
    i: u64,
    body: &[u8],
) -> u64 {
    let r = send(v, vec![msg("T", &format!("msg-{i}"), body)]).await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    let offset = r.entries[0].offset as u64;
    acked.insert((0, offset), i);
    offset
}

/// Connects from `source` (another loopback address is another host to
/// the broker).
#[derive(Clone)]
struct FromAddr {
    source: SocketAddr,
}

impl tonic::codegen::Service<Uri> for FromAddr {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let source = self.source;
        Box::pin(async move {
            let target: SocketAddr = uri.authority().unwrap().as_str().parse().unwrap();
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(source)?;
            Ok(hyper_util::rt::TokioIo::new(socket.connect(target).await?))
        })
    }
}

async fn client_from(c: &Cluster, id: u64, source: [u8; 4]) -> MessagingServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{}", c.node(id).client_addr))
        .unwrap()
        .connect_with_connector(FromAddr {
            source: SocketAddr::from((source, 0)),
        })
        .await
        .unwrap();
    MessagingServiceClient::new(channel)
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_callers_are_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", LIMITS);
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    c.create_topic("T2", 1, "").await;
    c.create_topic("Txn", 1, "TRANSACTION").await;
    let mut acked = BTreeMap::new();
    let mut v = client(&c, leader).await;

    // Finding 9: receipt handles are sealed for their group and topic.
    for i in 0..3 {
        sent_v2(&mut v, &mut acked, 2_000_000 + i, b"x").await;
    }
    let (s, got) = receive_as(&mut v, "c-1", receive_req("G1", "T", 3, 1000)).await;
    assert_eq!((s, got.len()), (Code::Ok, 3));
    let handles: Vec<String> = got.iter().map(receipt_of).collect();
    let mut tampered = handles[0].clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    for (group, topic, handle) in [
        ("G2", "T", &handles[0]),
        ("G1", "Txn", &handles[0]),
        ("G1", "T", &tampered),
    ] {
        let r = v
            .ack_message(with_id(ack_req(group, topic, std::slice::from_ref(handle)), "c-1"))
            .await
            .unwrap();
        let r = r.into_inner();
        assert_eq!(
            code(&r.entries[0].status),
            Code::InvalidReceiptHandle,
            "{group} {topic} {handle}"
        );
    }
    let r = v
        .ack_message(with_id(ack_req("G1", "T", &handles), "c-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.entries.iter().all(|e| code(&e.status) == Code::Ok), "{r:?}");

    // Finding 9: transaction ids are sealed for their message.
    let mut half = msg("Txn", "h1", b"half");
    half.system_properties.as_mut().unwrap().message_type = v2::MessageType::Transaction as i32;
    let r = send(&mut v, vec![half]).await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    let real = r.entries[0].transaction_id.clone();
    let forged = format!("{}.{}", real.rsplit_once('.').unwrap().0, "0".repeat(32));
    for (message_id, id) in [("h1", forged.as_str()), ("other", real.as_str())] {
        assert_eq!(
            commit(&mut v, "Txn", message_id, id).await,
            Code::InvalidTransactionId,
            "{message_id} {id}"
        );
    }
    // Finding 2: a tag filter of a megabyte is refused at subscription.
    let mut huge_filter = receive_req("G1", "T", 1, 0);
    huge_filter.filter_expression = Some(tags(&"t||".repeat(350_000)));
    let (s, _) = receive_as(&mut v, "c-1", huge_filter).await;
    assert_eq!(s, Code::IllegalFilterExpression);

    // Finding 12: queue ids at the edge of their type are no queue, not an
    // overflow.
    let mut admin = c.client(leader).await;
    let r = admin
        .read(pb::ReadRequest {
            topic: "T".into(),
            queue_id: u32::MAX,
            offset: u64::MAX,
            max_count: u32::MAX,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.messages.is_empty());
    let r = admin
        .query_messages(pb::QueryMessagesRequest {
            topic: "T".into(),
            max: u32::MAX,
            by: Some(pb::query_messages_request::By::TimeRange(pb::TimeRange {
                queue_id: Some(u32::MAX),
                begin_ms: 0,
                end_ms: u64::MAX,
            })),
        })
        .await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::InvalidArgument);
    still_whole(
        &mut c,
        &mut acked,
        "forged receipts and transaction ids, huge filters, edge queue ids",
    )
    .await;

    // Finding 7: a client id belongs to the address that first used it.
    let mut here = client(&c, leader).await;
    let mut elsewhere = client_from(&c, leader, [127, 0, 0, 2]).await;
    let r = here
        .heartbeat(with_id(heartbeat(), "producer-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    let r = elsewhere
        .heartbeat(with_id(heartbeat(), "producer-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Forbidden, "{r:?}");
    let r = elsewhere
        .notify_client_termination(with_id(
            v2::NotifyClientTerminationRequest { group: None },
            "producer-1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Forbidden);
    let settings = v2::TelemetryCommand {
        status: None,
        command: Some(v2::telemetry_command::Command::Settings(v2::Settings {
            client_type: Some(v2::ClientType::Producer as i32),
            ..Default::default()
        })),
    };
    let mut t = elsewhere
        .telemetry(with_id(tokio_stream::iter(vec![settings]), "producer-1"))
        .await
        .unwrap()
        .into_inner();
    let first = t.message().await.unwrap().unwrap();
    assert_eq!(code(&first.status), Code::Forbidden, "{first:?}");
    assert!(
        first.command.is_none(),
        "no settings for a caller that is not the client"
    );
    let r = here.heartbeat(with_id(heartbeat(), "bad id")).await;
    assert!(r.is_err() || code(&r.unwrap().into_inner().status) == Code::BadRequest);
    still_whole(&mut c, &mut acked, "client id takeovers").await;

    // Finding 5: the topic is checked before a group is made; groups and
    // in-flight deliveries are bounded.
    let (s, _) = receive_as(&mut v, "c-2", receive_req("Ghost", "NoSuchTopic", 1, 0)).await;
    assert_eq!(s, Code::TopicNotFound);
    let ghost = admin
        .get_consumer_group(pb::GetConsumerGroupRequest { name: "Ghost".into() })
        .await;
    assert!(ghost.is_err(), "no group was made for a missing topic: {ghost:?}");
    for g in ["G2", "G3", "G4"] {
        let (s, _) = receive_as(&mut v, "c-2", receive_req(g, "T", 1, 0)).await;
        assert!(matches!(s, Code::Ok | Code::MessageNotFound), "{g}: {s:?}");
    }
    let (s, _) = receive_as(&mut v, "c-2", receive_req("G5", "T", 1, 0)).await;
    assert_eq!(s, Code::Forbidden, "the fifth group is over max_groups = 4");
    for i in 0..12 {
        sent_v2(&mut v, &mut acked, 3_000_000 + i, b"y").await;
    }
    let (s, first) = receive_as(&mut v, "c-2", receive_req("G1", "T", 32, 0)).await;
    assert_eq!((s, first.len()), (Code::Ok, 5), "max_inflight_per_queue = 5");
    let (s, none) = receive_as(&mut v, "c-2", receive_req("G1", "T", 32, 0)).await;
    assert_eq!((s, none.len()), (Code::MessageNotFound, 0));
    let handles: Vec<String> = first.iter().map(receipt_of).collect();
    v.ack_message(with_id(ack_req("G1", "T", &handles), "c-2"))
        .await
        .unwrap();
    let (s, more) = receive_as(&mut v, "c-2", receive_req("G1", "T", 32, 0)).await;
    assert_eq!((s, more.len()), (Code::Ok, 5), "acks make room");
    // Five in flight on T: another topic's queue gives G1 only three more.
    send_ok(&mut v, "T2", "t2", 6).await;
    let (s, other) = receive_as(&mut v, "c-2", receive_req("G1", "T2", 32, 0)).await;
    assert_eq!((s, other.len()), (Code::Ok, 3), "max_inflight_per_group = 8");
    let (s, none) = receive_as(&mut v, "c-2", receive_req("G1", "T2", 32, 0)).await;
    assert_eq!((s, none.len()), (Code::MessageNotFound, 0));
    // A receive waiting on T2 finds the room acks on T make (its wake-ups
    // follow T2 only: it looks again every second while the group is full).
    // A receive also looks once more at its deadline: the wait is long, and
    // the answer must come well before it.
    let mut waiter = v.clone();
    let waiting =
        tokio::spawn(async move { receive_as(&mut waiter, "c-2", receive_req("G1", "T2", 32, 15_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handles: Vec<String> = more.iter().map(receipt_of).collect();
    let acked_at = std::time::Instant::now();
    v.ack_message(with_id(ack_req("G1", "T", &handles), "c-2"))
        .await
        .unwrap();
    let (s, rest) = waiting.await.unwrap();
    assert!(
        acked_at.elapsed() < Duration::from_secs(8),
        "the waiting receive saw the room only at its deadline"
    );
    assert_eq!(
        (s, rest.len()),
        (Code::Ok, 2),
        "acks on T make room on T2, up to its queue's bound of 5"
    );

    // Finding 6: long polls per client are bounded.
    let mut polls = Vec::new();
    for _ in 0..2 {
        let mut v2c = client(&c, leader).await;
        polls.push(tokio::spawn(async move {
            receive_as(&mut v2c, "poller", receive_req("G2", "Txn", 1, 5000)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (s, _) = receive_as(&mut v, "poller", receive_req("G2", "Txn", 1, 5000)).await;
    assert_eq!(s, Code::TooManyRequests, "a third long poll of one client");
    for p in polls {
        assert_eq!(p.await.unwrap().0, Code::MessageNotFound);
    }

    // Finding 6: per-client request rate (50/s with bursts of 50): 300 at
    // once are mostly refused, however slowly this machine runs them.
    let route = |id: &str| {
        let mut v = v.clone();
        let req = with_id(
            v2::QueryRouteRequest {
                topic: resource("T"),
                endpoints: None,
            },
            id,
        );
        async move { code(&v.query_route(req).await.unwrap().into_inner().status) }
    };
    let codes = futures::future::join_all((0..300).map(|_| route("greedy"))).await;
    let refused = codes.iter().filter(|c| **c == Code::TooManyRequests).count();
    assert!(refused >= 100, "{refused} of 300 requests at once refused at 50/s");
    let r = v
        .query_route(with_id(
            v2::QueryRouteRequest {
                topic: resource("T"),
                endpoints: None,
            },
            "modest",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        code(&r.status),
        Code::TooManyRequests,
        "other clients are not held back"
    );
    still_whole(&mut c, &mut acked, "greedy consumers").await;

    // Finding 3: answers are bounded in bytes (1 MiB here), and a reader
    // still gets everything, a few messages at a time.
    let big = vec![b'z'; 400 * 1024];
    let mut big_offsets = Vec::new();
    for i in 0..5 {
        big_offsets.push(sent_v2(&mut v, &mut acked, 4_000_000 + i, &big).await);
    }
    let mut offset = big_offsets[0];
    let mut seen = 0;
    while offset <= big_offsets[4] {
        let r = admin
            .read(pb::ReadRequest {
                topic: "T".into(),
                queue_id: 0,
                offset,
                max_count: 100,
            })
            .await
            .unwrap()
            .into_inner();
        let bytes: usize = r.messages.iter().map(|m| m.body.len()).sum();
        assert!(!r.messages.is_empty() && bytes <= 1 << 20, "{} bytes", bytes);
        seen += r.messages.len();
        offset = r.next_offset;
    }
    assert!(seen >= 5);
    let (s, got) = receive_as(&mut v, "c-3", receive_req("G3", "T", 32, 0)).await;
    assert_eq!(s, Code::Ok);
    assert!(got.len() <= 5, "{} messages", got.len());

    // Finding 4: digests run one at a time, off the async workers, and at
    // most 3 wait; other store scans (4 at once, 64 waiting) have a line of
    // their own. 150 of each at once on one connection: every answer is a
    // result or that line's clean refusal, some of each kind run, and the
    // node stays whole.
    let ch = c.channel(leader).await;
    let digests = (0..150).map(|_| {
        let mut b = pb::broker_client::BrokerClient::new(ch.clone());
        async move { b.status(pb::StatusRequest { with_digest: true }).await.map(drop) }
    });
    let queries = (0..150).map(|_| {
        let mut b = pb::broker_client::BrokerClient::new(ch.clone());
        async move {
            b.query_messages(pb::QueryMessagesRequest {
                topic: "T".into(),
                max: 32,
                by: Some(pb::query_messages_request::By::Key("key-1".into())),
            })
            .await
            .map(drop)
        }
    });
    let (digests, queries) = tokio::join!(futures::future::join_all(digests), futures::future::join_all(queries));
    for (answers, line) in [
        (&digests, "log digests already wait"),
        (&queries, "store scans already wait"),
    ] {
        for e in answers.iter().filter_map(|a| a.as_ref().err()) {
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
            assert!(e.message().contains(line), "{e}");
        }
        let refused = answers.iter().filter(|a| a.is_err()).count();
        assert!(refused < answers.len(), "none of 150 ran ({line})");
        eprintln!("150 at once, refused as \"{line}\": {refused}");
    }
    still_whole(&mut c, &mut acked, "big answers and digests").await;

    // Finding 11: hostile HTTP/2 on the client port closes that connection
    // only. A HEADERS frame claiming 1 MiB; a CONTINUATION flood.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut huge = preface.to_vec();
    huge.extend_from_slice(&[0x10, 0, 0, 1, 0, 0, 0, 0, 1]);
    let mut flood = preface.to_vec();
    flood.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 1]);
    for _ in 0..1000 {
        flood.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 0, 1]);
    }
    for bytes in [huge, flood] {
        let mut s = tokio::net::TcpStream::connect(&c.node(leader).client_addr)
            .await
            .unwrap();
        let _ = s.write_all(&bytes).await;
        let mut buf = vec![0u8; 4096];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection was closed");
    }

    // Connections past max_connections (64) are closed at once.
    let mut open = Vec::new();
    for _ in 0..80 {
        open.push(
            tokio::net::TcpStream::connect(&c.node(leader).client_addr)
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut closed = 0;
    for s in &mut open {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await {
            closed += 1;
        }
    }
    assert!(closed >= 80 - 64, "{closed} of 80 connections were closed");
    drop(open);
    tokio::time::sleep(Duration::from_millis(300)).await;
    still_whole(&mut c, &mut acked, "hostile HTTP/2 and a connection flood").await;

    // Finding 10: the Raft port refuses what openraft or storage would
    // treat as fatal: a snapshot that is not one, a term out of range.
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let st = c.status(leader, false).await.unwrap();
    let channel = Channel::from_shared(format!("http://{}", c.node(follower).raft_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raft = raftmq_raft::pb::raft_client::RaftClient::new(channel);
    let address = |r: &mut tonic::metadata::MetadataMap| {
        r.insert(raftmq_raft::network::GROUP_HEADER, "test".parse().unwrap());
        r.insert(
            raftmq_raft::network::TARGET_HEADER,
            follower.to_string().parse().unwrap(),
        );
    };
    let meta = serde_json::to_vec(&raftmq_raft::types::SnapshotMeta::default()).unwrap();
    let chunks = vec![
        raftmq_raft::pb::SnapshotChunk {
            chunk: Some(raftmq_raft::pb::snapshot_chunk::Chunk::Header(
                raftmq_raft::pb::SnapshotHeader {
                    vote: Some(raftmq_raft::pb::Vote {
                        term: st.term,
                        voted_for: leader,
                        committed: true,
                    }),
                    meta_json: meta,
                    total_len: 9,
                },
            )),
        },
        raftmq_raft::pb::SnapshotChunk {
            chunk: Some(raftmq_raft::pb::snapshot_chunk::Chunk::Data(bytes::Bytes::from_static(
                b"{not json",
            ))),
        },
    ];
    let mut req = tonic::Request::new(tokio_stream::iter(chunks));
    address(req.metadata_mut());
    let r = raft.install_snapshot(req).await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::InvalidArgument);
    let mut req = tonic::Request::new(raftmq_raft::pb::VoteRequest {
        vote: Some(raftmq_raft::pb::Vote {
            term: u64::MAX,
            voted_for: follower,
            committed: false,
        }),
        last_log_id: None,
        leadership_transfer: false,
    });
    address(req.metadata_mut());
    assert!(raft.vote(req).await.is_err());
    // A term within range but far ahead, with a log that looks newest:
    // taken, it would leave no term for a real candidate past MAX_TERM.
    let mut req = tonic::Request::new(raftmq_raft::pb::VoteRequest {
        vote: Some(raftmq_raft::pb::Vote {
            term: raftmq_raft::MAX_TERM,
            voted_for: follower,
            committed: false,
        }),
        last_log_id: Some(raftmq_raft::pb::LogId {
            term: raftmq_raft::MAX_TERM,
            index: raftmq_raft::MAX_INDEX,
        }),
        leadership_transfer: false,
    });
    address(req.metadata_mut());
    let e = raft.vote(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    // The group still elects: its leader stops, another takes over.
    c.kill(leader);
    let next = c.leader().await;
    assert_ne!(next, leader);
    assert!(c.status(next, false).await.unwrap().term < raftmq_raft::service::MAX_TERM_JUMP);
    c.spawn(leader);
    still_whole(&mut c, &mut acked, "a bad snapshot and absurd terms").await;
}

/// Sends past `limits.max_inflight_sends` are refused by the gate in front
/// of the service, before their bodies are decoded: each gets a whole
/// answer with `TOO_MANY_REQUESTS` (no transport error, even though the
/// request body was never read into a message), nothing of theirs is
/// stored, and every send that was let in is where it was acknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn sends_past_the_in_flight_bound_are_refused_whole_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "sync", "[limits]\nmax_inflight_sends = 2\n");
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    let v = client(&c, leader).await;
    let body = vec![b'x'; 256 << 10];
    let one = |i: u64| {
        let mut v = v.clone();
        let m = msg("T", &format!("msg-{i}"), &body);
        async move { (i, send(&mut v, vec![m]).await) }
    };
    let answers = futures::future::join_all((0..64).map(one)).await;
    let mut acked = BTreeMap::new();
    let mut refused = 0;
    for (i, r) in &answers {
        match code(&r.status) {
            Code::Ok => {
                acked.insert((0, r.entries[0].offset as u64), *i);
            }
            Code::TooManyRequests => refused += 1,
            other => panic!("send {i}: {other:?} {r:?}"),
        }
    }
    eprintln!("{} let in, {refused} refused", acked.len());
    assert!(refused > 0, "64 sends at once, 2 places: some must be refused");
    assert!(!acked.is_empty(), "some sends must get in");
    // Only what was acknowledged is stored: dense offsets 0..acked.
    let offsets: Vec<u64> = acked.keys().map(|(_, o)| *o).collect();
    assert_eq!(offsets, (0..acked.len() as u64).collect::<Vec<_>>());
    let mut admin = c.client(leader).await;
    let read = admin
        .read(pb::ReadRequest {
            topic: "T".into(),
            queue_id: 0,
            offset: 0,
            max_count: 1000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.messages.len(), acked.len(), "a refused send was stored");

    // raftmq's own v1 Send, the same way: refused with RESOURCE_EXHAUSTED.
    // Its messages have ids of their own (msg-64 on): one sent again with
    // an id stored above would be a retry, answered with the first copy.
    let first = acked.len() as u64;
    let ids = 64;
    let one_v1 = |i: u64| {
        let mut admin = admin.clone();
        let body = body.clone();
        async move {
            let r = admin
                .send(pb::SendRequest {
                    topic: "T".into(),
                    queue_id: 0,
                    messages: vec![pb::Message {
                        body: body.into(),
                        ..common::message(i)
                    }],
                })
                .await;
            (i, r)
        }
    };
    let answers = futures::future::join_all((ids..ids + 64).map(one_v1)).await;
    let mut refused = 0;
    for (i, r) in answers {
        match r {
            Ok(r) => {
                acked.insert((0, r.into_inner().first_queue_offset), i);
            }
            Err(e) if e.code() == tonic::Code::ResourceExhausted => refused += 1,
            Err(e) => panic!("v1 send {i}: {e:?}"),
        }
    }
    eprintln!("v1: {} let in, {refused} refused", acked.len() as u64 - first);
    assert!(refused > 0, "64 v1 sends at once, 2 places: some must be refused");
    let offsets: Vec<u64> = acked.keys().map(|(_, o)| *o).collect();
    assert_eq!(offsets, (0..acked.len() as u64).collect::<Vec<_>>());
    still_whole(&mut c, &mut acked, "sends past the in-flight bound").await;
}

/// A v1 `SendRequest` whose topic is raw bytes: invalid UTF-8 there fails
/// decoding, which only the handler's side does, so the answer tells the
/// gate's refusal (`RESOURCE_EXHAUSTED`, the body never decoded) from the
/// handler's (a decode error).
#[derive(Clone, PartialEq, prost::Message)]
struct RawSend {
    #[prost(bytes = "vec", tag = "1")]
    topic: Vec<u8>,
}

async fn raw_v1_send(channel: Channel) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<RawSend, pb::SendResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/raftmq.v1.Broker/Send");
    let request = tonic::Request::new(RawSend {
        topic: vec![0xff, 0xfe],
    });
    grpc.unary(request, path, codec).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_v1_send_past_the_bound_is_refused_before_its_body_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "sync", "[limits]\nmax_inflight_sends = 2\n");
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    let s = raw_v1_send(c.channel(leader).await).await;
    assert_ne!(
        s.code(),
        tonic::Code::ResourceExhausted,
        "places free: decoded, and refused for it: {s:?}"
    );

    // Two sends that cannot commit (both followers are gone, and a leader
    // waits out its write timeout) hold both places.
    let followers: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
    for &f in &followers {
        c.kill(f);
    }
    let mut held = Vec::new();
    for i in 0..2 {
        let mut client = c.client(leader).await;
        held.push(tokio::spawn(async move {
            client
                .send(pb::SendRequest {
                    topic: "T".into(),
                    queue_id: 0,
                    messages: vec![common::message(i)],
                })
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s = raw_v1_send(c.channel(leader).await).await;
    assert_eq!(
        s.code(),
        tonic::Code::ResourceExhausted,
        "the gate refuses before decoding: {s:?}"
    );
    for &f in &followers {
        c.spawn(f);
    }
    for h in held {
        let _ = h.await;
    }
    c.check_alive();
}

/// Deliveries in flight are bounded over all consumer groups too (each is
/// in every snapshot a follower must install): with `max_inflight_total =
/// 6`, one group's six leave another none until acks make room, and a new
/// leader, whose counts were kept by applying the same entries, bounds the
/// same.
#[tokio::test(flavor = "multi_thread")]
async fn deliveries_in_flight_are_bounded_over_all_groups() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", "[limits]\nmax_inflight_total = 6\n");
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    let mut v = client(&c, leader).await;
    send_ok(&mut v, "T", "total", 10).await;
    let (s, a) = receive_as(&mut v, "c-1", receive_req("A", "T", 32, 0)).await;
    assert_eq!((s, a.len()), (Code::Ok, 6), "max_inflight_total = 6");
    let (s, b) = receive_as(&mut v, "c-1", receive_req("B", "T", 32, 0)).await;
    assert_eq!(
        (s, b.len()),
        (Code::MessageNotFound, 0),
        "the groups together are at the bound"
    );
    let handles: Vec<String> = a[..4].iter().map(receipt_of).collect();
    let acked = v
        .ack_message(with_id(ack_req("A", "T", &handles), "c-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&acked.status), Code::Ok, "{acked:?}");
    assert!(acked.entries.iter().all(|e| code(&e.status) == Code::Ok), "{acked:?}");

    c.kill(leader);
    let next = c.leader().await;
    assert_ne!(next, leader);
    let mut v = client(&c, next).await;
    // A long poll: the new leader may not have applied the acks yet when it
    // is first asked (it looks again each second while the bound is met).
    let (s, b) = receive_as(&mut v, "c-1", receive_req("B", "T", 32, 5000)).await;
    assert_eq!((s, b.len()), (Code::Ok, 4), "A's acks made room for four");
    let (s, none) = receive_as(&mut v, "c-1", receive_req("A", "T", 32, 0)).await;
    assert_eq!((s, none.len()), (Code::MessageNotFound, 0), "full again");
    c.spawn(leader);
    c.check_alive();
}
