//! Damage on disk against a real three-node group (processes on
//! 127.0.0.1): a node is stopped, one of its files is cut short or has bits
//! flipped, and it is started again. What must hold each time: the node
//! comes back and serves every acknowledged message at its offset, and the
//! three replicas' applied logs are identical. Damage recovery cannot cut
//! (an index cut short) sets the store aside and the node is sent the log
//! again; a damaged copy of the vote is repaired from the other; a log cut
//! below its committed index is caught up from the leader; a snapshot
//! install a crash interrupted is finished at start.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{Cluster, replicas_whole, send_retrying};

/// Sends `n` more messages to T through the leader.
async fn send_more(c: &mut Cluster, acked: &mut BTreeMap<(u32, u64), u64>, n: u64) {
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    for _ in 0..n {
        let i = acked.len() as u64;
        let offset = send_retrying(&mut client, 0, i).await;
        acked.insert((0, offset), i);
    }
}

/// Every node up, every acknowledged message where it was on each, and
/// the replicas identical.
async fn whole(c: &mut Cluster, acked: &BTreeMap<(u32, u64), u64>, what: &str) {
    c.check_alive();
    replicas_whole(c, acked, what).await;
}

fn node_dir(c: &Cluster, id: u64) -> PathBuf {
    c.dir.join(format!("node{id}"))
}

/// The newest file of `dir`, not counting a CommitLog segment made ahead
/// (`<start>.next`), which holds no data yet.
fn last_file(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "next"))
        .collect();
    files.sort();
    files.pop().unwrap_or_else(|| panic!("no file in {}", dir.display()))
}

/// Bytes up to the last non-zero one.
fn written(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i as u64 + 1)
}

fn cut(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// What node `id` logged.
fn node_log(c: &Cluster, id: u64) -> String {
    std::fs::read_to_string(c.dir.join(format!("node{id}.log"))).unwrap()
}

/// A follower (not `leader`).
fn follower(leader: u64) -> u64 {
    if leader == 1 { 2 } else { 1 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_files_are_noticed_and_repaired_from_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "sync");
    c.create_topic("T", 1, "").await;
    let mut acked = BTreeMap::new();
    send_more(&mut c, &mut acked, 40).await;
    whole(&mut c, &acked, "the first sends").await;

    // 1. A ConsumeQueue cut short on a follower: its lost units would shift
    //    offsets, so the store is set aside and sent again.
    let f = follower(c.leader().await);
    assert!(c.stop(f).success());
    let cq = last_file(&node_dir(&c, f).join("consumequeue/T/0"));
    cut(&cq, written(&cq) / 2);
    c.spawn(f);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, "a consume queue cut short").await;
    assert!(
        node_dir(&c, f).join("quarantine").is_dir(),
        "node {f} set its damaged store aside"
    );

    // 2. A digit of the vote changed on a follower: the CRC tells, and the
    //    second copy repairs it; nothing is set aside.
    let f = follower(c.leader().await);
    let quarantined_before = node_dir(&c, f).join("quarantine").is_dir();
    assert!(c.stop(f).success());
    let vote = node_dir(&c, f).join("raft/vote.json");
    let mut bytes = std::fs::read(&vote).unwrap();
    let at = bytes.iter().rposition(u8::is_ascii_digit).unwrap();
    bytes[at] = if bytes[at] == b'9' { b'8' } else { bytes[at] + 1 };
    std::fs::write(&vote, &bytes).unwrap();
    c.spawn(f);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, "a damaged vote").await;
    assert_eq!(
        node_dir(&c, f).join("quarantine").is_dir(),
        quarantined_before,
        "a damaged vote copy sets nothing aside"
    );
    assert_eq!(
        std::fs::read(&vote).unwrap(),
        std::fs::read(node_dir(&c, f).join("raft/vote.copy.json")).unwrap(),
        "the damaged copy was rewritten from the good one"
    );

    // 3. The leader's CommitLog cut below what it had committed: recovery
    //    cuts its log, it votes again only once it has the entries back.
    let l = c.leader().await;
    assert!(c.stop(l).success());
    let segment = last_file(&node_dir(&c, l).join("commitlog"));
    cut(&segment, written(&segment) / 2);
    c.spawn(l);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, "a commitlog cut short").await;
    let log = node_log(&c, l);
    assert!(log.contains("entries were lost to damage"), "node {l} noticed its loss");
    assert!(log.contains("voting again"), "node {l} caught up and votes again");

    // 4. A bit flipped in the leader's key index: its header is checked,
    //    so the store is set aside and sent again.
    let l = c.leader().await;
    assert!(c.stop(l).success());
    let index = last_file(&node_dir(&c, l).join("index"));
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[0] ^= 0x10; // the magic
    std::fs::write(&index, &bytes).unwrap();
    c.spawn(l);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, "a damaged key index").await;
    assert!(
        node_dir(&c, l).join("quarantine").is_dir(),
        "node {l} set its store aside"
    );

    // 5. The Raft log index cut short on the leader (found by a jepsen
    //    campaign: the node would not start). It is derived from the
    //    CommitLog, so it is rebuilt at open.
    let l = c.leader().await;
    assert!(c.stop(l).success());
    let log_index = last_file(&node_dir(&c, l).join("raft/log_index"));
    cut(&log_index, written(&log_index) / 2);
    c.spawn(l);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, "a log index cut short").await;
    let log = node_log(&c, l);
    assert!(
        log.contains("rebuilding it from the commitlog"),
        "node {l} rebuilt its log index"
    );
}

/// The damage tests below share their shape: a group that took snapshots
/// (every 20 entries) of most of its log; a follower stopped (or killed,
/// as the jepsen nemesis does, so that recovery cuts a torn log rather
/// than refusing a clean store's damage); `damage` done to its files; the
/// follower back; more sends; then every node whole, and the follower's
/// log saying it `noticed`.
async fn damage_below_the_snapshot(kill: bool, damage: impl FnOnce(&Path), what: &str, noticed: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "sync", "snapshot_every = 20\n");
    c.create_topic("T", 1, "").await;
    let mut acked = BTreeMap::new();
    send_more(&mut c, &mut acked, 60).await;
    whole(&mut c, &acked, "the first sends").await;

    let f = follower(c.leader().await);
    if kill {
        c.kill(f);
    } else {
        assert!(c.stop(f).success());
    }
    let node = node_dir(&c, f);
    assert!(node.join("raft/snapshot.json").exists(), "node {f} took a snapshot");
    damage(&node);
    c.spawn(f);
    send_more(&mut c, &mut acked, 10).await;
    whole(&mut c, &acked, what).await;
    assert!(node_log(&c, f).contains(noticed), "node {f} noticed");
}

/// The checkpoint cut short on a follower whose snapshot covers most of
/// its log (found by a jepsen campaign, seed 1: every queue of that node
/// restarted at offset 0). Recovery rescans the whole log, but the
/// entries the snapshot covers are never applied again, so the indexes
/// below the snapshot must be kept: the snapshot was written only after
/// they were flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_checkpoint_keeps_the_queues_the_snapshot_covers() {
    damage_below_the_snapshot(
        false,
        |node| cut(&node.join("checkpoint"), 23),
        "a checkpoint cut short",
        "ignoring damaged checkpoint",
    )
    .await;
}

/// A follower's CommitLog cut below what its snapshot covers (found by a
/// jepsen campaign, seed 9: polls on that node skipped hundreds of
/// offsets). The entries between come back from the leader, but the
/// snapshot counts them as applied: the node sets the snapshot aside and
/// applies its whole log again, so their queue units are written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_below_the_snapshot_is_applied_again() {
    damage_below_the_snapshot(
        true,
        |node| {
            let segment = last_file(&node.join("commitlog"));
            cut(&segment, written(&segment) / 4);
        },
        "a commitlog cut below the snapshot",
        "setting the snapshot aside",
    )
    .await;
}

/// A crash in the middle of a snapshot install: the follower had written
/// the install file (here, the leader's snapshot, as the leader sent it)
/// but not yet reset its store to it. At start it must finish the install
/// (the reset is idempotent), take the log after the snapshot from the
/// leader, and serve every acknowledged message from the snapshot on.
/// Its log now starts at the snapshot, so it is compared by what it
/// serves, not by the digest of a log the others hold from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_a_crash_interrupted_is_finished_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "sync", "snapshot_every = 20\n");
    c.create_topic("T", 1, "").await;
    let mut acked = BTreeMap::new();
    send_more(&mut c, &mut acked, 30).await;
    let leader = c.leader().await;
    let f = follower(leader);
    assert!(c.stop(f).success());
    send_more(&mut c, &mut acked, 60).await;

    // The leader's snapshot, past everything the stopped follower has.
    let snapshot = std::fs::read(node_dir(&c, leader).join("raft/snapshot.json")).unwrap();
    let installing = node_dir(&c, f).join("raft/snapshot.installing.json");
    std::fs::write(&installing, &snapshot).unwrap();
    c.spawn(f);
    send_more(&mut c, &mut acked, 10).await;
    common::wait_applied_equal(&c, &[1, 2, 3]).await;
    assert!(
        node_log(&c, f).contains("finishing a snapshot install that a crash interrupted"),
        "node {f} finished the install"
    );
    assert!(!installing.exists(), "the install file became the snapshot");
    let got = common::read_queue(&c, f, 0).await;
    let first = *got.keys().next().expect("node {f} serves T's queue");
    assert!(first > 30, "node {f}'s queue starts at the snapshot, not at {first}");
    assert!(got.keys().copied().eq(first..first + got.len() as u64), "no holes");
    for (&(_, offset), i) in acked.range((0, first)..) {
        assert_eq!(got.get(&offset), Some(&format!("msg-{i}")), "node {f} offset {offset}");
    }
    for id in 1..=3 {
        if id != f {
            common::check_reads(&c, id, &acked, 1).await;
        }
    }
    c.check_alive();
}

/// Pulls T's queue 0 from `node` from offset 0: the messages' offsets, or
/// the status code that ended the pull.
async fn pull_all(c: &Cluster, node: u64) -> Result<Vec<i64>, raftmq::proto::rocketmq::v2::Code> {
    use common::v2::{client, code, resource, tags};
    use raftmq::proto::rocketmq::v2;
    let mut v = client(c, node).await;
    let (mut got, mut offset) = (Vec::new(), 0);
    loop {
        let mut s = v
            .pull_message(v2::PullMessageRequest {
                group: resource("Puller"),
                message_queue: Some(v2::MessageQueue {
                    topic: resource("T"),
                    id: 0,
                    ..Default::default()
                }),
                offset,
                batch_size: 32,
                filter_expression: Some(tags("*")),
                long_polling_timeout: None,
            })
            .await
            .unwrap()
            .into_inner();
        let (mut next, mut status) = (offset, None);
        while let Some(r) = s.message().await.unwrap() {
            match r.content {
                Some(v2::pull_message_response::Content::Message(m)) => {
                    got.push(m.system_properties.unwrap().queue_offset.unwrap_or(-1))
                }
                Some(v2::pull_message_response::Content::NextOffset(n)) => next = n,
                Some(v2::pull_message_response::Content::Status(st)) => status = Some(code(&Some(st))),
                None => {}
            }
        }
        match status {
            Some(v2::Code::Ok) | Some(v2::Code::MessageNotFound) | None if next == offset => return Ok(got),
            Some(v2::Code::Ok) | None => offset = next,
            Some(other) => return Err(other),
        }
    }
}

/// Flipped bits in a follower's ConsumeQueue (found by a jepsen campaign,
/// seed 26 of a sync campaign: two bits moved a unit's `phys` 32 bytes,
/// and the node drained its queue one committed message short). Every
/// 512-byte block of units carries a seal, so the damage is found: in the
/// block that grows, at start, which sets the store aside; in a whole
/// block (checked when read), by the pull, which is refused rather than
/// served with a gap, and noted so that the next start sets the store
/// aside. Either way the node ends up serving every message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_queue_unit_is_found_refused_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with(dir.path(), 3, "sync", "");
    c.create_topic("T", 1, "").await;
    let mut acked = BTreeMap::new();
    // Units 0-99 fill four blocks of 25; later ones grow the fifth.
    send_more(&mut c, &mut acked, 100).await;
    whole(&mut c, &acked, "the sends").await;
    let all: Vec<i64> = (0..100).collect();
    let flip = |c: &Cluster, node: u64, unit: usize| {
        let cq = last_file(&node_dir(c, node).join("consumequeue/T/0"));
        let mut bytes = std::fs::read(&cq).unwrap();
        let at = unit / 25 * 512 + unit % 25 * 20; // the unit's `phys`
        bytes[at] ^= 0x20;
        std::fs::write(&cq, &bytes).unwrap();
    };

    // 1. In a whole block that start does not read (it reads the first
    //    and last units and checks the growing block): the pull is
    //    refused, the damage noted.
    let f = follower(c.leader().await);
    assert!(c.stop(f).success());
    flip(&c, f, 30);
    c.spawn(f);
    common::wait_applied_equal(&c, &[1, 2, 3]).await;
    let other = (1..=3).find(|&n| n != f).unwrap();
    assert_eq!(
        pull_all(&c, other).await,
        Ok(all.clone()),
        "a sound node serves every message"
    );
    assert_eq!(
        pull_all(&c, f).await,
        Err(raftmq::proto::rocketmq::v2::Code::InternalError),
        "node {f} must not serve its queue with a gap"
    );
    assert!(
        node_log(&c, f).contains("this node's store is damaged"),
        "node {f} said why"
    );
    let note = std::fs::read_to_string(node_dir(&c, f).join("damaged")).unwrap();
    assert!(
        note.contains("T/0 offset 25"),
        "the note says where (the block's first unit read): {note}"
    );
    // Made leader, it hands leadership on: receives are served by the
    // leader, and it cannot read what the damage hides.
    let l = c.leader().await;
    c.client(l)
        .await
        .transfer_leader(raftmq::proto::pb::TransferLeaderToRequest { node_id: f })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let handed = node_log(&c, f).contains("the leader's store is damaged");
        let leader = c.leader().await;
        if handed && leader != f {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {f} still leads ({leader}), handed over: {handed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // 2. Its next start sets the store aside; the group sends it again.
    assert!(c.stop(f).success());
    c.spawn(f);
    send_more(&mut c, &mut acked, 5).await;
    whole(&mut c, &acked, "a store set aside for noted damage").await;
    assert!(
        node_dir(&c, f).join("quarantine").is_dir(),
        "node {f} set its store aside"
    );
    assert!(!node_dir(&c, f).join("damaged").exists(), "the note went with it");
    let all: Vec<i64> = (0..105).collect();
    assert_eq!(
        pull_all(&c, f).await,
        Ok(all.clone()),
        "node {f} serves every message again"
    );

    // 3. In the growing block (units 100-104), killed as the jepsen nemesis
    //    does: found at start, set aside at once.
    let f = (1..=3).find(|&n| n != f).unwrap();
    c.kill(f);
    flip(&c, f, 102);
    c.spawn(f);
    send_more(&mut c, &mut acked, 5).await;
    whole(&mut c, &acked, "damage in the growing block").await;
    assert!(
        node_dir(&c, f).join("quarantine").is_dir(),
        "node {f} set its store aside"
    );
    assert!(node_log(&c, f).contains("does not match its seal"), "node {f} said why");
    assert_eq!(
        pull_all(&c, f).await,
        Ok((0..110).collect()),
        "node {f} serves every message"
    );
    c.check_alive();
}
