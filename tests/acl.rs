//! ACL without TLS, on a group of real broker processes: users and
//! policies are the group's replicated state, so they come back when every
//! node restarts (from each node's snapshot and the log after it), and a
//! follower that forwards a signed call does not vouch for it: the leader
//! checks the signature again. Operators' calls and Telemetry settings
//! are checked on the topics and groups they name.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use raftmq::client::credentials::Credentials;
use raftmq::client::{Client, ClientError, Outgoing};
use raftmq::proto::pb;
use raftmq::proto::pb::broker_client::BrokerClient;
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::Code;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;
use raftmq_raft::acl::{AclCommand, Action, Decision, PolicyEntry, Resource, User, UserStatus, UserType};
use tonic::transport::Channel;

const CONFIG: &str = "snapshot_every = 20\n\
    [acl]\nenabled = true\ninit_access_key = \"root\"\ninit_secret_key = \"root-secret\"\n";

fn creds(ak: &str, sk: &str) -> Credentials {
    Credentials {
        access_key: ak.into(),
        secret_key: sk.into(),
    }
}

/// `msg`, signed as the Super user.
fn as_root<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    creds("root", "root-secret").sign_into(r.metadata_mut());
    r
}

fn v1(addr: &str) -> BrokerClient<Channel> {
    BrokerClient::new(Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy())
}

/// The node that leads, asked as the Super user: until the initial user
/// is applied every call is refused, so this also waits for that.
async fn leader(c: &Cluster) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for n in &c.nodes {
            if let Ok(s) = v1(&n.client_addr)
                .status(as_root(pb::StatusRequest { with_digest: false }))
                .await
                && s.get_ref().role == "leader"
            {
                return n.client_addr.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader answered the Super user within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn change(addr: &str, cmd: &AclCommand) {
    v1(addr)
        .change_acl(as_root(pb::ChangeAclRequest {
            command_json: serde_json::to_string(cmd).unwrap(),
        }))
        .await
        .unwrap();
}

/// Makes a Normal user through node `addr`, as the Super user.
async fn create_user(addr: &str, name: &str, password: &str) {
    let user = User {
        name: name.into(),
        password: password.into(),
        user_type: UserType::Normal,
        status: UserStatus::Enable,
    };
    change(addr, &AclCommand::CreateUser(user)).await;
}

/// The user names and `User:alice`'s resources as node `addr` has applied them.
async fn acl_of(addr: &str) -> Option<(Vec<String>, Vec<String>)> {
    let r = v1(addr)
        .read_acl(as_root(pb::ReadAclRequest {}))
        .await
        .ok()?
        .into_inner();
    let users = r.users.into_iter().map(|u| u.name).collect();
    let alice = r
        .policies
        .into_iter()
        .filter(|p| p.subject == "User:alice")
        .flat_map(|p| p.entries.into_iter().map(|e| e.resource))
        .collect();
    Some((users, alice))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_policies_outlive_a_restart_of_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", CONFIG);
    let l = leader(&c).await;
    v1(&l)
        .put_topic(as_root(pb::PutTopicRequest {
            name: "T".into(),
            read_queues: 2,
            write_queues: 2,
            perm: 6,
            message_type: String::new(),
        }))
        .await
        .unwrap();
    create_user(&l, "alice", "alice-secret").await;
    change(
        &l,
        &AclCommand::PutAcl {
            subject: "User:alice".into(),
            entries: vec![PolicyEntry {
                resource: Resource::parse("Topic:T").unwrap(),
                actions: vec![Action::Pub],
                source_ips: vec![],
                decision: Decision::Allow,
            }],
        },
    )
    .await;
    let all: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let alice = Client::connect(&all.join(";"))
        .unwrap()
        .with_credentials(Some(creds("alice", "alice-secret")));
    // Past a snapshot (every 20 entries) on every node.
    for i in 0..30 {
        alice.send(Outgoing::new("T", format!("m{i}"))).await.unwrap();
    }
    for id in 1..=3 {
        assert!(c.stop(id).success());
        let snapshot = std::fs::read_to_string(dir.path().join(format!("node{id}/raft/snapshot.json"))).unwrap();
        assert!(snapshot.contains("alice"), "node {id}'s snapshot holds the user");
    }
    for id in 1..=3 {
        c.spawn(id);
    }
    let l = leader(&c).await;
    let want = (
        vec!["alice".to_string(), "root".to_string()],
        vec!["Topic:T".to_string()],
    );
    for addr in &all {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = acl_of(addr).await;
            if got.as_ref() == Some(&want) {
                break;
            }
            assert!(Instant::now() < deadline, "{addr} after the restart: {got:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Through a follower alone: it forwards, the leader checks again.
    let follower = all.iter().find(|a| **a != l).unwrap();
    let via = |sk: &str| {
        Client::connect(follower)
            .unwrap()
            .with_credentials(Some(creds("alice", sk)))
    };
    via("alice-secret").send(Outgoing::new("T", "after")).await.unwrap();
    match via("wrong-secret").send(Outgoing::new("T", "x")).await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, Code::Unauthorized),
        other => panic!("a wrong secret through a follower: {other:?}"),
    }
}

/// Asserts that a call was refused for want of a policy.
fn denied<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>, what: &str) {
    match r {
        Err(s) => assert_eq!(s.code(), tonic::Code::PermissionDenied, "{what}: {s:?}"),
        Ok(r) => panic!("{what} was allowed: {r:?}"),
    }
}

/// `msg`, signed as `user`.
fn as_user<T>(user: &Credentials, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    user.sign_into(r.metadata_mut());
    r
}

/// Operators' calls on one topic or group need the action on that topic
/// or group, not on the cluster: a user allowed to create `own-*` topics
/// and read group `g` may do that and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_are_checked_on_the_topic_or_group_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start_with(dir.path(), 1, "async", CONFIG);
    let l = leader(&c).await;
    create_user(&l, "ops", "ops-secret").await;
    let entry = |resource: &str, actions: Vec<Action>| PolicyEntry {
        resource: Resource::parse(resource).unwrap(),
        actions,
        source_ips: vec![],
        decision: Decision::Allow,
    };
    change(
        &l,
        &AclCommand::PutAcl {
            subject: "User:ops".into(),
            entries: vec![
                entry("Topic:own-*", vec![Action::Create, Action::Get]),
                entry("Group:g", vec![Action::Get]),
            ],
        },
    )
    .await;
    let ops = creds("ops", "ops-secret");
    let topic = |name: &str| common::topic_request(name, 1, "");
    v1(&l).put_topic(as_user(&ops, topic("own-1"))).await.unwrap();
    v1(&l)
        .get_topic(as_user(&ops, pb::GetTopicRequest { name: "own-1".into() }))
        .await
        .unwrap();
    v1(&l)
        .put_consumer_group(as_root(pb::PutConsumerGroupRequest {
            name: "g".into(),
            fifo: false,
            max_delivery_attempts: 16,
        }))
        .await
        .unwrap();
    v1(&l)
        .get_consumer_group(as_user(&ops, pb::GetConsumerGroupRequest { name: "g".into() }))
        .await
        .unwrap();
    denied(
        v1(&l).put_topic(as_user(&ops, topic("other"))).await,
        "creating another topic",
    );
    denied(
        v1(&l)
            .delete_topic(as_user(&ops, pb::DeleteTopicRequest { name: "own-1".into() }))
            .await,
        "deleting without Delete",
    );
    denied(
        v1(&l)
            .delete_consumer_group(as_user(&ops, pb::GetConsumerGroupRequest { name: "g".into() }))
            .await,
        "deleting the group",
    );
    denied(
        v1(&l)
            .group_progress(as_user(&ops, pb::GroupProgressRequest { group: String::new() }))
            .await,
        "every group's progress (List on the cluster)",
    );
    denied(
        v1(&l)
            .reset_offset(as_user(
                &ops,
                pb::ResetOffsetRequest {
                    group: "g".into(),
                    topic: "own-1".into(),
                    to_end: true,
                    ..Default::default()
                },
            ))
            .await,
        "resetting without Update on the group",
    );
    denied(
        v1(&l)
            .add_node(as_user(
                &ops,
                pb::AddNodeRequest {
                    node_id: 9,
                    raft_addr: "127.0.0.1:1".into(),
                    client_addr: "127.0.0.1:2".into(),
                },
            ))
            .await,
        "adding a node",
    );
    // A producer's Telemetry settings name the topics whose transaction
    // check-backs it would be sent: it is registered for those it may Pub
    // to, and the rest are left out (the Java producer names every topic it
    // ever tried). A consumer whose group it may not Sub is refused.
    let telemetry = |who: Credentials, settings: v2::Settings| {
        let l = l.clone();
        async move {
            let cmd = v2::TelemetryCommand {
                status: None,
                command: Some(v2::telemetry_command::Command::Settings(settings)),
            };
            let mut r = as_user(&who, tokio_stream::iter(vec![cmd]));
            r.metadata_mut()
                .insert("x-mq-client-id", format!("client-{}", who.access_key).parse().unwrap());
            let mut t =
                MessagingServiceClient::new(Channel::from_shared(format!("http://{l}")).unwrap().connect_lazy())
                    .telemetry(r)
                    .await
                    .unwrap()
                    .into_inner();
            let first = t.message().await.unwrap().unwrap();
            (first.status.map(|s| s.code), t)
        }
    };
    let res = |n: &str| v2::Resource {
        resource_namespace: String::new(),
        name: n.into(),
    };
    let publishing = v2::Settings {
        client_type: Some(v2::ClientType::Producer as i32),
        pub_sub: Some(v2::settings::PubSub::Publishing(v2::Publishing {
            topics: vec![res("own-1")],
            ..Default::default()
        })),
        ..Default::default()
    };
    let registered = |who: &'static str| {
        let l = l.clone();
        async move {
            let clients = v1(&l)
                .list_clients(as_root(pb::ListClientsRequest::default()))
                .await
                .unwrap()
                .into_inner()
                .clients;
            clients
                .into_iter()
                .find(|c| c.client_id == format!("client-{who}"))
                .map(|c| c.topics)
        }
    };
    for (who, topics) in [
        (ops.clone(), vec![]),
        (creds("root", "root-secret"), vec!["own-1".to_string()]),
    ] {
        let name = if who.access_key == "ops" { "ops" } else { "root" };
        let (code, _stream) = telemetry(who, publishing.clone()).await;
        assert_eq!(code, Some(Code::Ok as i32), "{name}'s settings");
        assert_eq!(registered(name).await, Some(topics), "{name} is sent check-backs of");
    }
    let consumer = v2::Settings {
        client_type: Some(v2::ClientType::SimpleConsumer as i32),
        pub_sub: Some(v2::settings::PubSub::Subscription(v2::Subscription {
            group: Some(res("not-g")),
            ..Default::default()
        })),
        ..Default::default()
    };
    let (code, _) = telemetry(ops.clone(), consumer).await;
    assert_eq!(
        code,
        Some(Code::Unauthorized as i32),
        "a consumer of a group it may not Sub"
    );

    // What was refused did not happen.
    let topics = v1(&l)
        .get_topic(as_root(pb::GetTopicRequest { name: "other".into() }))
        .await;
    assert!(topics.is_err(), "topic other exists: {topics:?}");
}

/// A group with ACL on and no first user could never be called: its
/// bootstrap node refuses to make it, and says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_with_acl_on_needs_an_initial_user() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 1, "async", "[acl]\nenabled = true\n");
    let child = c.nodes[0].child.as_mut().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the node kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    c.nodes[0].child = None;
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.path().join("node1.log")).unwrap();
    assert!(
        log.contains("will not initialize a new group") && log.contains("init_access_key"),
        "{log}"
    );
}

/// A node that has not applied its group's latest users never refuses one
/// of them: it catches up first, and while it cannot (it knows no leader)
/// it answers "unavailable", which clients retry, not "unauthorized".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_on_users_answers_unavailable_not_unauthorized() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "async", CONFIG);
    let l = leader(&c).await;
    // Node 3 is down while alice is made, so its log lacks her.
    let lagging = c.nodes.iter().position(|n| n.client_addr != l).unwrap() as u64 + 1;
    assert!(c.stop(lagging).success());
    create_user(&l, "alice", "alice-secret").await;
    let alice = creds("alice", "alice-secret");
    let heartbeat = |addr: String| {
        let alice = alice.clone();
        async move {
            let mut r = as_user(
                &alice,
                v2::HeartbeatRequest {
                    group: None,
                    client_type: v2::ClientType::Producer as i32,
                },
            );
            r.metadata_mut().insert("x-mq-client-id", "alice-1".parse().unwrap());
            MessagingServiceClient::new(Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy())
                .heartbeat(r)
                .await
                .map(|r| r.into_inner().status.map_or(0, |s| s.code))
        }
    };
    // Alone, it cannot learn what it lacks.
    for id in 1..=3 {
        if id != lagging {
            assert!(c.stop(id).success());
        }
    }
    c.spawn(lagging);
    let addr = c.node(lagging).client_addr.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        match heartbeat(addr.clone()).await {
            Ok(code) => break code,
            Err(e) => assert!(Instant::now() < deadline, "node {lagging} never answered: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(code, Code::HaNotAvailable as i32, "a node that knows no leader");
    // With its group back, it catches up and lets her in; never a refusal.
    for id in 1..=3 {
        if id != lagging {
            c.spawn(id);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match heartbeat(addr.clone()).await {
            Ok(code) if code == Code::Ok as i32 => break,
            Ok(code) => assert_ne!(code, Code::Unauthorized as i32, "alice refused by a node catching up"),
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "node {lagging} never let alice in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
