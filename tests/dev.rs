//! `raftmq dev` as a newcomer uses it: start it, wait for `dev.json`,
//! produce and consume with the CLI, try a second `raftmq dev` on the same
//! directory, crash the leader (dev says how to start it again), keep
//! producing, and stop everything with SIGINT.

mod common;

use std::time::{Duration, Instant};

use common::dev::{base_port, start_dev};
use common::raftmq_cli;

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_cluster_produce_consume_failover_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_port();
    let (mut dev, info) = start_dev(dir.path(), base, &[]);
    let dev_err = dir.path().join("dev.stderr");
    let info_path = dir.path().join("dev.json");
    let nodes = info["nodes"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 3);
    let access: Vec<String> = nodes
        .iter()
        .map(|n| n["client_addr"].as_str().unwrap().to_string())
        .collect();
    let access = access.join(";");
    let pids: Vec<u32> = nodes.iter().map(|n| n["pid"].as_u64().unwrap() as u32).collect();
    assert!(pids.iter().all(|p| alive(*p)));

    // A second `raftmq dev` on the same directory is refused at once, names
    // the one that holds it, and leaves the running cluster alone.
    let dir_arg = dir.path().to_str().unwrap();
    let (ok, _, err) = raftmq_cli(&["dev", "--dir", dir_arg, "--base-port", &base.to_string()]);
    assert!(!ok, "a second dev on the same directory started");
    assert!(
        err.contains("in use by another raftmq dev") && err.contains(&format!("pid {}", dev.id())),
        "{err}"
    );
    assert!(info_path.exists(), "the running cluster's dev.json is kept");
    assert!(pids.iter().all(|p| alive(*p)));

    // --node-config was merged into each node's config: its table joined
    // the generated `[store]` without displacing the keys dev writes.
    let node1 = std::fs::read_to_string(dir.path().join("node1.toml")).unwrap();
    let node1: toml::Table = node1.parse().unwrap();
    assert_eq!(node1["store"]["retention"]["disk_refuse_ratio"].as_float(), Some(1.0));
    assert_eq!(node1["store"]["segment_size"].as_integer(), Some(64 << 20));

    // A key no node knows is refused before anything starts, by its name.
    let other = tempfile::tempdir().unwrap();
    let bad = other.path().join("bad.toml");
    std::fs::write(&bad, "[store]\nsegment_sise = 4096\n").unwrap();
    let other_dir = other.path().join("dev");
    let (ok, _, err) = raftmq_cli(&[
        "dev",
        "--dir",
        other_dir.to_str().unwrap(),
        "--base-port",
        &(base + 500).to_string(),
        "--node-config",
        bad.to_str().unwrap(),
    ]);
    assert!(!ok, "dev started with an unknown key");
    assert!(err.contains("segment_sise") && err.contains("--node-config"), "{err}");
    assert!(!other_dir.join("dev.json").exists());

    let (ok, out, err) = raftmq_cli(&["produce", "--endpoint", &access, "--topic", "TestTopic", "--count", "5"]);
    assert!(ok, "produce: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 5, "{out}");
    let (ok, out, err) = raftmq_cli(&[
        "consume",
        "--endpoint",
        &access,
        "--topic",
        "TestTopic",
        "--group",
        "DevTest",
        "--count",
        "5",
        "--timeout",
        "30s",
    ]);
    assert!(ok, "consume: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("queue ")).count(), 5, "{out}");

    // Every node serves /metrics; exactly one of them is the leader.
    let leaders: f64 = nodes
        .iter()
        .map(|n| {
            common::sum_of(
                &common::scrape(n["metrics_addr"].as_str().unwrap()),
                "raftmq_raft_role",
                &["role=\"leader\""],
            )
        })
        .sum();
    assert_eq!(leaders, 1.0);
    let ns = common::scrape(info["namesrv_metrics_addr"].as_str().unwrap());
    assert!(common::sum_of(&ns, "raftmq_namesrv_heartbeats_total", &[]) >= 1.0);

    // Crash the leader: the CLI keeps producing after a short gap.
    let namesrv = info["namesrv_addr"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader_pid = loop {
        let (ok, out, _) = raftmq_cli(&["cluster", "status", "--namesrv", &namesrv, "--json"]);
        if ok {
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            if let Some(n) = v["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["is_group_leader"] == true)
            {
                break n["pid"].as_u64().unwrap() as u32;
            }
        }
        assert!(Instant::now() < deadline, "the NameServer never named a leader");
        std::thread::sleep(Duration::from_millis(200));
    };
    // SAFETY: plain syscall on a process this test started (through dev).
    unsafe { libc::kill(leader_pid as i32, libc::SIGKILL) };
    let (ok, out, err) = raftmq_cli(&["produce", "--endpoint", &access, "--topic", "TestTopic", "--count", "3"]);
    assert!(ok, "produce after the crash: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 3, "{out}");
    // dev noticed, and says how to start the node again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let said = std::fs::read_to_string(&dev_err).unwrap_or_default();
        if said.contains(&format!("(pid {leader_pid}) exited")) {
            assert!(
                said.contains("to start it again") && said.contains("broker --config"),
                "{said}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "dev did not report the crash: {said}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // cluster status shows the dead node as unreachable (with what it last
    // said) and names the live leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, _) = raftmq_cli(&["cluster", "status", "--namesrv", &namesrv, "--json"]);
        if ok {
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let nodes = v["nodes"].as_array().unwrap();
            let dead = nodes.iter().find(|n| n["pid"].as_u64() == Some(u64::from(leader_pid)));
            let live_leader = nodes
                .iter()
                .find(|n| n["is_group_leader"] == true && n["reachable"] == true);
            if let (Some(d), Some(_)) = (dead, live_leader)
                && d["reachable"] == false
                && d["role"] == "unreachable"
            {
                assert_eq!(d["reported_role"], "leader", "{d}");
                let (_, text, _) = raftmq_cli(&["cluster", "status", "--namesrv", &namesrv]);
                assert!(
                    text.contains("unreachable (last said leader)") && text.contains("leader node"),
                    "{text}"
                );
                break;
            }
        }
        assert!(Instant::now() < deadline, "cluster status never showed the crash");
        std::thread::sleep(Duration::from_millis(200));
    }

    // SIGINT stops everything; nothing is left behind.
    // SAFETY: as above.
    unsafe { libc::kill(dev.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = dev.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let tail = |name: &str| {
                let text = std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!("--- {name}:\n{}", lines[lines.len().saturating_sub(15)..].join("\n"))
            };
            let logs: Vec<String> = ["dev.stderr", "node1.log", "node2.log", "node3.log", "namesrv.log"]
                .iter()
                .map(|n| tail(n))
                .collect();
            panic!("raftmq dev did not stop on SIGINT\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "raftmq dev exited with {status}");
    for p in pids {
        assert!(!alive(p), "process {p} is still running");
    }
    assert!(!info_path.exists(), "dev.json is removed on stop");
}

/// `raftmq dev --groups 2`: two three-node groups, each node named with its
/// group in `dev.json`, and `TestTopic` with 8 queues in each.
#[tokio::test(flavor = "multi_thread")]
async fn dev_with_two_groups_spreads_the_test_topic() {
    let dir = tempfile::tempdir().unwrap();
    // Clear of the single-group test's ports (this one's reach 100 higher).
    let base = base_port() + 1000;
    let (mut dev, info) = start_dev(dir.path(), base, &["--groups", "2"]);
    let nodes = info["nodes"].as_array().unwrap().clone();
    let mut groups: Vec<(&str, u64)> = nodes
        .iter()
        .map(|n| (n["group"].as_str().unwrap(), n["node_id"].as_u64().unwrap()))
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        [
            ("dev", 1),
            ("dev", 2),
            ("dev", 3),
            ("dev-2", 1),
            ("dev-2", 2),
            ("dev-2", 3)
        ]
    );
    // The second group's ports are the first's plus 100.
    let client = |g: &str, id: u64| {
        nodes.iter().find(|n| n["group"] == g && n["node_id"] == id).unwrap()["client_addr"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(client("dev", 1), format!("127.0.0.1:{}", base + 8081));
    assert_eq!(client("dev-2", 1), format!("127.0.0.1:{}", base + 8181));

    // The NameServer routes TestTopic to both groups (the brokers register
    // their topics within a heartbeat interval).
    let namesrv = info["namesrv_addr"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out, _) = raftmq_cli(&[
            "topic",
            "route",
            "--topic",
            "TestTopic",
            "--json",
            "--namesrv",
            &namesrv,
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let mut seen: Vec<(String, u64)> = v["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                (
                    g["group"].as_str().unwrap_or("").to_string(),
                    g["write_queues"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        seen.sort();
        if ok && seen == [("dev".to_string(), 8), ("dev-2".to_string(), 8)] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "TestTopic's route never named both groups: {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Each group takes writes.
    for g in ["dev", "dev-2"] {
        let (ok, out, err) = raftmq_cli(&[
            "produce",
            "--endpoint",
            &client(g, 2),
            "--topic",
            "TestTopic",
            "--count",
            "2",
        ]);
        assert!(ok, "produce to {g}: {err}");
        assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 2, "{out}");
    }

    let pids: Vec<u32> = nodes.iter().map(|n| n["pid"].as_u64().unwrap() as u32).collect();
    // SAFETY: a signal to the child we started.
    unsafe { libc::kill(dev.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "raftmq dev did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in pids {
        assert!(!alive(p), "process {p} is still running");
    }
}
