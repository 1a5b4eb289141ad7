//! A three-node group in one process, over real gRPC on 127.0.0.1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use raftmq_raft::command::{AdminCommand, BatchOutcome, Command, Duplicate, Response, SendBatch, TopicConfig};
use raftmq_raft::message::MessageView;
use raftmq_raft::{Message, NodeAddr, NodeConfig, RaftNode};
use raftmq_store::StoreConfig;

/// A port nothing listens on, below the OS's ephemeral range: a port picked
/// there cannot be taken by an outgoing connection's local end between the
/// pick and the server's bind (which port 0 allows). Never the same twice in
/// one process; the start is spread by process id.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Below 30000 too: Kubernetes NodePorts (30000-32767) may answer on
    // 127.0.0.1 with no socket bound.
    let top = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(2_048, 30_000);
    let bottom = top.saturating_sub(20_000).max(1_024);
    let span = top - bottom;
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let port = (bottom + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {bottom}..{top}");
}

fn node_config(dir: &std::path::Path, id: u64, addr: &NodeAddr, members: &BTreeMap<u64, NodeAddr>) -> NodeConfig {
    let mut cfg = NodeConfig::new("g", id, dir.join(format!("n{id}")), addr.clone());
    cfg.initial_members = members.clone();
    cfg.bootstrap = id == 1;
    cfg.store = StoreConfig::small_for_tests();
    // Tests run in parallel on two cores: keep elections rare.
    cfg.election_timeout_min_ms = 600;
    cfg.election_timeout_max_ms = 1200;
    cfg.heartbeat_interval_ms = 100;
    cfg
}

fn new_addr() -> NodeAddr {
    NodeAddr {
        raft_addr: format!("127.0.0.1:{}", free_port()),
        client_addr: format!("127.0.0.1:{}", free_port()),
    }
}

async fn put_topic(l: &RaftNode) {
    l.write(Command::admin(&AdminCommand::PutTopic(TopicConfig {
        name: "T".into(),
        read_queues: 2,
        write_queues: 2,
        perm: 6,
        message_type: Default::default(),
    })))
    .await
    .unwrap();
}

/// Sends messages `range` to topic T (queue = i % 2) through `l`.
async fn send(l: &RaftNode, range: std::ops::Range<u64>) {
    send_padded(l, range, 0).await
}

/// As [`send`], with `pad` extra body bytes per message.
async fn send_padded(l: &RaftNode, range: std::ops::Range<u64>, pad: usize) {
    for i in range {
        let mut m = message(i);
        m.body = Bytes::from([m.body.to_vec(), vec![b'.'; pad]].concat());
        let batch = SendBatch {
            topic: "T".into(),
            queue_id: (i % 2) as u32,
            messages: vec![m],
        };
        let (_, resp) = l.write(Command::send(&[batch], 1000 + i).unwrap()).await.unwrap();
        assert!(
            matches!(resp, Response::Sent(ref o) if matches!(o[0], BatchOutcome::Appended { .. })),
            "{resp:?}"
        );
    }
}

/// Has `n` snapshot its state and waits until the snapshot covers `last`.
async fn snapshot(n: &RaftNode, last: u64) {
    n.raft.trigger().snapshot().await.unwrap();
    n.raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.snapshot.is_some_and(|s| s.index >= last), "snapshot")
        .await
        .unwrap();
}

/// Hands leadership from `from` to `to` and waits until `to` leads.
async fn transfer(from: &RaftNode, to: &RaftNode) {
    from.transfer_leader(to.id).await.unwrap();
    to.raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.current_leader == Some(to.id), "transfer")
        .await
        .unwrap();
}

async fn wait_applied(n: &RaftNode, index: u64) {
    let mut applied = n.sm.applied_watch();
    tokio::time::timeout(Duration::from_secs(10), applied.wait_for(|&i| i >= index))
        .await
        .unwrap_or_else(|_| panic!("node {} never applied {index}", n.id))
        .unwrap();
}

async fn start_group(dir: &std::path::Path) -> Vec<Arc<RaftNode>> {
    let addrs: BTreeMap<u64, NodeAddr> = (1..=3).map(|id| (id, new_addr())).collect();
    let mut nodes = Vec::new();
    for (&id, addr) in &addrs {
        nodes.push(RaftNode::start(node_config(dir, id, addr, &addrs)).await.unwrap());
    }
    nodes
}

async fn leader(nodes: &[Arc<RaftNode>]) -> Arc<RaftNode> {
    for _ in 0..200 {
        if let Some(n) = nodes.iter().find(|n| n.is_leader()) {
            return n.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no leader elected");
}

fn message(i: u64) -> Message {
    Message {
        message_id: format!("m{i}"),
        tag: "TagA".into(),
        keys: vec![format!("k{i}")],
        properties: vec![],
        body: Bytes::from(format!("body {i}")),
        born_timestamp_ms: i,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_and_assign_identical_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    l.write(Command::admin(&AdminCommand::PutTopic(TopicConfig {
        name: "T".into(),
        read_queues: 2,
        write_queues: 2,
        perm: 6,
        message_type: Default::default(),
    })))
    .await
    .unwrap();
    let mut expected = Vec::new();
    for i in 0..50u64 {
        let batch = SendBatch {
            topic: "T".into(),
            queue_id: (i % 2) as u32,
            messages: vec![message(i)],
        };
        let (_, resp) = l.write(Command::send(&[batch], 1000 + i).unwrap()).await.unwrap();
        let Response::Sent(outcomes) = resp else {
            panic!("{resp:?}")
        };
        let BatchOutcome::Appended {
            first_queue_offset,
            count,
            ..
        } = outcomes[0]
        else {
            panic!()
        };
        assert_eq!((first_queue_offset, count), (i / 2, 1));
        expected.push(((i % 2) as u32, i / 2, format!("body {i}")));
    }
    // Unknown topics are refused by the state machine, deterministically.
    let bad = SendBatch {
        topic: "Nope".into(),
        queue_id: 0,
        messages: vec![message(0)],
    };
    let (_, resp) = l.write(Command::send(&[bad], 1).unwrap()).await.unwrap();
    assert!(matches!(resp, Response::Sent(ref o) if matches!(o[0], BatchOutcome::Rejected(_))));

    // Every node applies the same entries and assigns the same offsets.
    let last = l.sm.last_applied().unwrap().index;
    for n in &nodes {
        let mut applied = n.sm.applied_watch();
        tokio::time::timeout(Duration::from_secs(5), applied.wait_for(|&i| i >= last))
            .await
            .unwrap()
            .unwrap();
        for (q, offset, body) in &expected {
            let (_, bytes) = n.store.message("T", *q, *offset).unwrap();
            let (view, _) = MessageView::parse(&bytes).unwrap();
            assert_eq!(view.body, body.as_bytes(), "node {}", n.id);
        }
    }
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_after_the_log_was_purged_installs_a_snapshot_and_keeps_up() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    put_topic(&l).await;
    // A user and its policy: replicated state a new node gets only from
    // the snapshot.
    let alice = raftmq_raft::acl::User {
        name: "alice".into(),
        password: "alice-secret".into(),
        user_type: raftmq_raft::acl::UserType::Normal,
        status: raftmq_raft::acl::UserStatus::Enable,
    };
    let entry = raftmq_raft::acl::PolicyEntry {
        resource: raftmq_raft::acl::Resource::parse("Topic:T").unwrap(),
        actions: vec![raftmq_raft::acl::Action::Pub],
        source_ips: vec![],
        decision: raftmq_raft::acl::Decision::Allow,
    };
    for c in [
        raftmq_raft::acl::AclCommand::CreateUser(alice.clone()),
        raftmq_raft::acl::AclCommand::PutAcl {
            subject: "User:alice".into(),
            entries: vec![entry.clone()],
        },
    ] {
        l.write(Command::admin(&AdminCommand::Acl(c))).await.unwrap();
    }
    // Enough entries to fill several 64 KiB segments.
    send_padded(&l, 0..400, 1000).await;
    let last = l.sm.last_applied().unwrap().index;
    for n in &nodes {
        wait_applied(n, last).await;
        snapshot(n, last).await;
        // As retention would: let the purge delete the segments too.
        n.log.allow_deletion_below(u64::MAX);
        n.raft.trigger().purge_log(last).await.unwrap();
        n.raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.purged.is_some_and(|p| p.index >= last), "purge")
            .await
            .unwrap();
    }
    assert!(l.store.commitlog().min_offset() > 0, "purging deleted whole segments");

    // Node 4 starts empty; the leader can only send it the snapshot.
    let addr4 = new_addr();
    let mut cfg = node_config(dir.path(), 4, &addr4, &BTreeMap::new());
    cfg.bootstrap = false;
    let n4 = RaftNode::start(cfg).await.unwrap();
    l.add_node(4, addr4).await.unwrap();
    wait_applied(&n4, last).await;
    assert!(
        n4.log.bounds().0 > last,
        "node 4 holds no purged entry: bounds {:?}, last {last}, purged {:?}",
        n4.log.bounds(),
        n4.raft.metrics().borrow_watched().purged
    );

    send(&l, 400..420).await;
    let last = l.sm.last_applied().unwrap().index;
    wait_applied(&n4, last).await;
    // New entries sit at the same physical offsets, and new messages at the
    // same queue offsets, on node 4 as on the leader.
    for i in n4.log.bounds().0..=last {
        assert_eq!(
            n4.log.locate(i).unwrap().phys,
            l.log.locate(i).unwrap().phys,
            "entry {i}"
        );
    }
    for q in 0..2u32 {
        let (lq, q4) = (l.store.queue("T", q).unwrap(), n4.store.queue("T", q).unwrap());
        assert_eq!(q4.max_offset(), lq.max_offset());
        for o in q4.min_offset()..q4.max_offset() {
            let (_, a) = l.store.message("T", q, o).unwrap();
            let (_, b) = n4.store.message("T", q, o).unwrap();
            assert_eq!(&a[..], &b[..]);
        }
        assert_eq!(
            q4.min_offset(),
            200,
            "node 4's queues start where the snapshot left them"
        );
    }
    assert!(n4.sm.topic("T").is_some(), "metadata came with the snapshot");
    // The deduplication window came with it: as leader, node 4 answers a
    // retry of message 395 (queue 1, offset 197) with its first copy.
    transfer(&l, &n4).await;
    assert_eq!(send_ids(&n4, 0, &[395], 1500).await, appended(0, 0, &[(0, 1, 197)]));
    n4.sm.with_metadata(|m| {
        assert_eq!(m.users.get("alice"), Some(&alice), "users came with the snapshot");
        assert_eq!(
            m.acls.get("User:alice"),
            Some(&vec![entry]),
            "policies came with the snapshot"
        );
    });
    n4.shutdown().await.unwrap();
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_on_request_and_remove_node_shrinks_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    put_topic(&l).await;
    let target = nodes.iter().find(|n| n.id != l.id).unwrap().clone();
    transfer(&l, &target).await;
    let new = target;
    assert!(new.is_leader());

    // Remove the old leader: two voters remain and writes go on.
    new.remove_node(l.id).await.unwrap();
    let voters: Vec<u64> = new.raft.voter_ids().collect();
    assert_eq!(voters.len(), 2);
    assert!(!voters.contains(&l.id));
    send(&new, 0..10).await;
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_raft_rpcs_are_rejected_not_fatal() {
    use raftmq_raft::pb;
    use raftmq_raft::pb::raft_client::RaftClient;

    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    let mut c = RaftClient::connect(format!("http://{}", l.raft_addr())).await.unwrap();

    // Calls must name this group and node.
    fn to<T>(group: &str, target: u64, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert("x-raftmq-group", group.parse().unwrap());
        r.metadata_mut().insert("x-raftmq-target", target.into());
        r
    }
    let e = c.vote(pb::VoteRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "unaddressed: {e}");
    let e = c
        .vote(to("other-group", l.id, pb::VoteRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    let e = c
        .vote(to("g", l.id + 100, pb::VoteRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");

    let e = c.vote(to("g", l.id, pb::VoteRequest::default())).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = c
        .vote(to(
            "g",
            l.id,
            pb::VoteRequest {
                vote: Some(pb::Vote {
                    term: (u64::MAX >> 2) + 1,
                    voted_for: 1,
                    committed: false,
                }),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::InvalidArgument,
        "a term openraft would overflow: {e}"
    );

    // An append without a vote, one with an entry of an unknown kind, one
    // whose entries do not follow each other (storage would refuse it, and
    // openraft take that as fatal), and terms near u64::MAX (which openraft
    // would add one to).
    let vote = Some(pb::Vote {
        term: 1,
        voted_for: 1,
        committed: true,
    });
    let blank = |term, index| pb::Entry {
        term,
        index,
        kind: raftmq_raft::entry::KIND_BLANK.into(),
        payload: Default::default(),
    };
    // The smallest term refused (wire.rs's MAX_TERM + 1): openraft adds
    // one to terms, and the bound leaves it room.
    let huge = Some(pb::Vote {
        term: (u64::MAX >> 2) + 1,
        voted_for: 1,
        committed: true,
    });
    for (req, says) in [
        (pb::AppendRequest::default(), ""),
        (
            pb::AppendRequest {
                vote,
                entries: vec![pb::Entry {
                    term: 1,
                    index: 1,
                    kind: 99,
                    payload: Default::default(),
                }],
                ..Default::default()
            },
            "",
        ),
        (
            pb::AppendRequest {
                vote,
                prev_log_id: Some(pb::LogId { term: 1, index: 1 }),
                entries: vec![blank(1, 2), blank(1, 4)],
                ..Default::default()
            },
            "do not follow each other",
        ),
        (
            pb::AppendRequest {
                vote: huge,
                ..Default::default()
            },
            "",
        ),
    ] {
        let mut answers = c
            .append(to("g", l.id, futures::stream::iter([req])))
            .await
            .unwrap()
            .into_inner();
        let e = answers.message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(e.message().contains(says), "{e}");
    }

    // Snapshots: data before the header, a huge announced size, a forged meta.
    use pb::snapshot_chunk::Chunk;
    let chunk = |c: Chunk| pb::SnapshotChunk { chunk: Some(c) };
    for chunks in [
        vec![chunk(Chunk::Data(bytes::Bytes::from_static(b"x")))],
        vec![chunk(Chunk::Header(pb::SnapshotHeader {
            vote,
            meta_json: b"{}".to_vec(),
            total_len: u64::MAX,
        }))],
        vec![chunk(Chunk::Header(pb::SnapshotHeader {
            vote,
            meta_json: b"not json".to_vec(),
            total_len: 1,
        }))],
    ] {
        let e = c
            .install_snapshot(to("g", l.id, futures::stream::iter(chunks)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    }

    // The group is unharmed.
    put_topic(&*leader(&nodes).await).await;
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_returns_to_the_preferred_leader() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: BTreeMap<u64, NodeAddr> = (1..=3).map(|id| (id, new_addr())).collect();
    let mut nodes = Vec::new();
    for (&id, addr) in &addrs {
        let mut cfg = node_config(dir.path(), id, addr, &addrs);
        cfg.preferred_leader = Some(3);
        nodes.push(RaftNode::start(cfg).await.unwrap());
    }
    // Node 1 bootstraps and usually wins the first election; leadership
    // then moves to node 3 once it has caught up.
    nodes[2]
        .raft
        .wait(Some(Duration::from_secs(20)))
        .metrics(|m| m.current_leader == Some(3), "node 3 leads")
        .await
        .unwrap();
    put_topic(&nodes[2]).await;
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

struct FakeClock(u64);
impl raftmq_store::retention::Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
    fn local_hour(&self, _: u64) -> u8 {
        4
    }
}
struct FakeDisk;
impl raftmq_store::retention::DiskProbe for FakeDisk {
    fn usage(&self, _: &std::path::Path) -> raftmq_store::Result<raftmq_store::retention::DiskUsage> {
        Ok(raftmq_store::retention::DiskUsage {
            total_bytes: 100,
            used_bytes: 10,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_expired_segments_through_a_raft_purge() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    put_topic(&l).await;
    send_padded(&l, 0..300, 1000).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let later = FakeClock(now + 100 * 3600 * 1000);

    // Without a snapshot nothing may go, however old.
    let plan = l.enforce_retention(&later, &FakeDisk).await.unwrap();
    assert_eq!(plan.delete_before, None);

    let last = l.sm.last_applied().unwrap().index;
    snapshot(&l, last).await;
    let plan = l.enforce_retention(&later, &FakeDisk).await.unwrap();
    assert!(plan.delete_before.is_some(), "{plan:?}");
    l.raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.purged.is_some(), "purge")
        .await
        .unwrap();
    let min = l.store.commitlog().min_offset();
    assert!(min > 0, "whole segments were deleted");
    let cq = l.store.queue("T", 0).unwrap();
    assert!(cq.min_offset() > 0, "queues start past the deleted segments");
    // The group keeps working.
    send(&l, 300..310).await;
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

/// Sends `ids` as one batch to `queue_id` at store time `at_ms`; the
/// outcome.
async fn send_ids(l: &RaftNode, queue_id: u32, ids: &[u64], at_ms: u64) -> BatchOutcome {
    let batch = SendBatch {
        topic: "T".into(),
        queue_id,
        messages: ids.iter().map(|&i| message(i)).collect(),
    };
    let (_, resp) = l.write(Command::send(&[batch], at_ms).unwrap()).await.unwrap();
    let Response::Sent(mut o) = resp else {
        panic!("{resp:?}")
    };
    o.remove(0)
}

/// `batch` sent as the broker sends its own (retries, released timers):
/// guarded by a commit of group G's offset on T, queue 0.
async fn guarded_send(l: &RaftNode, batch: SendBatch, at_ms: u64) -> BatchOutcome {
    let guard = AdminCommand::CommitOffset {
        group: "G".into(),
        topic: "T".into(),
        queue_id: 0,
        offset: 1,
        bound: None,
    };
    let (_, resp) = l
        .write(Command::guarded_send(&guard, &[batch], at_ms).unwrap())
        .await
        .unwrap();
    let Response::Sent(mut o) = resp else {
        panic!("{resp:?}")
    };
    o.remove(0)
}

fn appended(first_queue_offset: u64, count: u32, duplicates: &[(u32, u32, u64)]) -> BatchOutcome {
    BatchOutcome::Appended {
        first_queue_offset,
        count,
        duplicates: duplicates
            .iter()
            .map(|&(index, queue_id, queue_offset)| Duplicate {
                index,
                queue_id,
                queue_offset,
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_write_permission_fences_the_sends_ordered_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    let l = leader(&nodes).await;
    put_topic(&l).await;
    assert_eq!(send_ids(&l, 0, &[1], 1000).await, appended(0, 1, &[]));
    let writable = |writable| Command::admin(&AdminCommand::SetWritable { writable });
    l.write(writable(false)).await.unwrap();
    // A producer's send the leader admitted before the wipe applied, and
    // so ordered after it (a race the broker's own check cannot close):
    // refused at its place in the log.
    let batch = |i| SendBatch {
        topic: "T".into(),
        queue_id: 0,
        messages: vec![message(i)],
    };
    let (_, resp) = l.write(Command::send(&[batch(2)], 2000).unwrap()).await.unwrap();
    assert_eq!(
        resp,
        Response::Sent(vec![BatchOutcome::Rejected(
            raftmq_raft::state_machine::WRITES_WIPED.into()
        )])
    );
    // The broker's own sends (guarded: retries, released timers) still go in.
    assert_eq!(guarded_send(&l, batch(3), 3000).await, appended(1, 1, &[]));
    // Every replica refused the same send.
    let last = l.sm.last_applied().unwrap().index;
    for n in &nodes {
        wait_applied(n, last).await;
        assert_eq!(n.store.queue("T", 0).unwrap().max_offset(), 2, "node {}", n.id);
    }
    // Restored: sends go in again.
    l.write(writable(true)).await.unwrap();
    assert_eq!(send_ids(&l, 0, &[4], 4000).await, appended(2, 1, &[]));
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_is_stored_once_across_leader_failover_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: BTreeMap<u64, NodeAddr> = (1..=3).map(|id| (id, new_addr())).collect();
    let mut nodes = Vec::new();
    for (&id, addr) in &addrs {
        nodes.push(
            RaftNode::start(node_config(dir.path(), id, addr, &addrs))
                .await
                .unwrap(),
        );
    }
    let l = leader(&nodes).await;
    put_topic(&l).await;
    assert_eq!(send_ids(&l, 0, &[1, 2], 1000).await, appended(0, 2, &[]));
    // A retry on another queue (as clients pick one) in a batch with a new
    // message: the new one is stored, the retry answered with its first copy.
    assert_eq!(send_ids(&l, 1, &[3, 1], 2000).await, appended(0, 1, &[(1, 0, 0)]));

    // The leader goes (as if killed before it answered), after a snapshot;
    // the next leader knows every id the old one stored.
    let last = l.sm.last_applied().unwrap().index;
    for n in &nodes {
        wait_applied(n, last).await;
    }
    snapshot(&l, last).await;
    l.shutdown().await.unwrap();
    nodes.retain(|n| n.id != l.id);
    let l2 = leader(&nodes).await;
    assert_eq!(send_ids(&l2, 1, &[2], 3000).await, appended(0, 0, &[(0, 0, 1)]));
    // Nothing else went into queue 1 than message 3.
    assert_eq!(l2.store.queue("T", 1).unwrap().max_offset(), 1);
    assert_eq!(send_ids(&l2, 0, &[4], 4000).await, appended(2, 1, &[]));

    // The old leader starts again: its window comes from its snapshot and
    // the entries after it, and it answers retries as leader too.
    let last = l2.sm.last_applied().unwrap().index;
    let mut cfg = node_config(dir.path(), l.id, &addrs[&l.id], &addrs);
    cfg.bootstrap = false;
    let back = RaftNode::start(cfg).await.unwrap();
    wait_applied(&back, last).await;
    transfer(&l2, &back).await;
    assert_eq!(
        send_ids(&back, 1, &[4, 2, 5], 5000).await,
        appended(1, 1, &[(0, 0, 2), (1, 0, 1)])
    );

    // A leader whose clock runs ten minutes ahead ages the window by one
    // step of 10 s, not by ten minutes: the retry is still known.
    let ahead = 5000 + 600_000;
    assert_eq!(send_ids(&back, 1, &[3], ahead).await, appended(0, 0, &[(0, 1, 0)]));
    // Past the window (120 s of the window's clock, which moves at most
    // 10 s from one entry to the next) an id is stored again:
    // at-least-once.
    for k in 1..=11u64 {
        let stamp = ahead + k * 10_000;
        assert_eq!(send_ids(&back, 1, &[100 + k], stamp).await, appended(1 + k, 1, &[]));
    }
    assert_eq!(send_ids(&back, 1, &[3], ahead + 120_000).await, appended(13, 1, &[]));
    // The broker's own sends (guarded: retries, released timers) keep
    // their message ids and are never deduplicated.
    let batch = SendBatch {
        topic: "T".into(),
        queue_id: 0,
        messages: vec![message(4)],
    };
    assert_eq!(guarded_send(&back, batch, 123_000).await, appended(3, 1, &[]));
    back.shutdown().await.unwrap();
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}
