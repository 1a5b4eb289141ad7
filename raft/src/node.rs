//! One node of a broker group: its store, Raft log, state machine, openraft
//! instance and Raft transport server, plus bootstrap and membership.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError as OpenRaftError};
use openraft::{ChangeMembers, Config, SnapshotPolicy};
use raftmq_store::retention::Clock as _;
use raftmq_store::{Store, StoreConfig};
use tokio::sync::watch;

use crate::Raft;
use crate::command::{Command, Response};
use crate::error::RaftError;
use crate::log_store::LogStore;
use crate::network::NetworkFactory;
use crate::service::RaftService;
use crate::state_machine::StateMachine;
use crate::types::{LogId, NodeAddr, NodeId};

/// How long a write waits for leadership to settle after an election.
pub const SETTLE_WAIT: Duration = Duration::from_secs(2);
/// How long a leader that is stopping, or being removed, waits for another
/// voter to take over (see [`RaftNode::hand_over`]).
pub const HAND_OVER_WAIT: Duration = Duration::from_secs(2);

/// How often a node looks at its disk's use (one `statvfs`), so a full
/// disk is refused, and a full leader hands over, within about this long.
pub const DISK_WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a leader whose disk is full waits before it tries handing
/// over again (when the first try found no follower to take over).
pub const DISK_HAND_OVER_RETRY: Duration = Duration::from_secs(4);

/// Leadership handed to the preferred leader and back within this long
/// counts as a bounce: the next hand-back waits, twice as long each time.
pub const PREFERRED_BOUNCE: Duration = Duration::from_secs(10);
/// The longest wait after bounces before leadership goes back to the
/// preferred leader.
pub const PREFERRED_MAX_HOLD_OFF: Duration = Duration::from_secs(300);

/// How a node runs. The broker fills it from its TOML config.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Name of the broker group (openraft's cluster name).
    pub group: String,
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    /// Address the Raft transport listens on.
    pub raft_listen: String,
    /// How the other nodes reach this one.
    pub advertise: NodeAddr,
    /// The group's first members (this node included); used once, by the
    /// node with `bootstrap`, to initialize a fresh group.
    pub initial_members: BTreeMap<NodeId, NodeAddr>,
    /// This node initializes the group if it was never initialized. Exactly
    /// one node of a new group should have it; restarts never re-initialize.
    pub bootstrap: bool,
    /// Why this node must not initialize a new group, if it must not: then
    /// a bootstrap of a group that never was fails with this reason, while
    /// a restart of a group that was goes on (the broker sets it when no
    /// one could ever call the new group, see its `[acl]`).
    pub bootstrap_refusal: Option<String>,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Build a snapshot every this many applied entries.
    pub snapshot_every: u64,
    /// Leadership goes back to this node whenever it is caught up.
    pub preferred_leader: Option<NodeId>,
    /// Raft addresses to dial for some peers instead of the advertised ones
    /// (a peer reachable from here only through a NAT or a proxy).
    pub dial_overrides: std::collections::HashMap<NodeId, String>,
    /// How often retention runs (RocketMQ checks every 10 s).
    pub retention_interval: Duration,
    /// The wall clock retention judges ages by (milliseconds since the
    /// epoch); the broker passes its own, which fault injection can skew.
    pub wall_clock_ms: fn() -> u64,
    pub store: StoreConfig,
    /// TLS on the Raft port and towards peers: mutual, with certificates
    /// from the cluster's CA naming this group's nodes. None: plain.
    pub tls: Option<Arc<crate::tls::Material>>,
}

impl NodeConfig {
    /// A config with the default timings for `node_id`.
    pub fn new(group: &str, node_id: NodeId, data_dir: PathBuf, advertise: NodeAddr) -> NodeConfig {
        NodeConfig {
            group: group.to_string(),
            node_id,
            data_dir,
            raft_listen: advertise.raft_addr.clone(),
            advertise,
            initial_members: BTreeMap::new(),
            bootstrap: false,
            bootstrap_refusal: None,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            heartbeat_interval_ms: 50,
            snapshot_every: 10_000,
            preferred_leader: None,
            dial_overrides: Default::default(),
            retention_interval: Duration::from_secs(10),
            wall_clock_ms: || raftmq_store::retention::SystemClock.now_ms(),
            store: StoreConfig::default(),
            tls: None,
        }
    }

    fn openraft_config(&self) -> Result<Config, RaftError> {
        Config {
            cluster_name: self.group.clone(),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            heartbeat_interval: self.heartbeat_interval_ms,
            install_snapshot_timeout: 10_000,
            // Bounded so that one append request stays below the transport's
            // message limit even when every entry is as large as allowed.
            max_payload_entries: (crate::network::MAX_MESSAGE_SIZE as u64 / self.store.max_record_size).clamp(1, 64),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            // The log is the message store: it is purged by retention (which
            // calls `purge_log`), never just because a snapshot exists.
            max_in_snapshot_log_to_keep: u64::MAX,
            // A follower's log can go back below what the leader counted
            // on: with async flush a power loss takes acknowledged appends
            // (the documented trade-off), and in either mode damage on disk
            // cuts a log short (`LogStore::lost_up_to`). openraft treats that
            // as a bug and stops replicating to the node for good (the jepsen
            // power nemesis left a follower 1335 entries behind, never caught
            // up); re-replicating is the repair.
            allow_log_reversion: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| RaftError::Invalid(format!("raft config: {e}")))
    }
}

/// A running node.
/// Connections the Raft port holds at once: peers only, which keep one or
/// two each.
pub const RAFT_MAX_CONNECTIONS: usize = 256;
/// Of which from one address: a peer needs a few (replication, votes,
/// snapshots, reconnects), several nodes may share a host.
pub const RAFT_MAX_CONNECTIONS_PER_IP: usize = 64;

pub struct RaftNode {
    pub id: NodeId,
    pub raft: Raft,
    pub sm: StateMachine,
    pub log: LogStore,
    pub store: Store,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    raft_addr: std::net::SocketAddr,
    /// Dials peers outside openraft's own calls (a follower's ReadIndex).
    network: NetworkFactory,
    /// Bounds the [`RaftNode::read_barrier`]s asking the leader at once,
    /// each a heartbeat round there: a flood of refused calls costs the
    /// group little.
    barriers: tokio::sync::Semaphore,
    /// Findings of damage this run has noted ([`RaftNode::note_damage`]).
    damage_noted: std::sync::atomic::AtomicUsize,
    /// The newest term in which this node, as leader, looked at its disk
    /// before taking a send ([`RaftNode::disk_full_for_sends`]).
    disk_looked_term: std::sync::atomic::AtomicU64,
}

/// Most [`RaftNode::read_barrier`]s asking the leader at once from one node.
const MAX_BARRIERS: usize = 4;

/// Opens the store (recovering it after a crash), the Raft log over it
/// and the state machine.
async fn open_storage(cfg: &NodeConfig) -> Result<(Store, LogStore, StateMachine), RaftError> {
    let raft_dir = cfg.data_dir.join("raft");
    let store = tokio::task::spawn_blocking({
        let (dir, sc, raft_dir) = (cfg.data_dir.clone(), cfg.store.clone(), raft_dir.clone());
        move || Store::open_above(&dir, &sc, crate::state_machine::durable_dispatch(&raft_dir))
    })
    .await
    .map_err(|e| RaftError::Fatal(e.to_string()))??;
    let log = LogStore::open(store.clone(), &raft_dir)?;
    let sm = StateMachine::open(log.clone(), &raft_dir)?;
    Ok((store, log, sm))
}

/// Sets a damaged store aside ([`crate::quarantine::set_aside`]), keeping
/// room for a new store to start and take writes: two segments.
fn set_aside_store(cfg: &NodeConfig, why: &dyn std::fmt::Display) -> Result<(), RaftError> {
    let room = cfg.store.segment_size.saturating_mul(2);
    let to = crate::quarantine::set_aside(&cfg.data_dir, room)?;
    let kept = to.map_or_else(|| "deleted for room".to_string(), |t| t.display().to_string());
    tracing::error!(error = %why, quarantine = %kept,
        "the store is damaged beyond what recovery cuts; set it aside, starting empty to be sent the log again");
    Ok(())
}

impl RaftNode {
    /// Opens the node's storage (recovering it after a crash), starts Raft
    /// and the transport, and initializes the group if this is its
    /// bootstrap node and it never was.
    pub async fn start(cfg: NodeConfig) -> Result<Arc<RaftNode>, RaftError> {
        let listener = tokio::net::TcpListener::bind(&cfg.raft_listen)
            .await
            .map_err(|e| RaftError::Invalid(format!("cannot listen on {}: {e}", cfg.raft_listen)))?;
        let raft_addr = listener.local_addr()?;
        // With peers to send the log again, damage sets the store aside; a
        // lone node's store is all there is, so it refuses to start instead.
        let has_peers = cfg.initial_members.keys().any(|&id| id != cfg.node_id);
        let noted = crate::quarantine::noted_damage(&cfg.data_dir);
        if let (Some(note), false) = (&noted, has_peers) {
            tracing::warn!(
                note = note.trim(),
                "this node found its store damaged when it last ran, \
                and has no peers to be sent the log again by: starting with it as it is"
            );
        }
        let (store, log, sm) = match noted.filter(|_| has_peers) {
            Some(note) => {
                set_aside_store(&cfg, &format!("found while running: {}", note.trim()))?;
                open_storage(&cfg).await?
            }
            None => match open_storage(&cfg).await {
                Err(e) if has_peers && crate::quarantine::is_damage(&e) => {
                    set_aside_store(&cfg, &e)?;
                    open_storage(&cfg).await?
                }
                r => r?,
            },
        };
        let mut config = cfg.openraft_config()?;
        // Lost committed entries: no campaign until they are back.
        let catching_up = crate::catching_up::CatchingUp::new(log.lost_up_to());
        if catching_up.target().is_some() {
            config.enable_elect = false;
        }
        let config = Arc::new(config);
        let network = NetworkFactory::new(
            &cfg.group,
            cfg.dial_overrides.clone(),
            crate::tls::Dialer::new(cfg.tls.clone()),
        );
        let raft = Raft::new(cfg.node_id, config, network.clone(), log.clone(), sm.clone())
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;

        let (stop, stopped) = watch::channel(false);
        // A few streams per peer: replication, heartbeats, votes, snapshots;
        // a few connections per peer, with room for reconnects.
        let router = crate::serve::builder(64, crate::serve::Keepalive::default()).add_service(
            RaftService::new(
                raft.clone(),
                &cfg.group,
                cfg.node_id,
                catching_up.clone(),
                cfg.tls.is_some(),
                cfg.store.max_record_size,
            )
            .into_server(),
        );
        let tls = cfg.tls.clone().map(|material| crate::serve::Tls {
            material,
            auth: crate::tls::ClientAuth::Required,
        });
        let server = crate::serve::spawn(
            listener,
            router,
            stopped,
            "raft transport",
            crate::serve::Capacity {
                total: RAFT_MAX_CONNECTIONS,
                per_ip: RAFT_MAX_CONNECTIONS_PER_IP,
                idle_timeout: crate::serve::IDLE_TIMEOUT,
            },
            tls,
        );

        let node = Arc::new(RaftNode {
            id: cfg.node_id,
            raft,
            sm,
            log,
            store,
            stop,
            server,
            raft_addr,
            network,
            barriers: tokio::sync::Semaphore::new(MAX_BARRIERS),
            damage_noted: Default::default(),
            disk_looked_term: Default::default(),
        });
        if cfg.bootstrap {
            node.bootstrap(&cfg).await?;
        }
        if let Some(target) = catching_up.target() {
            node.clone().spawn_catch_up(target, catching_up);
        }
        if let Some(preferred) = cfg.preferred_leader {
            node.clone().spawn_preferred_leader(preferred);
        }
        node.clone().spawn_retention(cfg.retention_interval, cfg.wall_clock_ms);
        node.clone().spawn_disk_watch(DISK_WATCH_INTERVAL);
        tracing::info!(node = cfg.node_id, raft = %raft_addr, "raft node started");
        Ok(node)
    }

    /// Records damage a reader found in this node's store (a ConsumeQueue
    /// block that does not match its seal, a unit that does not lead to its
    /// message): the reads it spoils are refused, and the next start sets
    /// the store aside to be sent the log again by the group
    /// ([`crate::quarantine`]). Only the first findings are written. A
    /// leader hands leadership on (see `spawn_disk_watch`).
    pub fn note_damage(&self, what: &str) {
        if self.damage_noted.fetch_add(1, Ordering::Relaxed) >= crate::quarantine::NOTE_LINES {
            return;
        }
        tracing::error!(
            damage = what,
            "this node's store is damaged: it refuses the reads that meet the damage; \
            restart it to have the store set aside and sent again by its group"
        );
        if let Err(e) = crate::quarantine::note_damage(self.store.root(), what) {
            tracing::error!(error = %e, "could not write the damage note");
        }
    }

    async fn bootstrap(&self, cfg: &NodeConfig) -> Result<(), RaftError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        if let Some(why) = &cfg.bootstrap_refusal {
            return Err(RaftError::Invalid(format!("will not initialize a new group: {why}")));
        }
        let mut members = cfg.initial_members.clone();
        members.entry(cfg.node_id).or_insert_with(|| cfg.advertise.clone());
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(node = cfg.node_id, "initialized a new raft group");
                Ok(())
            }
            Err(OpenRaftError::APIError(openraft::errors::InitializeError::NotAllowed(e))) => {
                tracing::info!(error = %e, "group already initialized");
                Ok(())
            }
            // Not in its own initial membership, say: a config mistake.
            Err(OpenRaftError::APIError(e)) => Err(RaftError::Invalid(format!("cannot initialize the group: {e}"))),
            Err(e) => Err(RaftError::Fatal(e.to_string())),
        }
    }

    /// The address the Raft transport actually listens on.
    pub fn raft_addr(&self) -> std::net::SocketAddr {
        self.raft_addr
    }

    /// Proposes a command on this node (it must be the leader) and waits
    /// until it is committed and applied here.
    ///
    /// Right after an election openraft may refuse writes with "no leader"
    /// for a moment (the new leader's term is not established yet); such a
    /// refusal means the entry was never appended, so it is retried here
    /// for up to [`SETTLE_WAIT`] instead of failing the caller.
    pub async fn write(&self, cmd: Command) -> Result<(LogId, Response), RaftError> {
        self.settled(|| self.raft.client_write(cmd.clone()))
            .await
            .map(|r| (r.log_id, r.data))
    }

    /// Confirms that this node still leads (a heartbeat round answered by a
    /// quorum: Raft's ReadIndex) and waits until it has applied everything
    /// committed before the call, so a read that follows sees every write
    /// acknowledged before it began. A deposed leader that has not noticed
    /// yet fails here instead of answering from stale state.
    pub async fn linearizable(&self) -> Result<(), RaftError> {
        // `settled` bounds its retries; this also bounds one call, which
        // waits for a quorum that may not answer.
        let read = self.settled(|| self.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex));
        match tokio::time::timeout(SETTLE_WAIT, read).await {
            Ok(out) => out.map(|_| ()),
            Err(_) => Err(RaftError::Unavailable(
                "no quorum confirmed this node's leadership in time".into(),
            )),
        }
    }

    /// A read barrier: waits, up to `within`, until this node has applied
    /// everything its group committed before the call, so that what it
    /// reads next of its state is as current as the group's. As leader
    /// after a ReadIndex round ([`RaftNode::linearizable`]); otherwise up
    /// to the index its leader gives for a ReadIndex (the `ReadIndex` RPC),
    /// Raft's follower read. `Err`: no leader answered (a node that just
    /// restarted, say, may name a leader of its last term that is gone),
    /// or this node did not apply that far in time.
    pub async fn read_barrier(&self, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        // Each barrier costs the leader a heartbeat round: a few at once.
        let turn = tokio::time::timeout(within, self.barriers.acquire())
            .await
            .map_err(|_| "too many calls are waiting for a read barrier on this node".to_string())?
            .map_err(|_| "shutting down".to_string())?;
        if self.is_leader() {
            return tokio::time::timeout(left(), self.linearizable())
                .await
                .map_err(|_| "this leader could not confirm its commit index in time".to_string())?
                .map_err(|e| e.to_string());
        }
        let m = self.raft.metrics().borrow_watched().clone();
        let leader = m.current_leader.ok_or("this node knows no leader")?;
        let at = m
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()
            .ok_or_else(|| format!("leader {leader} is not in this node's membership"))?;
        let index = self.network.read_index(leader, &at, left()).await?;
        // Applying here costs the leader nothing.
        drop(turn);
        self.raft
            .wait(Some(left()))
            .applied_index_at_least(Some(index), "applied what the leader committed")
            .await
            .map_err(|_| {
                let applied = self.raft.metrics().borrow_watched().last_applied.map_or(0, |l| l.index);
                format!("this node has applied {applied} of the {index} entries its group committed")
            })?;
        Ok(())
    }

    /// Runs a leader-only openraft call, retrying while leadership is
    /// settling (see [`RaftNode::write`]).
    async fn settled<T, E, F, Fut>(&self, call: F) -> Result<T, RaftError>
    where
        E: IntoRaftError,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            match call().await.map_err(IntoRaftError::into_raft_error) {
                Err(RaftError::NotLeader { leader_id, .. })
                    if (leader_id.is_none() || leader_id == Some(self.id))
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => return other,
            }
        }
    }

    /// Resolves once `leader` is no longer the leader this node knows: a
    /// new term, another leader, or none while an election runs (a
    /// follower that stops hearing its leader starts one within the
    /// election timeout). A call forwarded to `leader` may then never be
    /// answered.
    pub async fn leader_lost(&self, leader: NodeId) {
        let mut metrics = self.raft.metrics();
        loop {
            if metrics.borrow_watched().current_leader != Some(leader) {
                return;
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// The current leader's id and address, as this node knows them.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        let m = self.raft.metrics().borrow_watched().clone();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id).cloned()?;
        Some((id, addr))
    }

    /// This node's Raft role: leader, follower, candidate, learner or shutdown.
    pub fn role(&self) -> &'static str {
        match self.raft.metrics().borrow_watched().state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        }
    }

    pub fn is_leader(&self) -> bool {
        self.raft.is_leader()
    }

    /// Whether the disk is past `disk_refuse_ratio`, as a leader must know
    /// it before it proposes a send: `(used %, limit %)` when full. The
    /// disk watch looks every second at every node, so a node that has
    /// just won an election may carry a mark up to a second old, while the
    /// leader it replaced refused sends for that same disk state. So the
    /// first send of each term at this node looks again (one `statvfs`);
    /// the mark then stays as current as the old leader's was.
    pub fn disk_full_for_sends(&self) -> Option<(f64, f64)> {
        let term = self.raft.metrics().borrow_watched().current_term;
        if self.disk_looked_term.load(Ordering::Acquire) < term {
            match self.store.watch_disk(&raftmq_store::retention::StatvfsProbe) {
                Ok(_) => {
                    self.disk_looked_term.fetch_max(term, Ordering::AcqRel);
                }
                // The watch goes on trying and says so; the mark stands.
                Err(e) => tracing::debug!(error = %e, "cannot read the disk's use"),
            }
        }
        self.store.commitlog().disk_full()
    }

    /// Adds a node: as a learner first (which blocks until it has caught
    /// up), then as a voter.
    pub async fn add_node(&self, id: NodeId, addr: NodeAddr) -> Result<(), RaftError> {
        self.settled(|| self.raft.add_learner(id, addr.clone(), true)).await?;
        self.settled(|| {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
        })
        .await?;
        Ok(())
    }

    /// Removes a node from the group entirely. A leader does not remove
    /// itself: it would go on appending entries, the removal's second step
    /// among them, from outside the voters, which openraft does not allow
    /// (it asserts against it). Leadership moves first (see
    /// [`RaftNode::hand_over`]) and the removal is asked of the new leader.
    pub async fn remove_node(&self, id: NodeId) -> Result<(), RaftError> {
        if id == self.id && self.is_leader() {
            return Err(RaftError::Invalid(
                "a leader does not remove itself: hand leadership over first".into(),
            ));
        }
        self.settled(|| {
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
        })
        .await?;
        self.settled(|| {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
        })
        .await?;
        Ok(())
    }

    /// Hands leadership to `to` (this node must be the leader).
    pub async fn transfer_leader(&self, to: NodeId) -> Result<(), RaftError> {
        if !self.is_leader() {
            let leader = self.leader();
            return Err(RaftError::NotLeader {
                leader_id: leader.as_ref().map(|l| l.0),
                leader: leader.map(|l| l.1),
            });
        }
        // openraft starts a transfer to any id (the leader stops
        // heartbeating and an election follows), so a refused one must be
        // refused before anything happens.
        let voters: Vec<NodeId> = {
            let m = self.raft.metrics().borrow_watched().clone();
            m.membership_config.membership().voter_ids().collect()
        };
        if !voters.contains(&to) {
            return Err(RaftError::Invalid(format!(
                "node {to} is not a voter of this group (voters: {voters:?})"
            )));
        }
        if to == self.id {
            return Ok(());
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))
    }

    /// Before a planned stop: when this node leads, hands leadership to the
    /// voter whose log matches the most of it among those that answered a
    /// heartbeat lately, and waits for the group to follow someone else, so
    /// the stop costs the clients no election timeout. All of it, the
    /// transfer call included, takes at most `within`: a stop never hangs
    /// on its peers.
    /// Nothing happens when no other voter is answering (the last node of a
    /// group stopping). Returns the new leader, if one took over.
    pub async fn hand_over(&self, within: Duration) -> Option<NodeId> {
        let m = self.raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(self.id) {
            return None;
        }
        let replication = m.replication.clone().unwrap_or_default();
        let heartbeat = m.heartbeat.clone().unwrap_or_default();
        let fresh = Duration::from_millis(3 * self.raft.config().heartbeat_interval);
        let answering = |v: &NodeId| {
            use openraft::async_runtime::Instant as _;
            heartbeat.get(v).cloned().flatten().is_some_and(|t| t.elapsed() < fresh)
        };
        let to = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != self.id && answering(v))
            .max_by_key(|v| replication.get(v).cloned().flatten().map(|l| l.index))?;
        tracing::info!(to, "stopping: handing leadership over");
        let mut metrics = self.raft.metrics();
        let moved = tokio::time::timeout(within, async {
            if let Err(e) = self.raft.trigger().transfer_leader(to).await {
                tracing::warn!(error = %e, "leadership hand-over");
                return None;
            }
            loop {
                let leader = metrics.borrow_watched().current_leader;
                if leader.is_some_and(|l| l != self.id) {
                    return leader;
                }
                if metrics.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match moved {
            Ok(Some(l)) => Some(l),
            _ => {
                tracing::warn!(to, "no other leader within {within:?}; stopping anyway");
                None
            }
        }
    }

    /// Gives a node that lost committed entries to damage its vote back
    /// once it has applied up to `target` again (from the leader), or at
    /// once when it is its group's only voter (no one has them).
    fn spawn_catch_up(self: Arc<Self>, target: u64, catching_up: crate::catching_up::CatchingUp) {
        let mut stopped = self.stop.subscribe();
        let mut metrics = self.raft.metrics();
        tokio::spawn(async move {
            loop {
                let (applied, alone) = {
                    let m = metrics.borrow_and_update();
                    let mut voters = m.membership_config.membership().voter_ids();
                    let alone = voters.next() == Some(self.id) && voters.next().is_none();
                    (m.last_applied.map(|l| l.index), alone)
                };
                if alone {
                    catching_up.done();
                    self.raft.runtime_config().elect(true);
                    tracing::error!(
                        target,
                        "the only voter of its group lost committed entries to damage: they are gone"
                    );
                    return;
                }
                if applied.is_some_and(|a| a >= target) {
                    catching_up.done();
                    self.raft.runtime_config().elect(true);
                    tracing::info!(target, "caught up with the entries lost to damage; voting again");
                    return;
                }
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    r = metrics.changed() => if r.is_err() { return },
                }
            }
        });
    }

    /// While this node leads, hands leadership to `preferred` whenever that
    /// node is a voter whose log has caught up with the leader's.
    fn spawn_preferred_leader(self: Arc<Self>, preferred: NodeId) {
        let mut stopped = self.stop.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            // When leadership was last handed to `preferred`, and whether it
            // left this node since.
            let mut handed: Option<tokio::time::Instant> = None;
            let mut left = false;
            let mut hold_off = Duration::ZERO;
            let mut not_before = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tick.tick() => {}
                }
                let m = self.raft.metrics().borrow_watched().clone();
                if m.current_leader != Some(self.id) || self.id == preferred {
                    left |= handed.is_some();
                    continue;
                }
                let voter = m.membership_config.membership().voter_ids().any(|v| v == preferred);
                let caught_up = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&preferred))
                    .is_some_and(|matched| {
                        matched.as_ref().map(|l| l.index) >= m.last_log_index.map(|i| i.saturating_sub(0))
                    });
                if !(voter && caught_up) || tokio::time::Instant::now() < not_before {
                    continue;
                }
                // A transfer still under way.
                if !left && handed.is_some_and(|t| t.elapsed() < HAND_OVER_WAIT) {
                    continue;
                }
                // Leading again soon after handing over, or never seen to
                // stop: the preferred node could not take or keep it (its
                // disk is full, say). Each try costs the group an election,
                // so wait longer at each bounce.
                if let Some(t) = handed
                    && (!left || t.elapsed() < PREFERRED_BOUNCE)
                {
                    hold_off = (hold_off * 2).clamp(PREFERRED_BOUNCE, PREFERRED_MAX_HOLD_OFF);
                    not_before = tokio::time::Instant::now() + hold_off;
                    handed = None;
                    tracing::warn!(
                        preferred,
                        hold_off_s = hold_off.as_secs(),
                        "the preferred leader gave leadership back at once; waiting before returning it again"
                    );
                    continue;
                }
                // It kept leadership a while, then lost it: a fresh start.
                if handed.is_some() {
                    hold_off = Duration::ZERO;
                }
                tracing::info!(to = preferred, "returning leadership to the preferred leader");
                handed = Some(tokio::time::Instant::now());
                left = false;
                let _ = self.raft.trigger().transfer_leader(preferred).await;
            }
        });
    }

    /// Applies the store's retention rules through Raft: segments may only
    /// go once a snapshot covers every entry in them, and openraft must
    /// stop reading those entries first, so the deletion runs as a Raft
    /// log purge (`purge_log`, whose storage side deletes whole segments).
    /// Also refuses or re-allows appends by disk use. Returns the plan.
    pub async fn enforce_retention(
        &self,
        clock: &dyn raftmq_store::retention::Clock,
        probe: &dyn raftmq_store::retention::DiskProbe,
    ) -> Result<raftmq_store::retention::RetentionPlan, RaftError> {
        let snapshot = self.raft.metrics().borrow_watched().snapshot;
        let end = self.log.bounds().1;
        // Nothing after the snapshot may go.
        let limit = match snapshot {
            None => 0,
            Some(s) if s.index + 1 < end => self.log.locate(s.index + 1)?.phys,
            Some(_) => self.store.commitlog().max_offset(),
        };
        // Nor anything from the oldest held message on: it is read back
        // from the log when it is released.
        let held = self.sm.with_metadata(|m| m.held.lowest_index());
        let limit = match held {
            Some(i) if i >= self.log.bounds().0 => limit.min(self.log.locate(i)?.phys),
            _ => limit,
        };
        let plan = self.store.plan_retention(clock, probe, limit)?;
        if let Some(before) = plan.delete_before
            && let Some(upto) = self.log.last_entry_ending_by(before)?
        {
            tracing::info!(
                upto = upto.index,
                reason = plan.reason.as_str(),
                "retention purges the raft log"
            );
            // Retention decided these segments may go; the purge's
            // storage side deletes them.
            self.log.allow_deletion_below(before);
            self.raft
                .trigger()
                .purge_log(upto.index)
                .await
                .map_err(|e| RaftError::Fatal(e.to_string()))?;
        }
        Ok(plan)
    }

    /// Runs retention every `every`, with the given wall clock and the real
    /// disk.
    fn spawn_retention(self: Arc<Self>, every: Duration, wall_clock_ms: fn() -> u64) {
        let mut stopped = self.stop.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tick.tick() => {}
                }
                let clock = WallClock(wall_clock_ms);
                let probe = raftmq_store::retention::StatvfsProbe;
                if let Err(e) = self.enforce_retention(&clock, &probe).await {
                    tracing::error!(error = %e, "retention failed");
                }
            }
        });
    }

    /// Looks at the disk's use every `every` and marks the store full past
    /// `disk_refuse_ratio` (the broker then refuses new sends). A leader
    /// whose disk is full hands leadership to the follower with the most of
    /// its log, so the group goes on taking sends through the others; it
    /// tries again every [`DISK_HAND_OVER_RETRY`] while it still leads. So
    /// does a leader whose store was found damaged ([`RaftNode::note_damage`]):
    /// receives and dead letters are served by the leader, and it cannot
    /// read the messages the damage hides.
    fn spawn_disk_watch(self: Arc<Self>, every: Duration) {
        let mut stopped = self.stop.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut handed_over: Option<tokio::time::Instant> = None;
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tick.tick() => {}
                }
                let store = self.store.clone();
                let looked =
                    tokio::task::spawn_blocking(move || store.watch_disk(&raftmq_store::retention::StatvfsProbe)).await;
                let full = match looked {
                    Ok(Ok(full)) => {
                        failing = false;
                        full
                    }
                    Ok(Err(e)) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(error = %e, "cannot read the disk's use");
                        }
                        continue;
                    }
                    Err(_) => continue,
                };
                let due = handed_over.is_none_or(|t| t.elapsed() >= DISK_HAND_OVER_RETRY);
                let damaged = self.damage_noted.load(Ordering::Relaxed) > 0;
                if (full.is_some() || damaged) && self.is_leader() && due {
                    handed_over = Some(tokio::time::Instant::now());
                    match full {
                        Some((used, limit)) => tracing::warn!(
                            disk_percent = used,
                            limit_percent = limit,
                            "disk full on the leader: handing leadership over"
                        ),
                        None => tracing::warn!(
                            "the leader's store is damaged (it cannot read some messages it must deliver): \
                             handing leadership over"
                        ),
                    }
                    self.hand_over(DISK_HAND_OVER_RETRY / 2).await;
                }
            }
        });
    }

    /// Stops Raft and the transport and closes the store cleanly.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        let _ = self.stop.send(true);
        self.log.stop_waiting_for_room();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        self.server.abort();
        self.log.flush_meta()?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.close())
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))??;
        Ok(())
    }
}

/// openraft's error for leader-only calls.
type WriteError = OpenRaftError<crate::types::TypeConfig, ClientWriteError<crate::types::TypeConfig>>;
type ReadError = OpenRaftError<crate::types::TypeConfig, LinearizableReadError<crate::types::TypeConfig>>;

/// A wall-clock function as retention's clock (hours in the host's zone).
struct WallClock(fn() -> u64);

impl raftmq_store::retention::Clock for WallClock {
    fn now_ms(&self) -> u64 {
        (self.0)()
    }
    fn local_hour(&self, at_ms: u64) -> u8 {
        raftmq_store::retention::SystemClock.local_hour(at_ms)
    }
}

/// The openraft errors of leader-only calls, as raftmq's.
trait IntoRaftError {
    fn into_raft_error(self) -> RaftError;
}

impl IntoRaftError for WriteError {
    fn into_raft_error(self) -> RaftError {
        match self {
            OpenRaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RaftError::NotLeader {
                leader_id: f.leader_id,
                leader: f.leader_node,
            },
            OpenRaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => RaftError::OutcomeUnknown(format!(
                "the entry was discarded by a leader change (new leader: {:?})",
                f.leader_id
            )),
            OpenRaftError::APIError(other) => RaftError::Invalid(other.to_string()),
            OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
        }
    }
}

impl IntoRaftError for ReadError {
    fn into_raft_error(self) -> RaftError {
        match self {
            OpenRaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => RaftError::NotLeader {
                leader_id: f.leader_id,
                leader: f.leader_node,
            },
            OpenRaftError::APIError(LinearizableReadError::QuorumNotEnough(q)) => {
                RaftError::Unavailable(format!("no quorum confirmed this node's leadership: {q}"))
            }
            OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
        }
    }
}
