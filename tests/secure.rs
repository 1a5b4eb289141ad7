//! `raftmq dev --secure`: TLS on every port, and a Raft port and
//! NameServer that admit only the cluster's members, each speaking only for
//! itself. The outsiders here are real TLS clients with real certificates:
//! one from another CA, one from the cluster's CA for another group, one
//! for a member that claims to be another member, and none at all. The
//! official Python client (5.1.2, `tls_enable=True`) sends and receives.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::dev::{base_port, start_dev};
use common::raftmq_cli;
use raftmq::proto::pb;
use raftmq_raft::network::{GROUP_HEADER, TARGET_HEADER};
use raftmq_raft::pb::raft_client::RaftClient;
use raftmq_raft::tls::issue::{Ca, Pem};
use raftmq_raft::tls::material::Files;
use raftmq_raft::tls::{Dialer, Material};
use tonic::Code;
use tonic::transport::Channel;

/// Writes `pem` under `dir` and makes a dialer that shows it and trusts
/// `ca_cert`.
fn dialer(dir: &Path, name: &str, pem: Option<&Pem>, ca_cert: &Path) -> Dialer {
    let mut files = Files::client(ca_cert);
    if let Some(pem) = pem {
        let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&cert, &pem.cert).unwrap();
        std::fs::write(&key, &pem.key).unwrap();
        files.cert = Some(cert);
        files.key = Some(key);
    }
    Dialer::tls(Arc::new(Material::load(files).unwrap()))
}

fn channel(dialer: &Dialer, addr: &str) -> Channel {
    let ep = raftmq::client::channel::endpoint(addr, Duration::from_secs(2))
        .unwrap()
        .timeout(Duration::from_secs(5));
    raftmq::client::channel::lazy(ep, addr, dialer)
}

fn addressed<T>(msg: T, group: &str, target: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(GROUP_HEADER, group.parse().unwrap());
    r.metadata_mut()
        .insert(TARGET_HEADER, target.to_string().parse().unwrap());
    r
}

fn vote(term: u64, node: u64) -> raftmq_raft::pb::Vote {
    raftmq_raft::pb::Vote {
        term,
        voted_for: node,
        committed: false,
    }
}

/// Every Raft call a member could make, as `node`, to node `target` of
/// `group`: the codes they end with (`Ok` for an answer).
async fn raft_calls(ch: Channel, group: &str, target: u64, node: u64) -> Vec<(&'static str, Code)> {
    let mut c = RaftClient::new(ch);
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    let mut out = Vec::new();
    let v = c
        .vote(addressed(
            raftmq_raft::pb::VoteRequest {
                vote: Some(vote(1_000, node)),
                last_log_id: None,
                leadership_transfer: false,
            },
            group,
            target,
        ))
        .await;
    out.push(("vote", code(v.map(drop))));
    let append = raftmq_raft::pb::AppendRequest {
        vote: Some(vote(1_000, node)),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let a = async {
        let mut answers = c
            .append(addressed(futures::stream::iter([append]), group, target))
            .await?
            .into_inner();
        match futures::StreamExt::next(&mut answers).await {
            Some(Err(s)) => Err(s),
            _ => Ok(()),
        }
    }
    .await;
    out.push(("append", code(a)));
    let header = raftmq_raft::pb::SnapshotChunk {
        chunk: Some(raftmq_raft::pb::snapshot_chunk::Chunk::Header(
            raftmq_raft::pb::SnapshotHeader {
                vote: Some(vote(1_000, node)),
                meta_json: b"{}".to_vec(),
                total_len: 0,
            },
        )),
    };
    let s = c
        .install_snapshot(addressed(futures::stream::iter([header]), group, target))
        .await;
    out.push(("install-snapshot", code(s.map(drop))));
    let t = c
        .transfer_leader(addressed(
            raftmq_raft::pb::TransferLeaderRequest {
                from_leader: Some(vote(1_000, node)),
                to_node_id: node,
                last_log_id: None,
            },
            group,
            target,
        ))
        .await;
    out.push(("transfer-leader", code(t.map(drop))));
    let r = c
        .read_index(addressed(raftmq_raft::pb::ReadIndexRequest {}, group, target))
        .await;
    out.push(("read-index", code(r.map(drop))));
    out
}

fn heartbeat(group: &str, node: u64) -> pb::BrokerHeartbeat {
    pb::BrokerHeartbeat {
        cluster: "DefaultCluster".into(),
        group: group.into(),
        node_id: node,
        role: "leader".into(),
        term: 1_000,
        client_addr: "127.0.0.1:1".into(),
        raft_addr: "127.0.0.1:2".into(),
        commit_index: 0,
        applied_index: 0,
        pid: 1,
        topics: vec![],
    }
}

async fn heartbeat_code(ch: Channel, group: &str, node: u64) -> Code {
    let mut c = pb::name_server_client::NameServerClient::new(ch);
    c.heartbeat(heartbeat(group, node))
        .await
        .err()
        .map_or(Code::Ok, |s| s.code())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_members_reach_the_raft_port_and_the_nameserver() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, info) = start_dev(dir.path(), base_port(), &["--secure"]);
    let ca_cert = Path::new(info["ca_cert"].as_str().expect("dev.json names ca_cert")).to_path_buf();
    let ca_arg = ca_cert.to_str().unwrap().to_string();
    let namesrv = info["namesrv_addr"].as_str().unwrap().to_string();
    let nodes = info["nodes"].as_array().unwrap();
    let raft1 = nodes[0]["raft_addr"].as_str().unwrap().to_string();
    let access: Vec<&str> = nodes.iter().map(|n| n["client_addr"].as_str().unwrap()).collect();
    let access = access.join(";");
    let admin = info["admin_access_key"].as_str().unwrap().to_string();
    let admin_secret = info["admin_secret_key"].as_str().unwrap().to_string();
    let produce_as = |with_ca: bool, user: Option<(&str, &str)>| {
        let mut args = vec!["produce", "--endpoint", &access, "--topic", "TestTopic", "--count", "3"];
        if with_ca {
            args.extend(["--ca-cert", &ca_arg]);
        }
        if let Some((ak, sk)) = user {
            args.extend(["--access-key", ak, "--secret-key", sk]);
        }
        raftmq_cli(&args)
    };
    let produce = |with_ca: bool| produce_as(with_ca, Some((&admin, &admin_secret)));
    let (ok, out, err) = produce(true);
    assert!(ok, "produce over TLS: {err}");
    // ACL is on: no credentials, an unknown user or a wrong secret get
    // UNAUTHORIZED, and nothing is sent.
    for (who, user) in [
        ("no credentials", None),
        ("an unknown user", Some(("mallory", "mallory-secret"))),
        ("a wrong secret", Some((admin.as_str(), "wrong-secret"))),
    ] {
        let (ok, _, err) = produce_as(true, user);
        assert!(!ok && err.contains("Unauthorized (40100)"), "{who}: {err}");
    }
    assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 3, "{out}");
    // Plaintext to a TLS port fails, and says what to do.
    let (ok, _, err) = produce(false);
    assert!(!ok, "a plaintext produce reached a TLS port");
    assert!(err.contains("--ca-cert"), "{err}");

    let certs = dir.path().join("certs");
    let cluster_ca = Ca::load(Pem {
        cert: std::fs::read_to_string(certs.join("ca.pem")).unwrap(),
        key: std::fs::read_to_string(certs.join("ca.key")).unwrap(),
    })
    .unwrap();
    let stranger_ca = Ca::new("another CA").unwrap();
    let hosts = ["127.0.0.1"];
    let out_dir = tempfile::tempdir().unwrap();
    let od = out_dir.path();
    // A leaf for dev node 2, but from another CA.
    let forged = stranger_ca.leaf("forged", &hosts, Some(("dev", 2))).unwrap();
    let forged = dialer(od, "forged", Some(&forged), &ca_cert);
    // A client certificate from the cluster's CA for another group's node.
    let other_group = cluster_ca.leaf("other", &hosts, Some(("other", 1))).unwrap();
    let other_group = dialer(od, "other", Some(&other_group), &ca_cert);
    // Dev node 2's own name, used to speak as node 1.
    let node2 = cluster_ca.leaf("node2", &hosts, Some(("dev", 2))).unwrap();
    let node2 = dialer(od, "node2", Some(&node2), &ca_cert);
    let anonymous = dialer(od, "anonymous", None, &ca_cert);

    // The handshake itself refuses a certificate from another CA, and no
    // certificate at all: nothing reaches the service.
    // With TLS 1.3 the client learns of the refusal only when it reads, so
    // the call ends as whichever transport failure h2 saw first; what
    // matters is that the service answered nothing.
    let refused = |code: Code| matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled);
    for (who, d) in [("another CA", &forged), ("no certificate", &anonymous)] {
        for (call, code) in raft_calls(channel(d, &raft1), "dev", 1, 2).await {
            assert!(refused(code), "{who}: {call}: {code:?}");
        }
    }
    for (call, code) in raft_calls(channel(&other_group, &raft1), "dev", 1, 1).await {
        assert_eq!(code, Code::PermissionDenied, "another group's node: {call}");
    }
    // A ReadIndex speaks for no one: any member may ask.
    for (call, code) in raft_calls(channel(&node2, &raft1), "dev", 1, 3).await {
        if call == "read-index" {
            continue;
        }
        assert_eq!(code, Code::PermissionDenied, "node 2 speaking as node 3: {call}");
    }

    // The NameServer: a forged CA fails the handshake, no certificate is
    // refused for a heartbeat (routes stay readable), a member speaks only
    // for itself.
    let forged_hb = heartbeat_code(channel(&forged, &namesrv), "dev", 2).await;
    assert!(refused(forged_hb), "{forged_hb:?}");
    assert_eq!(
        heartbeat_code(channel(&anonymous, &namesrv), "dev", 2).await,
        Code::Unauthenticated
    );
    assert_eq!(
        heartbeat_code(channel(&node2, &namesrv), "dev", 1).await,
        Code::PermissionDenied
    );
    assert_eq!(
        heartbeat_code(channel(&other_group, &namesrv), "other", 2).await,
        Code::PermissionDenied
    );
    let mut reader = pb::name_server_client::NameServerClient::new(channel(&anonymous, &namesrv));
    let route = reader
        .get_route(pb::RouteRequest {
            topic: "TestTopic".into(),
        })
        .await
        .unwrap();
    assert!(!route.get_ref().groups.is_empty());

    // The cluster went on meanwhile, with no stray member or registration.
    let (ok, _, err) = produce(true);
    assert!(ok, "produce after the outsiders: {err}");
    let admin_cli = |args: &[&str]| common::dev::admin_cli(&info, args);
    let (ok, out, err) = admin_cli(&["cluster", "status", "--namesrv", &namesrv]);
    assert!(ok, "{err}");
    assert!(!out.contains("127.0.0.1:1 ") && !out.contains("group other"), "{out}");
    assert!(out.contains("leader"), "{out}");

    // Users and policies are the group's replicated state: they outlive
    // the node that took the change.
    let ok_cli = |args: &[&str]| {
        let (ok, out, err) = admin_cli(args);
        assert!(ok, "raftmq {args:?}: {out}{err}");
        out
    };
    ok_cli(&[
        "user",
        "create",
        "--namesrv",
        &namesrv,
        "-u",
        "alice",
        "-p",
        "alice-secret",
    ]);
    ok_cli(&[
        "acl",
        "create",
        "--namesrv",
        &namesrv,
        "-s",
        "User:alice",
        "-r",
        "Topic:Test*",
        "-a",
        "Pub",
        "-d",
        "Allow",
    ]);
    let leader = (0..3)
        .find(|&i| {
            let addr = nodes[i]["client_addr"].as_str().unwrap();
            ok_cli(&["node", "status", "--endpoint", addr]).contains("leader")
        })
        .expect("a node leads");
    // SAFETY: a broker process dev started for this test.
    unsafe { libc::kill(nodes[leader]["pid"].as_i64().unwrap() as i32, libc::SIGKILL) };
    let others: Vec<&str> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| nodes[i]["client_addr"].as_str().unwrap())
        .collect();
    let others = others.join(";");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, err) = raftmq_cli(&[
            "produce",
            "--endpoint",
            &others,
            "--topic",
            "TestTopic",
            "--count",
            "1",
            "--ca-cert",
            &ca_arg,
            "--access-key",
            "alice",
            "--secret-key",
            "alice-secret",
        ]);
        if ok {
            assert!(out.contains("sent "), "{out}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "alice cannot send after the failover: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The CLI reaches a group at the leader the NameServer names, which is
    // the dead node until the new leader's heartbeat lands.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let policy = loop {
        let (ok, out, err) = admin_cli(&["acl", "get", "--namesrv", &namesrv, "-s", "User:alice"]);
        if ok {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "acl get after the failover: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(policy.contains("Topic:Test*") && policy.contains("Allow"), "{policy}");
    // Alice may not manage users.
    let (ok, _, err) = raftmq_cli(&[
        "user",
        "create",
        "--namesrv",
        &namesrv,
        "-u",
        "bob",
        "-p",
        "bob-secret",
        "--ca-cert",
        &ca_arg,
        "--access-key",
        "alice",
        "--secret-key",
        "alice-secret",
    ]);
    assert!(!ok && err.contains("refused"), "{err}");

    // SIGINT, as a person stops dev.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(dev.id() as i32, libc::SIGINT) };
    assert!(dev.wait().unwrap().success());
}
