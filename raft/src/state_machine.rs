//! The replicated state machine: applies committed entries, in log order, on
//! every node.
//!
//! * Message batches get their queue offsets here: each message's
//!   ConsumeQueue unit is appended (dense offsets per queue, identical on
//!   every replica because every replica applies the same entries in the
//!   same order) and its keys are indexed. The unit points at the message's
//!   bytes inside the entry's own CommitLog record: messages are never
//!   copied.
//! * Admin commands change the [`Metadata`] (topics, consumer offsets).
//!
//! # Restarts and snapshots
//!
//! The metadata lives in memory and in snapshots (`raft/snapshot.json`):
//! the metadata, the last applied log id and membership, the physical offset
//! after the last applied record, and every queue's next offset; never the
//! messages. At start the state machine loads the snapshot and openraft
//! re-applies the entries after it. Re-applying is idempotent: an entry whose
//! record lies below the store's dispatch checkpoint is already in the
//! ConsumeQueues and only its metadata effects are replayed. A snapshot is
//! written only after the indexes it covers are durable, so the checkpoint
//! never trails a snapshot.
//!
//! Installing a snapshot from the leader either catches up from the local
//! log (when it already holds the snapshot's last entry) or replaces the
//! local log and queues with empty ones that continue at the snapshot's
//! physical and queue offsets, so the node appends at the same positions as
//! everyone else.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futures::TryStreamExt;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload as Payload, OptionalSend, RaftSnapshotBuilder};
use raftmq_store::Dispatch;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::command::{AdminCommand, BatchOutcome, BatchView, Decoded, Duplicate, Response, TopicConfig};
use crate::consumption::{self, Consumption, GroupConfig, InFlightCounts};
use crate::dedup::{self, DedupConfig, DedupWindow, Original, UNKNOWN_OFFSET};
use crate::error::io_err;
use crate::held::{self, Held, HeldId};
use crate::log_store::LogStore;
use crate::message::tag_hash;
use crate::room::until_room;
use crate::secret::GroupSecret;
use crate::types::{Entry, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// File name of the current snapshot inside the raft directory.
pub const SNAPSHOT_FILE: &str = "snapshot.json";

/// Replicated metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub topics: BTreeMap<String, TopicConfig>,
    /// Consumer offsets: group -> topic -> queue id -> next offset to consume.
    pub offsets: BTreeMap<String, BTreeMap<String, BTreeMap<u32, u64>>>,
    /// Consumer groups.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupConfig>,
    /// Pop-style consumption state ([`crate::consumption`]).
    #[serde(default)]
    pub consumption: Consumption,
    /// Timed and half messages not yet released ([`crate::held`]).
    #[serde(default)]
    pub held: Held,
    /// Keys the MACs of client tokens ([`crate::secret`]); none until the
    /// first leader that needs it proposes one.
    #[serde(default)]
    pub secret: Option<GroupSecret>,
    /// Producers' sends are refused and routes show the group's queues
    /// read-only ([`AdminCommand::SetWritable`]).
    #[serde(default)]
    pub writes_wiped: bool,
    /// Users by access key ([`crate::acl`]).
    #[serde(default)]
    pub users: crate::acl::Users,
    /// Access policies by subject ([`crate::acl`]).
    #[serde(default)]
    pub acls: crate::acl::Acls,
    /// What the deduplication window of producers' sends keeps
    /// ([`crate::dedup`]).
    #[serde(default)]
    pub dedup: DedupConfig,
}

impl Metadata {
    /// Whether `group` has an offset in `topic`'s queue `queue_id`.
    fn has_offset(&self, group: &str, topic: &str, queue_id: u32) -> bool {
        self.offsets
            .get(group)
            .and_then(|t| t.get(topic))
            .is_some_and(|q| q.contains_key(&queue_id))
    }

    /// Committed offsets over every group, topic and queue: each is in
    /// every snapshot. Walks the groups and their topics, not the queues.
    fn committed_offsets(&self) -> u64 {
        self.offsets
            .values()
            .flat_map(|t| t.values())
            .map(|q| q.len() as u64)
            .sum()
    }

    /// Why committing `group`'s offset in `topic`'s queue `queue_id` would
    /// pass `bound` (`limits.max_consumer_positions`): only a new offset
    /// can. The leader asks before proposing, and applying asks again.
    pub fn offset_refusal(&self, group: &str, topic: &str, queue_id: u32, bound: u64) -> Option<String> {
        (!self.has_offset(group, topic, queue_id) && self.committed_offsets() >= bound).then(|| {
            format!(
                "this broker group keeps {bound} committed offsets, its limit \
                 (limits.max_consumer_positions): delete unused consumer groups"
            )
        })
    }
}

/// What a snapshot holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotContent {
    meta: SnapshotMeta,
    metadata: Metadata,
    /// Physical offset right after the last applied record.
    next_phys: u64,
    /// (topic, queue id, next queue offset) of every queue.
    queues: Vec<(String, u32, u64)>,
    /// The message ids producers' sends stored recently ([`crate::dedup`]).
    #[serde(default)]
    sends: DedupWindow,
}

#[derive(Debug, Default)]
struct State {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    metadata: Metadata,
    /// Deliveries in flight in `metadata.consumption`, counted: set with it
    /// ([`State::replace_metadata`]), kept by [`apply_admin`].
    inflight: InFlightCounts,
    /// The guard of the guarded send at this index was applied with this
    /// outcome, and its messages may be half dispatched: a retry (after
    /// running out of space) must reuse the outcome, not apply the guard
    /// twice (a second ack of the same receipt fails).
    guard_applied: Option<(u64, bool)>,
    /// The entry at this index failed half-way for want of disk space and
    /// waits to be applied again: its queue units, keys or guard may be in
    /// already, so no snapshot may be taken until it is whole.
    half_applied: Option<u64>,
    /// The message ids producers' sends stored recently ([`crate::dedup`]).
    sends: DedupWindow,
}

impl State {
    /// The metadata of a snapshot loaded or installed, with its deliveries
    /// in flight counted anew.
    fn replace_metadata(&mut self, metadata: Metadata) {
        self.inflight = InFlightCounts::of(&metadata.consumption);
        self.metadata = metadata;
    }
}

struct Inner {
    log: LogStore,
    dir: PathBuf,
    state: RwLock<State>,
    applied: watch::Sender<u64>,
    /// Held by snapshot builds (capture and write) and installs, which
    /// openraft may run at the same time: a build must not capture a
    /// half-installed store, nor overwrite a newer installed snapshot.
    /// Holds the last log id of the snapshot file, so that a build need
    /// not read the file (tens of MB with a full deduplication window) to
    /// learn it.
    snapshots: std::sync::Mutex<Option<LogId>>,
}

/// The state machine of one node. Cloning gives another handle.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Inner>,
}

fn read_state(l: &RwLock<State>) -> std::sync::RwLockReadGuard<'_, State> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_state(l: &RwLock<State>) -> std::sync::RwLockWriteGuard<'_, State> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StateMachine {
    /// Opens the state machine over `log`, loading the current snapshot from
    /// `raft_dir` if there is one.
    pub fn open(log: LogStore, raft_dir: &Path) -> io::Result<StateMachine> {
        let mut state = State::default();
        finish_interrupted_install(&log, raft_dir)?;
        let mut snapshot = None;
        if let Some(content) = read_snapshot(raft_dir)? {
            if !indexes_cover(&log, raft_dir, &content)? {
                return Self::open(log, raft_dir);
            }
            snapshot = content.meta.last_log_id;
            state.last_applied = content.meta.last_log_id;
            state.membership = content.meta.last_membership;
            state.replace_metadata(content.metadata);
            state.sends = content.sends;
        }
        let applied = state.last_applied.map_or(0, |l| l.index);
        Ok(StateMachine {
            inner: Arc::new(Inner {
                log,
                dir: raft_dir.to_path_buf(),
                state: RwLock::new(state),
                applied: watch::channel(applied).0,
                snapshots: std::sync::Mutex::new(snapshot),
            }),
        })
    }

    /// A copy of the replicated metadata.
    pub fn metadata(&self) -> Metadata {
        read_state(&self.inner.state).metadata.clone()
    }

    /// The topics only (cheaper than [`StateMachine::metadata`]).
    pub fn topics(&self) -> Vec<TopicConfig> {
        read_state(&self.inner.state)
            .metadata
            .topics
            .values()
            .cloned()
            .collect()
    }

    /// Runs `f` on the metadata under the state lock (no copy; keep `f`
    /// short: applying waits for it).
    pub fn with_metadata<R>(&self, f: impl FnOnce(&Metadata) -> R) -> R {
        f(&read_state(&self.inner.state).metadata)
    }

    /// As [`StateMachine::with_metadata`], with the deliveries in flight
    /// counted (per group and in all).
    pub fn with_metadata_and_inflight<R>(&self, f: impl FnOnce(&Metadata, &InFlightCounts) -> R) -> R {
        let st = read_state(&self.inner.state);
        f(&st.metadata, &st.inflight)
    }

    /// Whether producers may send to the group ([`AdminCommand::SetWritable`]).
    pub fn writable(&self) -> bool {
        !read_state(&self.inner.state).metadata.writes_wiped
    }

    /// The deduplication window's configuration and how many ids it holds.
    pub fn dedup(&self) -> (DedupConfig, usize) {
        let st = read_state(&self.inner.state);
        (st.metadata.dedup, st.sends.len())
    }

    pub fn topic(&self, name: &str) -> Option<TopicConfig> {
        read_state(&self.inner.state).metadata.topics.get(name).cloned()
    }

    pub fn last_applied(&self) -> Option<LogId> {
        read_state(&self.inner.state).last_applied
    }

    /// Watches the index of the last applied entry (long polling, reading
    /// one's own writes).
    pub fn applied_watch(&self) -> watch::Receiver<u64> {
        self.inner.applied.subscribe()
    }

    pub fn log(&self) -> &LogStore {
        &self.inner.log
    }

    fn apply_entry(&self, entry: &Entry) -> io::Result<Response> {
        let inner = &*self.inner;
        let store = inner.log.store();
        // Where the entry's record is. openraft only applies entries that are
        // in the log; blank and membership entries do not need the position
        // (openraft's storage suite applies them without a log).
        let located = inner.log.locate(entry.log_id.index);
        let record = located.as_ref().ok().map(|u| {
            let end = u.phys + u64::from(u.size);
            // Entries below the dispatch checkpoint are already in the queues
            // (a restart re-applies them for their metadata only).
            (
                u.phys + raftmq_store::record::HEADER_LEN as u64,
                end,
                end > store.dispatched_offset(),
            )
        });
        let mut locked = write_state(&inner.state);
        // One borrow of the state, so that its fields can be borrowed apart.
        let st = &mut *locked;
        let resp = match &entry.payload {
            Payload::Blank => Response::Done,
            Payload::Membership(m) => {
                st.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                Response::Done
            }
            Payload::Normal(cmd) => match cmd.decode() {
                // Every replica sees the same bytes and refuses them the same way.
                Err(e) => Response::Rejected(e.to_string()),
                Ok(Decoded::Admin(a)) => {
                    // Queue files go with a deleted topic, once (a restart
                    // re-applying the entry finds them gone already).
                    if let AdminCommand::DeleteTopic { name } = &a
                        && record.is_some_and(|(_, _, redo)| redo)
                    {
                        store.queues().delete_topic(name).map_err(io_err)?;
                    }
                    if let AdminCommand::DeleteTopic { name } = &a {
                        st.sends.remove_topic(name);
                    }
                    apply_admin(&mut st.metadata, &mut st.inflight, a, entry.log_id.index)
                }
                Ok(Decoded::Send(batches)) => {
                    let Some((payload_phys, _, redo)) = record else {
                        return Err(located
                            .err()
                            .unwrap_or_else(|| io::Error::other("entry not in the log")));
                    };
                    let mut out = Vec::with_capacity(batches.len());
                    // Producers' sends, and only they, are deduplicated:
                    // the broker's own sends (retries, dead letters,
                    // released timers) carry the message ids of messages
                    // already stored, on purpose.
                    let mut window = st.metadata.dedup.enabled().then_some(&mut st.sends);
                    let mut ordinal = 0u32;
                    for b in &batches {
                        // A wiped write permission is a fence at its log
                        // position: a send the leader admitted before the
                        // wipe applied but ordered after it is refused
                        // here, on every replica (the broker's own guarded
                        // sends still go in).
                        if st.metadata.writes_wiped {
                            out.push(BatchOutcome::Rejected(WRITES_WIPED.into()));
                            ordinal = ordinal.saturating_add(b.messages.len() as u32);
                            continue;
                        }
                        let held_at = held::is_system_topic(b.topic).then_some(HeldId {
                            index: entry.log_id.index,
                            ordinal,
                        });
                        out.push(apply_batch(
                            &st.metadata,
                            store,
                            b,
                            payload_phys,
                            redo,
                            window.as_deref_mut(),
                            held_at,
                        )?);
                        ordinal = ordinal.saturating_add(b.messages.len() as u32);
                    }
                    hold(&mut st.metadata.held, entry.log_id.index, &batches, &out);
                    Response::Sent(out)
                }
                Ok(Decoded::GuardedSend(guard, batches)) => {
                    let Some((payload_phys, _, redo)) = record else {
                        return Err(located
                            .err()
                            .unwrap_or_else(|| io::Error::other("entry not in the log")));
                    };
                    // All or nothing: a send that would be refused leaves the
                    // guard unapplied (an ack must not happen without its copy).
                    let refused = batches.iter().find_map(|b| batch_refusal(&st.metadata, b));
                    let ok = match st.guard_applied {
                        Some((index, ok)) if index == entry.log_id.index => ok,
                        _ => {
                            let ok = refused.is_none()
                                && match apply_admin(&mut st.metadata, &mut st.inflight, guard, entry.log_id.index) {
                                    Response::Acked(acks) => acks.iter().all(|a| *a),
                                    Response::Done => true,
                                    _ => false,
                                };
                            st.guard_applied = Some((entry.log_id.index, ok));
                            ok
                        }
                    };
                    let mut out = Vec::with_capacity(batches.len());
                    for b in &batches {
                        out.push(if ok {
                            apply_batch(&st.metadata, store, b, payload_phys, redo, None, None)?
                        } else {
                            BatchOutcome::Rejected(
                                refused
                                    .clone()
                                    .unwrap_or_else(|| "its guard failed (the receipt is no longer valid)".into()),
                            )
                        });
                    }
                    hold(&mut st.metadata.held, entry.log_id.index, &batches, &out);
                    Response::Sent(out)
                }
            },
        };
        st.last_applied = Some(entry.log_id);
        if let Some((_, end, true)) = record {
            store.mark_dispatched(end);
        }
        Ok(resp)
    }

    fn snapshot_content(&self) -> io::Result<SnapshotContent> {
        let store = self.inner.log.store();
        let content = {
            // Under the state lock no entry is being applied; one that ran
            // out of space half-way is waited for (this is a blocking thread).
            let st = loop {
                let st = read_state(&self.inner.state);
                if st.half_applied.is_none() {
                    break st;
                }
                drop(st);
                if self.inner.log.stopping().load(std::sync::atomic::Ordering::Acquire) {
                    return Err(io::Error::other("stopping while an entry waits for disk space"));
                }
                std::thread::sleep(crate::room::RETRY);
            };
            // The kept counts are what counting anew gives (tests and the
            // debug-built jepsen runs check it at every snapshot).
            debug_assert_eq!(st.inflight, InFlightCounts::of(&st.metadata.consumption));
            SnapshotContent {
                meta: SnapshotMeta {
                    last_log_id: st.last_applied,
                    last_membership: st.membership.clone(),
                },
                metadata: st.metadata.clone(),
                next_phys: store.dispatched_offset(),
                queues: store
                    .queues()
                    .queues()
                    .into_iter()
                    .map(|(t, q, cq)| (t, q, cq.max_offset()))
                    .collect(),
                sends: st.sends.clone(),
            }
        };
        // The snapshot may only claim what the indexes have made durable;
        // and the log up to there is made durable too (async flush leaves
        // it to the flusher), so that a power loss cannot cut the log below
        // a snapshot (`indexes_cover` then rebuilds at great cost).
        store.commitlog().flush().map_err(io_err)?;
        store.flush_indexes().map_err(io_err)?;
        Ok(content)
    }

    fn install(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let mut snapshot_file = self
            .inner
            .snapshots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let content: SnapshotContent =
            serde_json::from_slice(data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if content.meta.last_log_id != meta.last_log_id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the snapshot's data and its metadata name different log ids",
            ));
        }
        let Some(last) = meta.last_log_id else {
            return Ok(());
        };
        let log = &self.inner.log;
        let (first, end) = log.bounds();
        let local_has_it = last.index >= first
            && last.index < end
            && log
                .locate(last.index)
                .is_ok_and(|u| u.tag_hash == crate::types::term_of(&last));
        let applied = self.last_applied().map_or(0, |l| l.index + 1);
        if local_has_it && applied >= first {
            // The local log holds everything the snapshot covers: apply it
            // from there, which keeps this node's queues and offsets.
            for i in applied..=last.index {
                let entry = futures::executor::block_on(async {
                    let mut reader = log.clone();
                    openraft::RaftLogReader::try_get_log_entries(&mut reader, i..i + 1).await
                })?;
                if let Some(e) = entry.first() {
                    self.apply_entry(e)?;
                }
            }
            // The snapshot file names `next_phys` as durable in the log and
            // the indexes (`durable_dispatch`): make it so before writing it.
            log.store().commitlog().flush().map_err(io_err)?;
            log.store().flush_indexes().map_err(io_err)?;
            write_snapshot(&self.inner.dir, data)?;
        } else {
            // The snapshot goes to the install file first: it records that
            // this reset was decided, and `open` finishes a reset that a
            // crash interrupted (`finish_interrupted_install`). It becomes
            // the snapshot file once the store holds what it describes.
            write_checked(&self.inner.dir, SNAPSHOT_INSTALLING_FILE, data)?;
            log.reset_for_snapshot(last, content.next_phys, &content.queues)?;
            fs::rename(
                self.inner.dir.join(SNAPSHOT_INSTALLING_FILE),
                self.inner.dir.join(SNAPSHOT_FILE),
            )?;
            fs::File::open(&self.inner.dir)?.sync_all()?;
        }
        {
            let mut st = write_state(&self.inner.state);
            st.last_applied = Some(last);
            st.membership = meta.last_membership.clone();
            st.replace_metadata(content.metadata);
            st.sends = content.sends;
        }
        *snapshot_file = Some(last);
        self.inner.applied.send_replace(last.index);
        tracing::info!(last = %last, next_phys = content.next_phys, kept_log = local_has_it, "installed snapshot");
        Ok(())
    }
}

/// Largest snapshot accepted from a peer. Snapshots hold metadata only
/// (topics, offsets, queue positions), never messages.
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;

/// Most queues a snapshot may list (each becomes a ConsumeQueue on
/// install): as many as 10,000 topics of 100 queues.
pub const MAX_SNAPSHOT_QUEUES: usize = 1_000_000;

/// Checks a snapshot received from a peer before openraft installs it: an
/// install that fails is a storage error, which openraft treats as fatal,
/// so whatever would fail must be refused here. The data must parse, name
/// the same last log id as its metadata, and list only valid queues of a
/// bounded number.
pub fn check_snapshot(meta: &SnapshotMeta, data: &[u8]) -> Result<(), String> {
    let content: SnapshotContent = serde_json::from_slice(data).map_err(|e| format!("snapshot data: {e}"))?;
    if content.meta.last_log_id != meta.last_log_id {
        return Err("the snapshot's data and its metadata name different log ids".into());
    }
    if content.queues.len() > MAX_SNAPSHOT_QUEUES {
        return Err(format!(
            "the snapshot lists {} queues, more than {MAX_SNAPSHOT_QUEUES}",
            content.queues.len()
        ));
    }
    for (topic, queue_id, _) in &content.queues {
        raftmq_store::queue_table::validate_topic(topic).map_err(|e| format!("snapshot queue: {e}"))?;
        if *queue_id >= crate::command::MAX_QUEUES {
            return Err(format!(
                "snapshot queue {topic}/{queue_id}: queue ids are below {}",
                crate::command::MAX_QUEUES
            ));
        }
    }
    Ok(())
}

/// Where a snapshot the indexes no longer cover is set aside.
pub const SNAPSHOT_AHEAD_FILE: &str = "snapshot.ahead.json";

/// Whether the store's indexes hold every record the snapshot counts as
/// applied. They do unless damage cut the log below the snapshot's
/// `next_phys` (recovery then cuts the indexes with it): the entries
/// between come back from the leader, but as already applied they would
/// never be dispatched again, and their queues would lack them. When the
/// log still starts at its first entry, the snapshot is set aside (false)
/// and the state is rebuilt by applying the whole log again; when it was
/// purged, nothing here can rebuild it, and the error (damage) sets the
/// store aside so that the node is sent the group's state afresh.
fn indexes_cover(log: &LogStore, raft_dir: &Path, content: &SnapshotContent) -> io::Result<bool> {
    let dispatched = log.store().dispatched_offset();
    if content.next_phys <= dispatched {
        return Ok(true);
    }
    let (first, _) = log.bounds();
    if first > 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the log was cut at {dispatched}, below the snapshot's {}, and its start was purged: \
                 the entries between cannot be applied again",
                content.next_phys
            ),
        ));
    }
    tracing::warn!(
        snapshot = ?content.meta.last_log_id,
        next_phys = content.next_phys,
        dispatched,
        "the log was cut below the snapshot; setting the snapshot aside and applying the whole log again"
    );
    fs::rename(raft_dir.join(SNAPSHOT_FILE), raft_dir.join(SNAPSHOT_AHEAD_FILE))?;
    fs::File::open(raft_dir)?.sync_all()?;
    Ok(false)
}

/// A snapshot being installed by reset, until the store is reset to it.
pub const SNAPSHOT_INSTALLING_FILE: &str = "snapshot.installing.json";

/// A snapshot install by reset writes the install file, resets the store
/// and log, then renames the file to the snapshot file. If the install file
/// is there at open, a crash came in between: do the reset again (it is
/// idempotent) and finish. (Before the install file, an install was
/// guessed from a log lacking the snapshot's last entry, and a log that
/// damage had cut below its snapshot was taken for one: its whole log was
/// dropped.)
fn finish_interrupted_install(log: &LogStore, raft_dir: &Path) -> io::Result<()> {
    let Some(json) = read_checked(raft_dir, SNAPSHOT_INSTALLING_FILE)? else {
        return Ok(());
    };
    let content: SnapshotContent = serde_json::from_slice(&json)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{SNAPSHOT_INSTALLING_FILE}: {e}")))?;
    if let Some(last) = content.meta.last_log_id {
        tracing::warn!(last = %last, "finishing a snapshot install that a crash interrupted");
        log.reset_for_snapshot(last, content.next_phys, &content.queues)?;
    }
    fs::rename(raft_dir.join(SNAPSHOT_INSTALLING_FILE), raft_dir.join(SNAPSHOT_FILE))?;
    fs::File::open(raft_dir)?.sync_all()
}

/// Applies a metadata change; `index` is the entry's log index (the handle
/// of the deliveries a pop or change makes).
fn apply_admin(md: &mut Metadata, inflight: &mut InFlightCounts, a: AdminCommand, index: u64) -> Response {
    match a {
        AdminCommand::PutTopic(t) => {
            md.topics.insert(t.name.clone(), t);
        }
        AdminCommand::DeleteTopic { name } => {
            md.topics.remove(&name);
            for topics in md.offsets.values_mut() {
                topics.remove(&name);
            }
            consumption::remove_topic(&mut md.consumption, inflight, &name);
        }
        AdminCommand::PutGroup(g) => {
            md.groups.insert(g.name.clone(), g);
        }
        AdminCommand::DeleteGroup { name } => {
            md.groups.remove(&name);
            md.offsets.remove(&name);
            consumption::remove_group(&mut md.consumption, inflight, &name);
        }
        AdminCommand::Pop(plans) => {
            if let Some(p) = plans.iter().find(|p| !md.topics.contains_key(&p.topic)) {
                return Response::Rejected(format!("topic {} does not exist", p.topic));
            }
            return Response::Popped(
                plans
                    .into_iter()
                    .map(|p| consumption::apply_pop(&mut md.consumption, inflight, p, index))
                    .collect(),
            );
        }
        AdminCommand::InitSecret { secret } => {
            md.secret.get_or_insert(secret);
        }
        AdminCommand::SetWritable { writable } => md.writes_wiped = !writable,
        AdminCommand::Acl(c) => {
            if let Err(e) = c.apply(&mut md.users, &mut md.acls) {
                return Response::Rejected(e);
            }
        }
        AdminCommand::SetDedup(cfg) => {
            if let Some(why) = cfg.refusal() {
                return Response::Rejected(why);
            }
            md.dedup = cfg;
        }
        AdminCommand::Ack { group, topic, receipts } => {
            return Response::Acked(consumption::apply_ack(
                &mut md.consumption,
                inflight,
                &group,
                &topic,
                &receipts,
            ));
        }
        AdminCommand::ChangeInvisible {
            group,
            topic,
            receipt,
            visible_at_ms,
        } => {
            return Response::Changed(consumption::apply_change_invisible(
                &mut md.consumption,
                &group,
                &topic,
                &receipt,
                visible_at_ms,
                index,
            ));
        }
        AdminCommand::ResetConsumption {
            group,
            topic,
            queue_id,
            offset,
        } => consumption::apply_reset(&mut md.consumption, inflight, &group, &topic, queue_id, offset),
        AdminCommand::ReleaseTimers { keys } => {
            if !md.held.release_timers(&keys) {
                return Response::Rejected("a timed message is no longer pending".into());
            }
        }
        AdminCommand::EndTransaction { id } => {
            if !md.held.end_transaction(id) {
                return Response::Rejected("the transaction is not pending (resolved already?)".into());
            }
        }
        AdminCommand::TransactionsChecked { ids, at_ms } => {
            for id in ids {
                md.held.checked(id, at_ms);
            }
        }
        AdminCommand::CommitOffset {
            group,
            topic,
            queue_id,
            offset,
            bound,
        } => {
            if let Some(why) = bound.and_then(|b| md.offset_refusal(&group, &topic, queue_id, b)) {
                return Response::Rejected(why);
            }
            md.offsets
                .entry(group)
                .or_default()
                .entry(topic)
                .or_default()
                .insert(queue_id, offset);
        }
    }
    Response::Done
}

/// Records the messages an applied send stored in a system topic of held
/// messages. Their ids count messages across all of the entry's batches.
fn hold(h: &mut Held, index: u64, batches: &[BatchView<'_>], outcomes: &[BatchOutcome]) {
    let mut ordinal = 0u32;
    for (b, o) in batches.iter().zip(outcomes) {
        if let (true, BatchOutcome::Appended { duplicates, .. }) = (held::is_system_topic(b.topic), o) {
            for (k, (_, _, view)) in b.messages.iter().enumerate() {
                // A retry of a held message is not held a second time: its
                // first copy is (released once, ended once).
                if crate::command::duplicate(duplicates, k as u32).is_some() {
                    continue;
                }
                h.on_applied(
                    b.topic,
                    HeldId {
                        index,
                        ordinal: ordinal + k as u32,
                    },
                    view,
                );
            }
        }
        ordinal = ordinal.saturating_add(b.messages.len() as u32);
    }
}

/// Why a producer's send ordered after [`AdminCommand::SetWritable`]
/// `false` is refused.
pub const WRITES_WIPED: &str = "the broker group's write permission is wiped: it takes no sends";

/// Why the state machine refuses a batch, if it does.
fn batch_refusal(md: &Metadata, b: &BatchView<'_>) -> Option<String> {
    let Some(topic) = md.topics.get(b.topic) else {
        return Some(format!("topic {} does not exist", b.topic));
    };
    if !topic.writable() {
        return Some(format!("topic {} is not writable", b.topic));
    }
    if b.queue_id >= topic.write_queues {
        // No arithmetic on the id: it may be u32::MAX.
        return Some(format!(
            "topic {} has {} write queues; there is no queue {}",
            b.topic, topic.write_queues, b.queue_id
        ));
    }
    None
}

fn apply_batch(
    md: &Metadata,
    store: &raftmq_store::Store,
    b: &BatchView<'_>,
    payload_phys: u64,
    redo: bool,
    mut window: Option<&mut DedupWindow>,
    held_at: Option<HeldId>,
) -> io::Result<BatchOutcome> {
    if let Some(why) = batch_refusal(md, b) {
        return Ok(BatchOutcome::Rejected(why));
    }
    let mut first = None;
    let mut count = 0u32;
    let mut duplicates = Vec::new();
    // Index keys are "topic#key"; one buffer serves every message.
    let mut buf = String::new();
    let mut ranges = Vec::new();
    for (k, (at, len, view)) in b.messages.iter().enumerate() {
        let phys = payload_phys + *at as u64;
        let mut key = None;
        if let Some(w) = window.as_mut().filter(|_| !view.message_id.is_empty()) {
            w.evict(&md.dedup, view.store_timestamp_ms);
            let id_key = dedup::Key::new(b.topic, view.message_id);
            match w.find_key(&id_key) {
                // The same message applied again (its first try ran out
                // of disk space half-way): dispatching is idempotent.
                Some(o) if o.phys == phys => {}
                // Its offset was looked up when it went in: one still
                // unknown is a copy retention has deleted since.
                Some(o) => {
                    duplicates.push(Duplicate {
                        index: k as u32,
                        queue_id: o.queue_id,
                        queue_offset: o.queue_offset,
                    });
                    continue;
                }
                None => key = Some(id_key),
            }
        }
        count += 1;
        let offset = if redo {
            buf.clear();
            ranges.clear();
            for key in view
                .keys()
                .chain((!view.message_id.is_empty()).then_some(view.message_id))
            {
                let start = buf.len();
                buf.push_str(b.topic);
                buf.push('#');
                buf.push_str(key);
                ranges.push(start..buf.len());
            }
            let keys = ranges.iter().map(|r| &buf.as_bytes()[r.clone()]).collect();
            let offset = store
                .dispatch(&Dispatch {
                    topic: b.topic,
                    queue_id: b.queue_id,
                    phys,
                    size: *len as u32,
                    tag_hash: tag_hash(view.tag),
                    store_timestamp_ms: view.store_timestamp_ms,
                    keys,
                })
                .map_err(io_err)?;
            first.get_or_insert(offset);
            Some(offset)
        } else {
            None
        };
        if let (Some(w), Some(key)) = (window.as_mut(), key) {
            let (queue_id, queue_offset) = match (held_at, offset) {
                // A held message's answer needs its first copy's HeldId, not
                // its place in the system topic's one queue (see `Duplicate`).
                (Some(at), _) => (at.ordinal.saturating_add(k as u32), at.index),
                (None, Some(o)) => (b.queue_id, o),
                // Applied again after a restart (below the dispatch
                // checkpoint): the queue holds the message; a snapshot must
                // carry its offset to nodes whose queues will not.
                (None, None) => (
                    b.queue_id,
                    store
                        .queue(b.topic, b.queue_id)
                        .and_then(|cq| cq.offset_of_phys(phys).ok().flatten())
                        .unwrap_or(UNKNOWN_OFFSET),
                ),
            };
            let original = Original {
                queue_id,
                queue_offset,
                phys,
            };
            w.insert_key(key, dedup::topic_hash(b.topic), original);
        }
    }
    Ok(BatchOutcome::Appended {
        first_queue_offset: first.unwrap_or(0),
        count,
        duplicates,
    })
}

/// The snapshot file's JSON, its CRC checked (the file is laid out as the
/// Raft metadata files are: `crate::raft_meta`).
fn read_snapshot_json(dir: &Path) -> io::Result<Option<Vec<u8>>> {
    read_checked(dir, SNAPSHOT_FILE)
}

/// A file laid out as the Raft metadata files are, its CRC checked.
fn read_checked(dir: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(crate::raft_meta::verified(&path, &bytes)?.to_vec())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The dispatch offset the current snapshot found durable in the indexes
/// (its `next_phys`; 0 without a snapshot that can be read): the floor
/// below which [`raftmq_store::Store::open_above`] keeps them even when the
/// checkpoint was lost. Every snapshot file is written after the indexes
/// below its `next_phys` were flushed.
pub fn durable_dispatch(raft_dir: &Path) -> u64 {
    #[derive(Deserialize)]
    struct NextPhys {
        next_phys: u64,
    }
    match read_snapshot_json(raft_dir) {
        Ok(Some(json)) => serde_json::from_slice::<NextPhys>(&json).map_or(0, |s| s.next_phys),
        _ => 0,
    }
}

fn read_snapshot(dir: &Path) -> io::Result<Option<SnapshotContent>> {
    read_snapshot_json(dir)?
        .map(|json| {
            serde_json::from_slice(&json)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{SNAPSHOT_FILE}: {e}")))
        })
        .transpose()
}

/// Replaces the snapshot file atomically (callers hold the snapshot lock;
/// the temporary name is unique anyway), with its CRC in front.
fn write_snapshot(dir: &Path, data: &[u8]) -> io::Result<()> {
    write_checked(dir, SNAPSHOT_FILE, data)
}

/// Replaces file `name` atomically, with its CRC in front.
fn write_checked(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    let data = &crate::raft_meta::checked(data);
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.{}.{n}.tmp", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    fs::File::open(dir)?.sync_all()
}

/// Builds a snapshot of the state as it is when `build_snapshot` runs.
pub struct SnapshotBuilder {
    sm: StateMachine,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let sm = self.sm.clone();
        tokio::task::spawn_blocking(move || {
            let mut snapshot_file = sm
                .inner
                .snapshots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let content = sm.snapshot_content()?;
            // An install may have replaced the state meanwhile: never put an
            // older snapshot over a newer one.
            if *snapshot_file > content.meta.last_log_id
                && let Some(current) = read_snapshot(&sm.inner.dir)?
            {
                return Ok(Snapshot {
                    meta: current.meta.clone(),
                    snapshot: serde_json::to_vec(&current).map_err(io::Error::other)?,
                });
            }
            let data = serde_json::to_vec(&content).map_err(io::Error::other)?;
            crate::room::until_room_blocking("snapshot build", sm.inner.log.stopping(), || {
                write_snapshot(&sm.inner.dir, &data)
            })?;
            *snapshot_file = content.meta.last_log_id;
            tracing::info!(last = ?content.meta.last_log_id, bytes = data.len(), "built snapshot");
            if data.len() as u64 > MAX_SNAPSHOT_BYTES {
                tracing::error!(
                    bytes = data.len(),
                    max = MAX_SNAPSHOT_BYTES,
                    "this snapshot is larger than a follower accepts: a follower that needs it cannot catch up; \
                     delete unused consumer groups and topics"
                );
            }
            Ok(Snapshot {
                meta: content.meta,
                snapshot: data,
            })
        })
        .await
        .map_err(io::Error::other)?
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let st = read_state(&self.inner.state);
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut last = None;
        while let Some((entry, responder)) = entries.try_next().await? {
            // A new queue or key-index file may find the disk full: the
            // entry is applied again once there is room (see `crate::room`;
            // dispatch finds what a half-done try already indexed).
            let mut half = false;
            let resp = until_room("apply", self.inner.log.stopping(), || {
                let applied = self.apply_entry(&entry);
                // Marked while a failed try waits, so that snapshots wait too.
                if applied.is_err() != half {
                    half = applied.is_err();
                    write_state(&self.inner.state).half_applied = half.then_some(entry.log_id.index);
                }
                std::future::ready(applied)
            })
            .await?;
            last = Some(entry.log_id.index);
            if let Some(r) = responder {
                r.send(resp);
            }
        }
        if let Some(i) = last {
            self.inner.applied.send_replace(i);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { sm: self.clone() }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Vec<u8>) -> Result<(), io::Error> {
        let sm = self.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || sm.install(&meta, &snapshot))
            .await
            .map_err(io::Error::other)?
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let dir = self.inner.dir.clone();
        let Some(bytes) = tokio::task::spawn_blocking(move || read_snapshot_json(&dir))
            .await
            .map_err(io::Error::other)??
        else {
            return Ok(None);
        };
        let content: SnapshotContent =
            serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Some(Snapshot {
            meta: content.meta,
            snapshot: bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(md: &mut Metadata, group: &str, queue_id: u32, offset: u64, bound: Option<u64>) -> Response {
        let cmd = AdminCommand::CommitOffset {
            group: group.into(),
            topic: "T".into(),
            queue_id,
            offset,
            bound,
        };
        apply_admin(md, &mut InFlightCounts::default(), cmd, 1)
    }

    #[test]
    fn committed_offsets_stop_at_the_bound_the_command_carries() {
        let mut md = Metadata::default();
        assert!(matches!(commit(&mut md, "G", 0, 5, Some(2)), Response::Done));
        assert!(matches!(commit(&mut md, "H", 0, 5, Some(2)), Response::Done));
        assert_eq!(md.committed_offsets(), 2);
        assert!(
            matches!(commit(&mut md, "G", 1, 5, Some(2)), Response::Rejected(why) if why.contains("max_consumer_positions")),
            "a third offset past a bound of two"
        );
        assert!(!md.has_offset("G", "T", 1));
        assert!(
            matches!(commit(&mut md, "G", 0, 9, Some(2)), Response::Done),
            "a kept one moves"
        );
        assert_eq!(md.offsets["G"]["T"][&0], 9);
        assert!(
            matches!(commit(&mut md, "G", 1, 5, None), Response::Done),
            "an entry from before the bound existed"
        );
        assert_eq!(md.committed_offsets(), 3);
    }
}
