//! Every `raftmq` admin command against a NameServer and a three-node group
//! of real processes, and what bad arguments get: one line, a non-zero exit,
//! never a backtrace.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Namesrv, raftmq_cli, raftmq_cli_ok as ok};
use raftmq::proto::rocketmq::v2;

/// Runs `raftmq args`, which must fail saying `says`.
fn refused(args: &[&str], says: &str) {
    let (ok, out, err) = raftmq_cli(args);
    assert!(!ok, "raftmq {args:?} succeeded: {out}");
    assert!(err.contains(says), "raftmq {args:?}: {err}");
}

/// A NameServer and a three-node group `test` registered with it (every
/// 200 ms), with a leader; and the group's nodes as one access point list.
async fn start(dir: &std::path::Path) -> (Namesrv, Cluster, String) {
    let ns = Namesrv::start(dir, "ns", 120_000);
    let extra = format!(
        "namesrv_addrs = [\"{}\"]\nnamesrv_heartbeat_interval_ms = 200\n",
        ns.addr
    );
    let mut cluster = Cluster::start_with(dir, 3, "async", &extra);
    cluster.leader().await;
    let access: Vec<String> = cluster.nodes.iter().map(|n| n.client_addr.clone()).collect();
    (ns, cluster, access.join(";"))
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_commands_against_a_real_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, mut cluster, access) = start(dir.path()).await;
    let n = ns.addr.as_str();

    ok(&["topic", "create", "--namesrv", n, "--topic", "Cli", "--queues", "2"]);
    let out = ok(&[
        "group",
        "create",
        "--namesrv",
        n,
        "--group",
        "Orders",
        "--fifo",
        "--max-attempts",
        "5",
    ]);
    assert!(out.contains("FIFO") && out.contains("at most 5"), "{out}");
    let out = ok(&["group", "list", "--namesrv", n]);
    assert!(
        out.lines()
            .any(|l| l.contains("Orders") && l.contains("FIFO") && l.contains('5')),
        "{out}"
    );
    let out = ok(&[
        "group",
        "update",
        "--namesrv",
        n,
        "--group",
        "Orders",
        "--max-attempts",
        "7",
    ]);
    assert!(
        out.contains("FIFO, at most 5 deliveries -> FIFO, at most 7 deliveries"),
        "an update says what changed: {out}"
    );
    let out = ok(&["group", "list", "--namesrv", n]);
    // Only what was given changed: still FIFO.
    assert!(
        out.lines()
            .any(|l| l.contains("Orders") && l.contains("FIFO") && l.contains('7')),
        "{out}"
    );
    refused(
        &[
            "group",
            "update",
            "--namesrv",
            n,
            "--group",
            "NoSuchGroup",
            "--fifo",
            "true",
        ],
        "no such consumer group: NoSuchGroup",
    );

    // A topic update changes only what it is given, and says what it did;
    // creating a topic that exists is refused.
    ok(&[
        "topic",
        "create",
        "--namesrv",
        n,
        "--topic",
        "Upd",
        "--queues",
        "4",
        "--message-type",
        "DELAY",
    ]);
    let out = ok(&["topic", "update", "--namesrv", n, "--topic", "Upd", "--perm", "4"]);
    assert!(
        out.contains("perm 6 -> 4") && out.contains("queues 4") && out.contains("message type DELAY"),
        "{out}"
    );
    let (done, _, err) = raftmq_cli(&["topic", "create", "--namesrv", n, "--topic", "Upd"]);
    assert!(
        !done && err.contains("exists in group test") && err.contains("topic update"),
        "{err}"
    );
    refused(
        &[
            "topic",
            "update",
            "--namesrv",
            n,
            "--topic",
            "NoSuchTopic",
            "--perm",
            "6",
        ],
        "no such topic: NoSuchTopic",
    );

    // A topic update reaches the NameServer's routes with the next heartbeat.
    ok(&["topic", "update", "--namesrv", n, "--topic", "Cli", "--queues", "3"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ok(&["topic", "route", "--namesrv", n, "--topic", "Cli", "--json"]);
        if out.contains("\"write_queues\": 3") {
            break;
        }
        assert!(Instant::now() < deadline, "the route never showed 3 queues: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Produce 6 with a key, consume 2: progress shows a lag of 4.
    let out = ok(&[
        "produce",
        "--endpoint",
        &access,
        "--topic",
        "Cli",
        "--count",
        "6",
        "--key",
        "order-7",
    ]);
    let first_id = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let out = ok(&[
        "consume",
        "--endpoint",
        &access,
        "--topic",
        "Cli",
        "--group",
        "Readers",
        "--count",
        "2",
        "--timeout",
        "20s",
    ]);
    assert_eq!(out.lines().count(), 2, "{out}");
    let out = ok(&["group", "progress", "--namesrv", n, "--group", "Readers", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let lag: u64 = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["lag"].as_u64().unwrap())
        .sum();
    assert_eq!(lag, 4, "{out}");
    // Back to the beginning: the lag is all 6 again.
    ok(&[
        "group",
        "reset-offset",
        "--namesrv",
        n,
        "--group",
        "Readers",
        "--topic",
        "Cli",
        "--to-timestamp",
        "0",
    ]);
    let out = ok(&["group", "progress", "--namesrv", n, "--group", "Readers"]);
    assert!(out.contains("total lag: 6"), "{out}");

    // mqadmin's daily commands: every group's progress at once, a copy of
    // a group's offsets, skipping a backlog, deleting a group.
    let lag_of = |group: &str| -> u64 {
        let out = ok(&["group", "progress", "--namesrv", n, "--json", "--interval", "0"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let g = v["groups"].as_array().unwrap().iter().find(|g| g["group"] == group);
        g.map_or(u64::MAX, |g| g["lag"].as_u64().unwrap())
    };
    assert_eq!(lag_of("Readers"), 6);
    let out = ok(&[
        "group",
        "clone-offsets",
        "--namesrv",
        n,
        "--from",
        "Readers",
        "--to",
        "Copy",
        "--topic",
        "Cli",
    ]);
    assert!(out.contains("Copy now continues where Readers is"), "{out}");
    assert_eq!(lag_of("Copy"), 6);
    ok(&[
        "group",
        "skip-backlog",
        "--namesrv",
        n,
        "--group",
        "Readers",
        "--topic",
        "Cli",
    ]);
    assert_eq!(lag_of("Readers"), 0);
    assert_eq!(lag_of("Copy"), 6, "a copy moves on its own");
    let out = ok(&["group", "progress", "--namesrv", n]);
    assert!(
        out.contains("Readers") && out.contains("Copy") && out.contains("msgs/s"),
        "{out}"
    );
    let out = ok(&["group", "delete", "--namesrv", n, "--group", "Copy"]);
    assert!(out.contains("deleted consumer group Copy"), "{out}");
    assert_eq!(lag_of("Copy"), u64::MAX, "a deleted group has no progress");
    refused(
        &["group", "delete", "--namesrv", n, "--group", "Copy"],
        "no such consumer group: Copy",
    );
    refused(
        &[
            "group",
            "clone-offsets",
            "--namesrv",
            n,
            "--from",
            "Nobody",
            "--to",
            "X",
            "--topic",
            "Cli",
        ],
        "Nobody has no offsets in topic Cli",
    );

    // Topic status, and a message by queue and offset.
    let out = ok(&["topic", "status", "--namesrv", n, "--topic", "Cli", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let queues = v["queues"].as_array().unwrap();
    let kept: u64 = queues
        .iter()
        .map(|q| q["max_offset"].as_u64().unwrap() - q["min_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(kept, 6, "{out}");
    let full = queues.iter().find(|q| q["max_offset"].as_u64().unwrap() > 0).unwrap();
    assert!(full["last_store_ms"].as_u64().unwrap() > 0, "{out}");
    assert!(
        queues.iter().all(|q| q["max_offset"] != 0 || q["last_store_ms"] == 0),
        "{out}"
    );
    let q = full["queue"].to_string();
    let end = full["max_offset"].to_string();
    let out = ok(&[
        "message",
        "at",
        "--namesrv",
        n,
        "--topic",
        "Cli",
        "--queue",
        &q,
        "--offset",
        "0",
    ]);
    assert!(
        out.contains(&format!("queue {q} offset 0")) && out.contains("order-7"),
        "{out}"
    );
    refused(
        &[
            "message",
            "at",
            "--namesrv",
            n,
            "--topic",
            "Cli",
            "--queue",
            &q,
            "--offset",
            &end,
        ],
        "no message at offset",
    );
    refused(
        &["topic", "status", "--namesrv", n, "--topic", "NoSuchTopic"],
        "no such topic: NoSuchTopic",
    );

    // Queries by id and by key.
    let out = ok(&["message", "get", "--namesrv", n, "--topic", "Cli", "--id", &first_id]);
    assert!(out.contains(&first_id) && out.contains("message 0"), "{out}");
    let out = ok(&["message", "find", "--namesrv", n, "--topic", "Cli", "--key", "order-7"]);
    assert_eq!(out.lines().filter(|l| l.contains("order-7")).count(), 6, "{out}");
    refused(
        &["message", "get", "--namesrv", n, "--topic", "Cli", "--id", "nope"],
        "no such message",
    );
    // Typos are errors, not empty answers.
    refused(
        &[
            "message",
            "find",
            "--namesrv",
            n,
            "--topic",
            "NoSuchTopic",
            "--key",
            "k",
        ],
        "no such topic: NoSuchTopic",
    );
    refused(
        &["group", "progress", "--namesrv", n, "--group", "NoSuchGroup"],
        "no such consumer group: NoSuchGroup",
    );
    refused(
        &[
            "group",
            "reset-offset",
            "--namesrv",
            n,
            "--group",
            "Readers",
            "--topic",
            "NoSuchTopic",
            "--to-timestamp",
            "0",
        ],
        "no such topic: NoSuchTopic",
    );
    // Errors say what was reached: a NameServer is not a broker, a broker
    // is not a NameServer, and nothing listening is said plainly.
    refused(
        &["produce", "--endpoint", n, "--topic", "Cli"],
        "not as a raftmq broker's client port",
    );
    let broker = cluster.node(1).client_addr.clone();
    refused(&["cluster", "status", "--namesrv", &broker], "not as a NameServer");
    let (done, _, err) = raftmq_cli(&["node", "status", "--endpoint", "127.0.0.1:1"]);
    assert!(
        !done && err.contains("refused") && !err.contains("tcp connect error: tcp connect error"),
        "{err}"
    );
    // Both separators work for address lists.
    let out = ok(&["cluster", "status", "--namesrv", &format!("127.0.0.1:1;{n}")]);
    assert!(out.contains("leader node"), "{out}");
    // By store time: the last hour holds all 6 (with their queues and
    // offsets); the future holds none.
    let out = ok(&["message", "range", "--namesrv", n, "--topic", "Cli", "--begin", "1h"]);
    assert_eq!(out.lines().filter(|l| l.contains("order-7")).count(), 6, "{out}");
    assert!(out.contains("queue ") && out.contains(" offset "), "{out}");
    assert!(!out.contains("stopped at --max"), "{out}");
    // Store times are local date-times; a cut-short answer says so.
    let year = out.split(" stored ").nth(1).unwrap_or("").get(..4).unwrap_or("");
    assert!(year.len() == 4 && year.starts_with("20"), "{out}");
    let out = ok(&[
        "message",
        "range",
        "--namesrv",
        n,
        "--topic",
        "Cli",
        "--begin",
        "1h",
        "--max",
        "2",
    ]);
    assert!(out.contains("stopped at --max 2"), "{out}");
    // A timed message, recalled by the handle produce printed: once only.
    ok(&[
        "topic",
        "create",
        "--namesrv",
        n,
        "--topic",
        "Later",
        "--message-type",
        "DELAY",
    ]);
    let out = ok(&[
        "produce",
        "--endpoint",
        &access,
        "--topic",
        "Later",
        "--delay",
        "1h",
        "--count",
        "1",
    ]);
    let handle = out
        .split("recall handle ")
        .nth(1)
        .unwrap()
        .trim_end_matches([')', '\n']);
    let out = ok(&["recall", "--endpoint", &access, "--topic", "Later", "--handle", handle]);
    assert!(out.starts_with("recalled "), "{out}");
    let (again, _, err) = raftmq_cli(&["recall", "--endpoint", &access, "--topic", "Later", "--handle", handle]);
    assert!(!again && err.contains("not pending"), "{err}");
    let later = (raftmq::clock::now_ms() + 3_600_000).to_string();
    let (found, _, _) = raftmq_cli(&["message", "range", "--namesrv", n, "--topic", "Cli", "--begin", &later]);
    assert!(!found, "nothing was stored in the future");

    // Benchmarks: JSON reports with the promised fields, and a plot.
    let plot = dir.path().join("lat.png");
    let out = ok(&[
        "bench",
        "produce",
        "--endpoint",
        &access,
        "--topic",
        "Cli",
        "--count",
        "60",
        "--concurrency",
        "4",
        "--size",
        "100",
        "--batch",
        "3",
        "--json",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for key in [
        "msgs_per_s",
        "mib_per_s",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
        "ok",
        "errors",
    ] {
        assert!(v.get(key).is_some(), "bench report lacks {key}: {out}");
    }
    assert_eq!((v["ok"].as_u64(), v["errors"].as_u64()), (Some(60), Some(0)), "{out}");
    let per_second: u64 = v["per_second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 60, "messages, not calls of three, second by second: {out}");
    let png = std::fs::read(&plot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "the plot is a PNG");
    let out = ok(&[
        "bench",
        "consume",
        "--endpoint",
        &access,
        "--topic",
        "Cli",
        "--group",
        "BenchReaders",
        "--count",
        "60",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["ok"].as_u64().unwrap() >= 60, "{out}");
    let out = ok(&[
        "bench",
        "e2e",
        "--endpoint",
        &access,
        "--topic",
        "Cli",
        "--duration",
        "2s",
        "--concurrency",
        "2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        v["ok"].as_u64().unwrap() > 0 && v["p50_ms"].as_f64().unwrap() > 0.0,
        "{out}"
    );
    // e2e counts only the messages it sent itself, not a backlog left on
    // the topic by others.
    ok(&["topic", "create", "--namesrv", n, "--topic", "E2e", "--queues", "1"]);
    ok(&["produce", "--endpoint", &access, "--topic", "E2e", "--count", "40"]);
    let out = ok(&[
        "bench",
        "e2e",
        "--endpoint",
        &access,
        "--topic",
        "E2e",
        "--group",
        "E2eReaders",
        "--count",
        "10",
        "--concurrency",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ok"].as_u64(), Some(10), "{out}");

    // A refused leadership transfer changes nothing: same leader, same term.
    let leader = cluster.leader().await;
    let before = cluster.status(leader, false).await.unwrap();
    refused(
        &[
            "cluster",
            "transfer-leader",
            "--namesrv",
            n,
            "--broker",
            "test",
            "--to",
            "9",
        ],
        "has no node 9",
    );
    let refused = cluster
        .client(leader)
        .await
        .transfer_leader(raftmq::proto::pb::TransferLeaderToRequest { node_id: 9 })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    // Several election timeouts (150-300 ms): an election would have happened.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = cluster.status(leader, false).await.unwrap();
    assert_eq!(
        (after.role.as_str(), after.term),
        ("leader", before.term),
        "a refused transfer moved the leader"
    );

    // Membership: move leadership, take a node out and put it back.
    let to = (1..=3).find(|i| *i != leader).unwrap();
    ok(&[
        "cluster",
        "transfer-leader",
        "--namesrv",
        n,
        "--broker",
        "test",
        "--to",
        &to.to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.leader().await != to {
        assert!(Instant::now() < deadline, "node {to} never led");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other = (1..=3).find(|i| *i != to).unwrap();
    let remove = |id: u64| {
        ok(&[
            "cluster",
            "remove-node",
            "--namesrv",
            n,
            "--broker",
            "test",
            "--node-id",
            &id.to_string(),
        ])
    };
    let addrs: Vec<(String, String)> = (1..=3)
        .map(|i| (cluster.node(i).raft_addr.clone(), cluster.node(i).client_addr.clone()))
        .collect();
    let add = |id: u64| {
        let (raft, client) = &addrs[id as usize - 1];
        ok(&[
            "cluster",
            "add-node",
            "--namesrv",
            n,
            "--broker",
            "test",
            "--node-id",
            &id.to_string(),
            "--raft-addr",
            raft,
            "--client-addr",
            client,
        ])
    };
    remove(other);
    let s = cluster.status(to, false).await.unwrap();
    assert!(s.members.iter().all(|m| m.node_id != other), "{s:?}");
    add(other);
    let s = cluster.status(to, false).await.unwrap();
    assert!(s.members.iter().any(|m| m.node_id == other && m.voter), "{s:?}");

    // The leader itself: leadership moves first, and the new leader
    // removes it (openraft does not let a leader remove itself).
    let removed = to;
    remove(removed);
    let leader = cluster.leader().await;
    assert_ne!(leader, removed, "the removed leader still leads");
    let s = cluster.status(leader, false).await.unwrap();
    assert!(s.members.iter().all(|m| m.node_id != removed), "{s:?}");
    add(removed);
    let s = cluster.status(leader, false).await.unwrap();
    assert!(s.members.iter().any(|m| m.node_id == removed && m.voter), "{s:?}");
    cluster.check_alive();
}

/// Every node's answer to `Status` says `writable == want` (the flag is
/// applied on each node once its log has the change).
async fn wait_writable(cluster: &Cluster, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = true;
        for n in &cluster.nodes {
            all &= cluster.status(n.id, false).await.is_some_and(|s| s.writable == want);
        }
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "not every node says writable = {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `raftmq cluster update-config --broker test ARGS` until it succeeds.
fn update_config(namesrv: &str, args: &[&str]) -> String {
    let mut all = vec!["cluster", "update-config", "--namesrv", namesrv, "--broker", "test"];
    all.extend(args);
    ok(&all)
}

/// The permission each queue of `topic` has in a v2 route from node `id`.
async fn route_permissions(cluster: &Cluster, id: u64, topic: &str) -> Vec<i32> {
    let r = common::v2::client(cluster, id)
        .await
        .query_route(v2::QueryRouteRequest {
            topic: common::v2::resource(topic),
            endpoints: None,
        })
        .await
        .unwrap()
        .into_inner();
    r.message_queues.iter().map(|q| q.permission).collect()
}

/// mqadmin's maintenance commands: wipe and add a group's write permission
/// (through Raft: every node, after a leader change and a restart), get and
/// update broker config at run time (per node, typed and validated, in
/// force at once).
#[tokio::test(flavor = "multi_thread")]
async fn write_permission_and_runtime_config() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, mut cluster, access) = start(dir.path()).await;
    let leader = cluster.leader().await;
    let n = ns.addr.as_str();
    ok(&["topic", "create", "--namesrv", n, "--topic", "Maint", "--queues", "2"]);
    ok(&["produce", "--endpoint", &access, "--topic", "Maint", "--count", "3"]);
    assert!(
        route_permissions(&cluster, 1, "Maint")
            .await
            .iter()
            .all(|p| *p == v2::Permission::ReadWrite as i32)
    );

    // Wiped: every node agrees, routes are read-only, sends are refused
    // with FORBIDDEN, and what is stored is still consumed.
    let out = ok(&["cluster", "wipe-write-perm", "--namesrv", n, "--broker", "test"]);
    assert!(out.contains("broker group test takes no sends"), "{out}");
    wait_writable(&cluster, false).await;
    for id in 1..=3 {
        let perms = route_permissions(&cluster, id, "Maint").await;
        assert!(
            !perms.is_empty() && perms.iter().all(|p| *p == v2::Permission::Read as i32),
            "node {id}: {perms:?}"
        );
    }
    let r = common::v2::send(
        &mut common::v2::client(&cluster, leader).await,
        vec![common::v2::msg("Maint", "maint-1", b"x")],
    )
    .await;
    assert_eq!(common::v2::code(&r.status), v2::Code::Forbidden, "{r:?}");
    let (sent, _, err) = raftmq_cli(&["produce", "--endpoint", &access, "--topic", "Maint", "--count", "1"]);
    assert!(!sent && err.contains("write permission is wiped"), "{err}");
    let out = ok(&[
        "consume",
        "--endpoint",
        &access,
        "--topic",
        "Maint",
        "--group",
        "Maint",
        "--count",
        "3",
        "--timeout",
        "20s",
    ]);
    assert_eq!(out.lines().filter(|l| l.starts_with("queue ")).count(), 3, "{out}");
    let out = ok(&["cluster", "status", "--namesrv", n]);
    assert!(out.contains("WRITE PERMISSION WIPED"), "{out}");
    let node = cluster.node(leader).metrics_addr.clone();
    assert_eq!(
        common::sum_of(&common::scrape(&node), "raftmq_group_writable", &[]),
        0.0
    );
    // The NameServer's route (from the heartbeats, sent at once on the
    // change) says read-only too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = ok(&["topic", "route", "--namesrv", n, "--topic", "Maint"]);
        if out.contains("perm 4") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the NameServer's route stayed writable: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Replicated state: a new leader, and a restarted node, still refuse.
    let other = (1..=3).find(|i| *i != leader).unwrap();
    ok(&[
        "cluster",
        "transfer-leader",
        "--namesrv",
        n,
        "--broker",
        "test",
        "--to",
        &other.to_string(),
    ]);
    cluster.kill(leader);
    cluster.spawn(leader);
    wait_writable(&cluster, false).await;
    let now = cluster.leader().await;
    let r = common::v2::send(
        &mut common::v2::client(&cluster, now).await,
        vec![common::v2::msg("Maint", "maint-2", b"x")],
    )
    .await;
    assert_eq!(common::v2::code(&r.status), v2::Code::Forbidden, "{r:?}");

    // Back: sends go through again.
    let out = ok(&["cluster", "add-write-perm", "--namesrv", n, "--broker", "test"]);
    assert!(out.contains("broker group test takes sends again"), "{out}");
    wait_writable(&cluster, true).await;
    ok(&["produce", "--endpoint", &access, "--topic", "Maint", "--count", "2"]);
    let out = ok(&["cluster", "add-write-perm", "--namesrv", n, "--broker", "test"]);
    assert!(out.contains("(no change)"), "{out}");

    // Config at run time: shown per node, `*` on the keys that change.
    let out = ok(&["cluster", "get-config", "--namesrv", n, "--broker", "test", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{out}");
    for node in nodes {
        assert_eq!(node["config"]["store.retention.file_reserved_hours"], "72");
        assert_eq!(node["config"]["broker"], "\"test\"");
        assert!(
            node["runtime_keys"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "long_polling_timeout_ms")
        );
    }
    let out = ok(&[
        "cluster",
        "get-config",
        "--namesrv",
        n,
        "--broker",
        "test",
        "--node",
        "2",
        "--runtime",
    ]);
    assert!(
        out.contains("* limits.max_response_bytes = 16777216") && !out.contains("segment_size"),
        "{out}"
    );
    // Every node changes, and says what it was; the metrics follow at once.
    let out = update_config(n, &["--key", "store.retention.disk_warn_ratio", "--value", "0.5"]);
    for id in 1..=3 {
        assert!(
            out.contains(&format!("node {id}: store.retention.disk_warn_ratio = 0.5 (was 1.0)")),
            "{out}"
        );
    }
    assert!(out.contains("until a node restarts"), "{out}");
    for node in &cluster.nodes {
        let warn = common::sum_of(
            &common::scrape(&node.metrics_addr),
            "raftmq_disk_watermark_ratio",
            &["watermark=\"warn\""],
        );
        assert_eq!(warn, 0.5, "node {}", node.id);
    }
    // A change reaches the next request: a body over the new limit is refused.
    let max_body = nodes[0]["config"]["max_body_bytes"].as_str().unwrap().to_string();
    update_config(n, &["--key", "max_body_bytes", "--value", "100"]);
    let (sent, _, err) = raftmq_cli(&["produce", "--endpoint", &access, "--topic", "Maint", "--size", "200"]);
    assert!(!sent && err.contains("100"), "{err}");
    update_config(n, &["--key", "max_body_bytes", "--value", &max_body]);
    ok(&["produce", "--endpoint", &access, "--topic", "Maint", "--size", "200"]);
    // Only one node, when asked.
    let out = update_config(
        n,
        &["--node", "3", "--key", "long_polling_timeout_ms", "--value", "5000"],
    );
    assert!(
        out.contains("node 3: long_polling_timeout_ms = 5000 (was 20000)") && !out.contains("node 1"),
        "{out}"
    );
    // Refused, by name: keys fixed at start, wrong types, invalid values, unknown nodes.
    for (key, value, says) in [
        ("store.segment_size", "4096", "cannot be changed while the node runs"),
        ("long_polling_timeout_ms", "soon", "long_polling_timeout_ms = soon"),
        ("store.retention.disk_refuse_ratio", "0.2", "disk"),
        ("nonsense", "1", "cannot be changed while the node runs"),
    ] {
        refused(
            &[
                "cluster",
                "update-config",
                "--namesrv",
                n,
                "--broker",
                "test",
                "--key",
                key,
                "--value",
                value,
            ],
            says,
        );
    }
    refused(
        &[
            "cluster",
            "update-config",
            "--namesrv",
            n,
            "--broker",
            "test",
            "--node",
            "9",
            "--key",
            "min_invisible_ms",
            "--value",
            "1000",
        ],
        "has no node 9",
    );
    cluster.check_alive();
}

#[test]
fn bad_arguments_get_one_line_and_a_non_zero_exit() {
    for args in [
        vec!["produce"],
        vec!["produce", "--topic", "T", "--count", "many"],
        vec!["consume", "--topic", "T", "--group", "G", "--timeout", "5 days"],
        vec!["bogus"],
        vec!["group", "reset-offset", "--group", "G", "--topic", "T"],
        vec!["cluster", "transfer-leader", "--broker", "b", "--to", "x"],
        vec!["bench", "produce", "--count", "5", "--duration", "5s"],
        // A delay names its unit; each bench takes only its own flags.
        vec!["produce", "--topic", "T", "--delay", "30"],
        vec!["bench", "consume", "--size", "100"],
        vec!["bench", "produce", "--group", "G"],
    ] {
        let (ok, out, err) = raftmq_cli(&args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    }
    // Errors found after parsing are one line too.
    for args in [
        vec!["produce", "--endpoint", "127.0.0.1:1", "--topic", "T"],
        vec!["group", "list", "--namesrv", "127.0.0.1:1"],
        vec![
            "message",
            "get",
            "--namesrv",
            "not an address",
            "--topic",
            "T",
            "--id",
            "x",
        ],
        vec!["produce", "--endpoint", "", "--topic", "T"],
    ] {
        let (ok, _, err) = raftmq_cli(&args);
        assert!(!ok, "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
