//! Who is calling, and whether they may: RocketMQ 5's ACL 2.0 for the
//! client port (`[acl]`).
//!
//! A call is made by one of:
//! - a **member**: its TLS certificate, issued by the cluster's CA, names a
//!   broker node ([`raftmq_raft::tls::identity`]). Nodes forward calls and
//!   ask each other for status; they pass every check, like RocketMQ's
//!   inner-client credentials;
//! - a **user**: the call is signed with a user's secret key
//!   ([`crate::client::credentials`]); the user must exist, be enabled,
//!   and the signed date-time be within `max_clock_skew_ms`;
//! - nobody, refused as unauthenticated while ACL is on.
//!
//! A Super user passes every check; anyone else needs, for every [`Check`]
//! of the call, a policy entry that allows it and none that denies it
//! ([`raftmq_raft::acl::decide`]). Users and policies are read from the
//! node's applied state, so a change is in force on a node once it has
//! applied it.
//!
//! A node that has not applied the latest changes (it just restarted, was
//! given back its log after a wipe, or has just been elected) could refuse
//! a user that exists, or a grant just made. So such a refusal is not
//! final until the node has applied what its group committed before the
//! call ([`Broker::checked`]): then it checks again; if it cannot get
//! there within [`BARRIER_WAIT`], the call gets "unavailable" (retry,
//! perhaps elsewhere), never a refusal the group as a whole would not give.

use std::net::IpAddr;
use std::time::Duration;

use raftmq_raft::acl::{self, Check, Decision, UserStatus, UserType};
use raftmq_raft::tls::{NodeIdentity, PeerInfo};
use tonic::metadata::MetadataMap;

use crate::broker::Broker;
use crate::broker::clients::Owner;
use crate::client::credentials::Signed;
use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

/// Who a call comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// ACL is off: everyone may do everything.
    Open,
    Member(NodeIdentity),
    User {
        name: String,
        super_user: bool,
    },
}

impl Caller {
    /// Who a client id is bound to ([`crate::broker::clients::Owner`]):
    /// the user, or the member node; none while ACL is off.
    pub fn user(&self) -> Option<String> {
        match self {
            Caller::Open => None,
            Caller::Member(id) => Some(format!("node:{}/{}", id.group, id.node)),
            Caller::User { name, .. } => Some(name.clone()),
        }
    }
}

/// Who a call's client id belongs to: its address, and the caller that the
/// v2 service's access check left in its extensions (none with ACL off).
pub fn owner_of<T>(r: &tonic::Request<T>) -> Owner {
    Owner {
        ip: PeerInfo::ip(r),
        user: r.extensions().get::<Caller>().and_then(Caller::user),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials, or ones no node's state could make good (malformed,
    /// signed too far from this node's clock).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Credentials this node's users do not accept (a user unknown or
    /// disabled here, a signature that does not match the secret here):
    /// a node behind its group could be wrong about them.
    #[error("unauthenticated: {0}")]
    NotAccepted(String),
    #[error("access denied: {0}")]
    Denied(String),
    /// This node could not tell: it has not applied its group's latest
    /// users and policies, and did not catch up in time.
    #[error("cannot check credentials here yet: {0}")]
    Behind(String),
}

impl AuthError {
    /// Whether a node that has applied more of its group's log could
    /// answer otherwise (a user or a grant it has not seen yet).
    fn may_be_stale(&self) -> bool {
        matches!(self, AuthError::NotAccepted(_) | AuthError::Denied(_))
    }
}

/// How long a refused call waits for its node to catch up with the users
/// and policies its group committed (about two election timeouts and a
/// snapshot's worth of applying, on a node that just restarted).
pub const BARRIER_WAIT: Duration = Duration::from_secs(2);

impl From<AuthError> for BrokerError {
    /// As RocketMQ answers both: `UNAUTHORIZED` (40100), the message
    /// telling which it was.
    fn from(e: AuthError) -> BrokerError {
        match e {
            AuthError::Behind(_) => BrokerError::Unavailable(e.to_string()),
            _ => BrokerError::Refused(Code::Unauthorized, e.to_string()),
        }
    }
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> tonic::Status {
        match e {
            AuthError::Unauthenticated(_) | AuthError::NotAccepted(_) => tonic::Status::unauthenticated(e.to_string()),
            AuthError::Denied(_) => tonic::Status::permission_denied(e.to_string()),
            AuthError::Behind(_) => tonic::Status::unavailable(e.to_string()),
        }
    }
}

/// What [`Broker::authenticate`] reads of a call.
pub struct CallInfo<'a> {
    pub metadata: &'a MetadataMap,
    pub peer: Option<&'a PeerInfo>,
}

impl CallInfo<'_> {
    pub fn ip(&self) -> Option<IpAddr> {
        self.peer.and_then(|p| p.remote_addr).map(|a| a.ip())
    }
}

impl<'a> CallInfo<'a> {
    pub fn of<T>(r: &'a tonic::Request<T>) -> CallInfo<'a> {
        CallInfo {
            metadata: r.metadata(),
            peer: PeerInfo::of(r),
        }
    }
}

impl Broker {
    /// Whether calls are checked (`[acl] enabled`).
    pub fn acl_enabled(&self) -> bool {
        self.cfg.acl.enabled
    }

    /// Who makes the call.
    pub fn authenticate(&self, call: &CallInfo<'_>) -> Result<Caller, AuthError> {
        if !self.acl_enabled() {
            return Ok(Caller::Open);
        }
        if let Some(p) = call.peer
            && let Ok(Some(member)) = p.node()
        {
            return Ok(Caller::Member(member));
        }
        let signed = Signed::of(call.metadata)
            .map_err(AuthError::Unauthenticated)?
            .ok_or_else(|| {
                AuthError::Unauthenticated(
                    "ACL is on: sign calls with an access key and secret key (--access-key/--secret-key)".into(),
                )
            })?;
        let window = self.cfg.acl.max_clock_skew_ms;
        if window > 0 {
            let now = crate::clock::now_ms() as i64;
            match signed.skew_ms(now) {
                Some(skew) if skew <= window => {}
                Some(skew) => {
                    return Err(AuthError::Unauthenticated(format!(
                        "the signed x-mq-date-time is {} s from this node's clock (at most {} s)",
                        skew / 1000,
                        window / 1000
                    )));
                }
                None => {
                    return Err(AuthError::Unauthenticated(
                        "x-mq-date-time is not yyyyMMddTHHmmssZ".into(),
                    ));
                }
            }
        }
        // Checked under the metadata's read lock: no copy of the secret.
        let (name, super_user) = self.node.sm.with_metadata(|m| {
            let user = m
                .users
                .get(signed.access_key)
                .ok_or_else(|| AuthError::NotAccepted(format!("no user {}", signed.access_key)))?;
            if user.status == UserStatus::Disable {
                return Err(AuthError::NotAccepted(format!("user {} is disabled", user.name)));
            }
            if !signed.verify(&user.password) {
                return Err(AuthError::NotAccepted(format!(
                    "the signature does not match user {}'s secret key",
                    user.name
                )));
            }
            Ok((user.name.clone(), user.user_type == UserType::Super))
        })?;
        Ok(Caller::User { name, super_user })
    }

    /// Whether `caller`, at `ip`, may do all of `checks`. A user is looked
    /// up again (a Telemetry stream's caller was authenticated when it
    /// opened, and may since have been disabled, removed or demoted).
    pub fn authorize(&self, caller: &Caller, checks: &[Check], ip: Option<IpAddr>) -> Result<(), AuthError> {
        let name = match caller {
            Caller::Open | Caller::Member(_) => return Ok(()),
            Caller::User { name, .. } => name,
        };
        let subject = acl::subject_of(name);
        self.node.sm.with_metadata(|m| {
            match m.users.get(name.as_str()) {
                None => return Err(AuthError::NotAccepted(format!("no user {name}"))),
                Some(u) if u.status == UserStatus::Disable => {
                    return Err(AuthError::NotAccepted(format!("user {name} is disabled")));
                }
                Some(u) if u.user_type == UserType::Super => return Ok(()),
                Some(_) => {}
            }
            let policy = m.acls.get(&subject).map_or(&[][..], Vec::as_slice);
            for c in checks {
                if acl::decide(policy, c, ip) == Decision::Deny {
                    return Err(AuthError::Denied(format!("{subject} may not {c}")));
                }
            }
            Ok(())
        })
    }

    /// [`Broker::authenticate`], then [`Broker::authorize`].
    pub fn access(&self, call: &CallInfo<'_>, checks: &[Check]) -> Result<Caller, AuthError> {
        let caller = self.authenticate(call)?;
        self.authorize(&caller, checks, call.ip())?;
        Ok(caller)
    }

    /// `check` (one of the checks here) against this node's users and
    /// policies as its group committed them: a refusal that a node behind
    /// could be wrong about ([`AuthError::may_be_stale`]) is checked again
    /// after a read barrier ([`raftmq_raft::RaftNode::read_barrier`]), or
    /// becomes [`AuthError::Behind`] when the barrier cannot be had.
    /// Allowed calls, and refusals no state could change, answer at once.
    pub async fn checked<T>(&self, check: impl Fn() -> Result<T, AuthError>) -> Result<T, AuthError> {
        match check() {
            Err(e) if e.may_be_stale() => match self.node.read_barrier(BARRIER_WAIT).await {
                Ok(()) => check(),
                Err(why) => Err(AuthError::Behind(format!("{why} (it would refuse: {e})"))),
            },
            other => other,
        }
    }

    /// Refuses a call that is not from a member or a Super user (user and
    /// policy management).
    pub fn require_admin(&self, call: &CallInfo<'_>) -> Result<(), AuthError> {
        match self.authenticate(call)? {
            Caller::Open | Caller::Member(_) | Caller::User { super_user: true, .. } => Ok(()),
            Caller::User { name, .. } => Err(AuthError::Denied(format!(
                "only Super users manage users and policies, and {name} is not one"
            ))),
        }
    }
}
