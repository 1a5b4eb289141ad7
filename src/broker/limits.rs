//! What one caller may take from a node (`[limits]` in the broker's
//! config): every bound a request can meet, with its default. A request
//! over a bound is refused with a clear v2 code (`TOO_MANY_REQUESTS` where
//! retrying later helps, `ILLEGAL_*` or `RESOURCE_EXHAUSTED` where it does
//! not), never queued without bound. `deploy/CONFIG.md` lists them.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// TCP connections the client port holds at once; one more is closed
    /// as soon as it is accepted.
    pub max_connections: usize,
    /// Of which from one IP address, so that one host cannot take every
    /// place (clients behind one NAT share an address: keep it generous).
    pub max_connections_per_ip: usize,
    /// Concurrent HTTP/2 streams per client connection (a consumer keeps
    /// one long poll per queue it is assigned, all on one connection).
    pub max_streams_per_connection: u32,
    /// HTTP/2 keepalive on the client port: an idle connection is pinged
    /// this often, and dropped when a ping goes unanswered this long.
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    /// A client connection with no call open this long is closed (its
    /// keepalive pings do not count as use); the official clients keep a
    /// Telemetry stream open, so only abandoned connections meet it.
    /// RocketMQ's servers close a channel idle for 120 s.
    pub idle_connection_timeout_ms: u64,
    /// Clients (by client id) a node keeps track of; a new one beyond is
    /// refused with `TOO_MANY_REQUESTS` until others leave or expire.
    pub max_clients: usize,
    /// Long-polling receives waiting at once on this node, all clients
    /// together, and per client id. One more is answered at once with
    /// `TOO_MANY_REQUESTS` (the official clients retry after a back-off).
    pub max_long_polls: usize,
    pub max_long_polls_per_client: usize,
    /// Topics a group of brokers keeps (created by `topic create` or on a
    /// client's first route query alike); a new one beyond is refused.
    pub max_topics: usize,
    /// Consumer groups a group of brokers keeps (created ones and the ones
    /// made on first use alike).
    pub max_groups: usize,
    /// Deliveries of one consumer group in flight in one queue (received,
    /// not yet acked); a receive finds no more messages in that queue
    /// until some are acked or their invisible time ends.
    pub max_inflight_per_queue: usize,
    /// Deliveries of one consumer group in flight over all its topics and
    /// queues: each is replicated state (and snapshot bytes) until acked,
    /// so a group that never acks cannot grow it without end.
    pub max_inflight_per_group: usize,
    /// Deliveries in flight over every consumer group of the broker group:
    /// they are all in each snapshot (75-81 bytes each), which a follower
    /// must be able to install (at most 256 MiB, the Raft port's bound:
    /// see [`LimitsConfig::worst_snapshot_bytes`]).
    pub max_inflight_total: usize,
    /// Consumer positions a group of brokers keeps, one per consumer
    /// group, topic and queue, of each kind: committed offsets (pull
    /// consumers) and receive positions (the others). Each is in every
    /// snapshot. A commit that would add an offset past it is refused, and
    /// a receive finds nothing new in a queue its group never received
    /// from; moving a kept one is never refused.
    pub max_consumer_positions: usize,
    /// Timed messages not yet due and transactional half messages not yet
    /// ended, over the group of brokers: each is in every snapshot (about
    /// 30 and 150 bytes). A send that would pass it gets
    /// `TOO_MANY_REQUESTS`.
    pub max_held_messages: usize,
    /// Message bytes one read, query or receive answers with; the answer
    /// stops before the message that would pass it (one message always
    /// fits).
    pub max_response_bytes: usize,
    /// Send requests a node works on at once (its clients' and, on the
    /// leader, those forwarded to it); one more is refused at once with
    /// `TOO_MANY_REQUESTS`, nothing stored.
    pub max_inflight_sends: usize,
    /// Sends waiting for the leader to propose them, and how long one may
    /// wait before its proposal starts (RocketMQ's send queue: 10,000 and
    /// `waitTimeMillsInSendQueue`, 200 ms; the wait here includes the
    /// commit of the proposal before, hence a longer default). Past either
    /// a send gets `TOO_MANY_REQUESTS`, certain that nothing was stored.
    pub max_queued_sends: usize,
    pub max_send_queue_wait_ms: u64,
    /// Requests per second one client id may make to this node, with
    /// bursts of as many (0: no limit). Requests over it are refused with
    /// `TOO_MANY_REQUESTS`, RocketMQ's flow-control answer.
    pub max_requests_per_client_per_s: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: 4096,
            max_connections_per_ip: 1024,
            max_streams_per_connection: 1024,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 20_000,
            idle_connection_timeout_ms: 120_000,
            max_clients: 65_536,
            max_long_polls: 16_384,
            max_long_polls_per_client: 1024,
            max_topics: 10_000,
            max_groups: 10_000,
            max_inflight_per_queue: 100_000,
            max_inflight_per_group: 1_000_000,
            max_inflight_total: 1_000_000,
            max_consumer_positions: 500_000,
            max_held_messages: 500_000,
            max_response_bytes: 16 << 20,
            max_inflight_sends: 1024,
            max_queued_sends: 10_000,
            max_send_queue_wait_ms: 500,
            max_requests_per_client_per_s: 0,
        }
    }
}

/// Snapshot bytes one item of each bounded kind takes, about (JSON, with
/// the 12- and 13-digit numbers a long-lived group reaches, and group and
/// topic names of about 20 bytes shared by many entries);
/// [`LimitsConfig::worst_snapshot_bytes`] adds them up. An estimate, not a
/// bound: names are written again for every (group, topic) pair and every
/// queue, so many long names take more.
mod snapshot_bytes {
    /// A delivery in flight: offset, visibility deadline, attempt, handle.
    pub const INFLIGHT: u64 = 81;
    /// A committed offset and a receive position (queue state), which the
    /// same bound counts separately.
    pub const OFFSET: u64 = 24;
    pub const POSITION: u64 = 56;
    /// A half message (a timer takes 30).
    pub const HELD: u64 = 150;
    /// A queue in the snapshot's queue list.
    pub const QUEUE: u64 = 48;
    /// A topic's or a group's configuration.
    pub const CONFIG: u64 = 256;
}

/// Most queues over all of a group's topics: a tenth below what a snapshot
/// may list ([`raftmq_raft::state_machine::MAX_SNAPSHOT_QUEUES`], which a
/// follower checks before installing one), leaving room for the retry and
/// dead-letter queues groups make after the check.
pub const MAX_GROUP_QUEUES: u64 = raftmq_raft::state_machine::MAX_SNAPSHOT_QUEUES as u64 / 10 * 9;

/// What the bounded state may take of a snapshot together: the 256 MiB a
/// follower installs, less room for users, policies and the rest.
const SNAPSHOT_BUDGET: u64 = 240 << 20;

/// The longest keepalive or idle timer a connection may be given.
const MAX_CONNECTION_TIMER_MS: u64 = 7 * 24 * 3600 * 1000;

impl LimitsConfig {
    /// The most the state these bounds allow takes of a Raft snapshot,
    /// about (see [`snapshot_bytes`]): every bound reached at once, with
    /// the broker group's most queues. Each kind is bounded on its own; this keeps them within one
    /// snapshot together.
    pub fn worst_snapshot_bytes(&self) -> u64 {
        use snapshot_bytes::*;
        let n = |v: usize, each: u64| (v as u64).saturating_mul(each);
        [
            n(self.max_inflight_total, INFLIGHT),
            n(self.max_consumer_positions, OFFSET + POSITION),
            n(self.max_held_messages, HELD),
            MAX_GROUP_QUEUES.saturating_mul(QUEUE),
            n(self.max_topics, CONFIG),
            n(self.max_groups, CONFIG),
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("max_connections", self.max_connections),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("max_streams_per_connection", self.max_streams_per_connection as usize),
            ("keepalive_interval_ms", self.keepalive_interval_ms as usize),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms as usize),
            ("idle_connection_timeout_ms", self.idle_connection_timeout_ms as usize),
            ("max_clients", self.max_clients),
            ("max_long_polls", self.max_long_polls),
            ("max_long_polls_per_client", self.max_long_polls_per_client),
            ("max_topics", self.max_topics),
            ("max_groups", self.max_groups),
            ("max_inflight_per_queue", self.max_inflight_per_queue),
            ("max_inflight_per_group", self.max_inflight_per_group),
            ("max_inflight_total", self.max_inflight_total),
            ("max_consumer_positions", self.max_consumer_positions),
            ("max_held_messages", self.max_held_messages),
            ("max_response_bytes", self.max_response_bytes),
            ("max_inflight_sends", self.max_inflight_sends),
            ("max_queued_sends", self.max_queued_sends),
            ("max_send_queue_wait_ms", self.max_send_queue_wait_ms as usize),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("limits.{name} must be at least 1")));
            }
        }
        // hyper adds these to an Instant: a value near u64::MAX overflows
        // (a panic in every connection task).
        for (name, v) in [
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("idle_connection_timeout_ms", self.idle_connection_timeout_ms),
        ] {
            if v > MAX_CONNECTION_TIMER_MS {
                return Err(ConfigError::Invalid(format!(
                    "limits.{name} must be at most {MAX_CONNECTION_TIMER_MS} (a week)"
                )));
            }
        }
        let worst = self.worst_snapshot_bytes();
        if worst > SNAPSHOT_BUDGET {
            return Err(ConfigError::Invalid(format!(
                "limits.max_inflight_total, max_consumer_positions, max_held_messages, max_topics and \
                 max_groups together let a snapshot reach about {} MiB, more than the {} MiB a follower \
                 can be sent: lower some of them",
                worst >> 20,
                SNAPSHOT_BUDGET >> 20
            )));
        }
        // Above the gRPC message limit an answer could not be sent at all.
        if self.max_response_bytes > crate::MAX_MESSAGE_SIZE / 2 {
            return Err(ConfigError::Invalid(format!(
                "limits.max_response_bytes must be at most {} (half the gRPC message limit)",
                crate::MAX_MESSAGE_SIZE / 2
            )));
        }
        Ok(())
    }

    /// The client port's HTTP/2 keepalive.
    pub fn keepalive(&self) -> raftmq_raft::serve::Keepalive {
        raftmq_raft::serve::Keepalive {
            interval: std::time::Duration::from_millis(self.keepalive_interval_ms),
            timeout: std::time::Duration::from_millis(self.keepalive_timeout_ms),
        }
    }
}

/// The bytes an answer may still carry (`limits.max_response_bytes`); the
/// first message always fits, so a reader always makes progress.
pub struct ResponseBudget {
    left: usize,
    taken: usize,
}

impl ResponseBudget {
    pub fn new(max: usize) -> ResponseBudget {
        ResponseBudget { left: max, taken: 0 }
    }

    pub fn fits(&self, size: usize) -> bool {
        self.taken == 0 || size <= self.left
    }

    /// Counts a message of `size` bytes in; false if it does not fit.
    pub fn take(&mut self, size: usize) -> bool {
        if !self.fits(size) {
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.taken += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bounds_fit_one_snapshot_together_and_raising_one_must_be_paid_for() {
        let defaults = LimitsConfig::default();
        defaults.validate().unwrap();
        assert!(defaults.worst_snapshot_bytes() <= SNAPSHOT_BUDGET);
        let raised = LimitsConfig {
            max_inflight_total: 2_000_000,
            ..LimitsConfig::default()
        };
        let e = raised.validate().unwrap_err().to_string();
        assert!(e.contains("max_inflight_total") && e.contains("MiB"), "{e}");
        let traded = LimitsConfig {
            max_consumer_positions: 100_000,
            max_held_messages: 10_000,
            ..raised
        };
        traded.validate().unwrap();
    }
}
