//! Changing and reading users and access policies (`raftmq user`, `raftmq
//! acl`): changes go through Raft like topics do, so every node and every
//! later leader holds the same ones ([`raftmq_raft::acl`]).

use raftmq_raft::acl::{AclCommand, Acls, User};
use raftmq_raft::command::{AdminCommand, Response};

use crate::broker::Broker;
use crate::error::BrokerError;

/// Largest `ChangeAcl` command accepted, as JSON.
pub const MAX_COMMAND_JSON: usize = 1 << 20;

impl Broker {
    /// Applies `cmd` through Raft; runs on the leader.
    pub async fn change_acl_local(&self, cmd: AclCommand) -> Result<(), BrokerError> {
        cmd.check().map_err(BrokerError::Invalid)?;
        match self
            .node
            .write(raftmq_raft::Command::admin(&AdminCommand::Acl(cmd)))
            .await?
            .1
        {
            Response::Rejected(why) => Err(BrokerError::Invalid(why)),
            _ => Ok(()),
        }
    }

    /// The users (secret keys blanked) and policies this node has applied.
    pub fn read_acl(&self) -> (Vec<User>, Acls) {
        self.node.sm.with_metadata(|m| {
            let users = m
                .users
                .values()
                .map(|u| User {
                    password: String::new(),
                    ..u.clone()
                })
                .collect();
            (users, m.acls.clone())
        })
    }
}

/// With `[acl]` on and an initial user configured: proposes it, as
/// leader, until the group has a user (the first committed one stays;
/// [`AclCommand::InitUser`] is a no-op once any user exists). Ends with
/// `stop`.
pub fn spawn_init_user(broker: std::sync::Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Ok(Some(user)) = broker.cfg.acl.init_user() else {
        return;
    };
    if !broker.acl_enabled() {
        return;
    }
    tokio::spawn(async move {
        loop {
            if broker.node.sm.with_metadata(|m| !m.users.is_empty()) {
                return;
            }
            if broker.node.is_leader() {
                match broker.change_acl_local(AclCommand::InitUser(user.clone())).await {
                    Ok(()) => tracing::info!(user = user.name, "ACL: the initial Super user is in place"),
                    Err(e) => tracing::warn!(error = %e, "ACL: proposing the initial Super user failed; retrying"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

/// Parses a `ChangeAcl` request's command.
pub fn parse_command(json: &str) -> Result<AclCommand, BrokerError> {
    if json.len() > MAX_COMMAND_JSON {
        return Err(BrokerError::Invalid(format!(
            "an ACL change is at most {MAX_COMMAND_JSON} bytes of JSON"
        )));
    }
    serde_json::from_str(json).map_err(|e| BrokerError::Invalid(format!("ACL change: {e}")))
}
