//! The harness's transactional producer: one Telemetry session per node,
//! through which the broker checks back transactions their sender left
//! unresolved (or whose end it never learned).
//!
//! A session registers as a producer of every held key, then answers each
//! `RecoverOrphanedTransactionCommand` with `EndTransaction` (source
//! SERVER_CHECK) by [`check_back_answer`], recorded as a `txn-check` of the
//! session's process. It heartbeats every [`HEARTBEAT`] (the broker forgets
//! silent clients) and is opened again whenever it breaks: a node killed,
//! paused or cut off loses its sessions, and a heartbeat that fails ends
//! one that may be dead without knowing it.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::client::{Client, Half, Outcome, v2};
use crate::history::{CHECK_PROCESS, Call, OpType, Process, check_back_answer};
use crate::recorder::Recorder;

/// Between heartbeats (the broker forgets a client after 120 s).
const HEARTBEAT: Duration = Duration::from_secs(10);
/// Before opening a broken session again.
const REOPEN: Duration = Duration::from_millis(500);

/// Starts one session per node (`clients[i]` is node `i + 1`'s); they run
/// until aborted.
pub fn spawn(clients: &[Client], topics: &[String], recorder: &Recorder) -> Vec<JoinHandle<()>> {
    let nodes = clients.len() as u64;
    clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let session = Session {
                node: i as u64 + 1,
                nodes,
                client: client.clone(),
                topics: topics.to_vec(),
                recorder: recorder.clone(),
            };
            tokio::spawn(session.run())
        })
        .collect()
}

struct Session {
    node: u64,
    nodes: u64,
    client: Client,
    topics: Vec<String>,
    recorder: Recorder,
}

impl Session {
    async fn run(self) {
        let id = format!("jepsen-producer-n{}", self.node);
        let mut process = CHECK_PROCESS + self.node - 1;
        loop {
            if let Ok((_keep_open, mut inbound)) = self.client.producer_session(&id, &self.topics).await {
                let mut beat = tokio::time::interval(HEARTBEAT);
                loop {
                    tokio::select! {
                        cmd = inbound.message() => match cmd {
                            Ok(Some(v2::TelemetryCommand {
                                command: Some(v2::telemetry_command::Command::RecoverOrphanedTransactionCommand(c)),
                                ..
                            })) => {
                                if self.answer(process, c).await {
                                    process += self.nodes;
                                }
                            }
                            Ok(Some(_)) => {}
                            Ok(None) | Err(_) => break,
                        },
                        _ = beat.tick() => {
                            if !matches!(self.client.heartbeat(&id).await, Outcome::Ok(())) {
                                break;
                            }
                        }
                    }
                }
            }
            tokio::time::sleep(REOPEN).await;
        }
    }

    /// Answers one check-back; true when the answer's outcome is unknown
    /// (the process retires).
    async fn answer(&self, process: u64, c: v2::RecoverOrphanedTransactionCommand) -> bool {
        let Some(m) = c.message else { return false };
        let key = m.topic.map(|t| t.name).unwrap_or_default();
        let message_id = m.system_properties.map(|p| p.message_id).unwrap_or_default();
        let Some(value) = std::str::from_utf8(&m.body).ok().and_then(|b| b.parse::<u64>().ok()) else {
            eprintln!("warning: a check-back of {key} message {message_id} whose body is not a value");
            return false;
        };
        let resolution = check_back_answer(value);
        let half = Half {
            message_id,
            transaction_id: c.transaction_id,
        };
        let call = Call::TxnCheck {
            key: key.clone(),
            value,
            resolution,
            transaction_id: half.transaction_id.clone(),
        };
        let p = Process::Client(process);
        self.recorder
            .record(p, OpType::Invoke, call.clone(), Some(self.node), None);
        let out = self.client.end_txn(&key, &half, resolution, true).await;
        self.recorder
            .complete(p, self.node, out, |()| call.clone(), call.clone())
    }
}
