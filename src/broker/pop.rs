//! Pop-style consumption at the leader: receive (with long polling and tag
//! filters), ack, change of invisibility, and dead-letter moves.
//!
//! The leader *plans* each receive from its applied state and proposes the
//! plan through Raft ([`raftmq_raft::consumption`]); what the applied plan
//! delivered is what the consumer gets. Plans for one (group, topic) are
//! made one at a time, so two receives never pick the same message; a plan
//! made from stale state (just after an election) is cut down when applied,
//! never applied twice.
//!
//! ```text
//!  receive ─► lock (group, topic) ─► plan from applied state: due redeliveries,
//!             then fresh offsets that pass the filter ─► Raft write ─► deliveries
//!     └─ nothing to deliver: wait for the next applied entry or the next due
//!        redelivery, until the long-polling deadline
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use raftmq_raft::command::{AdminCommand, Response, SendBatch, TopicConfig};
use raftmq_raft::consumption::{self, FreshRange, GroupConfig, InFlightBounds, PopPlan, Popped, QueueState, Receipt};
use raftmq_raft::{Command, RaftNode};
use tokio::time::Instant;

use crate::broker::lane::Lane;
use crate::broker::limits::LimitsConfig;
use crate::broker::limits::ResponseBudget;
use crate::broker::metrics::ConsumeLabels;
use crate::broker::queued::{self, Queued, parse, queued};
use crate::broker::{receipt, seal};
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::filter::Filter;
use crate::proto::rocketmq::v2::Code;

/// Most messages one receive returns.
pub const MAX_BATCH: usize = 64;
/// Most ConsumeQueue units one plan looks at per queue (filters that match
/// little must not make one receive read a whole queue).
const MAX_SCAN: u64 = 1024;
/// Longest invisible time a consumer may ask for (RocketMQ: 12 h).
pub const MAX_INVISIBLE: Duration = Duration::from_secs(12 * 3600);

/// A receive as a consumer asks for it.
pub struct Receive {
    pub group: String,
    pub topic: String,
    pub filter: Filter,
    pub batch: usize,
    pub invisible: Duration,
    /// The queue to look at first (the others follow, in order).
    pub first_queue: u32,
    /// When to answer empty-handed.
    pub deadline: Instant,
    /// Message bytes the answer may hold (`limits.max_response_bytes`,
    /// which changes at run time).
    pub max_bytes: usize,
}

/// One delivered message.
pub struct Delivered {
    pub queue_id: u32,
    pub offset: u64,
    pub attempt: u32,
    pub receipt: String,
    /// The stored message ([`raftmq_raft::message`] layout).
    pub bytes: bytes::Bytes,
}

type PlanningLock = Arc<tokio::sync::Mutex<()>>;

/// What one receive may still take: messages, and bytes of them.
struct Room {
    messages: usize,
    bytes: ResponseBudget,
}

impl Room {
    fn fits(&self, size: usize) -> bool {
        self.messages > 0 && self.bytes.fits(size)
    }

    /// Takes a message of `size` bytes if it fits.
    fn take(&mut self, size: usize) -> bool {
        if !self.fits(size) {
            return false;
        }
        self.messages -= 1;
        self.bytes.take(size)
    }
}

/// The leader's consumption logic; one per broker.
pub struct Popper {
    node: Arc<RaftNode>,
    /// Plans whose filter reads messages (SQL) run here, off the async
    /// workers: such a plan may read up to [`MAX_SCAN`] messages per queue.
    reads: Arc<Lane>,
    defaults: GroupDefaults,
    limits: LimitsConfig,
    /// One planning lock per (group, topic).
    locks: Mutex<HashMap<(String, String), PlanningLock>>,
    /// `rocketmq_send_to_dlq_messages_total`.
    dead_lettered: Family<ConsumeLabels, Counter>,
}

/// What a group created on first use gets.
#[derive(Debug, Clone)]
pub struct GroupDefaults {
    pub auto_create: bool,
    pub max_delivery_attempts: u32,
}

/// Due deliveries one plan takes per queue, of each kind: redeliveries (a
/// receive answers at most [`MAX_BATCH`]) and those past their last attempt
/// (dead-lettered by this receive). Further ones wait for the next receive;
/// separate caps so that dead letters failing to move cannot hold up
/// redeliveries behind them.
const REDELIVER_PER_PLAN: usize = MAX_BATCH;
const DEAD_PER_PLAN: usize = 4 * MAX_BATCH;

/// While a consumer group is at `limits.max_inflight_per_group` (or all
/// groups at `max_inflight_total`), how soon a waiting receive plans again:
/// acks on other topics, which make room, do not wake it.
const GROUP_FULL_RECHECK_MS: u64 = 1000;

/// What planning needs of one queue's state, read under the state lock
/// without copying its in-flight map (up to `max_inflight_per_queue`
/// entries, which a copy per receive would hold applying up for).
struct QueueView {
    /// The pop frontier.
    next: u64,
    /// Deliveries in flight.
    inflight: usize,
    /// Due deliveries by offset, (offset, handle), at most
    /// [`REDELIVER_PER_PLAN`]; in a FIFO queue only those before the first
    /// one still invisible.
    redeliver: Vec<(u64, u64)>,
    /// Due deliveries past their last attempt, the same way, at most
    /// [`DEAD_PER_PLAN`].
    dead: Vec<(u64, u64)>,
    /// When the earliest invisible delivery becomes visible (in a FIFO
    /// queue, the first).
    next_visible_ms: Option<u64>,
}

impl QueueView {
    fn of(s: &QueueState, now: u64, group: &GroupConfig) -> QueueView {
        let mut v = QueueView {
            next: s.next,
            inflight: s.inflight.len(),
            redeliver: Vec::new(),
            dead: Vec::new(),
            next_visible_ms: None,
        };
        for (&offset, f) in &s.inflight {
            if f.visible_at_ms > now {
                v.next_visible_ms = Some(v.next_visible_ms.map_or(f.visible_at_ms, |t| t.min(f.visible_at_ms)));
                if group.fifo {
                    // In order: nothing after an invisible message.
                    break;
                }
            } else if f.attempt >= group.max_delivery_attempts {
                if v.dead.len() < DEAD_PER_PLAN {
                    v.dead.push((offset, f.handle));
                }
            } else if v.redeliver.len() < REDELIVER_PER_PLAN {
                v.redeliver.push((offset, f.handle));
            }
        }
        v
    }
}

/// What a plan found, besides the plan.
struct Planned {
    plans: Vec<PopPlan>,
    /// Due in-flight messages past their last attempt: (queue, offset, handle).
    dead: Vec<(u32, u64, u64)>,
    /// When planning again may find more (ms): the earliest time an
    /// in-flight message becomes visible, or a recheck while the group is
    /// at its in-flight bound.
    next_visible_ms: Option<u64>,
}

impl Popper {
    pub fn new(
        node: Arc<RaftNode>,
        reads: Arc<Lane>,
        defaults: GroupDefaults,
        limits: LimitsConfig,
        dead_lettered: Family<ConsumeLabels, Counter>,
    ) -> Popper {
        Popper {
            node,
            reads,
            defaults,
            limits,
            locks: Mutex::new(HashMap::new()),
            dead_lettered,
        }
    }

    fn lock_for(&self, group: &str, topic: &str) -> PlanningLock {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if locks.len() > 4096 {
            // Forget the locks nobody holds (names clients stopped using).
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry((group.to_string(), topic.to_string())).or_default().clone()
    }

    /// The group's config; creates it with the defaults when it does not
    /// exist and groups are created on first use.
    pub async fn group(&self, name: &str) -> Result<GroupConfig, BrokerError> {
        validate_group(name)?;
        if let Some(g) = self.node.sm.with_metadata(|m| m.groups.get(name).cloned()) {
            return Ok(g);
        }
        if !self.defaults.auto_create {
            return Err(BrokerError::Refused(
                Code::ConsumerGroupNotFound,
                format!("consumer group {name} does not exist (groups are not created on first use here)"),
            ));
        }
        check_group_room(&self.node, self.limits.max_groups)?;
        let g = GroupConfig {
            name: name.to_string(),
            fifo: false,
            max_delivery_attempts: self.defaults.max_delivery_attempts,
        };
        self.node
            .write(Command::admin(&AdminCommand::PutGroup(g.clone())))
            .await?;
        tracing::info!(group = name, "created consumer group on first use");
        Ok(g)
    }

    /// The group's config without creating it (settings for a follower's
    /// clients): the defaults when it does not exist yet.
    pub fn group_or_default(&self, name: &str) -> GroupConfig {
        self.node
            .sm
            .with_metadata(|m| m.groups.get(name).cloned())
            .unwrap_or_else(|| GroupConfig {
                name: name.to_string(),
                fifo: false,
                max_delivery_attempts: self.defaults.max_delivery_attempts,
            })
    }

    /// Receives up to `r.batch` messages, waiting until `r.deadline` for
    /// one to arrive or become visible again. Runs on the leader.
    pub async fn receive(&self, r: Arc<Receive>) -> Result<Vec<Delivered>, BrokerError> {
        // The topic first: a receive for a topic that does not exist must
        // not leave a consumer group behind.
        let topic = self
            .node
            .sm
            .topic(&r.topic)
            .ok_or_else(|| BrokerError::TopicNotFound(r.topic.clone()))?;
        if !topic.readable() {
            return Err(BrokerError::Refused(
                Code::Forbidden,
                format!("topic {} is not readable", r.topic),
            ));
        }
        let group = self.group(&r.group).await?;
        let mut applied = self.node.sm.applied_watch();
        loop {
            applied.borrow_and_update();
            let seen = self.wake_key(&r);
            let (out, next_visible_ms) = self.try_receive(&r, &group).await?;
            if !out.is_empty() {
                return Ok(out);
            }
            let wake = next_visible_ms.map_or(r.deadline, |ms| {
                let now = Instant::now();
                now + Duration::from_millis(ms.saturating_sub(now_ms())).min(r.deadline.saturating_duration_since(now))
            });
            // Wait for a time to come, or for an applied entry that changed
            // what this receive could find: entries of other topics and
            // groups do not cost a planning round.
            loop {
                if Instant::now() >= r.deadline {
                    return Ok(Vec::new());
                }
                tokio::select! {
                    changed = applied.changed() => {
                        if changed.is_err() {
                            return Err(BrokerError::Unavailable("the node is shutting down".into()));
                        }
                        if self.wake_key(&r) != seen {
                            break;
                        }
                    }
                    _ = tokio::time::sleep_until(wake) => break,
                }
            }
        }
    }

    /// What a planning round of `r` depends on, summed up: the topic's
    /// config and queue ends, and the group's consumption state of it
    /// (each queue state counts its changes). Equal keys: re-planning would
    /// find what the last round found.
    fn wake_key(&self, r: &Receive) -> (Option<(u32, u32)>, u64, u64) {
        // (read queues, permission): what planning takes from the config.
        let (topic, changes) = self.node.sm.with_metadata(|m| {
            let changes = m
                .consumption
                .get(&r.group)
                .and_then(|t| t.get(&r.topic))
                .map_or(0, |q| q.values().fold(0u64, |a, s| a.wrapping_add(s.changes)));
            (m.topics.get(&r.topic).map(|t| (t.read_queues, t.perm)), changes)
        });
        let ends = topic.map_or(0, |(queues, _)| {
            (0..queues)
                .filter_map(|q| self.node.store.queue(&r.topic, q))
                .fold(0u64, |a, cq| a.wrapping_add(cq.max_offset()))
        });
        (topic, ends, changes)
    }

    /// One planning round: plans, proposes, and reads what was delivered.
    async fn try_receive(
        &self,
        r: &Arc<Receive>,
        group: &GroupConfig,
    ) -> Result<(Vec<Delivered>, Option<u64>), BrokerError> {
        let lock = self.lock_for(&r.group, &r.topic);
        let _planning = lock.lock().await;
        let now = now_ms();
        let visible_at_ms = now.saturating_add(r.invisible.as_millis() as u64);
        // A plan reads ConsumeQueue units, mapped and small (and, for a tag
        // filter, the messages whose tag hash matches, mostly the ones it
        // delivers): on this worker, where it costs less than a thread hop
        // (a busy host showed it, with 160 receivers of one group). One
        // whose SQL filter reads every message it looks at goes to the lane.
        let planned = if matches!(r.filter, Filter::Sql(_)) {
            let (node, limits, r, group) = (self.node.clone(), self.limits.clone(), r.clone(), group.clone());
            self.reads
                .run(move || plan(&node, &limits, &r, &group, now, visible_at_ms))
                .await?
        } else {
            plan(&self.node, &self.limits, r, group, now, visible_at_ms)?
        };
        for (queue_id, offset, handle) in &planned.dead {
            let receipt = Receipt {
                queue_id: *queue_id,
                offset: *offset,
                handle: *handle,
            };
            if let Err(e) = self.dead_letter(&r.group, &r.topic, &receipt).await {
                tracing::warn!(
                    group = r.group,
                    topic = r.topic,
                    queue_id,
                    offset,
                    "dead-letter move failed: {e}"
                );
            }
        }
        if planned.plans.is_empty() {
            return Ok((Vec::new(), planned.next_visible_ms));
        }
        // Before the pop: the deliveries must get handles their consumer can use.
        let seal = seal::of(&self.node).await?;
        let (_, resp) = self
            .node
            .write(Command::admin(&AdminCommand::Pop(planned.plans.clone())))
            .await?;
        let popped = match resp {
            Response::Popped(p) => p,
            Response::Rejected(why) => return Err(BrokerError::Invalid(why)),
            other => {
                return Err(BrokerError::Internal(format!(
                    "unexpected response to a pop: {other:?}"
                )));
            }
        };
        // Read here, never after a wait: the pop is committed, and a read
        // refused or abandoned in a line would leave its messages invisible
        // (a FIFO queue blocked) until their invisible time ends.
        let (out, gone) = read_delivered(&self.node, r, &seal, &planned.plans, popped);
        // Deleted by retention meanwhile: nothing to deliver, ever; it must
        // not stay in flight (a FIFO queue would wait for it forever).
        if !gone.is_empty() {
            self.ack(&r.group, &r.topic, &gone).await?;
        }
        Ok((out, planned.next_visible_ms))
    }

    /// Acknowledges deliveries: one result per receipt (`None`: acked).
    pub async fn ack(&self, group: &str, topic: &str, receipts: &[Receipt]) -> Result<Vec<bool>, BrokerError> {
        let cmd = Command::admin(&AdminCommand::Ack {
            group: group.to_string(),
            topic: topic.to_string(),
            receipts: receipts.to_vec(),
        });
        match self.node.write(cmd).await?.1 {
            Response::Acked(r) if r.len() == receipts.len() => Ok(r),
            other => Err(BrokerError::Internal(format!(
                "unexpected response to an ack: {other:?}"
            ))),
        }
    }

    /// Makes a delivery invisible for `invisible` from now; the new receipt.
    pub async fn change_invisible(
        &self,
        group: &str,
        topic: &str,
        r: &Receipt,
        invisible: Duration,
    ) -> Result<Option<String>, BrokerError> {
        let seal = seal::of(&self.node).await?;
        let cmd = Command::admin(&AdminCommand::ChangeInvisible {
            group: group.to_string(),
            topic: topic.to_string(),
            receipt: *r,
            visible_at_ms: now_ms().saturating_add(invisible.as_millis() as u64),
        });
        match self.node.write(cmd).await?.1 {
            Response::Changed(h) => Ok(h.map(|handle| receipt::encode(&seal, group, topic, &Receipt { handle, ..*r }))),
            other => Err(BrokerError::Internal(format!("unexpected response: {other:?}"))),
        }
    }

    /// Moves a delivery to the group's dead-letter topic: the copy and the
    /// ack are one entry. `Ok(false)`: the receipt was stale.
    pub async fn dead_letter(&self, group: &str, topic: &str, r: &Receipt) -> Result<bool, BrokerError> {
        let dlq = consumption::dlq_topic(group);
        crate::broker::internal_topic::ensure(&self.node, &dlq).await?;
        let (unit, bytes) = match queued(&self.node, topic, r.queue_id, r.offset)? {
            Queued::Found(unit, bytes) => (unit, bytes),
            Queued::Purged => {
                // Deleted by retention: nothing to copy, but it must leave
                // the in-flight set.
                tracing::warn!(
                    group,
                    topic,
                    queue = r.queue_id,
                    offset = r.offset,
                    "dead letter is gone: retention deleted it"
                );
                return Ok(self.ack(group, topic, &[*r]).await?.first().copied().unwrap_or(false));
            }
        };
        let view = parse(&self.node, topic, r.queue_id, r.offset, &unit, &bytes)?;
        // Reserved properties are kept: the copy still says what it was.
        let mut copy = view.to_message();
        copy.properties.push((
            "__rmq.dlq_origin".into(),
            format!("{topic}/{}/{}", r.queue_id, r.offset),
        ));
        drop(bytes);
        let guard = AdminCommand::Ack {
            group: group.to_string(),
            topic: topic.to_string(),
            receipts: vec![*r],
        };
        let batch = SendBatch {
            topic: dlq.clone(),
            queue_id: 0,
            messages: vec![copy],
        };
        let cmd =
            Command::guarded_send(&guard, &[batch], now_ms()).map_err(|e| BrokerError::Internal(e.to_string()))?;
        match self.node.write(cmd).await?.1 {
            Response::Sent(o) => match o.first() {
                Some(raftmq_raft::BatchOutcome::Appended { .. }) => {
                    tracing::info!(group, topic, queue = r.queue_id, offset = r.offset, "moved to {dlq}");
                    self.dead_lettered
                        .get_or_create(&ConsumeLabels {
                            topic: topic.to_string(),
                            consumer_group: group.to_string(),
                        })
                        .inc();
                    Ok(true)
                }
                Some(raftmq_raft::BatchOutcome::Rejected(why)) if self.in_flight(group, topic, r) => {
                    // The copy was refused (the dead-letter topic changed);
                    // the delivery stays in flight.
                    Err(BrokerError::Internal(format!("cannot write to {dlq}: {why}")))
                }
                _ => Ok(false),
            },
            other => Err(BrokerError::Internal(format!("unexpected response: {other:?}"))),
        }
    }
}

impl Popper {
    /// Whether the delivery `r` names is still in flight.
    fn in_flight(&self, group: &str, topic: &str, r: &Receipt) -> bool {
        self.node.sm.with_metadata(|m| {
            m.consumption
                .get(group)
                .and_then(|t| t.get(topic))
                .and_then(|q| q.get(&r.queue_id))
                .and_then(|q| q.inflight.get(&r.offset))
                .is_some_and(|f| f.handle == r.handle)
        })
    }
}

fn plan(
    node: &RaftNode,
    limits: &LimitsConfig,
    r: &Receive,
    group: &GroupConfig,
    now: u64,
    visible_at_ms: u64,
) -> Result<Planned, BrokerError> {
    // The in-flight bounds; each plan carries them, and applying it
    // enforces them again: plans for the group's other topics made at
    // the same moment may have taken the room this one counts.
    let bounds = InFlightBounds {
        group: limits.max_inflight_per_group as u64,
        total: limits.max_inflight_total as u64,
        positions: Some(limits.max_consumer_positions as u64),
    };
    let (topic, views, mut group_room, positions_full) = node.sm.with_metadata_and_inflight(|m, inflight| {
        let topic = m.topics.get(&r.topic).cloned();
        let views: HashMap<u32, QueueView> = m
            .consumption
            .get(&r.group)
            .and_then(|t| t.get(&r.topic))
            .map(|q| q.iter().map(|(k, v)| (*k, QueueView::of(v, now, group))).collect())
            .unwrap_or_default();
        // Walks every group and topic: only when a queue lacks a position.
        let full = views.len() < topic.as_ref().map_or(0, |t| t.read_queues.max(1) as usize)
            && consumption::positions(&m.consumption) >= limits.max_consumer_positions as u64;
        (topic, views, inflight.room(&r.group, bounds), full)
    });
    let topic: TopicConfig = topic.ok_or_else(|| BrokerError::TopicNotFound(r.topic.clone()))?;
    let queues = topic.read_queues.max(1);
    let mut planned = Planned {
        plans: Vec::new(),
        dead: Vec::new(),
        next_visible_ms: None,
    };
    let mut room = Room {
        messages: r.batch.clamp(1, MAX_BATCH),
        bytes: ResponseBudget::new(r.max_bytes),
    };
    // A queue with messages left out for want of a receive position.
    let mut refused_position = false;
    // The first queue that could not be read.
    let mut damage = None;
    for i in 0..queues {
        if room.messages == 0 {
            break;
        }
        let queue_id = (r.first_queue % queues + i) % queues;
        let view = views.get(&queue_id);
        let mut plan = PopPlan {
            group: r.group.clone(),
            topic: r.topic.clone(),
            queue_id,
            visible_at_ms,
            redeliver: Vec::new(),
            fresh: None,
            bounds: Some(bounds),
        };
        if let Some(v) = view {
            if let Some(t) = v.next_visible_ms {
                let next = planned.next_visible_ms.get_or_insert(t);
                *next = (*next).min(t);
            }
            planned
                .dead
                .extend(v.dead.iter().map(|&(offset, handle)| (queue_id, offset, handle)));
            for &(offset, handle) in &v.redeliver {
                let size = node
                    .store
                    .queue(&r.topic, queue_id)
                    .and_then(|cq| cq.get(offset).ok())
                    .map_or(0, |u| u.size as usize);
                if room.take(size) {
                    plan.redeliver.push((offset, handle));
                } else if group.fifo {
                    // In order: not a later message before this one.
                    break;
                }
            }
        }
        // A FIFO queue with anything in flight delivers nothing new, and
        // no queue more new messages than its in-flight bound, and the
        // group's, leave room for.
        let inflight = view.map_or(0, |v| v.inflight);
        // A queue never received from needs a new receive position.
        let no_position = view.is_none() && positions_full;
        if no_position
            && node
                .store
                .queue(&r.topic, queue_id)
                .is_some_and(|cq| cq.max_offset() > cq.min_offset())
        {
            refused_position = true;
        }
        let blocked = (group.fifo && inflight > 0) || no_position;
        let cap = limits.max_inflight_per_queue.saturating_sub(inflight).min(group_room);
        if !blocked && room.messages > 0 && cap > 0 {
            // Damage in one queue (refused and noted by `queued`) must not
            // keep the others from being received.
            plan.fresh = match fresh(node, r, queue_id, view.map(|v| v.next), &mut room, cap) {
                Ok(fresh) => fresh,
                Err(e) => {
                    damage.get_or_insert(e);
                    None
                }
            };
            group_room -= plan.fresh.as_ref().map_or(0, |f| f.offsets.len());
        } else if !blocked && group_room == 0 {
            let recheck = now.saturating_add(GROUP_FULL_RECHECK_MS);
            let next = planned.next_visible_ms.get_or_insert(recheck);
            *next = (*next).min(recheck);
        }
        if !plan.redeliver.is_empty() || plan.fresh.is_some() {
            planned.plans.push(plan);
        }
    }
    let nothing = planned.plans.is_empty() && planned.dead.is_empty();
    if let Some(e) = damage.filter(|_| nothing) {
        return Err(e);
    }
    // Nothing else to deliver: say why, rather than answer with silence
    // (a client would wait on a receive that can never be served).
    if refused_position && nothing {
        return Err(BrokerError::Refused(
            Code::Forbidden,
            format!(
                "this broker group keeps {} receive positions, its limit (limits.max_consumer_positions): \
                 delete unused consumer groups",
                limits.max_consumer_positions
            ),
        ));
    }
    Ok(planned)
}

/// Fresh offsets of one queue from its pop frontier `next` (none yet:
/// its oldest message) that pass the filter, as many as `room` takes
/// and at most `cap`.
fn fresh(
    node: &RaftNode,
    r: &Receive,
    queue_id: u32,
    next: Option<u64>,
    room: &mut Room,
    cap: usize,
) -> Result<Option<FreshRange>, BrokerError> {
    let Some(cq) = node.store.queue(&r.topic, queue_id) else {
        return Ok(None);
    };
    // A new group starts at the oldest message still kept; retention may
    // have deleted what lies between the frontier and that.
    let from = next.unwrap_or(cq.min_offset());
    let mut to = from.max(cq.min_offset());
    let end = cq.max_offset().min(to.saturating_add(MAX_SCAN));
    let mut offsets = Vec::new();
    while to < end && offsets.len() < cap {
        let Some(unit) = queued::unit(node, &r.topic, queue_id, to)? else {
            break;
        };
        if !room.fits(unit.size as usize) {
            break;
        }
        to += 1;
        if !r.filter.may_match(unit.tag_hash) {
            continue;
        }
        if r.filter.needs_message() {
            // Damage is an error, not a message the filter passes over: the
            // group's frontier would move past it for good.
            let at = to - 1;
            let matched = match queued(node, &r.topic, queue_id, at)? {
                Queued::Found(unit, bytes) => r.filter.matches(&parse(node, &r.topic, queue_id, at, &unit, &bytes)?),
                Queued::Purged => false,
            };
            if !matched {
                continue;
            }
        }
        offsets.push(to - 1);
        room.take(unit.size as usize);
    }
    Ok((to > from).then_some(FreshRange { from, to, offsets }))
}

/// The messages a pop delivered, read from the store with their receipts;
/// and the deliveries whose message retention deleted meanwhile. A
/// delivery this node's damaged store cannot read (`queued`) is in neither:
/// it stays in flight, to be delivered again when its invisible time ends.
fn read_delivered(
    node: &RaftNode,
    r: &Receive,
    seal: &seal::Seal,
    plans: &[PopPlan],
    popped: Vec<Popped>,
) -> (Vec<Delivered>, Vec<Receipt>) {
    let mut out = Vec::new();
    let mut gone = Vec::new();
    for (plan, Popped { handle, delivered }) in plans.iter().zip(popped) {
        for (offset, attempt) in delivered {
            let receipt = Receipt {
                queue_id: plan.queue_id,
                offset,
                handle,
            };
            let found = queued(node, &r.topic, plan.queue_id, offset).and_then(|q| match q {
                Queued::Found(unit, bytes) => {
                    parse(node, &r.topic, plan.queue_id, offset, &unit, &bytes)?;
                    Ok(Some(bytes))
                }
                Queued::Purged => Ok(None),
            });
            match found {
                Ok(Some(bytes)) => out.push(Delivered {
                    queue_id: plan.queue_id,
                    offset,
                    attempt,
                    receipt: receipt::encode(seal, &r.group, &r.topic, &receipt),
                    bytes: bytes::Bytes::copy_from_slice(&bytes),
                }),
                Ok(None) => {
                    tracing::warn!(
                        topic = r.topic,
                        queue = plan.queue_id,
                        offset,
                        "delivered message is gone: retention deleted it"
                    );
                    gone.push(receipt);
                }
                // Logged and noted by `queued`.
                Err(_) => {}
            }
        }
    }
    (out, gone)
}

/// Refuses a new consumer group when the group of brokers keeps `max`
/// already (`limits.max_groups`).
pub fn check_group_room(node: &RaftNode, max: usize) -> Result<(), BrokerError> {
    let n = node.sm.with_metadata(|m| m.groups.len());
    if n >= max {
        return Err(BrokerError::Refused(
            Code::Forbidden,
            format!("this broker group keeps {n} consumer groups, its limit (limits.max_groups): delete unused ones"),
        ));
    }
    Ok(())
}

/// Consumer group names follow the topic name rule (they name the group's
/// dead-letter topic too).
pub fn validate_group(name: &str) -> Result<(), BrokerError> {
    // Room for the "%DLQ%" prefix within a topic name's 127 characters.
    let max = 127 - consumption::DLQ_PREFIX.len();
    let valid = name.len() <= max && raftmq_store::queue_table::validate_topic(name).is_ok();
    valid.then_some(()).ok_or_else(|| {
        let shown: String = name.chars().take(128).collect();
        BrokerError::Refused(
            Code::IllegalConsumerGroup,
            format!(
                "invalid consumer group name {shown:?}: 1 to {max} characters from a-z, A-Z, 0-9, '_', '-', '%' and '|'"
            ),
        )
    })
}
