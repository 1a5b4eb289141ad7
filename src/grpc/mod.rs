//! The transports onto the broker core: `apache.rocketmq.v2` for the
//! official clients ([`rocketmq`]), `raftmq.v1.Broker` for raftmq's own
//! tools ([`raftmq`]), and the HTTP/2 shim in front of the client port
//! ([`h2_authority`], with the HPACK reading it needs in [`hpack`]);
//! [`admin_access`] checks `raftmq.v1.Broker` calls under ACL;
//! [`send_gate`] refuses sends past the in-flight bound before their
//! bodies are read.
//! Both services run what changes state on the leader through the one
//! forwarding helper here, [`on_leader`].

pub mod admin_access;
pub mod h2_authority;
pub mod hpack;
pub mod raftmq;
pub mod rocketmq;
pub mod send_gate;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::broker::{Broker, FORWARD_WAIT};
use crate::client::channel::not_delivered;
use crate::error::BrokerError;

/// Marks a request a follower forwarded to the leader; the value counts
/// the hops so far ("1", "2").
pub const FORWARDED: &str = "x-raftmq-forwarded";

/// How many times a request may be forwarded. Two hops reach any node of a
/// group from any other even when the first node's view of the leader is
/// one election behind (A thinks B leads, B knows C does); a third would
/// only let stale views bounce it around.
const MAX_HOPS: u8 = 2;

/// Runs `local` when this node leads, or forwards the request to the leader
/// with `forward` (given a channel to the leader's client port).
/// When the known leader cannot be reached (it died and the group has not
/// noticed yet), waits for the next one and forwards there, within
/// [`FORWARD_WAIT`]: the client need not retry elsewhere. A forward whose
/// leader stops being this node's leader before it answers (paused, or cut
/// off: this node stops hearing it within an election timeout) is given up
/// as an unknown outcome (it may have been carried out), and a request
/// while this node knows no leader for [`Broker::leader_wait`] is refused
/// as unavailable: either way a client hears within about an election
/// timeout, not at its own deadline, and may retry. A request is
/// forwarded at most [`MAX_HOPS`] times, so two nodes with stale views of
/// the leader cannot bounce it for ever. The forwarded copy keeps the
/// client's metadata and what is left of its deadline.
pub async fn on_leader<Req, Resp, L, LF, F, FF>(
    broker: &Broker,
    request: Request<Req>,
    local: L,
    forward: F,
) -> Result<Resp, BrokerError>
where
    Req: Clone,
    L: FnOnce(Req) -> LF,
    LF: Future<Output = Result<Resp, BrokerError>>,
    F: Fn(Channel, Request<Req>) -> FF,
    FF: Future<Output = Result<Resp, Status>>,
{
    let hops = forward_hops(request.metadata());
    let timeout = grpc_timeout(request.metadata());
    let started = Instant::now();
    let (meta, _, req) = request.into_parts();
    let deadline = started + FORWARD_WAIT;
    loop {
        let Some((leader, channel)) = broker.leader_channel().await? else {
            return local(req).await;
        };
        if hops >= MAX_HOPS {
            return Err(BrokerError::Unavailable(
                "this node is not the leader either; retry".into(),
            ));
        }
        let mut fwd = Request::from_parts(meta.clone(), Default::default(), req.clone());
        fwd.metadata_mut()
            .insert(FORWARDED, MetadataValue::from(u32::from(hops + 1)));
        // What is left of the client's time, not all of it.
        if let Some(t) = timeout {
            fwd.set_timeout(t.saturating_sub(started.elapsed()).max(Duration::from_millis(1)));
        }
        let lost = broker.node.leader_lost(leader);
        tokio::pin!(lost);
        // That leader was gone before anything was sent: look again.
        if futures::poll!(lost.as_mut()).is_ready() {
            if Instant::now() < deadline {
                continue;
            }
            return Err(BrokerError::Unavailable(
                "the leader changed before the request could be forwarded; retry".into(),
            ));
        }
        let answer = tokio::select! {
            r = forward(channel, fwd) => r,
            // The forwarded request may or may not have been carried out.
            _ = lost => return Err(BrokerError::OutcomeUnknown(format!(
                "leader {leader} stopped leading (or being heard) before it answered; retry"
            ))),
        };
        match answer {
            Ok(r) => return Ok(r),
            Err(s) if not_delivered(&s) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A forwarded call's own errors come back as they were.
            Err(s) => return Err(BrokerError::from(s)),
        }
    }
}

/// How often a request has been forwarded already. A value that is not a
/// small count (anyone can send the header) counts as the limit: such a
/// request is served here or refused, never forwarded.
fn forward_hops(m: &MetadataMap) -> u8 {
    match m.get(FORWARDED) {
        None => 0,
        Some(v) => match v.to_str().ok().and_then(|v| v.parse::<u8>().ok()) {
            Some(n) if n < MAX_HOPS => n,
            _ => MAX_HOPS,
        },
    }
}

/// Whether a follower forwarded this request (it was counted where the
/// client sent it).
pub fn is_forwarded(m: &MetadataMap) -> bool {
    m.get(FORWARDED).is_some()
}

/// A request header as text ("" when absent or not text).
pub fn header<'a>(m: &'a MetadataMap, key: &str) -> &'a str {
    m.get(key).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The client's deadline from the `grpc-timeout` header.
pub fn grpc_timeout(m: &MetadataMap) -> Option<Duration> {
    let v = header(m, "grpc-timeout");
    // At most 8 digits and a unit, as the gRPC spec allows.
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (n, unit) = v.split_at(v.len() - 1);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_hops_are_counted_and_bounded() {
        let mut m = MetadataMap::new();
        assert_eq!(forward_hops(&m), 0);
        m.insert(FORWARDED, MetadataValue::from_static("1"));
        assert_eq!(forward_hops(&m), 1);
        for v in ["2", "200", "x", "-1", ""] {
            m.insert(FORWARDED, v.parse().unwrap());
            assert_eq!(forward_hops(&m), MAX_HOPS, "{v:?}");
        }
    }

    #[test]
    fn grpc_timeouts() {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", MetadataValue::from_static("6000m"));
        assert_eq!(grpc_timeout(&m), Some(Duration::from_secs(6)));
        m.insert("grpc-timeout", MetadataValue::from_static("2S"));
        assert_eq!(grpc_timeout(&m), Some(Duration::from_secs(2)));
        m.insert("grpc-timeout", MetadataValue::from_static("x"));
        assert_eq!(grpc_timeout(&m), None);
        m.insert("grpc-timeout", MetadataValue::from_static("99999999999999999999999H"));
        assert_eq!(grpc_timeout(&m), None);
        // Nine digits: more than the spec allows (and than tonic can send on).
        m.insert("grpc-timeout", MetadataValue::from_static("100000000H"));
        assert_eq!(grpc_timeout(&m), None);
    }
}
