//! What the user logged in may do, so that pages offer only that: read at
//! login from the cluster's ACL (`ReadAcl`, with the dashboard's own keys,
//! which only a Super user's can do; [`super::session`]) and decided here with the broker's own
//! rule ([`raftmq_raft::acl::decide`]). Without such keys, or with ACL off,
//! everything is offered and the cluster refuses what it must; the
//! cluster decides either way, this only spares a user forms that would be
//! refused.

use raftmq_raft::acl::{self, Action, Check, Decision, PolicyEntry, Resource, ResourceType};

use crate::proto::pb;

/// What a user may do.
#[derive(Debug, Clone, Default)]
pub enum Permissions {
    /// Not known: offer everything.
    #[default]
    Unknown,
    /// A Super user: everything.
    Super,
    /// A Normal user's policy entries.
    Entries(Vec<PolicyEntry>),
}

/// `action` as the one-element list a [`Check`] takes.
fn only(action: Action) -> &'static [Action] {
    match action {
        Action::All => &[Action::All],
        Action::Pub => &[Action::Pub],
        Action::Sub => &[Action::Sub],
        Action::Create => &[Action::Create],
        Action::Update => &[Action::Update],
        Action::Delete => &[Action::Delete],
        Action::Get => &[Action::Get],
        Action::List => &[Action::List],
    }
}

impl Permissions {
    /// May do `action` on the `kind` resource `name`.
    pub fn may(&self, kind: ResourceType, name: &str, action: Action) -> bool {
        match self {
            Permissions::Unknown | Permissions::Super => true,
            Permissions::Entries(e) => {
                let check = Check {
                    kind,
                    name: name.to_string(),
                    actions: only(action),
                };
                acl::decide(e, &check, None) == Decision::Allow
            }
        }
    }

    /// May do `action` on some `kind` resource (a form for a name not
    /// chosen yet): an entry allows it on such resources.
    pub fn may_some(&self, kind: ResourceType, action: Action) -> bool {
        match self {
            Permissions::Unknown | Permissions::Super => true,
            Permissions::Entries(e) => e.iter().any(|e| {
                e.decision == Decision::Allow
                    && (e.actions.contains(&Action::All) || e.actions.contains(&action))
                    && (e.resource.kind == ResourceType::Any || e.resource.kind == kind)
            }),
        }
    }
}

/// `user`'s permissions in an ACL answer.
pub fn of(r: &pb::ReadAclResponse, user: &str) -> Permissions {
    match r.users.iter().find(|u| u.name == user) {
        Some(u) if u.user_type.eq_ignore_ascii_case("super") => return Permissions::Super,
        Some(_) => {}
        None => return Permissions::Unknown,
    }
    let subject = acl::subject_of(user);
    let entries = r
        .policies
        .iter()
        .filter(|p| p.subject == subject)
        .flat_map(|p| &p.entries)
        .filter_map(|e| {
            Some(PolicyEntry {
                resource: Resource::parse(&e.resource).ok()?,
                actions: e
                    .actions
                    .iter()
                    .map(|a| Action::parse(a))
                    .collect::<Result<_, _>>()
                    .ok()?,
                source_ips: e.source_ips.clone(),
                decision: Decision::parse(&e.decision).ok()?,
            })
        })
        .collect();
    Permissions::Entries(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> pb::ReadAclResponse {
        pb::ReadAclResponse {
            users: vec![
                pb::AclUser {
                    name: "root".into(),
                    user_type: "Super".into(),
                    status: "enable".into(),
                },
                pb::AclUser {
                    name: "alice".into(),
                    user_type: "Normal".into(),
                    status: "enable".into(),
                },
            ],
            policies: vec![pb::AclPolicy {
                subject: "User:alice".into(),
                entries: vec![
                    pb::AclEntry {
                        resource: "Topic:orders*".into(),
                        actions: vec!["Pub".into(), "Get".into()],
                        source_ips: vec![],
                        decision: "Allow".into(),
                    },
                    pb::AclEntry {
                        resource: "Topic:orders-secret".into(),
                        actions: vec!["All".into()],
                        source_ips: vec![],
                        decision: "Deny".into(),
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_normal_user_is_offered_what_her_policy_allows() {
        let p = of(&answer(), "alice");
        assert!(p.may(ResourceType::Topic, "orders-1", Action::Pub));
        assert!(!p.may(ResourceType::Topic, "orders-1", Action::Delete));
        assert!(!p.may(ResourceType::Topic, "orders-secret", Action::Pub), "deny wins");
        assert!(!p.may(ResourceType::Topic, "payments", Action::Pub));
        assert!(!p.may_some(ResourceType::Topic, Action::Create));
        assert!(!p.may_some(ResourceType::Group, Action::Pub));
    }

    #[test]
    fn super_users_and_unknown_ones_are_offered_everything() {
        assert!(matches!(of(&answer(), "root"), Permissions::Super));
        let unknown = of(&answer(), "nobody");
        assert!(unknown.may(ResourceType::Cluster, "c", Action::Delete));
        assert!(unknown.may_some(ResourceType::Topic, Action::Create));
    }
}
