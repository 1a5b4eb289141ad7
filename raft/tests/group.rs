//! A three-node group in one process, over real gRPC on 127.0.0.1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use raftmq_raft::command::{AdminCommand, BatchOutcome, Command, Response, SendBatch, TopicConfig};
use raftmq_raft::message::MessageView;
use raftmq_raft::{Message, NodeAddr, NodeConfig, RaftNode};
use raftmq_store::StoreConfig;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_group(dir: &std::path::Path) -> Vec<Arc<RaftNode>> {
    let addrs: BTreeMap<u64, NodeAddr> = (1..=3)
        .map(|id| {
            (
                id,
                NodeAddr {
                    raft_addr: format!("127.0.0.1:{}", free_port()),
                    client_addr: format!("127.0.0.1:{}", free_port()),
                },
            )
        })
        .collect();
    let mut nodes = Vec::new();
    for (&id, addr) in &addrs {
        let mut cfg = NodeConfig::new("g", id, dir.join(format!("n{id}")), addr.clone());
        cfg.initial_members = addrs.clone();
        cfg.bootstrap = id == 1;
        cfg.store = StoreConfig::small_for_tests();
        nodes.push(RaftNode::start(cfg).await.unwrap());
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
