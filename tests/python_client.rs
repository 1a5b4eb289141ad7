//! The official RocketMQ 5 Python client (`rocketmq-python-client` 5.1.2,
//! unmodified) against a NameServer and a three-node group of real
//! `raftmq` processes. The scenarios live in `tests/python/compat.py`;
//! this file starts the cluster, runs them, and acts on their requests
//! (such as killing the leader mid-run).
//!
//! The client is installed into a virtualenv under cargo's target tmp
//! directory on first use (`.ci/run` does it up front), or taken from
//! `RAFTMQ_PYTHON` (a Python with the client installed).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::raftmq_cli;
use common::scenario::{Env, python_venv, script_command};

const CLIENT: &str = "rocketmq-python-client==5.1.2";

/// A Python interpreter with the official client, installing it if needed.
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("RAFTMQ_PYTHON") {
        return PathBuf::from(p);
    }
    python_venv("python-venv", CLIENT)
}

/// A scenario of `tests/python/compat.py`.
fn compat(name: &str, endpoints: &str, topic: &str, group: &str) -> Command {
    script_command(python(), "tests/python/compat.py", [name, endpoints, topic, group])
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_simple_fifo_and_push_consumers() {
    let mut env = Env::start("python", compat).await;
    env.admin(&["topic", "create", "--topic", "Normal", "--queues", "4"]);
    env.admin(&[
        "topic",
        "create",
        "--topic",
        "Ordered",
        "--queues",
        "4",
        "--message-type",
        "FIFO",
    ]);
    env.admin(&["group", "create", "--group", "Fifo", "--fifo"]);
    // A follower alone as the access point: everything it cannot do itself
    // it forwards to the leader.
    let follower = env.follower().await;
    env.scenario("simple", &follower, "Normal", "Simple").await;
    let all = env.endpoints();
    env.scenario("fifo", &all, "Ordered", "Fifo").await;
    env.admin(&["topic", "create", "--topic", "Pushed", "--queues", "4"]);
    env.scenario("push", &all, "Pushed", "Push").await;
    env.admin(&["topic", "create", "--topic", "Filtered", "--queues", "4"]);
    env.scenario("sql92", &follower, "Filtered", "Sql").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_messages_survive_a_leader_crash() {
    let mut env = Env::start("python", compat).await;
    env.admin(&["topic", "create", "--topic", "Failover", "--queues", "4"]);
    let all = env.endpoints();
    let out = env.scenario("failover", &all, "Failover", "Survivor").await;
    eprintln!("{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn timed_messages_recall_delay_levels_and_transactions() {
    let mut env = Env::start("python", compat).await;
    let typed = |name: &str, kind: &str| {
        vec![
            "topic".to_string(),
            "create".into(),
            "--topic".into(),
            name.into(),
            "--queues".into(),
            "4".into(),
            "--message-type".into(),
            kind.into(),
        ]
    };
    let run = |env: &Env, args: Vec<String>| env.admin(&args.iter().map(String::as_str).collect::<Vec<_>>());
    run(&env, typed("Timed", "DELAY"));
    run(&env, typed("TimedLevels", "NORMAL"));
    run(&env, typed("Txn", "TRANSACTION"));
    let all = env.endpoints();
    env.scenario("timed", &all, "Timed", "TimedGroup").await;
    env.scenario("transactions", &all, "Txn", "TxnGroup").await;
    // The held-message system topics exist now, but are not routed.
    let (ok, out, err) = raftmq_cli(&["topic", "list", "--namesrv", &env.namesrv.addr]);
    assert!(ok, "{err}");
    assert!(out.contains("Timed") && out.contains("Txn"), "{out}");
    assert!(
        !out.contains("rmq_sys_wheel_timer") && !out.contains("RMQ_SYS_TRANS_HALF_TOPIC"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn timed_messages_survive_a_leader_crash() {
    let mut env = Env::start("python", compat).await;
    env.admin(&[
        "topic",
        "create",
        "--topic",
        "TimedFailover",
        "--queues",
        "4",
        "--message-type",
        "DELAY",
    ]);
    let all = env.endpoints();
    env.scenario("timed-failover", &all, "TimedFailover", "TimedSurvivor")
        .await;
}

/// `raftmq cluster rolling-restart` while the official client sends.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_loses_nothing_and_never_pauses_two_seconds() {
    let mut env = Env::start("python", compat).await;
    env.admin(&["topic", "create", "--topic", "Rolling", "--queues", "4"]);
    let all = env.endpoints();
    let out = env.scenario("rolling", &all, "Rolling", "RollingGroup").await;
    eprintln!("{out}");
}

/// A topic spread over two broker groups, as RocketMQ users scale out:
/// the official client writes to queues of both and receives everything;
/// one group's leader crashes mid-run and the other never stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_over_two_groups_survives_one_groups_leader_crash() {
    let mut env = Env::start_groups("python", compat, 2).await;
    // One group at a time: each create waits until that group registered.
    env.admin(&[
        "topic", "create", "--topic", "Spread", "--queues", "4", "--broker", "test",
    ]);
    env.admin(&[
        "topic", "create", "--topic", "Spread", "--queues", "4", "--broker", "test-2",
    ]);
    // The NameServer knows both groups' queues before any client asks a
    // broker for the route (brokers cache a route for 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, _) = raftmq_cli(&[
            "topic",
            "route",
            "--topic",
            "Spread",
            "--json",
            "--namesrv",
            &env.namesrv.addr,
        ]);
        if ok && route_groups(&out) == ["test", "test-2"] {
            break;
        }
        assert!(Instant::now() < deadline, "the route never named both groups: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let all = env.endpoints();
    let out = env.scenario("two-groups", &all, "Spread", "SpreadGroup").await;
    eprintln!("{out}");
}

/// The groups a `raftmq topic route --json` answer names, sorted.
fn route_groups(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut groups: Vec<String> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["group"].as_str().map(String::from))
        .collect();
    groups.sort();
    groups
}

/// `raftmq dev --secure` (TLS and ACL on every port): the official client
/// with `tls_enable=True`, trusting the cluster's CA through gRPC's own
/// environment variable. The Super user sends and receives; a user granted
/// `Pub` on the topic sends but may not receive until granted `Sub` on the
/// group and topic; a wrong secret, an unknown user and no credentials are
/// refused with the v2 `UNAUTHORIZED` code.
#[tokio::test(flavor = "multi_thread")]
async fn over_tls_with_acl_users_and_policies() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, info) = common::dev::start_dev(dir.path(), common::dev::base_port(), &["--secure"]);
    let ca = info["ca_cert"].as_str().expect("dev.json names ca_cert").to_string();
    let admin = info["admin_access_key"].as_str().unwrap().to_string();
    let admin_secret = info["admin_secret_key"].as_str().unwrap().to_string();
    let namesrv = info["namesrv_addr"].as_str().unwrap().to_string();
    // One access point: over TLS, grpc checks the server's certificate
    // against the channel's authority, and a list of addresses
    // ("a:1,b:2") is no name a certificate can carry. The routes name one
    // node per queue for the same reason (route.rs, `OnePerQueue`).
    let access = info["nodes"][1]["client_addr"].as_str().unwrap().to_string();
    let admin_cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--namesrv", &namesrv]);
        let (ok, out, err) = common::dev::admin_cli(&info, &all);
        assert!(ok, "raftmq {args:?}: {out}{err}");
    };
    let run = |scenario: &str, group: &str, ak: &str, sk: &str, expect: &str| {
        let out = compat(scenario, &access, "TestTopic", group)
            .env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", &ca)
            .env("RAFTMQ_ACCESS_KEY", ak)
            .env("RAFTMQ_SECRET_KEY", sk)
            .env("RAFTMQ_ACL_EXPECT", expect)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{scenario} as {ak:?} expecting {expect}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("tls", "TlsGroup", &admin, &admin_secret, "");
    admin_cli(&["user", "create", "-u", "alice", "-p", "alice-secret"]);
    admin_cli(&[
        "acl",
        "create",
        "-s",
        "User:alice",
        "-r",
        "Topic:TestTopic",
        "-a",
        "Pub",
        "-d",
        "Allow",
    ]);
    run("acl", "AliceGroup", "alice", "alice-secret", "pub");
    admin_cli(&[
        "acl",
        "update",
        "-s",
        "User:alice",
        "-r",
        "Topic:TestTopic,Group:AliceGroup",
        "-a",
        "Pub,Sub",
        "-d",
        "Allow",
    ]);
    run("acl", "AliceGroup", "alice", "alice-secret", "pub-sub");
    run("acl", "AliceGroup", "alice", "wrong-secret", "refused");
    run("acl", "AliceGroup", "mallory", "mallory-secret", "refused");
    run("acl", "AliceGroup", "", "", "refused");
}
