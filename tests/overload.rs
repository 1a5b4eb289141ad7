//! Overload: a real three-node group (processes on 127.0.0.1) with small
//! `[limits]` is flooded through every node at once, by many senders and
//! consumers, far past what the bounds let in. What must hold:
//!
//! - every answer is a success or a code the official clients retry
//!   (`TOO_MANY_REQUESTS`, or an unavailable leader), never a broken
//!   connection or a call left waiting to its deadline;
//! - a refused send stored nothing, every acknowledged one is at its offset
//!   on every node, and the replicas' logs are identical;
//! - the nodes stayed up and below a memory bound;
//! - once the flood stops, a plain client is served at once.
//!
//! `benches/overload.sh` drives ten times the sustainable load for 30 s and
//! prints the figures (p99, recovery second by second); this is the check
//! that runs with every test, small enough for CI.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::v2::*;
use common::{Cluster, read_queue, still_whole};
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use tonic::transport::Channel;

/// Few places, so that the flood is many times what is let in at once.
const LIMITS: &str = "[limits]\nmax_inflight_sends = 4\nmax_queued_sends = 8\nmax_send_queue_wait_ms = 300\n\
                      max_long_polls = 4\nmax_long_polls_per_client = 1\n";
const SENDERS_PER_NODE: u64 = 16;
const CONSUMERS_PER_NODE: u64 = 6;
/// How long the flood lasts, and the most sends one sender makes in it.
const FLOOD: Duration = Duration::from_secs(6);
const SENDS_EACH: u64 = 400;
/// An answer later than this means a request was queued without bound.
const CALL_DEADLINE: Duration = Duration::from_secs(20);
/// Message ids of the flood start here (`still_whole` uses 1,000,000 up).
const FIRST_ID: u64 = 10_000_000;

/// The codes an official client retries: overload, or no leader for now
/// (a definite refusal either way: nothing was stored).
fn retryable_refusal(c: Code) -> bool {
    matches!(c, Code::TooManyRequests | Code::HaNotAvailable)
}

/// Retryable too, but of unknown outcome: a forward that lost its leader.
fn unknown(c: Code) -> bool {
    c == Code::ProxyTimeout
}

#[derive(Default)]
struct Sends {
    /// (offset, message number, how long the send took)
    acked: Vec<(u64, u64, Duration)>,
    refused: Vec<(u64, Code)>,
    /// Answered "outcome unknown" (a leader change under the flood).
    unknown: Vec<u64>,
}

async fn sender(mut v: MessagingServiceClient<Channel>, who: String, first: u64, end: Instant) -> Sends {
    let mut out = Sends::default();
    for i in first..first + SENDS_EACH {
        if Instant::now() >= end {
            break;
        }
        let req = v2::SendMessageRequest {
            messages: vec![msg("T", &format!("msg-{i}"), &[b'o'; 512])],
        };
        let started = Instant::now();
        let r = tokio::time::timeout(CALL_DEADLINE, v.send_message(with_id(req, &who)))
            .await
            .unwrap_or_else(|_| panic!("send {i} by {who}: no answer within {CALL_DEADLINE:?}"))
            .unwrap_or_else(|e| panic!("send {i} by {who}: {e}"))
            .into_inner();
        match code(&r.status) {
            Code::Ok => out.acked.push((r.entries[0].offset as u64, i, started.elapsed())),
            c if unknown(c) => out.unknown.push(i),
            c if retryable_refusal(c) => {
                out.refused.push((i, c));
                // As the official clients do: back off a little.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c => panic!("send {i} by {who}: {c:?} {:?}", r.status),
        }
    }
    out
}

/// Receives and acks until `end`; the message ids received, and each
/// answer's code.
async fn consumer(mut v: MessagingServiceClient<Channel>, who: String, end: Instant) -> (Vec<String>, Vec<Code>) {
    let (mut ids, mut codes) = (Vec::new(), Vec::new());
    while Instant::now() < end {
        let (c, messages) =
            tokio::time::timeout(CALL_DEADLINE, receive_as(&mut v, &who, receive_req("G", "T", 16, 500)))
                .await
                .unwrap_or_else(|_| panic!("receive by {who}: no answer within {CALL_DEADLINE:?}"));
        codes.push(c);
        match c {
            Code::Ok => {}
            Code::MessageNotFound => continue,
            c if retryable_refusal(c) || unknown(c) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            c => panic!("receive by {who}: {c:?}"),
        }
        let handles: Vec<String> = messages.iter().map(receipt_of).collect();
        ids.extend(
            messages
                .iter()
                .map(|m| m.system_properties.as_ref().unwrap().message_id.clone()),
        );
        let r = v
            .ack_message(with_id(ack_req("G", "T", &handles), &who))
            .await
            .unwrap()
            .into_inner();
        let c = code(&r.status);
        assert!(
            c == Code::Ok || retryable_refusal(c) || unknown(c),
            "ack by {who}: {r:?}"
        );
    }
    (ids, codes)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * p).round() as usize],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_through_every_node_is_refused_retryably_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", LIMITS);
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    let term_before = c.status(leader, false).await.unwrap().term;

    let end = Instant::now() + FLOOD;
    let mut senders = Vec::new();
    let mut consumers = Vec::new();
    for node in 1..=3u64 {
        for k in 0..SENDERS_PER_NODE {
            // A connection of its own, as separate applications have.
            let v = client(&c, node).await;
            let n = (node - 1) * SENDERS_PER_NODE + k;
            senders.push(tokio::spawn(sender(
                v,
                format!("sender-{n}"),
                FIRST_ID + n * SENDS_EACH,
                end,
            )));
        }
        for k in 0..CONSUMERS_PER_NODE {
            let v = client(&c, node).await;
            consumers.push(tokio::spawn(consumer(v, format!("consumer-{node}-{k}"), end)));
        }
    }
    let mut sends = Sends::default();
    for s in senders {
        let s = s.await.unwrap();
        sends.acked.extend(s.acked);
        sends.refused.extend(s.refused);
        sends.unknown.extend(s.unknown);
    }
    let mut received = Vec::new();
    let mut receive_codes: BTreeMap<String, usize> = BTreeMap::new();
    for h in consumers {
        let (ids, codes) = h.await.unwrap();
        received.extend(ids);
        for c in codes {
            *receive_codes.entry(format!("{c:?}")).or_default() += 1;
        }
    }
    let mut term_after = 0;
    for node in 1..=3 {
        term_after = term_after.max(c.status(node, false).await.map_or(0, |s| s.term));
    }
    let mut took: Vec<Duration> = sends.acked.iter().map(|a| a.2).collect();
    took.sort();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    for (_, c) in &sends.refused {
        *refusals.entry(format!("{c:?}")).or_default() += 1;
    }
    eprintln!(
        "sends: {} acknowledged (p50 {:?}, p99 {:?}, max {:?}), refused {refusals:?}, {} unknown; \
         receives {receive_codes:?}, {} messages; the term went from {term_before} to {term_after}",
        sends.acked.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().copied().unwrap_or_default(),
        sends.unknown.len(),
        received.len(),
    );
    assert!(
        refusals.get("TooManyRequests").copied().unwrap_or(0) > 0,
        "{} senders on {} places: the flood must meet the bound",
        3 * SENDERS_PER_NODE,
        4
    );
    assert!(sends.acked.len() >= 100, "admitted sends must go on under the flood");
    // A send let in waits at most max_send_queue_wait_ms for its proposal,
    // then a commit: far below this unless something queued without bound.
    assert!(
        percentile(&took, 0.99) < Duration::from_secs(5),
        "p99 of admitted sends"
    );
    assert!(!received.is_empty(), "consumers must be served under the flood");

    // Each acknowledged send has an offset of its own...
    let mut acked = BTreeMap::new();
    for &(offset, i, _) in &sends.acked {
        assert_eq!(
            acked.insert((0, offset), i),
            None,
            "two acknowledged sends at offset {offset}"
        );
    }
    // ...and is there on every node, whose logs are identical; the nodes
    // are up, small, and take a new send.
    still_whole(&mut c, &mut acked, "the flood").await;
    // Nothing refused was stored, and consumers got only what was stored.
    let stored: BTreeSet<String> = read_queue(&c, 1, 0).await.into_values().collect();
    for (i, code) in &sends.refused {
        assert!(
            !stored.contains(&format!("msg-{i}")),
            "send {i} was refused ({code:?}) but stored"
        );
    }
    for id in &received {
        assert!(stored.contains(id), "{id} was received but is not stored");
    }

    // Once the flood stops, every node serves a plain client at once.
    for node in 1..=3u64 {
        let mut v = client(&c, node).await;
        for j in 0..20 {
            let r = send(&mut v, vec![msg("T", &format!("after-{node}-{j}"), b"x")]).await;
            assert_eq!(
                code(&r.status),
                Code::Ok,
                "send {j} through node {node} after the flood: {r:?}"
            );
        }
        let (s, _) = receive_as(&mut v, &format!("after-{node}"), receive_req("G", "T", 4, 0)).await;
        assert!(
            matches!(s, Code::Ok | Code::MessageNotFound),
            "receive on node {node}: {s:?}"
        );
    }
    c.check_alive();
}
