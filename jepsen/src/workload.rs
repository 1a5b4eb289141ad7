//! The queue workload, after Jepsen's Kafka test: `concurrency` worker
//! slots, each running one process at a time, send unique values to keys
//! (topics of one queue) and consume keys through consumer groups; after the
//! faults are healed, a drain reads every key from every node.
//!
//! Each slot owns the consumer group `jepsen-g<slot>`, so a group's commits
//! are issued one after another. A slot's consumer is assigned one key at a
//! time: `assign` reads the group's committed offset, `poll`s continue from
//! there with `PullMessage` (from any node: followers serve reads), `commit`
//! stores the position; every few polls the slot moves to another key.
//!
//! Requests go to a random node, so followers forward writes to the
//! leader. A node that keeps any call waiting past [`SLOW_CALL`], or
//! refuses a connection, is avoided by every slot (the slow call itself
//! waits on to its deadline) until it answers again: a call that was
//! already out, or the health probe sent to each avoided node every
//! [`PROBE_EVERY`]. That is how the official clients isolate an endpoint
//! and take it back after a good heartbeat, and it keeps a frozen or dead
//! node from gathering every slot. A node that answers late (a result or a
//! v2 status) is alive, only slow because it waited on another node, such
//! as a follower forwarding to a leader that froze, so its answer takes it
//! back at once. (Marks that simply expired sent every slot back to a
//! still-frozen node to wait out its deadline, and marks that no late
//! answer lifted left every node avoided after a leader froze: both showed
//! as 2 s gaps in `pause` runs.)
//!
//! An operation with an unknown
//! outcome retires its process (Jepsen's rule): the slot goes on as process
//! `p + concurrency`. Reads have no
//! effects, so a read that times out is a failure, not an unknown. A send
//! (plain, timed or transactional) with an unknown outcome is sent again,
//! as it was (value, message id, due time), as the new process's next
//! operation, up to [`SEND_ATTEMPTS`] attempts in all: the official clients
//! retry a send that way, and the broker must store (hold, release) it once
//! (its deduplication window).
//!
//! Held keys (`jepsen-held-<i>`, topics that take any message type) get
//! held messages: a `timed-send` due 0.2 to 5 s later, and a `txn-send`
//! whose process then commits it (40 %), rolls it back (40 %), or leaves it
//! to the broker's check-back (20 %), which the `producer` sessions answer.
//! The end is the process's next operation. Consumers read held keys like
//! the others, and the drain reads them too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{self, Client, Half, Outcome};
use crate::history::{Call, DRAIN_PROCESS, OpType, Process, Resolution};
use crate::recorder::Recorder;

/// How often each avoided node is sent a health probe (a heartbeat that
/// must be answered within [`SLOW_CALL`]).
pub const PROBE_EVERY: Duration = Duration::from_millis(250);
/// A call unanswered this long marks its node to be avoided. A healthy
/// node answers in milliseconds (p99 of a few ms in these runs); at two
/// hundred operations a second a third of them reach a frozen node, so
/// every 100 ms of waiting strands about seven slots there until their
/// deadlines (at 300 ms all ten were, a whole 2.4 s without a send). A
/// false mark costs little: it lasts until the node's next answer.
pub const SLOW_CALL: Duration = Duration::from_millis(100);

/// Node `drawn` (1..=`nodes`), or the next one after it that is not
/// `avoided` (`drawn` when all are).
fn pick(drawn: u64, nodes: u64, avoided: &[u64]) -> u64 {
    (0..nodes)
        .map(|i| (drawn - 1 + i) % nodes + 1)
        .find(|n| !avoided.contains(n))
        .unwrap_or(drawn)
}

/// The nodes the slots keep away from, until each answers again.
pub struct Avoided(std::sync::Mutex<Vec<u64>>);

impl Avoided {
    pub fn new() -> Avoided {
        Avoided(std::sync::Mutex::new(Vec::new()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Avoids `node` until it answers.
    fn mark(&self, node: u64) {
        let mut v = self.lock();
        if !v.contains(&node) {
            v.push(node);
        }
    }

    /// Takes `node` back: it answered.
    fn clear(&self, node: u64) {
        self.lock().retain(|&n| n != node);
    }

    fn now(&self) -> Vec<u64> {
        self.lock().clone()
    }
}

pub struct Workload {
    /// One client per node, node id `i` at index `i - 1`.
    pub clients: Vec<Client>,
    pub keys: Vec<String>,
    /// Keys of timed and transactional messages.
    pub held_keys: Vec<String>,
    pub concurrency: usize,
    /// Target operations per second over all slots.
    pub rate: f64,
    pub seed: u64,
    pub recorder: Recorder,
    pub avoided: Avoided,
}

/// Polls on one key before the consumer moves to another.
const POLLS_PER_ASSIGNMENT: u32 = 8;
const POLL_BATCH: i32 = 32;
const DRAIN_RETRIES: u32 = 20;
/// Keys of held messages (topics of one queue that take any message type).
pub const HELD_KEYS: usize = 2;
/// The share of operations that are plain sends, timed sends and
/// transactional sends (cumulative); the rest are the consumer's.
const SEND_SHARE: f64 = 0.40;
const TIMED_SHARE: f64 = 0.45;
const TXN_SHARE: f64 = 0.50;
/// Attempts at one send (of any kind), the first included (the official clients'
/// default `maxAttempts` for producers).
pub const SEND_ATTEMPTS: u32 = 3;
/// A timed message is due this many milliseconds after its send.
const DELAY_MS: std::ops::RangeInclusive<u64> = 200..=5000;

pub fn key_name(i: usize) -> String {
    format!("jepsen-{i}")
}

pub fn held_key_name(i: usize) -> String {
    format!("jepsen-held-{i}")
}

/// What a send is, beside its key and value.
#[derive(Clone, Copy)]
enum SendKind {
    Plain,
    /// Due at `due` on the wall clock (the broker's), `due_ns` on the
    /// history's clock.
    Timed {
        due: SystemTime,
        due_ns: u64,
    },
    /// How its process ends it (None: left to the check-back).
    Txn {
        resolution: Option<Resolution>,
    },
}

/// A send, and how many times it was tried: a send whose outcome was
/// unknown is sent again as it was, message id included.
struct Retry {
    kind: SendKind,
    key: String,
    value: u64,
    message_id: String,
    /// Attempts made so far.
    attempts: u32,
}

/// A transaction its process still has to end.
struct PendingEnd {
    key: String,
    value: u64,
    half: Half,
    resolution: Resolution,
}

impl Workload {
    /// Runs every slot until `until`.
    pub async fn run(self: Arc<Self>, until: Instant) {
        let values = Arc::new(AtomicU64::new(1));
        let mut tasks = Vec::new();
        for slot in 0..self.concurrency {
            let w = self.clone();
            let values = values.clone();
            tasks.push(tokio::spawn(async move { w.slot(slot, values, until).await }));
        }
        let w = self.clone();
        tasks.push(tokio::spawn(w.probe(until)));
        for t in tasks {
            let _ = t.await;
        }
    }

    async fn slot(&self, slot: usize, values: Arc<AtomicU64>, until: Instant) {
        let mut rng = StdRng::seed_from_u64(self.seed.wrapping_mul(1_000_003).wrapping_add(slot as u64));
        let mut process = slot as u64;
        let group = format!("jepsen-g{slot}");
        // (key, next offset to read, polls since the assignment)
        let mut assigned: Option<(String, u64, u32)> = None;
        let mut pending_end: Option<PendingEnd> = None;
        let mut retry: Option<Retry> = None;
        let every_key: Vec<&String> = self.keys.iter().chain(&self.held_keys).collect();
        let mean_gap = self.concurrency as f64 / self.rate.max(0.001);
        while Instant::now() < until {
            // Exponential gaps: Poisson arrivals at the target rate.
            let gap = -mean_gap * (1.0 - rng.random::<f64>()).ln();
            tokio::time::sleep(Duration::from_secs_f64(gap.min(5.0))).await;
            if Instant::now() >= until {
                break;
            }
            let node = pick(
                rng.random_range(1..=self.clients.len() as u64),
                self.clients.len() as u64,
                &self.avoided.now(),
            );
            let client = &self.clients[node as usize - 1];
            let p = Process::Client(process);
            let r: f64 = rng.random();
            let retire = if let Some(end) = pending_end.take() {
                let call = Call::TxnEnd {
                    key: end.key.clone(),
                    value: end.value,
                    resolution: end.resolution,
                    transaction_id: end.half.transaction_id.clone(),
                };
                let ended = client.end_txn(&end.key, &end.half, end.resolution, false);
                self.effect(p, node, call.clone(), ended, |()| call).await
            } else if retry.is_some() || r < TXN_SHARE {
                let send = retry.take().unwrap_or_else(|| self.draw_send(&mut rng, r, &values));
                let unknown = self.send(p, node, client, &send, &mut pending_end).await;
                if unknown && send.attempts + 1 < SEND_ATTEMPTS {
                    retry = Some(Retry {
                        attempts: send.attempts + 1,
                        ..send
                    });
                }
                unknown
            } else {
                match &mut assigned {
                    Some((key, pos, polls)) if *polls < POLLS_PER_ASSIGNMENT => {
                        if r < 0.85 {
                            *polls += 1;
                            let from = *pos;
                            let call = |msgs| Call::Poll {
                                key: key.clone(),
                                group: group.clone(),
                                from,
                                msgs,
                            };
                            self.recorder.record(p, OpType::Invoke, call(vec![]), Some(node), None);
                            let out = self.watched(node, client.pull(&group, key, from, POLL_BATCH)).await;
                            if let Outcome::Ok(msgs) = &out
                                && let Some(&(last, _)) = msgs.last()
                            {
                                *pos = last + 1;
                            }
                            self.recorder.complete_read(p, node, out, call, call(vec![]));
                            false
                        } else {
                            let (key, offset) = (key.clone(), *pos);
                            let call = Call::Commit {
                                key: key.clone(),
                                group: group.clone(),
                                offset,
                            };
                            self.recorder.record(p, OpType::Invoke, call.clone(), Some(node), None);
                            let out = self.watched(node, client.commit(&group, &key, offset)).await;
                            self.recorder.complete(p, node, out, |()| call.clone(), call.clone())
                        }
                    }
                    _ => {
                        let key = every_key[rng.random_range(0..every_key.len())].clone();
                        let call = |offset| Call::Assign {
                            key: key.clone(),
                            group: group.clone(),
                            offset,
                        };
                        self.recorder.record(p, OpType::Invoke, call(None), Some(node), None);
                        let out = self.watched(node, client.committed(&group, &key)).await;
                        assigned = match &out {
                            Outcome::Ok(o) => Some((key.clone(), o.unwrap_or(0), 0)),
                            _ => None,
                        };
                        self.recorder.complete_read(p, node, out, call, call(None));
                        false
                    }
                }
            };
            if retire {
                process += self.concurrency as u64;
                assigned = None;
            }
        }
    }

    /// A new send of the kind `r` (below [`TXN_SHARE`]) draws.
    fn draw_send(&self, rng: &mut StdRng, r: f64, values: &AtomicU64) -> Retry {
        let value = values.fetch_add(1, Ordering::Relaxed);
        let (kind, keys) = if r < SEND_SHARE {
            (SendKind::Plain, &self.keys)
        } else if r < TIMED_SHARE {
            let delay = Duration::from_millis(rng.random_range(DELAY_MS));
            // The broker gets the due time on the wall clock, the
            // history on its own clock.
            let kind = SendKind::Timed {
                due: SystemTime::now() + delay,
                due_ns: self.recorder.now() + delay.as_nanos() as u64,
            };
            (kind, &self.held_keys)
        } else {
            let resolution = match rng.random::<f64>() {
                x if x < 0.4 => Some(Resolution::Commit),
                x if x < 0.8 => Some(Resolution::Rollback),
                _ => None,
            };
            (SendKind::Txn { resolution }, &self.held_keys)
        };
        Retry {
            kind,
            key: keys[rng.random_range(0..keys.len())].clone(),
            value,
            message_id: client::message_id(),
            attempts: 0,
        }
    }

    /// Records `invoked` as process `p`'s operation on `node`, awaits
    /// `call`, and records its completion (`ok` of an ok result); whether
    /// the outcome was unknown, so that the process retires.
    async fn effect<T>(
        &self,
        p: Process,
        node: u64,
        invoked: Call,
        call: impl Future<Output = Outcome<T>>,
        ok: impl FnOnce(T) -> Call,
    ) -> bool {
        self.recorder
            .record(p, OpType::Invoke, invoked.clone(), Some(node), None);
        let out = self.watched(node, call).await;
        self.recorder.complete(p, node, out, ok, invoked)
    }

    /// Sends `s` once, as process `p` to `node`, and records it; whether
    /// the outcome was unknown (the process retires, the send is retried).
    /// An ok transactional send its process is to end sets `pending_end`.
    async fn send(
        &self,
        p: Process,
        node: u64,
        client: &Client,
        s: &Retry,
        pending_end: &mut Option<PendingEnd>,
    ) -> bool {
        let (key, value, id) = (&s.key, s.value, s.message_id.as_str());
        match s.kind {
            SendKind::Plain => {
                let call = |offset| Call::Send {
                    key: key.clone(),
                    value,
                    offset,
                };
                self.effect(p, node, call(None), client.send(key, value, id), |o| call(Some(o)))
                    .await
            }
            SendKind::Timed { due, due_ns } => {
                let call = Call::TimedSend {
                    key: key.clone(),
                    value,
                    due: due_ns,
                };
                let sent = client.timed_send(key, value, due, id);
                self.effect(p, node, call.clone(), sent, |()| call).await
            }
            SendKind::Txn { resolution } => {
                let call = |transaction_id| Call::TxnSend {
                    key: key.clone(),
                    value,
                    transaction_id,
                };
                let ok = |half: Half| {
                    if let Some(resolution) = resolution {
                        *pending_end = Some(PendingEnd {
                            key: key.clone(),
                            value,
                            half: half.clone(),
                            resolution,
                        });
                    }
                    call(Some(half.transaction_id))
                };
                self.effect(p, node, call(None), client.txn_send(key, value, id), ok)
                    .await
            }
        }
    }

    /// Every [`PROBE_EVERY`] until `until`, sends each avoided node a
    /// heartbeat, and takes back those that answer within [`SLOW_CALL`].
    async fn probe(self: Arc<Self>, until: Instant) {
        while Instant::now() < until {
            tokio::time::sleep(PROBE_EVERY).await;
            let mut probes = tokio::task::JoinSet::new();
            for node in self.avoided.now() {
                let w = self.clone();
                probes.spawn(async move {
                    let client = &w.clients[node as usize - 1];
                    let answer = tokio::time::timeout(SLOW_CALL, client.heartbeat("jepsen-prober")).await;
                    if answer.is_ok_and(|out| client::answered(&out)) {
                        w.avoided.clear(node);
                    }
                });
            }
            probes.join_all().await;
        }
    }

    /// Awaits `call` to `node`; if it is still unanswered after
    /// [`SLOW_CALL`], or it could not connect (a killed node), every slot
    /// avoids the node until it answers again (this call, another, or the
    /// health probe).
    async fn watched<T>(&self, node: u64, call: impl Future<Output = Outcome<T>>) -> Outcome<T> {
        tokio::pin!(call);
        let out = tokio::select! {
            out = &mut call => out,
            () = tokio::time::sleep(SLOW_CALL) => {
                self.avoided.mark(node);
                call.await
            }
        };
        if client::not_connected(&out) {
            self.avoided.mark(node);
        } else if client::answered(&out) {
            self.avoided.clear(node);
        }
        out
    }

    /// Reads every key from every node to its end: the final reads the
    /// lost-write check holds every acknowledged send against. Drain
    /// processes are numbered from [`DRAIN_PROCESS`], one per node.
    pub async fn drain(&self) -> anyhow::Result<()> {
        for (i, client) in self.clients.iter().enumerate() {
            let node = i as u64 + 1;
            let p = Process::Client(DRAIN_PROCESS + i as u64);
            for key in self.keys.iter().chain(&self.held_keys) {
                let call = |msgs| Call::Drain {
                    key: key.clone(),
                    node,
                    msgs,
                };
                self.recorder.record(p, OpType::Invoke, call(vec![]), Some(node), None);
                let mut msgs: Vec<(u64, u64)> = Vec::new();
                let mut from = 0;
                let mut error = None;
                // A node just healed may still refuse for a moment: retry a
                // read for up to DRAIN_RETRIES x 500 ms before giving up.
                let mut retries = 0;
                loop {
                    match client.pull("jepsen-drain", key, from, 256).await {
                        Outcome::Ok(batch) if batch.is_empty() => break,
                        Outcome::Ok(batch) => {
                            from = batch.last().map_or(from, |&(o, _)| o + 1);
                            msgs.extend(batch);
                        }
                        Outcome::Fail(e) | Outcome::Unknown(e) => {
                            retries += 1;
                            if retries > DRAIN_RETRIES {
                                error = Some(e);
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
                match error {
                    None => self.recorder.record(p, OpType::Ok, call(msgs), Some(node), None),
                    Some(e) => {
                        self.recorder
                            .record(p, OpType::Fail, call(vec![]), Some(node), Some(e.clone()));
                        anyhow::bail!("draining {key} from node {node}: {e}");
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_avoided_node_passes_its_turn_to_the_next() {
        assert_eq!(pick(2, 3, &[]), 2);
        assert_eq!(pick(2, 3, &[2]), 3);
        assert_eq!(pick(3, 3, &[3]), 1);
        assert_eq!(pick(1, 3, &[2]), 1);
        assert_eq!(pick(2, 3, &[2, 3]), 1);
        assert_eq!(pick(2, 3, &[1, 2, 3]), 2, "all avoided: the drawn one");
        assert_eq!(pick(1, 1, &[1]), 1);
    }

    #[test]
    fn a_marked_node_is_avoided_until_it_answers() {
        let avoided = Avoided::new();
        avoided.mark(2);
        avoided.mark(3);
        avoided.mark(2);
        assert_eq!(avoided.now(), vec![2, 3], "one mark a node");
        avoided.clear(2);
        assert_eq!(avoided.now(), vec![3], "an answer takes a node back");
    }
}
