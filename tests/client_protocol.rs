//! `apache.rocketmq.v2` at the protocol level, with raftmq's generated
//! client against real broker processes: every refusal has its v2 status
//! code, malformed input never crashes a node, and the offset-based calls
//! are served by followers.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use common::v2::*;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;

#[tokio::test(flavor = "multi_thread")]
async fn status_codes_and_malformed_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, "async");
    let leader = cluster.leader().await;
    cluster.create_topic("T", 2, "").await;
    cluster.create_topic("F", 2, "FIFO").await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let mut c = client(&cluster, follower).await;

    // Routes: every node of the group is an endpoint of broker id 0.
    let r = c
        .query_route(v2::QueryRouteRequest {
            topic: resource("T"),
            endpoints: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    assert_eq!(r.message_queues.len(), 2);
    let b = r.message_queues[0].broker.as_ref().unwrap();
    assert_eq!((b.name.as_str(), b.id), ("test", 0));
    assert_eq!(b.endpoints.as_ref().unwrap().addresses.len(), 3);
    assert_eq!(
        r.message_queues[0].accept_message_types,
        vec![v2::MessageType::Normal as i32]
    );
    for (topic, want) in [
        ("Nope", Code::TopicNotFound),
        ("bad topic!", Code::IllegalTopic),
        ("", Code::IllegalTopic),
    ] {
        let r = c
            .query_route(v2::QueryRouteRequest {
                topic: resource(topic),
                endpoints: None,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.status), want, "{topic:?}");
    }

    // Sends: a batch lands in one queue at consecutive offsets.
    let r = send(
        &mut c,
        vec![msg("T", "id-1", b"a"), msg("T", "id-2", b"b"), msg("T", "id-3", b"c")],
    )
    .await;
    assert_eq!(code(&r.status), Code::Ok);
    assert_eq!(r.entries.len(), 3);
    assert_eq!(
        r.entries.iter().map(|e| e.message_id.as_str()).collect::<Vec<_>>(),
        ["id-1", "id-2", "id-3"]
    );
    assert_eq!(r.entries[1].offset, r.entries[0].offset + 1);
    // Each refusal with its code, and one entry per message.
    let mut big = msg("T", "id-big", &[]);
    big.body = vec![0u8; 600_000].into();
    let mut bad_tag = msg("T", "id-t", b"x");
    bad_tag.system_properties.as_mut().unwrap().tag = Some("a|b".into());
    let mut bad_key = msg("T", "id-k", b"x");
    bad_key.system_properties.as_mut().unwrap().keys = vec!["a b".into()];
    let mut reserved = msg("T", "id-p", b"x");
    reserved.user_properties.insert("__rmq.group".into(), "x".into());
    let mut fifo_to_normal = msg("T", "id-f", b"x");
    fifo_to_normal.system_properties.as_mut().unwrap().message_group = Some("g".into());
    fifo_to_normal.system_properties.as_mut().unwrap().message_type = v2::MessageType::Fifo as i32;
    let mut timed = msg("T", "id-d", b"x");
    timed.system_properties.as_mut().unwrap().delivery_timestamp = Some(prost_types::Timestamp {
        seconds: 4_000_000_000,
        nanos: 0,
    });
    let cases = [
        (big, Code::MessageBodyTooLarge),
        (msg("T", "id-e", b""), Code::MessageBodyEmpty),
        (bad_tag, Code::IllegalMessageTag),
        (bad_key, Code::IllegalMessageKey),
        (msg("T", "", b"x"), Code::IllegalMessageId),
        (reserved, Code::IllegalMessagePropertyKey),
        (fifo_to_normal, Code::MessagePropertyConflictWithType),
        // 2096: past the broker's 40-day limit.
        (timed, Code::IllegalDeliveryTime),
        (msg("Nope", "id-n", b"x"), Code::TopicNotFound),
        (msg("bad topic", "id-n", b"x"), Code::IllegalTopic),
        // Half and not-yet-due messages live there: no client may use it.
        (msg("RMQ_SYS_TRANS_HALF_TOPIC", "id-s", b"x"), Code::Forbidden),
        (msg("F", "id-nogroup", b"x"), Code::MessagePropertyConflictWithType),
    ];
    for (m, want) in cases {
        let r = send(&mut c, vec![m]).await;
        assert_eq!(code(&r.status), want);
        assert_eq!(r.entries.len(), 1);
        assert_eq!(code(&r.entries[0].status), want);
    }
    let r = send(&mut c, vec![]).await;
    assert_eq!(code(&r.status), Code::BadRequest);
    assert!(!r.entries.is_empty(), "clients index the first entry");

    // Ending an unknown transaction, recalling with a bad handle.
    let topic = Some(v2::Resource {
        resource_namespace: String::new(),
        name: "T".into(),
    });
    assert_eq!(
        commit(&mut c, "T", "id-1", "x1.999999.0").await,
        Code::InvalidTransactionId
    );
    // A handle in the right shape but not sealed by this group is refused
    // as garbage is.
    for (handle, want) in [
        ("garbage", Code::BadRequest),
        ("t2.1.999999.0.00000000000000000000000000000000.id-1", Code::BadRequest),
    ] {
        let r = c
            .recall_message(v2::RecallMessageRequest {
                topic: topic.clone(),
                recall_handle: handle.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.status), want, "{handle}");
    }

    // Receives: bad names, filters, durations.
    let (s, _) = receive(&mut c, "bad group!", "T", tags("*"), 10, 10).await;
    assert_eq!(s, Code::IllegalConsumerGroup);
    let (s, _) = receive(&mut c, "G", "T", tags("a ||"), 10, 10).await;
    assert_eq!(s, Code::IllegalFilterExpression);
    let sql = |e: &str| v2::FilterExpression {
        r#type: v2::FilterType::Sql as i32,
        expression: e.into(),
    };
    // A valid SQL92 filter is taken (nothing has property a); a bad one is
    // refused at once. A group of their own: a group's receive moves past
    // what its filter skips.
    let (s, _) = receive(&mut c, "GSql", "T", sql("a > 1"), 10, 10).await;
    assert_eq!(s, Code::MessageNotFound);
    let (s, _) = receive(&mut c, "GSql", "T", sql("a >"), 10, 10).await;
    assert_eq!(s, Code::IllegalFilterExpression);
    let (s, _) = receive(&mut c, "G", "T", tags("*"), 100_000, 10).await;
    assert_eq!(s, Code::IllegalInvisibleTime);
    // Below the broker's minimum (10 s by default) a message could reach a
    // second consumer while the first still works on it.
    let (s, _) = receive(&mut c, "G", "T", tags("*"), 1, 10).await;
    assert_eq!(s, Code::IllegalInvisibleTime);
    let (s, _) = receive(&mut c, "G", "Nope", tags("*"), 10, 10).await;
    assert_eq!(s, Code::TopicNotFound);

    // A receive gets the batch; a second one finds nothing.
    let (s, got) = receive(&mut c, "G", "T", tags("TagA"), 30, 1000).await;
    assert_eq!((s, got.len()), (Code::Ok, 3));
    let sp = got[0].system_properties.as_ref().unwrap();
    assert_eq!(sp.delivery_attempt, Some(1));
    assert_eq!(sp.body_digest.as_ref().unwrap().r#type, v2::DigestType::Md5 as i32);
    assert!(sp.receipt_handle.is_some() && sp.store_timestamp.is_some() && sp.queue_offset.is_some());
    let t0 = Instant::now();
    let (s, none) = receive(&mut c, "G", "T", tags("*"), 30, 300).await;
    assert_eq!((s, none.len()), (Code::MessageNotFound, 0));
    assert!(t0.elapsed() >= Duration::from_millis(250), "long polling waited");

    // Long polling wakes as soon as a message is applied.
    let mut c2 = client(&cluster, leader).await;
    let waiter = tokio::spawn(async move { receive(&mut c2, "G", "T", tags("*"), 30, 10_000).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    send(&mut c, vec![msg("T", "id-late", b"late")]).await;
    let (s, late) = waiter.await.unwrap();
    assert_eq!((s, late.len()), (Code::Ok, 1));
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "woke at once, not at the deadline"
    );

    // Acks: one entry per receipt; garbage and stale receipts are 40013.
    let receipt = |m: &v2::Message| m.system_properties.as_ref().unwrap().receipt_handle.clone().unwrap();
    let entry = |h: &str| v2::AckMessageEntry {
        message_id: "x".into(),
        receipt_handle: h.into(),
        lite_topic: None,
    };
    let r = c
        .ack_message(v2::AckMessageRequest {
            group: resource("G"),
            topic: resource("T"),
            entries: vec![entry(&receipt(&got[0])), entry("garbage"), entry(&"9".repeat(10_000))],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::MultipleResults);
    let codes: Vec<Code> = r.entries.iter().map(|e| code(&e.status)).collect();
    assert_eq!(
        codes,
        [Code::Ok, Code::InvalidReceiptHandle, Code::InvalidReceiptHandle]
    );
    let r = c
        .ack_message(v2::AckMessageRequest {
            group: resource("G"),
            topic: resource("T"),
            entries: vec![entry(&receipt(&got[0]))],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::InvalidReceiptHandle, "acked twice");

    // A change of invisibility returns a new receipt; the old one is stale.
    let change = |h: String| v2::ChangeInvisibleDurationRequest {
        group: resource("G"),
        topic: resource("T"),
        receipt_handle: h,
        invisible_duration: Some(prost_types::Duration { seconds: 20, nanos: 0 }),
        message_id: "x".into(),
        lite_topic: None,
        suspend: None,
    };
    let r = c
        .change_invisible_duration(change(receipt(&got[1])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    assert!(!r.receipt_handle.is_empty() && r.receipt_handle != receipt(&got[1]));
    let r2 = c
        .change_invisible_duration(change(receipt(&got[1])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r2.status), Code::InvalidReceiptHandle);
    let r3 = c
        .change_invisible_duration(change("1.2.3".into()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r3.status), Code::InvalidReceiptHandle);
    // Forward to the dead-letter queue by receipt.
    let f = c
        .forward_message_to_dead_letter_queue(v2::ForwardMessageToDeadLetterQueueRequest {
            group: resource("G"),
            topic: resource("T"),
            receipt_handle: r.receipt_handle.clone(),
            message_id: "x".into(),
            delivery_attempt: 1,
            max_delivery_attempts: 16,
            lite_topic: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&f.status), Code::Ok);
    let (s, dead) = receive(&mut c, "DlqReader", "%DLQ%G", tags("*"), 30, 2000).await;
    assert_eq!((s, dead.len()), (Code::Ok, 1));
    assert_eq!(
        dead[0].system_properties.as_ref().unwrap().message_id,
        got[1].system_properties.as_ref().unwrap().message_id
    );

    // Offsets: committed through Raft, read back from a follower.
    let mq = |id: i32| {
        Some(v2::MessageQueue {
            topic: resource("T"),
            id,
            ..Default::default()
        })
    };
    let queue = got[0].system_properties.as_ref().unwrap().queue_id;
    let end = c
        .query_offset(v2::QueryOffsetRequest {
            message_queue: mq(queue),
            query_offset_policy: v2::QueryOffsetPolicy::End as i32,
            timestamp: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&end.status), Code::Ok);
    assert!(end.offset >= 3);
    let at = c
        .query_offset(v2::QueryOffsetRequest {
            message_queue: mq(queue),
            query_offset_policy: v2::QueryOffsetPolicy::Timestamp as i32,
            timestamp: Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((code(&at.status), at.offset), (Code::Ok, 0));
    let r = c
        .get_offset(v2::GetOffsetRequest {
            group: resource("Puller"),
            message_queue: mq(queue),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::OffsetNotFound);
    let r = c
        .update_offset(v2::UpdateOffsetRequest {
            group: resource("Puller"),
            message_queue: mq(queue),
            offset: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    let r = c
        .update_offset(v2::UpdateOffsetRequest {
            group: resource("Puller"),
            message_queue: mq(99),
            offset: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::BadRequest);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .get_offset(v2::GetOffsetRequest {
                group: resource("Puller"),
                message_queue: mq(queue),
            })
            .await
            .unwrap()
            .into_inner();
        if code(&r.status) == Code::Ok {
            assert_eq!(r.offset, 2);
            break;
        }
        assert!(Instant::now() < deadline, "the follower never applied the offset");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Pull from the follower.
    let mut s = c
        .pull_message(v2::PullMessageRequest {
            group: resource("Puller"),
            message_queue: mq(queue),
            offset: 0,
            batch_size: 10,
            filter_expression: Some(tags("*")),
            long_polling_timeout: None,
        })
        .await
        .unwrap()
        .into_inner();
    let (mut pulled, mut next) = (0, -1);
    while let Some(r) = s.message().await.unwrap() {
        match r.content {
            Some(v2::pull_message_response::Content::Message(_)) => pulled += 1,
            Some(v2::pull_message_response::Content::NextOffset(n)) => next = n,
            _ => {}
        }
    }
    assert!(pulled >= 3 && next == end.offset, "pulled {pulled}, next {next}");

    // Unknown and garbage headers do not matter; Heartbeat and goodbye.
    let mut req = tonic::Request::new(v2::HeartbeatRequest {
        group: resource("G"),
        client_type: v2::ClientType::SimpleConsumer as i32,
    });
    req.metadata_mut()
        .insert("authorization", "!!! not a signature".parse().unwrap());
    req.metadata_mut().insert("x-mq-client-id", "client-1".parse().unwrap());
    let r = c.heartbeat(req).await.unwrap().into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    let r = c
        .notify_client_termination(v2::NotifyClientTerminationRequest { group: resource("G") })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    cluster.check_alive();
}

#[tokio::test(flavor = "multi_thread")]
async fn telemetry_answers_settings() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 1, "async");
    cluster.leader().await;
    let mut c = client(&cluster, 1).await;
    // A stream without a client id is refused before it opens.
    let (_, rx) = tokio::sync::mpsc::channel(1);
    let refused = c.telemetry(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut open = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    open.metadata_mut()
        .insert("x-mq-client-id", "telemetry-client".parse().unwrap());
    let mut replies = c.telemetry(open).await.unwrap().into_inner();
    let settings = |pub_sub| v2::TelemetryCommand {
        status: None,
        command: Some(v2::telemetry_command::Command::Settings(v2::Settings {
            client_type: Some(v2::ClientType::Producer as i32),
            pub_sub: Some(pub_sub),
            ..Default::default()
        })),
    };
    tx.send(settings(v2::settings::PubSub::Publishing(v2::Publishing::default())))
        .await
        .unwrap();
    let r = replies.message().await.unwrap().unwrap();
    assert_eq!(code(&r.status), Code::Ok);
    let Some(v2::telemetry_command::Command::Settings(s)) = r.command else {
        panic!("no settings")
    };
    let Some(v2::settings::PubSub::Publishing(p)) = s.pub_sub else {
        panic!("no publishing")
    };
    assert_eq!(p.max_body_size, 524_288);
    assert!(s.backoff_policy.unwrap().max_attempts > 1);
    assert!(!s.metric.unwrap().on);
    tx.send(settings(v2::settings::PubSub::Subscription(v2::Subscription {
        group: resource("G"),
        ..Default::default()
    })))
    .await
    .unwrap();
    let r = replies.message().await.unwrap().unwrap();
    let Some(v2::telemetry_command::Command::Settings(s)) = r.command else {
        panic!("no settings")
    };
    let Some(v2::settings::PubSub::Subscription(sub)) = s.pub_sub else {
        panic!("no subscription")
    };
    assert_eq!(sub.fifo, Some(false));
    assert!(sub.long_polling_timeout.is_some() && sub.receive_batch_size.is_some());
    assert_eq!(s.backoff_policy.unwrap().max_attempts, 16);
}
