//! Group commit at the leader: sends that arrive while earlier ones are
//! being proposed are packed into one Raft entry (one record, one fsync),
//! so throughput grows with the number of concurrent producers.
//!
//! At most [`MAX_IN_FLIGHT`] proposals are outstanding; while they are,
//! new sends queue up, and the next proposal takes all of them. Under load
//! the entry size grows by itself; an idle broker proposes at once.
//!
//! ```text
//!  send ─► channel ─► wait for a free proposal slot, then take everything queued (bounded)
//!                         └─► one Command with many batches ─► raft write ─► each sender
//!                             gets its batch's outcome; the slot is freed
//! ```

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use raftmq_raft::RaftNode;
use raftmq_raft::command::{BatchOutcome, Command, Response, SendBatch};
use tokio::sync::{mpsc, oneshot};

use crate::error::BrokerError;

/// Most batches packed into one entry.
pub const MAX_BATCHES_PER_ENTRY: usize = 1024;
/// Most message bytes packed into one entry.
pub const MAX_BYTES_PER_ENTRY: usize = 4 << 20;
/// Proposals outstanding at once. Measured on the cluster benchmark, one
/// proposal in flight beats two or four: per-entry costs dominate, and the
/// entries grow (24 messages instead of 8 at 64 senders) while one commits.
pub const MAX_IN_FLIGHT: usize = 1;

struct Pending {
    batch: SendBatch,
    bytes: usize,
    reply: oneshot::Sender<Result<BatchOutcome, BrokerError>>,
}

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    pub fn start(node: Arc<RaftNode>) -> Batcher {
        let (tx, rx) = mpsc::channel(16 * 1024);
        tokio::spawn(run(node, rx));
        Batcher { tx }
    }

    /// Proposes a batch and waits for its outcome.
    pub async fn send(&self, batch: SendBatch) -> Result<BatchOutcome, BrokerError> {
        let bytes = batch.messages.iter().map(|m| m.encoded_len()).sum();
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { batch, bytes, reply })
            .await
            .map_err(|_| BrokerError::Unavailable("the broker is shutting down".into()))?;
        rx.await
            .map_err(|_| BrokerError::OutcomeUnknown("the proposal was dropped".into()))?
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn run(node: Arc<RaftNode>, mut rx: mpsc::Receiver<Pending>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // While every slot is taken, later sends queue up behind `first`.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.bytes;
        let mut group = vec![first];
        while group.len() < MAX_BATCHES_PER_ENTRY && bytes < MAX_BYTES_PER_ENTRY {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.bytes;
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        let node = node.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let (batches, replies): (Vec<SendBatch>, Vec<_>) = group.into_iter().map(|p| (p.batch, p.reply)).unzip();
            let result = match Command::send(&batches, now_ms()) {
                Err(e) => Err(BrokerError::Invalid(e.to_string())),
                Ok(cmd) => node.write(cmd).await.map_err(BrokerError::from),
            };
            match result {
                Ok((_, Response::Sent(outcomes))) if outcomes.len() == replies.len() => {
                    for (reply, o) in replies.into_iter().zip(outcomes) {
                        let _ = reply.send(Ok(o));
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
