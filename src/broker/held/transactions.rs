//! Transactional messages at the leader: ending transactions, and checking
//! unresolved ones back with their producers.
//!
//! A half message is stored at once in `RMQ_SYS_TRANS_HALF_TOPIC` and recorded in the
//! replicated half-message table ([`raftmq_raft::held`]); the send returns
//! a transaction id, `x1.<log index>.<ordinal>`. `EndTransaction` COMMIT
//! copies it into its topic under a guard that also ends the transaction
//! (so it becomes visible once, whoever commits); ROLLBACK only ends it.
//!
//! Check-backs: every [`CHECK_TICK`] the leader looks for half messages
//! whose immunity (then check interval) has passed. For each, it sends a
//! `RecoverOrphanedTransactionCommand` on the Telemetry stream of a
//! producer of the message's topic (the v2 protocol names no producer
//! group; RocketMQ's proxy also goes by topic) connected to this node, or
//! else asks the group's other nodes to pass it to one of theirs. The
//! producer answers with `EndTransaction` (source SERVER_CHECK). Each check
//! is counted through Raft; after `max_checks` the half message is
//! discarded, with a warning.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use raftmq_raft::command::AdminCommand;
use raftmq_raft::held::{self as rheld, HeldId};
use raftmq_raft::message::MessageView;
use tokio::sync::watch;

use crate::broker::Broker;
use crate::broker::held;
use crate::broker::seal::{self, Seal};
use crate::clock::now_ms;
use crate::error::BrokerError;
use crate::proto::pb;
use crate::proto::rocketmq::v2::{self, Code};
use crate::proto::v2_message::{self, Delivery};

/// How often the leader looks for transactions to check.
pub const CHECK_TICK: Duration = Duration::from_millis(500);
/// Most check-backs sent per tick.
const MAX_CHECKS_PER_TICK: usize = 256;
/// Check-backs under way at once.
const CONCURRENT_CHECKS: usize = 16;

/// Seal domain of transaction ids.
const SEAL_DOMAIN: &str = "transaction";
/// Longest transaction id accepted (the format needs at most 76 characters).
const MAX_ID_LEN: usize = 128;

/// The id of half message `id` (message `message_id` of `topic`), given to
/// its producer: `x2.<log index>.<ordinal>.<tag>`, the tag the group's seal
/// over topic, message id and the text before it, so an id cannot be
/// guessed from the message id and log position, nor used for another
/// message.
pub fn transaction_id(seal: &Seal, topic: &str, message_id: &str, id: HeldId) -> String {
    let body = format!("x2.{}.{}", id.index, id.ordinal);
    seal.seal(SEAL_DOMAIN, &[topic.as_bytes(), message_id.as_bytes()], body)
}

/// The half message a transaction id names, if the id is one this group
/// gave for `message_id` of `topic`.
pub fn parse_transaction_id(seal: &Seal, topic: &str, message_id: &str, s: &str) -> Option<HeldId> {
    let body = seal.open(SEAL_DOMAIN, &[topic.as_bytes(), message_id.as_bytes()], s, MAX_ID_LEN)?;
    let mut parts = body.strip_prefix("x2.")?.split('.');
    let index = parts.next()?.parse().ok()?;
    let ordinal = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some(HeldId { index, ordinal })
}

/// A producer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Commit,
    Rollback,
    /// The producer does not know yet: checked again later.
    Unknown,
}

/// Ends a transaction on the leader.
pub async fn end(
    broker: &Broker,
    topic: &str,
    message_id: &str,
    transaction_id: &str,
    resolution: Resolution,
    from_check: bool,
) -> Result<(), BrokerError> {
    let invalid = || {
        BrokerError::Refused(
            Code::InvalidTransactionId,
            format!("{transaction_id:?} is not a pending transaction of message {message_id} in topic {topic}"),
        )
    };
    let seal = seal::of(&broker.node).await?;
    let id = parse_transaction_id(&seal, topic, message_id, transaction_id).ok_or_else(invalid)?;
    // A new leader may not have applied everything committed yet.
    broker.node.linearizable().await?;
    let stored_ms = broker.node.sm.with_metadata(|m| {
        m.held
            .halves
            .get(&id)
            .filter(|h| h.topic == topic && h.message_id == message_id)
            .map(|h| h.stored_ms)
    });
    let Some(stored_ms) = stored_ms else {
        return Err(invalid());
    };
    let node = &broker.node;
    let source = if from_check { "check-back" } else { "producer" };
    let outcome = match resolution {
        Resolution::Unknown => {
            tracing::debug!(topic, message_id, source, "transaction still unknown");
            return Ok(());
        }
        Resolution::Rollback => {
            if !held::apply(node, &AdminCommand::EndTransaction { id }).await? {
                return Err(invalid());
            }
            "rollback"
        }
        Resolution::Commit => {
            let mut r = held::read(broker, id).await?;
            match held::deliverable(node, &mut r) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(BrokerError::Refused(
                        Code::Forbidden,
                        format!("cannot commit now: topic {topic} refuses writes"),
                    ));
                }
                Err(why) => return Err(BrokerError::Refused(Code::Forbidden, format!("cannot commit: {why}"))),
            }
            if !held::release(node, &AdminCommand::EndTransaction { id }, vec![r]).await? {
                return Err(BrokerError::Refused(
                    Code::InvalidTransactionId,
                    format!("the commit of {transaction_id:?} lost a race: resolved meanwhile, or its topic changed"),
                ));
            }
            "commit"
        }
    };
    broker
        .metrics
        .transaction_ended(topic, outcome == "commit", now_ms().saturating_sub(stored_ms));
    tracing::debug!(topic, message_id, source, outcome, "transaction ended");
    Ok(())
}

/// Passes a check-back for half message `id` of `topic` (the message
/// itself, in its stored layout) to a producer of the topic connected to
/// this node. False if none is.
pub fn check_locally(broker: &Broker, topic: &str, id: HeldId, view: &MessageView<'_>) -> bool {
    let producers = broker.clients.producers_of(topic);
    if producers.is_empty() {
        return false;
    }
    // Made with the first half message's transaction id, so present.
    let Some(seal) = seal::current(&broker.node) else {
        return false;
    };
    let transaction_id = transaction_id(&seal, topic, view.message_id, id);
    let addr = broker.client_addr();
    let message = v2_message::outgoing(
        view,
        &Delivery {
            topic,
            namespace: "",
            queue_id: 0,
            queue_offset: 0,
            store_host: &addr,
            receipt_handle: None,
            attempt: None,
            invisible: None,
            stored: None,
        },
    );
    let cmd = v2::TelemetryCommand {
        status: Some(v2_message::ok()),
        command: Some(v2::telemetry_command::Command::RecoverOrphanedTransactionCommand(
            v2::RecoverOrphanedTransactionCommand {
                message: Some(message),
                transaction_id: transaction_id.clone(),
            },
        )),
    };
    // Any one live producer will do; a full stream is skipped.
    for (client, tx) in producers {
        if tx.try_send(Ok(cmd.clone())).is_ok() {
            tracing::debug!(client, topic, transaction = transaction_id, "sent a check-back");
            broker.metrics.transaction_checks.inc();
            return true;
        }
    }
    false
}

/// A check-back passed on by the leader ([`pb::CheckTransactionRequest`]),
/// if it names a pending half message of its topic.
pub fn check_for_peer(broker: &Broker, r: &pb::CheckTransactionRequest) -> Result<bool, BrokerError> {
    let id = HeldId {
        index: r.log_index,
        ordinal: r.ordinal,
    };
    let (view, _) =
        MessageView::parse(&r.message).map_err(|e| BrokerError::Invalid(format!("check-back message: {e}")))?;
    let pending = broker.node.sm.with_metadata(|m| {
        m.held
            .halves
            .get(&id)
            .is_some_and(|h| h.topic == r.topic && h.message_id == view.message_id)
    });
    if !pending {
        return Ok(false);
    }
    Ok(check_locally(broker, &r.topic, id, &view))
}

/// Asks this node, then the group's other nodes, to pass a check-back on.
async fn check(broker: &Broker, topic: &str, id: HeldId) -> bool {
    // Encoded once: parsed here, carried as-is to the other nodes.
    let bytes = match held::read(broker, id).await {
        Ok(r) => held::stored_bytes(&r.message, r.stored_ms),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read a half message to check it back");
            return false;
        }
    };
    if let Ok((view, _)) = MessageView::parse(&bytes)
        && check_locally(broker, topic, id, &view)
    {
        return true;
    }
    for addr in broker.peer_client_addrs() {
        let Ok(mut client) = broker.peer_client(&addr) else {
            continue;
        };
        let mut req = tonic::Request::new(pb::CheckTransactionRequest {
            topic: topic.to_string(),
            log_index: id.index,
            ordinal: id.ordinal,
            message: bytes.clone(),
        });
        req.set_timeout(held::PEER_TIMEOUT);
        if let Ok(r) = client.check_transaction(req).await
            && r.into_inner().sent
        {
            return true;
        }
    }
    false
}

/// One round of check-backs and give-ups; returns the checks counted.
pub async fn check_due(broker: &Broker) -> Result<usize, BrokerError> {
    let cfg = &broker.cfg.transaction;
    let policy = rheld::CheckPolicy {
        immunity_ms: cfg.check_immunity_ms,
        // A message's own immunity may not outlast all its checks.
        max_immunity_ms: cfg.check_interval_ms.saturating_mul(u64::from(cfg.max_checks)),
        interval_ms: cfg.check_interval_ms,
    };
    let now = now_ms();
    type Due = (HeldId, String, String, u32);
    let (due, expired): (Vec<Due>, Vec<Due>) = broker.node.sm.with_metadata(|m| {
        m.held
            .halves
            .iter()
            .filter(|(_, h)| rheld::check_due(h, now, &policy))
            .take(MAX_CHECKS_PER_TICK)
            .map(|(id, h)| (*id, h.topic.clone(), h.message_id.clone(), h.checks))
            .partition(|(_, _, _, checks)| *checks < cfg.max_checks)
    });
    for (id, topic, message_id, checks) in expired {
        if held::apply(&broker.node, &AdminCommand::EndTransaction { id }).await? {
            tracing::warn!(
                topic,
                message_id,
                checks,
                "discarded a half message: its transaction was not resolved"
            );
            broker.metrics.transactions_discarded.inc();
        }
    }
    if due.is_empty() {
        return Ok(0);
    }
    // Concurrently: a peer that does not answer must not hold up the rest.
    let ids: Vec<HeldId> = futures::stream::iter(due)
        .map(|(id, topic, message_id, _)| async move {
            if !check(broker, &topic, id).await {
                tracing::debug!(
                    topic,
                    message_id,
                    "no producer of the topic to check a transaction with"
                );
            }
            // Counted whether or not a producer was there: a transaction
            // whose producers are all gone is given up in the end.
            id
        })
        .buffer_unordered(CONCURRENT_CHECKS)
        .collect()
        .await;
    let n = ids.len();
    held::apply(&broker.node, &AdminCommand::TransactionsChecked { ids, at_ms: now }).await?;
    Ok(n)
}

/// Runs the check-back loop on this node; it acts while the node leads.
pub fn spawn(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            if !broker.node.is_leader() {
                continue;
            }
            if let Err(e) = check_due(&broker).await {
                tracing::warn!(error = %e, "transaction check-backs failed; retrying");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_round_trip_and_reject_garbage() {
        let seal = Seal::new(raftmq_raft::secret::GroupSecret::from_bytes([7; 32]));
        let id = HeldId { index: 99, ordinal: 2 };
        let t = transaction_id(&seal, "T", "M", id);
        assert_eq!(parse_transaction_id(&seal, "T", "M", &t), Some(id));
        // Another message or topic, another group's secret.
        assert_eq!(parse_transaction_id(&seal, "T", "N", &t), None);
        assert_eq!(parse_transaction_id(&seal, "U", "M", &t), None);
        let other = Seal::new(raftmq_raft::secret::GroupSecret::from_bytes([8; 32]));
        assert_eq!(parse_transaction_id(&other, "T", "M", &t), None);
        // The old unsealed form, and garbage.
        for bad in [
            "",
            "x1.99.2",
            "x2.",
            "x2.99.2",
            "x2.99.2.3.0",
            "t1.1.2",
            &"x2.".repeat(100),
        ] {
            assert_eq!(parse_transaction_id(&seal, "T", "M", bad), None, "{bad}");
        }
    }
}
