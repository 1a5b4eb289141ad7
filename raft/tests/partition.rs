//! A leader cut off from its group keeps an uncommitted tail; after the
//! partition heals, that tail is truncated and every node ends with the same
//! entries at the same positions and the same queue offsets.
//!
//! Every Raft link between two nodes goes through a TCP proxy of its own
//! (nodes dial their peers' proxies), so a partition is a real loss of
//! connectivity, both ways.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use raftmq_raft::command::{AdminCommand, Command, SendBatch, TopicConfig};
use raftmq_raft::{Message, NodeAddr, NodeConfig, RaftNode};
use raftmq_store::StoreConfig;
use tokio::net::{TcpListener, TcpStream};

/// A free port, held by the returned listener until it is dropped: the
/// links bind port 0 too, and must not be handed a node's port meanwhile.
fn free_port(held: &mut Vec<std::net::TcpListener>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    held.push(l);
    port
}

/// A one-direction link (from one node to another) that can be cut.
struct Link {
    addr: String,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Link {
    async fn start(target: String) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (c, k) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused by closing it
                }
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(&target).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = out.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                k.lock().unwrap().push(h.abort_handle());
            }
        });
        Link { addr, cut, conns }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn message(i: u64) -> Message {
    Message {
        message_id: format!("m{i}"),
        body: Bytes::from(format!("body {i}")),
        ..Default::default()
    }
}

fn send(i: u64) -> Command {
    Command::send(
        &[SendBatch {
            topic: "T".into(),
            queue_id: (i % 2) as u32,
            messages: vec![message(i)],
        }],
        i,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leaders_uncommitted_tail_is_truncated_after_healing() {
    let dir = tempfile::tempdir().unwrap();
    let mut held = Vec::new();
    let addrs: BTreeMap<u64, NodeAddr> = (1..=3)
        .map(|id| {
            (
                id,
                NodeAddr {
                    raft_addr: format!("127.0.0.1:{}", free_port(&mut held)),
                    client_addr: format!("127.0.0.1:{}", free_port(&mut held)),
                },
            )
        })
        .collect();
    let mut links: HashMap<(u64, u64), Link> = HashMap::new();
    for i in 1..=3 {
        for j in 1..=3 {
            if i != j {
                links.insert((i, j), Link::start(addrs[&j].raft_addr.clone()).await);
            }
        }
    }
    // The links are up: the nodes may have their ports now.
    drop(held);
    let mut nodes = Vec::new();
    for (&id, addr) in &addrs {
        let mut cfg = NodeConfig::new("g", id, dir.path().join(format!("n{id}")), addr.clone());
        cfg.initial_members = addrs.clone();
        cfg.bootstrap = id == 1;
        cfg.store = StoreConfig::small_for_tests();
        cfg.election_timeout_min_ms = 600;
        cfg.election_timeout_max_ms = 1200;
        cfg.heartbeat_interval_ms = 100;
        cfg.dial_overrides = (1..=3)
            .filter(|&j| j != id)
            .map(|j| (j, links[&(id, j)].addr.clone()))
            .collect();
        nodes.push(RaftNode::start(cfg).await.unwrap());
    }
    let find_leader = |nodes: &[Arc<RaftNode>], except: Option<u64>| {
        nodes.iter().find(|n| n.is_leader() && Some(n.id) != except).cloned()
    };
    let mut old = None;
    for _ in 0..300 {
        old = find_leader(&nodes, None);
        if old.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = old.expect("a leader");
    old.write(Command::admin(&AdminCommand::PutTopic(TopicConfig {
        name: "T".into(),
        read_queues: 2,
        write_queues: 2,
        perm: 6,
        message_type: Default::default(),
    })))
    .await
    .unwrap();
    for i in 0..20 {
        old.write(send(i)).await.unwrap();
    }
    let committed_end = old.log.bounds().1;

    // Isolate the leader, both ways, and keep writing to it.
    for ((a, b), link) in &links {
        if *a == old.id || *b == old.id {
            link.cut();
        }
    }
    let mut doomed = Vec::new();
    for i in 100..105 {
        let node = old.clone();
        doomed.push(tokio::spawn(async move { node.write(send(i)).await }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while old.log.bounds().1 < committed_end + 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the isolated leader never appended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The majority elects a new leader and commits other entries at the
    // same indexes.
    let mut new = None;
    for _ in 0..500 {
        new = find_leader(&nodes, Some(old.id));
        if new.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new = new.expect("the majority elects a leader");
    for i in 200..210 {
        new.write(send(i)).await.unwrap();
    }

    // Heal. The old leader learns the higher term, drops its tail and
    // catches up.
    for link in links.values() {
        link.heal();
    }
    let last = new.sm.last_applied().unwrap().index;
    let mut applied = old.sm.applied_watch();
    tokio::time::timeout(Duration::from_secs(20), applied.wait_for(|&i| i >= last))
        .await
        .expect("the old leader catches up")
        .unwrap();
    for w in doomed {
        let r = tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("pending writes end")
            .unwrap();
        assert!(r.is_err(), "a write the majority never saw was acknowledged: {r:?}");
    }

    // Same entries at the same positions, same queues, everywhere.
    let (first, end) = new.log.bounds();
    for n in &nodes {
        assert_eq!(n.log.bounds().1, end, "node {}", n.id);
        for i in first..end {
            let (a, b) = (new.log.locate(i).unwrap(), n.log.locate(i).unwrap());
            assert_eq!(
                (a.phys, a.size, a.tag_hash),
                (b.phys, b.size, b.tag_hash),
                "node {} entry {i}",
                n.id
            );
            let ra = new.store.commitlog().read(a.phys).unwrap();
            let rb = n.store.commitlog().read(b.phys).unwrap();
            assert_eq!(ra.crc(), rb.crc(), "node {} entry {i}", n.id);
        }
        for q in 0..2 {
            let (x, y) = (new.store.queue("T", q).unwrap(), n.store.queue("T", q).unwrap());
            assert_eq!(x.max_offset(), y.max_offset(), "node {} queue {q}", n.id);
            for o in x.min_offset()..x.max_offset() {
                assert_eq!(
                    x.get(o).unwrap(),
                    y.get(o).unwrap(),
                    "node {} queue {q} offset {o}",
                    n.id
                );
            }
        }
    }
    // None of the cut-off writes is anywhere.
    for n in &nodes {
        for q in 0..2 {
            let cq = n.store.queue("T", q).unwrap();
            for o in cq.min_offset()..cq.max_offset() {
                let (_, bytes) = n.store.message("T", q, o).unwrap();
                let (view, _) = raftmq_raft::message::MessageView::parse(&bytes).unwrap();
                assert!(!(100..105).any(|i| view.message_id == format!("m{i}")));
            }
        }
    }
    for n in &nodes {
        n.shutdown().await.unwrap();
    }
}
