//! The official RocketMQ 5 Node.js client (`rocketmq-client-nodejs` 1.0.8,
//! unmodified) against a NameServer and a three-node group of real
//! `raftmq` processes. The scenarios live in `tests/node/compat.js`; this
//! file starts the cluster, runs them, and acts on their requests (such as
//! killing the leader mid-run).
//!
//! That client joins a group's addresses into one gRPC target, so routes
//! are shaped for it (`x-mq-language: NODE_JS`, see
//! `src/grpc/rocketmq/route.rs`); its access point is one node.
//!
//! The client is installed with npm under cargo's target tmp directory on
//! first use (`.ci/run` does it up front), or taken from
//! `RAFTMQ_NODE_MODULES` (a `node_modules` directory that has it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::scenario::{Env, install_once, script_command};

const CLIENT: &str = "rocketmq-client-nodejs@1.0.8";

/// A `node_modules` directory with the official client, installing it if
/// needed.
fn node_modules() -> PathBuf {
    if let Ok(p) = std::env::var("RAFTMQ_NODE_MODULES") {
        return PathBuf::from(p);
    }
    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("node-client");
    install_once(&prefix, CLIENT, || {
        std::fs::create_dir_all(&prefix).unwrap();
        let ok = Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .arg(CLIENT)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "npm install {CLIENT} failed (are Node.js, npm and the registry there?)"
        );
    });
    prefix.join("node_modules")
}

/// A scenario of `tests/node/compat.js`.
fn compat(name: &str, endpoints: &str, topic: &str, group: &str) -> Command {
    let mut c = script_command("node", "tests/node/compat.js", [name, endpoints, topic, group]);
    c.env("NODE_PATH", node_modules());
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_simple_push_and_fifo_consumers() {
    let mut env = Env::start("node", compat).await;
    env.admin(&["topic", "create", "--topic", "Normal", "--queues", "4"]);
    env.admin(&["topic", "create", "--topic", "Pushed", "--queues", "4"]);
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
    let access = env.follower().await;
    env.scenario("simple", &access, "Normal", "Simple").await;
    env.scenario("push", &access, "Pushed", "Push").await;
    env.scenario("fifo", &access, "Ordered", "Fifo").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_messages_survive_a_leader_crash() {
    let mut env = Env::start("node", compat).await;
    env.admin(&["topic", "create", "--topic", "Failover", "--queues", "4"]);
    let access = env.follower().await;
    let out = env.scenario("failover", &access, "Failover", "Survivor").await;
    eprintln!("{out}");
}
