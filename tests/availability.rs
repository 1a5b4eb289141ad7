//! Availability as a client sees it: a node that cannot reach a leader
//! answers a retryable `UNAVAILABLE` within about an election timeout, not
//! at the client's deadline, so the client tries another node instead of
//! waiting out its whole call time. Real broker processes on 127.0.0.1.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, message};
use raftmq::proto::pb;
use tonic::Code;

/// A client's call time: the errors below must come well before it.
const CLIENT_DEADLINE: Duration = Duration::from_secs(4);

async fn send(c: &Cluster, via: u64, i: u64) -> (Result<(), tonic::Status>, Duration) {
    let mut client = c.client(via).await;
    let mut req = tonic::Request::new(pb::SendRequest {
        topic: "T".into(),
        queue_id: 0,
        messages: vec![message(i)],
    });
    req.set_timeout(CLIENT_DEADLINE);
    let started = Instant::now();
    let r = client.send(req).await.map(|_| ());
    (r, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_left_without_a_majority_says_unavailable_before_the_client_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    c.create_topic("T", 1, "").await;
    let leader = c.leader().await;
    let (ok, _) = send(&c, leader, 0).await;
    ok.unwrap();

    // The leader and one follower die: the last node can never elect one.
    let last = (1..=3).find(|&n| n != leader).unwrap();
    for n in (1..=3).filter(|&n| n != last) {
        c.kill(n);
    }
    for i in 1..=3 {
        let (r, took) = send(&c, last, i).await;
        let s = r.expect_err("a lone node cannot commit");
        eprintln!(
            "send {i} to the lone node: {:?} after {took:?}: {}",
            s.code(),
            s.message()
        );
        assert_eq!(
            s.code(),
            Code::Unavailable,
            "a retryable answer, not the client's deadline: {s:?} after {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_to_a_paused_leader_is_given_up_once_the_followers_elect_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    c.create_topic("T", 1, "").await;
    let leader = c.leader().await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    send(&c, follower, 0).await.0.unwrap();

    // SIGSTOP: its connections stay open, it answers nothing.
    let pid = c.node(leader).child.as_ref().unwrap().id() as i32;
    // SAFETY: plain syscall on a child we own.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let mut answers = Vec::new();
    let mut i = 1;
    let until = Instant::now() + Duration::from_secs(8);
    let sent = loop {
        let (r, took) = send(&c, follower, i).await;
        i += 1;
        eprintln!(
            "send {i} via follower {follower}: {:?} after {took:?}",
            r.as_ref().map_err(|s| s.code())
        );
        match r {
            Ok(()) => break true,
            Err(s) => {
                // Aborted: the forward was given up, its outcome unknown;
                // Unavailable: no leader yet. Either is retryable.
                assert!(
                    matches!(s.code(), Code::Aborted | Code::Unavailable),
                    "the follower held the call until the client gave up: {s:?}"
                );
                answers.push(s.code());
            }
        }
        if Instant::now() > until {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(sent, "no send went through a new leader within 8 s: {answers:?}");
}
