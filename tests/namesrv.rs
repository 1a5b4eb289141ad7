//! NameServers and a three-node group, all real processes on 127.0.0.1,
//! with shrunk intervals: 200 ms heartbeats, 100 ms scans.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Namesrv};
use raftmq::proto::pb;

fn broker_extra(namesrvs: &[&Namesrv]) -> String {
    let addrs: Vec<String> = namesrvs.iter().map(|n| format!("\"{}\"", n.addr)).collect();
    format!(
        "cluster = \"test\"\nnamesrv_addrs = [{}]\nnamesrv_heartbeat_interval_ms = 200\n",
        addrs.join(", ")
    )
}

/// Polls `n`'s route for T until `cond` holds; returns the route.
async fn route_until(n: &Namesrv, cond: impl Fn(&pb::RouteResponse) -> bool, within: Duration) -> pb::RouteResponse {
    let deadline = Instant::now() + within;
    let mut client = n.client().await;
    loop {
        if let Ok(r) = client.get_route(pb::RouteRequest { topic: "T".into() }).await {
            let r = r.into_inner();
            if cond(&r) {
                return r;
            }
        }
        assert!(Instant::now() < deadline, "route condition not met within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the NameServer knows 3 nodes, one of them the leader.
async fn wait_registered(n: &Namesrv) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = n
            .client()
            .await
            .get_cluster_info(pb::ClusterInfoRequest {})
            .await
            .map(|r| r.into_inner());
        if let Ok(info) = info
            && info.nodes.len() == 3
            && info.nodes.iter().any(|x| x.role == "leader")
        {
            return;
        }
        assert!(Instant::now() < deadline, "the group never fully registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn node_count(n: &Namesrv) -> usize {
    n.client()
        .await
        .get_cluster_info(pb::ClusterInfoRequest {})
        .await
        .map(|r| r.into_inner().nodes.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nameservers_route_to_the_leader_and_follow_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        Namesrv::start(dir.path(), "ns1", 1000),
        Namesrv::start(dir.path(), "ns2", 1000),
    );
    let mut c = Cluster::start_with(dir.path(), 3, "async", &broker_extra(&[&a, &b]));
    let leader = c.leader().await;
    c.create_topic("T", 4, "").await;
    let full = |r: &pb::RouteResponse| r.groups.len() == 1 && r.groups[0].nodes.len() == 3;
    let ra = route_until(
        &a,
        |r| full(r) && r.groups[0].leader_id == Some(leader),
        Duration::from_secs(10),
    )
    .await;
    let rb = route_until(
        &b,
        |r| full(r) && r.groups[0].leader_id == Some(leader),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(ra.groups[0].queues, rb.groups[0].queues);
    assert_eq!(ra.groups[0].queues.as_ref().unwrap().write_queues, 4);
    assert_eq!(ra.groups[0].nodes, rb.groups[0].nodes);

    // Kill the leader: the new one is in the route long before the dead
    // node could have expired (it heartbeats at once on becoming leader),
    // and the dead node leaves once 1 s has passed since its last heartbeat.
    c.kill(leader);
    let killed_at = Instant::now();
    let new = c.leader().await;
    let elected_at = Instant::now();
    route_until(&a, |r| r.groups[0].leader_id == Some(new), Duration::from_millis(900)).await;
    let seen_after_election = elected_at.elapsed();
    assert!(
        seen_after_election < Duration::from_millis(500),
        "{seen_after_election:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while node_count(&a).await != 2 {
        assert!(Instant::now() < deadline, "the dead node never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its expiry counts from its last heartbeat, which may have gone out
    // up to one 200 ms interval before the kill.
    let gone_after = killed_at.elapsed();
    assert!(
        gone_after >= Duration::from_millis(1000 - 200),
        "dropped before its expiry: {gone_after:?}"
    );

    // A restarted NameServer relearns the group within about one heartbeat.
    let mut b = b;
    b.kill();
    b.spawn();
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(5);
    while node_count(&b).await != 2 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let relearned = restarted.elapsed();
    // Process start-up plus one 200 ms heartbeat interval.
    assert!(relearned < Duration::from_secs(2), "{relearned:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_unregisters_at_once_and_stale_claims_lose() {
    let dir = tempfile::tempdir().unwrap();
    let ns = Namesrv::start(dir.path(), "ns", 60_000);
    let mut c = Cluster::start_with(dir.path(), 3, "async", &broker_extra(&[&ns]));
    let leader = c.leader().await;
    c.create_topic("T", 4, "").await;
    wait_registered(&ns).await;
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    assert!(c.stop(follower).success());
    let stopped = Instant::now();
    while node_count(&ns).await != 2 {
        assert!(
            stopped.elapsed() < Duration::from_secs(2),
            "a clean stop must unregister, not wait 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A stale leadership claim (lower term) from a "cut-off old leader"
    // does not replace the current leader.
    let mut client = ns.client().await;
    let route = route_until(&ns, |r| r.groups[0].leader_id == Some(leader), Duration::from_secs(5)).await;
    let term = route.groups[0].leader_term;
    let old = route.groups[0]
        .nodes
        .iter()
        .find(|n| n.node_id != leader)
        .unwrap()
        .clone();
    client
        .heartbeat(pb::BrokerHeartbeat {
            cluster: "test".into(),
            group: "test".into(),
            node_id: old.node_id,
            role: "leader".into(),
            term: term.saturating_sub(1),
            client_addr: old.client_addr.clone(),
            raft_addr: old.raft_addr.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let r = route_until(&ns, |_| true, Duration::from_secs(1)).await;
    assert_eq!(r.groups[0].leader_id, Some(leader));

    // Bad input.
    let e = client
        .get_route(pb::RouteRequest { topic: "Nope".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let e = client
        .get_route(pb::RouteRequest {
            topic: "bad topic".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(
        e.message().contains("127 characters"),
        "the rule is in the message: {e}"
    );
    let e = client.heartbeat(pb::BrokerHeartbeat::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");

    // A forged heartbeat claiming the topic with 2^32 - 1 queues (it once
    // made every broker answering the route allocate billions of queues) is
    // refused, and the real route is unchanged.
    let forged = pb::BrokerHeartbeat {
        cluster: "forged".into(),
        group: "forged".into(),
        node_id: 1,
        role: "leader".into(),
        term: 99,
        client_addr: "127.0.0.1:1".into(),
        raft_addr: "127.0.0.1:2".into(),
        topics: vec![pb::TopicData {
            name: "T".into(),
            read_queues: u32::MAX,
            write_queues: u32::MAX,
            perm: 6,
            message_type: String::new(),
        }],
        ..Default::default()
    };
    let e = client.heartbeat(forged.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("at most 1024"), "{e}");
    let mut bad_perm = forged.clone();
    bad_perm.topics[0].read_queues = 1;
    bad_perm.topics[0].write_queues = 1;
    bad_perm.topics[0].perm = 0xff;
    let e = client.heartbeat(bad_perm).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let r = route_until(&ns, |_| true, Duration::from_secs(1)).await;
    assert!(r.groups.iter().all(|g| g.group != "forged"), "{r:?}");

    // A well-formed heartbeat that claims a live node of the real group,
    // at other addresses and with a higher term, would point clients at
    // the forger: refused while the node's entry lives.
    let real = &r.groups[0];
    let leader_before = real.leader_id;
    let mut hijack = forged.clone();
    hijack.cluster = real.cluster.clone();
    hijack.group = real.group.clone();
    hijack.node_id = real.nodes[0].node_id;
    hijack.topics[0].read_queues = 1;
    hijack.topics[0].write_queues = 1;
    let e = client.heartbeat(hijack).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("registered at"), "{e}");
    let r = route_until(&ns, |_| true, Duration::from_secs(1)).await;
    assert_eq!(r.groups[0].leader_id, leader_before);
    assert!(
        r.groups[0].nodes.iter().all(|n| n.client_addr != "127.0.0.1:1"),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_works_through_the_nameserver() {
    let dir = tempfile::tempdir().unwrap();
    let ns = Namesrv::start(dir.path(), "ns", 60_000);
    let mut c = Cluster::start_with(dir.path(), 3, "async", &broker_extra(&[&ns]));
    c.leader().await;
    let run = common::raftmq_cli;
    let nsa = ns.addr.as_str();
    wait_registered(&ns).await;
    let (ok, out, err) = run(&["cluster", "status", "--namesrv", nsa, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for key in [
        "cluster",
        "group",
        "node_id",
        "role",
        "term",
        "client_addr",
        "raft_addr",
        "commit_index",
        "applied_index",
        "pid",
        "reachable",
        "reported_role",
        "last_heartbeat_at_ms",
        "last_heartbeat_age_ms",
        "is_group_leader",
    ] {
        assert!(nodes[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(nodes.iter().filter(|n| n["role"] == "leader").count(), 1);
    let (ok, out, err) = run(&["cluster", "status", "--namesrv", &format!("127.0.0.1:1,{nsa}")]);
    assert!(
        ok && out.contains("leader"),
        "a dead first NameServer is skipped: {out}{err}"
    );

    let (ok, out, err) = run(&[
        "topic",
        "create",
        "--namesrv",
        nsa,
        "--topic",
        "Orders",
        "--queues",
        "3",
    ]);
    assert!(ok && out.contains("Orders"), "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (ok, out, _) = run(&["topic", "route", "--namesrv", nsa, "--topic", "Orders", "--json"]);
        if ok && out.contains("\"write_queues\": 3") {
            break;
        }
        assert!(Instant::now() < deadline, "route never showed the topic: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, out, _) = run(&["topic", "list", "--namesrv", nsa]);
    assert!(ok && out.lines().any(|l| l == "Orders"), "{out}");
    let (ok, _, err) = run(&["topic", "delete", "--namesrv", nsa, "--topic", "Orders"]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["topic", "create", "--namesrv", nsa, "--topic", "bad/name"]);
    assert!(
        !ok && err.contains("127 characters") && err.trim().lines().count() == 1,
        "{err}"
    );
    let (ok, _, err) = run(&["cluster", "status", "--namesrv", "127.0.0.1:1"]);
    assert!(!ok && err.contains("no NameServer answered"), "{err}");
}
