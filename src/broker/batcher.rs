//! Group commit at the leader: sends that arrive while earlier ones are
//! being proposed are packed into one Raft entry (one record, one fsync),
//! so throughput grows with the number of concurrent producers.
//!
//! At most [`MAX_IN_FLIGHT`] proposals are outstanding; while they are,
//! new sends queue up, and the next proposal takes all of them. Under load
//! the entry size grows by itself; an idle broker proposes at once.
//!
//! Admission control, as RocketMQ's send queue does it: at most
//! `limits.max_queued_sends` sends wait for a proposal, and one that
//! waited longer than `limits.max_send_queue_wait_ms` before its proposal
//! starts is refused instead of proposed. Both refusals are
//! `TOO_MANY_REQUESTS` (the clients retry after a back-off) and certain:
//! nothing was stored. Under overload the sends that are admitted keep
//! their latency; the rest are told at once to come back later.
//!
//! ```text
//!  send ─► channel ─► wait for a free proposal slot, then take everything queued (bounded)
//!                         └─► one Command with many batches ─► raft write ─► each sender
//!                             gets its batch's outcome; the slot is freed
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use raftmq_raft::RaftNode;
use raftmq_raft::command::{BatchOutcome, Command, Response, SendBatch};
use raftmq_raft::types::LogId;
use tokio::sync::{mpsc, oneshot};

use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

/// Most batches packed into one entry.
pub const MAX_BATCHES_PER_ENTRY: usize = 1024;
/// Most message bytes packed into one entry.
pub const MAX_BYTES_PER_ENTRY: usize = 4 << 20;
/// Proposals outstanding at once. Measured on the cluster benchmark, one
/// proposal in flight beats two or four: per-entry costs dominate, and the
/// entries grow (24 messages instead of 8 at 64 senders) while one commits.
pub const MAX_IN_FLIGHT: usize = 1;
/// How long a proposal may take before its senders are told the outcome is
/// unknown (a leader cut off from its group would otherwise hold them, and
/// the proposal slot, forever).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Room kept in a record for the command's own framing.
const FRAMING: usize = 4096;

struct Pending {
    batch: SendBatch,
    bytes: usize,
    queued: Instant,
    reply: oneshot::Sender<Result<Placed, BrokerError>>,
}

fn busy(why: String) -> BrokerError {
    BrokerError::Refused(Code::TooManyRequests, format!("the broker is busy: {why}; retry later"))
}

/// A batch's outcome and where its messages are in the log: the entry's
/// index and the position of its first message among the entry's messages
/// (held messages are known by these, see [`raftmq_raft::held::HeldId`]).
#[derive(Debug, Clone)]
pub struct Placed {
    pub outcome: BatchOutcome,
    pub index: u64,
    pub first_ordinal: u32,
}

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    /// `max_record` is the store's largest record: an entry never exceeds it
    /// (the log would refuse it, and openraft treats a refused append as a
    /// fatal storage error).
    ///
    /// At most `max_queued` sends wait, none longer than `max_wait`.
    pub fn start(node: Arc<RaftNode>, max_record: usize, max_queued: usize, max_wait: Duration) -> Batcher {
        let (tx, rx) = mpsc::channel(max_queued.max(1));
        let max_entry = MAX_BYTES_PER_ENTRY.min(max_record.saturating_sub(FRAMING));
        tokio::spawn(run(node, rx, max_entry, max_wait));
        Batcher { tx }
    }

    /// The most message bytes one send may carry.
    pub fn max_batch_bytes(max_record: usize) -> usize {
        max_record.saturating_sub(FRAMING)
    }

    /// Proposes a batch and waits for its outcome.
    pub async fn send(&self, batch: SendBatch) -> Result<BatchOutcome, BrokerError> {
        self.send_placed(batch).await.map(|p| p.outcome)
    }

    /// [`Batcher::send`], also telling where the messages went.
    pub async fn send_placed(&self, batch: SendBatch) -> Result<Placed, BrokerError> {
        let bytes = batch.messages.iter().map(|m| m.encoded_len()).sum();
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            batch,
            bytes,
            queued: Instant::now(),
            reply,
        };
        self.tx.try_send(pending).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => busy(format!("{} sends are queued", self.tx.max_capacity())),
            mpsc::error::TrySendError::Closed(_) => BrokerError::Unavailable("the broker is shutting down".into()),
        })?;
        rx.await
            .map_err(|_| BrokerError::OutcomeUnknown("the proposal was dropped".into()))?
    }
}

/// Proposes `cmd` and waits at most [`WRITE_TIMEOUT`] for its outcome
/// (the batcher's proposals, and the broker's own: releases, topics).
pub async fn write_bounded(node: &RaftNode, cmd: Command) -> Result<(LogId, Response), BrokerError> {
    match tokio::time::timeout(WRITE_TIMEOUT, node.write(cmd)).await {
        Ok(r) => r.map_err(BrokerError::from),
        Err(_) => Err(BrokerError::OutcomeUnknown(format!(
            "not committed within {WRITE_TIMEOUT:?} (is the leader cut off?)"
        ))),
    }
}

/// Refuses a send that waited longer than `max_wait`; hands it back if not.
fn fresh(p: Pending, max_wait: Duration) -> Option<Pending> {
    let waited = p.queued.elapsed();
    if waited <= max_wait {
        return Some(p);
    }
    let _ = p.reply.send(Err(busy(format!(
        "the send waited {} ms in the queue",
        waited.as_millis()
    ))));
    None
}

async fn run(node: Arc<RaftNode>, mut rx: mpsc::Receiver<Pending>, max_entry: usize, max_wait: Duration) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    // A send that did not fit in the previous entry starts the next one.
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // While every slot is taken, later sends queue up behind `first`.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = fresh(first, max_wait) else {
            continue;
        };
        let mut bytes = first.bytes;
        let mut group = vec![first];
        while group.len() < MAX_BATCHES_PER_ENTRY {
            match rx.try_recv().map(|p| fresh(p, max_wait)) {
                Ok(None) => {}
                Ok(Some(p)) if bytes + p.bytes <= max_entry => {
                    bytes += p.bytes;
                    group.push(p);
                }
                Ok(Some(p)) => {
                    carry = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let node = node.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let (batches, replies): (Vec<SendBatch>, Vec<_>) = group.into_iter().map(|p| (p.batch, p.reply)).unzip();
            let counts: Vec<u32> = batches.iter().map(|b| b.messages.len() as u32).collect();
            let result = match Command::send(&batches, now_ms()) {
                Err(e) => Err(BrokerError::Invalid(e.to_string())),
                Ok(cmd) => write_bounded(&node, cmd).await,
            };
            match result {
                Ok((log_id, Response::Sent(outcomes))) if outcomes.len() == replies.len() => {
                    let mut first_ordinal = 0u32;
                    for ((reply, outcome), n) in replies.into_iter().zip(outcomes).zip(counts) {
                        let _ = reply.send(Ok(Placed {
                            outcome,
                            index: log_id.index,
                            first_ordinal,
                        }));
                        first_ordinal = first_ordinal.saturating_add(n);
                    }
                }
                Ok((_, other)) => {
                    for reply in replies {
                        let _ = reply.send(Err(BrokerError::Internal(format!("unexpected response {other:?}"))));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
