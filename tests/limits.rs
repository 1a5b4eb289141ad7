//! The `[limits]` bounds a client meets one by one, on a live one-node
//! group (a real broker process on 127.0.0.1): topics, clients, waiting
//! receives, streams per connection, committed offsets and the
//! idle-connection timeout. Each is reached, its refusal checked (code and
//! message), and then the node must still serve a normal send and receive. The hostile-input review's
//! findings have their own test (`hostile.rs`).

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use common::v2::*;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIG: &str = "auto_create_topics = true\nauto_create_topic_queues = 2\n[limits]\nmax_topics = 3\nmax_clients = 4\n\
                      max_consumer_positions = 3\n\
                      max_long_polls = 5\nmax_long_polls_per_client = 2\nmax_streams_per_connection = 4\n\
                      idle_connection_timeout_ms = 1500\n";

/// A producer of `id` says hello; the answer's code.
async fn hello(
    v: &mut v2::messaging_service_client::MessagingServiceClient<tonic::transport::Channel>,
    id: &str,
) -> Code {
    code(&v.heartbeat(with_id(heartbeat(), id)).await.unwrap().into_inner().status)
}

fn route_req(topic: &str, id: &str) -> tonic::Request<v2::QueryRouteRequest> {
    with_id(
        v2::QueryRouteRequest {
            topic: resource(topic),
            endpoints: None,
        },
        id,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn each_limit_refuses_the_one_past_it_and_the_node_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 1, "async", CONFIG);
    let node = c.leader().await;
    let mut v = client(&c, node).await;

    // max_topics = 3: two made by the admin, one on a client's first route
    // query; a fourth is refused either way, and the three keep working.
    c.create_topic("T", 1, "").await;
    c.create_topic("T2", 1, "").await;
    let r = v.query_route(route_req("T3", "c-1")).await.unwrap().into_inner();
    assert_eq!(code(&r.status), Code::Ok, "made on first use: {r:?}");
    let e = c
        .client(node)
        .await
        .put_topic(common::topic_request("T4", 1, ""))
        .await
        .unwrap_err();
    assert!(e.message().contains("limits.max_topics"), "{e}");
    let r = v.query_route(route_req("T5", "c-1")).await.unwrap().into_inner();
    assert_eq!(code(&r.status), Code::Forbidden, "{r:?}");
    assert!(r.status.unwrap().message.contains("limits.max_topics"));
    let r = v.query_route(route_req("T3", "c-1")).await.unwrap().into_inner();
    assert_eq!((code(&r.status), r.message_queues.len()), (Code::Ok, 2), "{r:?}");

    // Waiting receives: two per client, five on the node. Each waits 3 s
    // on an empty topic; one past either bound is answered at once.
    for id in ["c-1", "c-2", "c-3"] {
        assert_eq!(hello(&mut v, id).await, Code::Ok);
    }
    // (Each on its own connection here: streams per connection come next.)
    let wait = |id: &'static str, mut v: v2::messaging_service_client::MessagingServiceClient<_>| {
        tokio::spawn(async move { receive_as(&mut v, id, receive_req("G", "T", 1, 3000)).await.0 })
    };
    let mut polls = Vec::new();
    for id in ["c-1", "c-1", "c-2", "c-2"] {
        polls.push(wait(id, client(&c, node).await));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let (third, _) = receive_as(&mut v, "c-1", receive_req("G", "T", 1, 3000)).await;
    assert_eq!(third, Code::TooManyRequests, "a client's third waiting receive");
    polls.push(wait("c-3", client(&c, node).await));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (sixth, _) = receive_as(&mut v, "c-3", receive_req("G", "T", 1, 3000)).await;
    assert_eq!(sixth, Code::TooManyRequests, "the node's sixth waiting receive");
    assert!(started.elapsed() < Duration::from_secs(2), "refusals are at once");
    for p in polls {
        assert_eq!(p.await.unwrap(), Code::MessageNotFound, "the admitted ones waited out");
    }

    // max_streams_per_connection = 4: with four receives waiting on one
    // connection, a fifth call on it waits for one of them to end, while
    // the same call on another connection is answered at once.
    let shared = client(&c, node).await;
    let polls: Vec<_> = ["c-1", "c-1", "c-2", "c-2"]
        .into_iter()
        .map(|id| wait(id, shared.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    assert_eq!(hello(&mut client(&c, node).await, "c-3").await, Code::Ok);
    let elsewhere = started.elapsed();
    assert_eq!(hello(&mut shared.clone(), "c-3").await, Code::Ok);
    let behind = started.elapsed();
    assert!(
        behind >= Duration::from_millis(1500) && elsewhere < Duration::from_secs(1),
        "a fifth stream on the connection waited {behind:?} (another connection: {elsewhere:?})"
    );
    for p in polls {
        assert_eq!(p.await.unwrap(), Code::MessageNotFound);
    }

    // max_clients = 4: c-1 to c-3 are known; a fourth id is taken, a fifth
    // refused while they live, and a known one still served.
    assert_eq!(hello(&mut v, "c-4").await, Code::Ok);
    assert_eq!(hello(&mut v, "c-5").await, Code::TooManyRequests);
    assert_eq!(hello(&mut v, "c-2").await, Code::Ok);

    // max_consumer_positions = 3: G commits in T, T2 and T3's first queue;
    // an offset in T3's second is refused, while a kept one still moves.
    let commit = |topic: &str, id: i32, offset: i64| {
        let mut v = v.clone();
        let req = v2::UpdateOffsetRequest {
            group: resource("G"),
            message_queue: Some(v2::MessageQueue {
                topic: resource(topic),
                id,
                ..Default::default()
            }),
            offset,
        };
        async move {
            let s = v.update_offset(req).await.unwrap().into_inner().status;
            (code(&s), s.map(|s| s.message).unwrap_or_default())
        }
    };
    for topic in ["T", "T2", "T3"] {
        assert_eq!(commit(topic, 0, 1).await.0, Code::Ok, "{topic}");
    }
    let (refused, why) = commit("T3", 1, 1).await;
    assert_eq!(refused, Code::Forbidden, "a fourth offset: {why}");
    assert!(why.contains("limits.max_consumer_positions"), "{why}");
    assert_eq!(commit("T", 0, 7).await.0, Code::Ok, "a kept offset moves");

    // idle_connection_timeout_ms = 1500: a connection that says its
    // preface and settings and then nothing is closed; one whose call
    // lasts longer (the 3 s receive above ran on `shared`) is not.
    let started = Instant::now();
    let mut raw = tokio::net::TcpStream::connect(&c.node(node).client_addr).await.unwrap();
    raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("an idle connection is closed");
    assert!(
        closed >= Duration::from_millis(1400),
        "closed after {closed:?}, before the timeout"
    );
    eprintln!("an idle connection was closed after {closed:?}");

    // Still whole: a send, and its receive (by a known client).
    send_ok(&mut v, "T", "after", 1).await;
    let (s, got) = receive_as(&mut v, "c-1", receive_req("G", "T", 1, 1000)).await;
    assert_eq!((s, got.len()), (Code::Ok, 1));

    // max_consumer_positions = 3 bounds receive positions too: each new
    // group's receive from T's one queue takes one; past the bound the
    // receive is refused with a reason, not answered with silence, and a
    // group that has its position is still served.
    send_ok(&mut v, "T", "more", 1).await;
    let mut refused = None;
    for g in 0..4 {
        let (s, _) = receive_as(&mut v, "c-1", receive_req(&format!("R{g}"), "T", 1, 1000)).await;
        if s != Code::Ok {
            refused = Some((g, s));
            break;
        }
    }
    let (g, s) = refused.expect("a receive past the bound of positions is refused");
    assert_eq!(s, Code::Forbidden, "group R{g}");
    let (s, got) = receive_as(&mut v, "c-1", receive_req("G", "T", 1, 1000)).await;
    assert_eq!((s, got.len()), (Code::Ok, 1), "G has its position");
    c.check_alive();
}
