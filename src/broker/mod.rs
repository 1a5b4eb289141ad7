//! The broker core at one node, with no gRPC service in it: [`Broker`]
//! sends (through the leader's batcher), reads applied state, changes
//! topics, groups and offsets through Raft. The services in [`crate::grpc`]
//! are its transports.
//!
//! | module             | what it holds                                                |
//! |--------------------|--------------------------------------------------------------|
//! | [`acl_admin`]      | users and access policies changed through Raft, and read     |
//! | [`auth`]           | who calls, and whether they may (ACL 2.0: users, policies)   |
//! | [`batcher`]        | group commit: concurrent sends packed into one Raft entry     |
//! | [`pop`]            | pop consumption at the leader: receive, long polling, ack, DLQ |
//! | [`receipt`]        | receipt handles                                              |
//! | [`seal`]           | MACs on the tokens clients hold, keyed by the group's secret |
//! | [`progress`]       | consumer groups' offsets, lag and in-flight counts per queue |
//! | [`group_admin`]    | moving a consumer group's offsets (time, offsets, end), deleting it |
//! | [`held`]           | timed and transactional messages: stored, then released      |
//! | [`internal_topic`] | topics the broker creates for itself (dead-letter, system)   |
//! | [`lane`]           | blocking work from requests: so many at once, a bounded line |
//! | [`read`]           | reads of applied state: a queue, by id, key or store time    |
//! | [`queued`]         | a queue's message, its unit checked against it; damage noted |
//! | [`status`]         | the node's own view of its group                             |
//! | [`stored`]         | where a stored batch's messages went (duplicates included)   |
//! | [`health`]         | whether the node is ready for traffic (`/readyz`)             |
//! | [`clients`]        | the v2 clients a node knows (heartbeats, Telemetry streams)  |
//! | [`flow_control`]   | per-client request rate (`TOO_MANY_REQUESTS`)                 |
//! | [`long_polls`]     | receives waiting on a node, bounded per node and per client  |
//! | [`registration`]   | heartbeats to every NameServer, unregister on stop           |
//! | [`metrics`]        | Prometheus metrics of a broker node                          |
//! | [`config`]         | the broker's TOML configuration                              |
//! | [`identity`]       | node id, group and peers from the host name (StatefulSets)  |
//! | [`limits`]         | what one caller may take from a node (`[limits]`)           |
//! | [`runtime_config`] | the settings a node changes while it runs (get/update config) |
//! | [`write_perm`]     | a group taken out of producers' sends and back (maintenance) |
//! | [`dedup_admin`]    | the group's deduplication window of sends, read and changed  |

pub mod acl_admin;
pub mod auth;
pub mod batcher;
pub mod clients;
pub mod config;
pub mod dedup_admin;
pub mod flow_control;
pub mod group_admin;
pub mod health;
pub mod held;
pub mod identity;
pub mod internal_topic;
pub mod lane;
pub mod limits;
pub mod long_polls;
pub mod metrics;
pub mod pop;
pub mod progress;
pub mod queued;
pub mod read;
pub mod receipt;
pub mod registration;
pub mod runtime_config;
pub mod seal;
pub mod status;
pub mod stored;
pub mod write_perm;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use raftmq_raft::command::{self, AdminCommand, BatchOutcome, Response, SendBatch, TopicConfig};
use raftmq_raft::consumption::GroupConfig;
use raftmq_raft::message::MessageView;
use raftmq_raft::tls::Dialer;
use raftmq_raft::{Message, NodeAddr, RaftNode};
use tonic::transport::Channel;

use crate::broker::batcher::Batcher;
use crate::broker::clients::Clients;
use crate::broker::config::BrokerConfig;
use crate::broker::flow_control::FlowControl;
use crate::broker::long_polls::LongPolls;
use crate::broker::metrics::{self as metric, BrokerMetrics, NodeIdentity};
use crate::broker::pop::{GroupDefaults, Popper};
use crate::error::BrokerError;
use crate::proto::pb::broker_client::BrokerClient;
use crate::proto::rocketmq::v2::Code;

/// How long a follower waits for a leader to forward to.
pub const FORWARD_WAIT: Duration = Duration::from_secs(5);
/// Reads that walk the store (by key or time, queue reads for the CLI)
/// running at once, off the async workers, and waiting for their turn.
const CONCURRENT_SCANS: usize = 4;
const SCANS_WAITING: usize = 64;
/// Log digests (each reads the whole log) run one at a time, and 3 wait; in
/// a lane of their own, so that they cannot fill the scans' line and keep
/// every other read waiting behind them.
const DIGESTS_WAITING: usize = 3;
/// Receive plans and the reads of what they delivered, and pulls, running
/// at once off the async workers (each holds a long-polling place too, so
/// the line is as long as `limits.max_long_polls`).
const CONCURRENT_READS: usize = 4;
pub use limits::MAX_GROUP_QUEUES;
pub use stored::Stored;

pub struct Broker {
    pub node: Arc<RaftNode>,
    /// The config the node started with; the keys that change at run time
    /// are read through [`Broker::live`] ([`runtime_config`]).
    pub cfg: BrokerConfig,
    live: runtime_config::LiveConfig,
    /// Pop-style consumption (runs on the leader).
    pub popper: Popper,
    /// The client-protocol clients that use this node.
    pub clients: Arc<Clients>,
    /// Receives waiting on this node.
    pub long_polls: LongPolls,
    pub flow_control: FlowControl,
    pub metrics: Arc<BrokerMetrics>,
    pub batcher: Batcher,
    peers: Mutex<HashMap<String, Channel>>,
    /// How this node dials peers and NameServers: with its certificate
    /// when it has `[tls]`.
    pub dialer: Dialer,
    /// Reads that walk the store ([`Broker::scan`]).
    scans: lane::Lane,
    /// Log digests, which also take a place among the scans to run.
    digests: lane::Lane,
    /// Receive plans and pulls ([`CONCURRENT_READS`]), shared with the popper.
    pub reads: Arc<lane::Lane>,
    /// Sends in progress at this node (`limits.max_inflight_sends`).
    sends: Arc<tokio::sync::Semaphore>,
    /// Held messages this node admitted and has not seen applied yet
    /// (`limits.max_held_messages`, [`held::store`]).
    pub held_admitted: std::sync::atomic::AtomicUsize,
    /// Wakes the timer loop when a timed message was held
    /// ([`held::timers`]).
    pub timers_changed: tokio::sync::Notify,
}

impl Broker {
    pub fn new(node: Arc<RaftNode>, cfg: BrokerConfig, tls: Option<Arc<raftmq_raft::tls::Material>>) -> Broker {
        let clients = Arc::new(Clients::new(cfg.limits.max_clients));
        let identity = NodeIdentity {
            cluster: &cfg.cluster,
            group: &cfg.group,
        };
        let metrics = Arc::new(BrokerMetrics::new(node.clone(), identity, clients.clone()));
        let reads = Arc::new(lane::Lane::new(
            "receives and pulls",
            CONCURRENT_READS,
            cfg.limits.max_long_polls,
        ));
        let popper = Popper::new(
            node.clone(),
            reads.clone(),
            GroupDefaults {
                auto_create: cfg.auto_create_groups,
                max_delivery_attempts: cfg.max_delivery_attempts,
            },
            cfg.limits.clone(),
            metrics.send_to_dlq.clone(),
        );
        Broker {
            batcher: Batcher::start(
                node.clone(),
                cfg.store.max_record_size as usize,
                cfg.limits.max_queued_sends,
                Duration::from_millis(cfg.limits.max_send_queue_wait_ms),
            ),
            popper,
            clients,
            long_polls: LongPolls::new(cfg.limits.max_long_polls, cfg.limits.max_long_polls_per_client),
            flow_control: FlowControl::new(cfg.limits.max_requests_per_client_per_s, cfg.limits.max_clients),
            metrics,
            node,
            peers: Mutex::new(HashMap::new()),
            scans: lane::Lane::new("store scans", CONCURRENT_SCANS, SCANS_WAITING),
            reads,
            digests: lane::Lane::new("log digests", 1, DIGESTS_WAITING),
            sends: Arc::new(tokio::sync::Semaphore::new(cfg.limits.max_inflight_sends)),
            held_admitted: std::sync::atomic::AtomicUsize::new(0),
            timers_changed: tokio::sync::Notify::new(),
            live: runtime_config::LiveConfig::new(cfg.clone()),
            dialer: Dialer::new(tls),
            cfg,
        }
    }

    /// The config in force: the keys of [`runtime_config::RUNTIME_KEYS`]
    /// as last changed.
    pub fn live(&self) -> Arc<BrokerConfig> {
        self.live.get()
    }

    /// Every key of the config in force, sorted.
    pub fn config_entries(&self) -> Result<Vec<runtime_config::ConfigEntry>, BrokerError> {
        self.live.entries()
    }

    /// Changes a run-time key at this node ([`runtime_config`]); answers
    /// its value before.
    pub fn update_config(&self, key: &str, value: &str) -> Result<String, BrokerError> {
        self.live.update(key, value, |next| {
            self.flow_control.set_rate(next.limits.max_requests_per_client_per_s);
            self.node.store.set_retention(next.store.retention.clone());
            // A changed watermark holds from the next send on, not from the
            // disk watch's next look.
            if let Err(e) = self.node.store.watch_disk(&raftmq_store::retention::StatvfsProbe) {
                tracing::warn!(error = %e, "cannot read the disk's use");
            }
        })
    }

    /// A topic's config from this node's applied state.
    pub fn topic(&self, name: &str) -> Result<TopicConfig, BrokerError> {
        self.node
            .sm
            .topic(name)
            .ok_or_else(|| BrokerError::TopicNotFound(name.to_string()))
    }

    /// A place for one more send request in progress at this node, or
    /// `TOO_MANY_REQUESTS` at once: under overload the sends a node works on
    /// stay bounded and the rest are refused with certainty (nothing stored)
    /// instead of timing out. Held until the answer (forwarding to the
    /// leader included).
    pub fn admit_send(&self) -> Result<tokio::sync::OwnedSemaphorePermit, BrokerError> {
        self.sends.clone().try_acquire_owned().map_err(|_| self.busy())
    }

    /// [`Broker::admit_send`]'s answer now, without taking a place: the
    /// refusal a send would get (`grpc::send_gate` refuses early with it).
    pub fn send_room(&self) -> Result<(), BrokerError> {
        match self.sends.available_permits() {
            0 => Err(self.busy()),
            _ => Ok(()),
        }
    }

    fn busy(&self) -> BrokerError {
        BrokerError::Refused(
            Code::TooManyRequests,
            format!(
                "the broker is busy: {} sends in progress (limits.max_inflight_sends); retry later",
                self.cfg.limits.max_inflight_sends
            ),
        )
    }

    /// Runs `f`, a read that walks the store, on a blocking thread once one
    /// of the few places for such reads is free (a digest waits for the
    /// single place for digests first). Refused at once with
    /// `TOO_MANY_REQUESTS` when [`SCANS_WAITING`] already wait (for a
    /// digest: [`DIGESTS_WAITING`]).
    pub async fn scan<T: Send + 'static>(
        self: &Arc<Self>,
        digest: bool,
        f: impl FnOnce(&Broker) -> Result<T, BrokerError> + Send + 'static,
    ) -> Result<T, BrokerError> {
        let in_line = match digest {
            true => self.digests.join()?,
            false => self.scans.join()?,
        };
        let digest = match digest {
            true => Some(self.digests.turn().await?),
            false => None,
        };
        let place = self.scans.turn().await?;
        let broker = self.clone();
        lane::blocking(move || {
            let _held = (in_line, digest, place);
            f(&broker)
        })
        .await
    }

    /// How long a request waits for its group to elect a leader: a few
    /// election timeouts, time for an election that can succeed. A node cut
    /// off from the majority (which will not see one) answers a retryable
    /// error then, long before a client's deadline, so the client tries
    /// another node.
    pub fn leader_wait(&self) -> Duration {
        Duration::from_millis(self.cfg.election_timeout_max_ms.saturating_mul(3))
            .clamp(Duration::from_millis(500), FORWARD_WAIT)
    }

    /// The current leader's id and a channel to its client port, waiting
    /// ([`Broker::leader_wait`]) for one to be elected. `None` when this
    /// node is the leader.
    pub async fn leader_channel(&self) -> Result<Option<(u64, Channel)>, BrokerError> {
        let deadline = tokio::time::Instant::now() + self.leader_wait();
        loop {
            if self.node.is_leader() {
                return Ok(None);
            }
            if let Some((id, addr)) = self.node.leader() {
                return Ok(Some((id, self.channel_for(&addr)?)));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BrokerError::Unavailable(
                    "this node knows no leader of its group (it may be cut off from the others); retry on another node"
                        .into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`Broker::leader_channel`] as a `raftmq.v1.Broker` client.
    pub async fn leader_client(&self) -> Result<Option<BrokerClient<Channel>>, BrokerError> {
        Ok(self.leader_channel().await?.map(|(_, channel)| {
            BrokerClient::new(channel)
                .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
                .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
        }))
    }

    fn channel_for(&self, addr: &NodeAddr) -> Result<Channel, BrokerError> {
        self.channel_to(&addr.client_addr)
    }

    fn channel_to(&self, client_addr: &str) -> Result<Channel, BrokerError> {
        let mut peers = self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(match peers.get(client_addr) {
            Some(c) => c.clone(),
            None => {
                let ep = crate::client::channel::endpoint(client_addr, Duration::from_millis(500))
                    .map_err(|e| BrokerError::Internal(format!("peer address: {e}")))?;
                let c = crate::client::channel::lazy(ep, client_addr, &self.dialer);
                peers.insert(client_addr.to_string(), c.clone());
                c
            }
        })
    }

    /// A `raftmq.v1.Broker` client of another node of the group.
    pub fn peer_client(&self, client_addr: &str) -> Result<BrokerClient<Channel>, BrokerError> {
        Ok(BrokerClient::new(self.channel_to(client_addr)?))
    }

    /// This node's client address as clients reach it.
    pub fn client_addr(&self) -> String {
        self.cfg.client_addr()
    }

    /// The client addresses of every member of the group, the leader's
    /// first, then this node's. The official clients connect to the first
    /// address of a route that answers, so their writes reach the leader
    /// without being forwarded; the rest are where the channel moves when
    /// that node dies.
    pub fn group_client_addrs(&self) -> Vec<String> {
        let m = self.node.raft.metrics().borrow_watched().clone();
        let nodes = m.membership_config.membership().nodes();
        let mut addrs: Vec<String> = Vec::new();
        let leader = m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.client_addr.clone())
        });
        addrs.extend(leader);
        let me = self.client_addr();
        if !addrs.contains(&me) {
            addrs.push(me);
        }
        for (_, n) in nodes {
            if !addrs.contains(&n.client_addr) {
                addrs.push(n.client_addr.clone());
            }
        }
        addrs
    }

    /// The client addresses of the group's other members, the leader's first.
    pub fn peer_client_addrs(&self) -> Vec<String> {
        let me = self.client_addr();
        self.group_client_addrs().into_iter().filter(|a| *a != me).collect()
    }

    /// Commits a consumer group's offset in a queue (offset-based consumers).
    /// `bounded`: a new offset past `limits.max_consumer_positions` is
    /// refused (a client's commit); an admin's reset is not, so that it is
    /// never left half done.
    pub async fn commit_offset_local(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        bounded: bool,
    ) -> Result<(), BrokerError> {
        let bound = self.cfg.limits.max_consumer_positions as u64;
        if bounded
            && let Some(why) = self
                .node
                .sm
                .with_metadata(|m| m.offset_refusal(group, topic, queue_id, bound))
        {
            return Err(BrokerError::Refused(Code::Forbidden, why));
        }
        let cmd = raftmq_raft::Command::admin(&AdminCommand::CommitOffset {
            group: group.to_string(),
            topic: topic.to_string(),
            queue_id,
            offset,
            bound: bounded.then_some(bound),
        });
        match self.node.write(cmd).await?.1 {
            Response::Rejected(why) => Err(BrokerError::Refused(Code::Forbidden, why)),
            _ => Ok(()),
        }
    }

    /// Validates and proposes a batch on the leader (this node).
    pub async fn send_local(&self, topic: &str, queue_id: u32, messages: Vec<Message>) -> Result<Stored, BrokerError> {
        self.check_group_writable()?;
        self.check_send(topic, queue_id, &messages)?;
        // Body sizes (and whether FIFO) the metrics count once stored.
        let sizes: Vec<(bool, usize)> = messages
            .iter()
            .map(|m| {
                let fifo = m.properties.iter().any(|(k, _)| k == crate::proto::v2_message::P_GROUP);
                (fifo, m.body.len())
            })
            .collect();
        let batch = SendBatch {
            topic: topic.to_string(),
            queue_id,
            messages,
        };
        if self.cfg.unsafe_ack_before_commit {
            // The jepsen self-test's bug (see the config key): answer with
            // the offset this batch would get if nothing else came first,
            // and let the proposal finish, or not, behind the client's back.
            let predicted = self.node.store.queue(topic, queue_id).map_or(0, |cq| cq.max_offset());
            let count = batch.messages.len() as u32;
            let batcher = self.batcher.clone();
            tokio::spawn(async move { batcher.send(batch).await });
            return Ok(Stored {
                queue_id,
                first_queue_offset: predicted,
                count,
                duplicates: Vec::new(),
            });
        }
        let started = std::time::Instant::now();
        match self.batcher.send(batch).await? {
            BatchOutcome::Appended {
                first_queue_offset,
                count,
                duplicates,
            } => {
                // Messages not stored again are not counted again.
                let dups = &duplicates;
                let stored = |fifo: bool| {
                    sizes
                        .iter()
                        .enumerate()
                        .filter(move |&(k, &(is_fifo, _))| {
                            is_fifo == fifo && command::duplicate(dups, k as u32).is_none()
                        })
                        .map(|(_, &(_, bytes))| bytes)
                };
                self.metrics.messages_in(topic, metric::NORMAL, stored(false));
                self.metrics.messages_in(topic, metric::FIFO, stored(true));
                self.metrics.send_duplicates.inc_by(duplicates.len() as u64);
                self.metrics.send_latency.observe(started.elapsed().as_secs_f64());
                Ok(Stored {
                    queue_id,
                    first_queue_offset,
                    count,
                    duplicates,
                })
            }
            BatchOutcome::Rejected(why) => Err(self.batch_refused(why)),
        }
    }

    /// What a send must pass before it is proposed (on the leader): the
    /// queue exists and takes writes, the disk has room, and the messages
    /// are valid and fit one record.
    pub fn check_send(&self, topic: &str, queue_id: u32, messages: &[Message]) -> Result<(), BrokerError> {
        let t = self.topic(topic)?;
        if !t.writable() {
            return Err(BrokerError::Invalid(format!("topic {topic} is not writable")));
        }
        if queue_id >= t.write_queues {
            return Err(BrokerError::Invalid(format!(
                "queue {queue_id} does not exist: topic {topic} has {} write queues",
                t.write_queues
            )));
        }
        if messages.is_empty() {
            return Err(BrokerError::Invalid("a send needs at least one message".into()));
        }
        if let Some((used, limit)) = self.node.disk_full_for_sends() {
            return Err(BrokerError::DiskFull(format!(
                "{used:.1}% of the disk is used; writes are refused above {limit:.1}%"
            )));
        }
        let total: usize = messages.iter().map(Message::encoded_len).sum();
        let max = Batcher::max_batch_bytes(self.cfg.store.max_record_size as usize);
        if total > max {
            return Err(BrokerError::Invalid(format!(
                "a send of {total} bytes exceeds the largest batch of {max} bytes"
            )));
        }
        let max_body = self.live().max_body_bytes;
        for m in messages {
            if m.body.len() > max_body {
                return Err(BrokerError::Invalid(format!(
                    "message body of {} bytes exceeds the limit of {max_body}",
                    m.body.len(),
                )));
            }
            m.validate().map_err(|e| BrokerError::Invalid(e.to_string()))?;
        }
        Ok(())
    }

    pub async fn put_topic_local(&self, t: TopicConfig) -> Result<(), BrokerError> {
        raftmq_store::queue_table::validate_topic(&t.name).map_err(|e| BrokerError::Invalid(e.to_string()))?;
        if raftmq_raft::held::is_system_topic(&t.name) {
            return Err(BrokerError::Invalid(format!("{} is a system topic", t.name)));
        }
        let max = raftmq_raft::command::MAX_QUEUES;
        if t.read_queues == 0 || t.write_queues == 0 || t.read_queues > max || t.write_queues > max {
            return Err(BrokerError::Invalid(format!(
                "queue counts must be between 1 and {max}"
            )));
        }
        if t.perm & !6 != 0 || t.perm == 0 {
            return Err(BrokerError::Invalid(
                "perm must be 2 (write), 4 (read) or 6 (both)".into(),
            ));
        }
        // A snapshot lists every queue in the store, which may be more than
        // a topic's config says (shrinking a topic deletes no queue).
        let stored = self.node.store.queues().counts();
        let in_store = |name: &str| stored.get(name).copied().unwrap_or(0) as u64;
        let (old, topics, others) = self.node.sm.with_metadata(|m| {
            let configured: u64 = m
                .topics
                .values()
                .filter(|o| o.name != t.name)
                .map(|o| u64::from(o.read_queues.max(o.write_queues)).max(in_store(&o.name)))
                .sum();
            // Queues of no configured topic (retry and dead-letter ones).
            let unlisted: u64 = stored
                .iter()
                .filter(|(name, _)| **name != t.name && !m.topics.contains_key(*name))
                .map(|(_, &n)| n as u64)
                .sum();
            let others = configured + unlisted;
            let old = m.topics.get(&t.name).map(|o| o.read_queues.max(o.write_queues));
            (old, m.topics.len(), others)
        });
        if old.is_none() && topics >= self.cfg.limits.max_topics {
            return Err(BrokerError::Refused(
                Code::Forbidden,
                format!("this broker group keeps {topics} topics, its limit (limits.max_topics): delete unused ones"),
            ));
        }
        let wanted = t.read_queues.max(t.write_queues);
        let queues = others + u64::from(wanted).max(in_store(&t.name));
        // Only growth is refused: a group over the bound may still shrink
        // a topic or change its perm.
        if queues > MAX_GROUP_QUEUES && old.is_none_or(|o| wanted > o) {
            return Err(BrokerError::Refused(
                Code::Forbidden,
                format!(
                    "this broker group would keep {queues} queues, more than {MAX_GROUP_QUEUES} \
                     (a follower could not install a snapshot listing them): use fewer queues"
                ),
            ));
        }
        let cmd = raftmq_raft::Command::admin(&AdminCommand::PutTopic(t));
        match self.node.write(cmd).await?.1 {
            Response::Rejected(why) => Err(BrokerError::Invalid(why)),
            _ => Ok(()),
        }
    }

    pub async fn put_group_local(&self, mut g: GroupConfig) -> Result<(), BrokerError> {
        crate::broker::pop::validate_group(&g.name)?;
        if self.node.sm.with_metadata(|m| !m.groups.contains_key(&g.name)) {
            crate::broker::pop::check_group_room(&self.node, self.cfg.limits.max_groups)?;
        }
        if g.max_delivery_attempts == 0 {
            g.max_delivery_attempts = self.cfg.max_delivery_attempts;
        }
        self.node
            .write(raftmq_raft::Command::admin(&AdminCommand::PutGroup(g)))
            .await?;
        Ok(())
    }

    /// The first queue offset whose message was stored at or after `ts_ms`
    /// (the queue's end if none was).
    pub fn offset_for_timestamp(&self, topic: &str, queue_id: u32, ts_ms: u64) -> Result<u64, BrokerError> {
        let store = &self.node.store;
        let Some(cq) = store.queue(topic, queue_id) else {
            return Ok(0);
        };
        cq.find_by_timestamp(ts_ms, |u| {
            let bytes = store.commitlog().read_bytes(u.phys, u64::from(u.size))?;
            MessageView::parse(&bytes)
                .map(|(v, _)| v.store_timestamp_ms)
                .map_err(|e| raftmq_store::StoreError::BadArgument(e.to_string()))
        })
        .map_err(|e| {
            if matches!(e, raftmq_store::StoreError::Corrupt { .. }) {
                self.node.note_damage(&format!("{topic}/{queue_id}: {e}"));
            }
            BrokerError::Internal(e.to_string())
        })
    }

    pub async fn delete_topic_local(&self, name: &str) -> Result<(), BrokerError> {
        if raftmq_raft::held::is_system_topic(name) {
            return Err(BrokerError::Invalid(format!("{name} is a system topic")));
        }
        if self.node.sm.topic(name).is_none() {
            return Err(BrokerError::TopicNotFound(name.to_string()));
        }
        let cmd = raftmq_raft::Command::admin(&AdminCommand::DeleteTopic { name: name.to_string() });
        self.node.write(cmd).await?;
        Ok(())
    }
}
