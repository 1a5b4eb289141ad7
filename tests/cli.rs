//! Every `raftmq` admin command against a NameServer and a three-node group
//! of real processes, and what bad arguments get: one line, a non-zero exit,
//! never a backtrace.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Namesrv, raftmq_cli};

/// Runs `raftmq args`, which must fail saying `says`.
fn refused(args: &[&str], says: &str) {
    let (ok, out, err) = raftmq_cli(args);
    assert!(!ok, "raftmq {args:?} succeeded: {out}");
    assert!(err.contains(says), "raftmq {args:?}: {err}");
}

/// Runs `raftmq args` until it succeeds (brokers may not be registered yet).
fn ok(args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, err) = raftmq_cli(args);
        if ok {
            return out;
        }
        assert!(Instant::now() < deadline, "raftmq {args:?}: {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_commands_against_a_real_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let ns = Namesrv::start(dir.path(), "ns", 120_000);
    let extra = format!(
        "namesrv_addrs = [\"{}\"]\nnamesrv_heartbeat_interval_ms = 200\n",
        ns.addr
    );
    let mut cluster = Cluster::start_with(dir.path(), 3, "async", &extra);
    cluster.leader().await;
    let n = ns.addr.as_str();
    let access: Vec<String> = cluster.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let access = access.join(";");

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
    ok(&[
        "cluster",
        "remove-node",
        "--namesrv",
        n,
        "--broker",
        "test",
        "--node-id",
        &other.to_string(),
    ]);
    let s = cluster.status(to, false).await.unwrap();
    assert!(s.members.iter().all(|m| m.node_id != other), "{s:?}");
    let (raft, client) = (
        cluster.node(other).raft_addr.clone(),
        cluster.node(other).client_addr.clone(),
    );
    ok(&[
        "cluster",
        "add-node",
        "--namesrv",
        n,
        "--broker",
        "test",
        "--node-id",
        &other.to_string(),
        "--raft-addr",
        &raft,
        "--client-addr",
        &client,
    ]);
    let s = cluster.status(to, false).await.unwrap();
    assert!(s.members.iter().any(|m| m.node_id == other && m.voter), "{s:?}");
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
