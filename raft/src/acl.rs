//! Users and access policies, RocketMQ 5's ACL 2.0 model, as replicated
//! state: changed only by [`AclCommand`]s applied through Raft, kept in
//! snapshots, so every node (and every later leader) decides alike.
//!
//! - A [`User`] is an access key (`name`) and secret key (`password`), a
//!   type ([`UserType::Super`] passes every check) and a status (a
//!   disabled user cannot authenticate).
//! - A subject (`User:<name>`) has policy entries: a [`Resource`] pattern
//!   (`*`, `Cluster:c`, `Namespace:n`, `Topic:t`, `Group:g`; a name may be
//!   `*` for any, or end in `*` for a prefix), the [`Action`]s it covers,
//!   optional source address ranges, and a [`Decision`].
//! - [`decide`]: among the entries that match a check, **Deny wins**; no
//!   matching entry means deny.
//!
//! Secret keys are kept as given: HMAC-SHA1 needs the key itself to check
//! a signature. They live in the node's data directory and its snapshots,
//! which must be protected like any other secret; they are never sent
//! back to a caller.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Most users a cluster keeps.
pub const MAX_USERS: usize = 10_000;
/// Most policy entries one subject has.
pub const MAX_ENTRIES: usize = 1_000;
/// Most source ranges one entry names.
pub const MAX_SOURCE_IPS: usize = 64;
/// Longest user name (access key), in bytes.
pub const MAX_NAME: usize = 64;
/// Longest secret key, in bytes.
pub const MAX_PASSWORD: usize = 256;
/// Longest resource name in a policy, in bytes.
pub const MAX_RESOURCE_NAME: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserType {
    Super,
    Normal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserStatus {
    Enable,
    Disable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The access key.
    pub name: String,
    /// The secret key.
    pub password: String,
    pub user_type: UserType,
    pub status: UserStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceType {
    /// `*`: every resource of every type.
    Any,
    Cluster,
    Namespace,
    Topic,
    Group,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Pattern {
    /// The name exactly.
    Literal,
    /// Names starting with `name`.
    Prefixed,
    /// Every name.
    Any,
}

/// What a policy entry is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Resource {
    pub kind: ResourceType,
    /// The literal name, or the prefix; empty for [`Pattern::Any`].
    pub name: String,
    pub pattern: Pattern,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    All,
    Pub,
    Sub,
    Create,
    Update,
    Delete,
    Get,
    List,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    Allow,
    Deny,
}

/// One rule of a subject's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyEntry {
    pub resource: Resource,
    pub actions: Vec<Action>,
    /// Addresses or CIDR ranges (`10.0.0.0/8`, `::1`); empty: from anywhere.
    #[serde(default)]
    pub source_ips: Vec<String>,
    pub decision: Decision,
}

/// Users by name.
pub type Users = BTreeMap<String, User>;
/// Policy entries by subject (`User:<name>`).
pub type Acls = BTreeMap<String, Vec<PolicyEntry>>;

/// A change to users or policies, as a Raft command carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AclCommand {
    /// Refused if the user exists.
    CreateUser(User),
    /// The first Super user of a cluster: applied only while there is no
    /// user at all, so every node's configured initial user is proposed
    /// harmlessly on each start.
    InitUser(User),
    /// Changes what is given; refused if the user does not exist.
    UpdateUser {
        name: String,
        password: Option<String>,
        user_type: Option<UserType>,
        status: Option<UserStatus>,
    },
    /// Removes the user and its policy.
    DeleteUser { name: String },
    /// Adds entries to the subject's policy (creating it); an entry for a
    /// resource the policy already has replaces it (mqadmin's createAcl and
    /// updateAcl). The subject's user must exist.
    PutAcl { subject: String, entries: Vec<PolicyEntry> },
    /// Removes the subject's entry for `resource`, or its whole policy.
    DeleteAcl {
        subject: String,
        resource: Option<Resource>,
    },
}

// ---- names and parsing ----------------------------------------------------

macro_rules! named {
    ($t:ty { $($v:ident = $s:literal),* $(,)? }) => {
        impl $t {
            /// The name ACL 2.0 uses.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }
            /// Parses [`Self::as_str`]'s names, in any case.
            pub fn parse(s: &str) -> Result<Self, String> {
                $(if s.eq_ignore_ascii_case($s) { return Ok(Self::$v); })*
                Err(format!(
                    "{s:?} is not one of {}",
                    [$($s),*].join(", ")
                ))
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named!(UserType { Super = "Super", Normal = "Normal" });
named!(UserStatus { Enable = "enable", Disable = "disable" });
named!(Action {
    All = "All",
    Pub = "Pub",
    Sub = "Sub",
    Create = "Create",
    Update = "Update",
    Delete = "Delete",
    Get = "Get",
    List = "List",
});
named!(Decision { Allow = "Allow", Deny = "Deny" });
named!(ResourceType {
    Any = "*",
    Cluster = "Cluster",
    Namespace = "Namespace",
    Topic = "Topic",
    Group = "Group",
});

/// The subject of a user's policy.
pub fn subject_of(user: &str) -> String {
    format!("User:{user}")
}

/// The user a subject names.
pub fn user_of(subject: &str) -> Result<&str, String> {
    match subject.split_once(':') {
        Some((kind, name)) if kind.eq_ignore_ascii_case("User") => {
            check_name(name)?;
            Ok(name)
        }
        _ => Err(format!("subject {subject:?} is not User:<name>")),
    }
}

/// A user name: 1 to [`MAX_NAME`] letters, digits, `-`, `_`, `.` or `@`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "user name {name:?} must be 1 to {MAX_NAME} letters, digits, '-', '_', '.' or '@'"
        ))
    }
}

/// A secret key: 6 to [`MAX_PASSWORD`] bytes of printable ASCII.
pub fn check_password(p: &str) -> Result<(), String> {
    if p.len() < 6 || p.len() > MAX_PASSWORD || !p.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "a secret key must be 6 to {MAX_PASSWORD} printable ASCII characters, without spaces"
        ));
    }
    Ok(())
}

impl User {
    pub fn check(&self) -> Result<(), String> {
        check_name(&self.name)?;
        check_password(&self.password)
    }
}

impl Resource {
    /// `*`, `Type:*`, `Type:prefix*` or `Type:name`.
    pub fn parse(s: &str) -> Result<Resource, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(Resource {
                kind: ResourceType::Any,
                name: String::new(),
                pattern: Pattern::Any,
            });
        }
        let Some((kind, name)) = s.split_once(':') else {
            return Err(format!(
                "resource {s:?} is not *, Cluster:<name>, Namespace:<name>, Topic:<name> or Group:<name>"
            ));
        };
        let kind = ResourceType::parse(kind)?;
        if kind == ResourceType::Any {
            return Err(format!("resource {s:?}: `*` stands alone"));
        }
        if name.is_empty() || name.len() > MAX_RESOURCE_NAME || name.chars().any(|c| c.is_control() || c == ',') {
            return Err(format!(
                "resource {s:?}: the name must be 1 to {MAX_RESOURCE_NAME} bytes, no commas"
            ));
        }
        let (name, pattern) = match name.strip_suffix('*') {
            Some("") => (String::new(), Pattern::Any),
            Some(prefix) => (prefix.to_string(), Pattern::Prefixed),
            None => (name.to_string(), Pattern::Literal),
        };
        if name.contains('*') {
            return Err(format!("resource {s:?}: `*` may only end a name"));
        }
        Ok(Resource { kind, name, pattern })
    }

    /// Whether this pattern covers resource `name` of type `kind`.
    pub fn covers(&self, kind: ResourceType, name: &str) -> bool {
        if self.kind == ResourceType::Any {
            return true;
        }
        self.kind == kind
            && match self.pattern {
                Pattern::Any => true,
                Pattern::Literal => self.name == name,
                Pattern::Prefixed => name.starts_with(&self.name),
            }
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.kind, self.pattern) {
            (ResourceType::Any, _) => f.write_str("*"),
            (k, Pattern::Any) => write!(f, "{k}:*"),
            (k, Pattern::Prefixed) => write!(f, "{k}:{}*", self.name),
            (k, Pattern::Literal) => write!(f, "{k}:{}", self.name),
        }
    }
}

/// A source range as written: an address, or an address and prefix length.
fn parse_range(s: &str) -> Result<ipnet::IpNet, String> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(ipnet::IpNet::from(ip));
    }
    s.parse::<ipnet::IpNet>()
        .map_err(|_| format!("source address {s:?} is not an IP address or CIDR range"))
}

impl PolicyEntry {
    pub fn check(&self) -> Result<(), String> {
        if self.actions.is_empty() {
            return Err(format!("the entry for {} names no action", self.resource));
        }
        if self.source_ips.len() > MAX_SOURCE_IPS {
            return Err(format!("at most {MAX_SOURCE_IPS} source addresses per entry"));
        }
        for s in &self.source_ips {
            parse_range(s)?;
        }
        Ok(())
    }

    fn admits(&self, ip: Option<IpAddr>) -> bool {
        if self.source_ips.is_empty() {
            return true;
        }
        let Some(ip) = ip else { return false };
        // A v4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.source_ips
            .iter()
            .filter_map(|s| parse_range(s).ok())
            .any(|net| net.contains(&ip))
    }
}

// ---- decisions ------------------------------------------------------------

/// One thing a request needs: any of `actions` on resource `name` of type
/// `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub kind: ResourceType,
    pub name: String,
    pub actions: &'static [Action],
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actions: Vec<&str> = self.actions.iter().map(|a| a.as_str()).collect();
        write!(f, "{} on {}:{}", actions.join(" or "), self.kind, self.name)
    }
}

/// The decision of `entries` (one subject's policy) on `check` for a
/// caller at `ip`: Deny if any matching entry denies, Allow if one allows,
/// Deny when none matches.
pub fn decide(entries: &[PolicyEntry], check: &Check, ip: Option<IpAddr>) -> Decision {
    let mut allowed = false;
    for e in entries {
        let acts = e.actions.contains(&Action::All) || check.actions.iter().any(|a| e.actions.contains(a));
        if acts && e.resource.covers(check.kind, &check.name) && e.admits(ip) {
            if e.decision == Decision::Deny {
                return Decision::Deny;
            }
            allowed = true;
        }
    }
    if allowed { Decision::Allow } else { Decision::Deny }
}

// ---- applying commands ----------------------------------------------------

impl AclCommand {
    /// Checks what the command carries (the leader does before proposing;
    /// applying checks again, since a log entry is input too).
    pub fn check(&self) -> Result<(), String> {
        match self {
            AclCommand::CreateUser(u) | AclCommand::InitUser(u) => u.check(),
            AclCommand::UpdateUser { name, password, .. } => {
                check_name(name)?;
                password.as_deref().map_or(Ok(()), check_password)
            }
            AclCommand::DeleteUser { name } => check_name(name),
            AclCommand::PutAcl { subject, entries } => {
                user_of(subject)?;
                if entries.is_empty() || entries.len() > MAX_ENTRIES {
                    return Err(format!("a policy change carries 1 to {MAX_ENTRIES} entries"));
                }
                entries.iter().try_for_each(PolicyEntry::check)
            }
            AclCommand::DeleteAcl { subject, .. } => user_of(subject).map(drop),
        }
    }

    /// Applies the command; an error leaves both maps as they were.
    pub fn apply(self, users: &mut Users, acls: &mut Acls) -> Result<(), String> {
        self.check()?;
        match self {
            AclCommand::CreateUser(u) => {
                if users.contains_key(&u.name) {
                    return Err(format!("user {} exists", u.name));
                }
                if users.len() >= MAX_USERS {
                    return Err(format!("the cluster has {MAX_USERS} users, the most it keeps"));
                }
                users.insert(u.name.clone(), u);
            }
            AclCommand::InitUser(u) => {
                if users.is_empty() {
                    users.insert(u.name.clone(), u);
                }
            }
            AclCommand::UpdateUser {
                name,
                password,
                user_type,
                status,
            } => {
                let u = users
                    .get_mut(&name)
                    .ok_or_else(|| format!("user {name} does not exist"))?;
                if let Some(p) = password {
                    u.password = p;
                }
                if let Some(t) = user_type {
                    u.user_type = t;
                }
                if let Some(s) = status {
                    u.status = s;
                }
            }
            AclCommand::DeleteUser { name } => {
                users
                    .remove(&name)
                    .ok_or_else(|| format!("user {name} does not exist"))?;
                acls.remove(&subject_of(&name));
            }
            AclCommand::PutAcl { subject, entries } => {
                let user = user_of(&subject)?;
                if !users.contains_key(user) {
                    return Err(format!("user {user} does not exist"));
                }
                let key = subject_of(user);
                let mut merged = acls.get(&key).cloned().unwrap_or_default();
                for e in entries {
                    match merged.iter_mut().find(|m| m.resource == e.resource) {
                        Some(m) => *m = e,
                        None => merged.push(e),
                    }
                }
                if merged.len() > MAX_ENTRIES {
                    return Err(format!("a policy holds at most {MAX_ENTRIES} entries"));
                }
                acls.insert(key, merged);
            }
            AclCommand::DeleteAcl { subject, resource } => {
                let key = subject_of(user_of(&subject)?);
                let policy = acls.get_mut(&key).ok_or_else(|| format!("{subject} has no policy"))?;
                match resource {
                    None => {
                        acls.remove(&key);
                    }
                    Some(r) => {
                        let before = policy.len();
                        policy.retain(|e| e.resource != r);
                        if policy.len() == before {
                            return Err(format!("{subject} has no entry for {r}"));
                        }
                        if policy.is_empty() {
                            acls.remove(&key);
                        }
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

    fn entry(resource: &str, actions: &[Action], ips: &[&str], decision: Decision) -> PolicyEntry {
        PolicyEntry {
            resource: Resource::parse(resource).unwrap(),
            actions: actions.to_vec(),
            source_ips: ips.iter().map(|s| s.to_string()).collect(),
            decision,
        }
    }

    fn check(kind: ResourceType, name: &str, actions: &'static [Action]) -> Check {
        Check {
            kind,
            name: name.into(),
            actions,
        }
    }

    #[test]
    fn resources_parse_and_print_back() {
        for s in [
            "*",
            "Topic:*",
            "Topic:order-*",
            "Group:g1",
            "Cluster:DefaultCluster",
            "Namespace:ns",
        ] {
            assert_eq!(Resource::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Resource::parse("topic:a").unwrap().to_string(), "Topic:a");
        for bad in ["", "Topic", "Topic:", "Queue:a", "Topic:a*b", "*:a", "Topic:a,b"] {
            assert!(Resource::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deny_wins_and_nothing_matching_is_deny() {
        let policy = vec![
            entry("Topic:*", &[Action::Pub, Action::Sub], &[], Decision::Allow),
            entry("Topic:secret-*", &[Action::Sub], &[], Decision::Deny),
            entry("Group:g1", &[Action::Sub], &["10.0.0.0/8"], Decision::Allow),
        ];
        let local: Option<IpAddr> = Some("10.1.2.3".parse().unwrap());
        let other: Option<IpAddr> = Some("192.0.2.1".parse().unwrap());
        let d = |c: Check, ip| decide(&policy, &c, ip);
        assert_eq!(
            d(check(ResourceType::Topic, "orders", &[Action::Pub]), other),
            Decision::Allow
        );
        assert_eq!(
            d(check(ResourceType::Topic, "secret-x", &[Action::Sub]), other),
            Decision::Deny
        );
        // Deny on Sub does not touch Pub.
        assert_eq!(
            d(check(ResourceType::Topic, "secret-x", &[Action::Pub]), other),
            Decision::Allow
        );
        assert_eq!(
            d(check(ResourceType::Group, "g1", &[Action::Sub]), local),
            Decision::Allow
        );
        assert_eq!(
            d(check(ResourceType::Group, "g1", &[Action::Sub]), other),
            Decision::Deny
        );
        assert_eq!(
            d(check(ResourceType::Group, "g1", &[Action::Sub]), None),
            Decision::Deny
        );
        assert_eq!(
            d(check(ResourceType::Group, "g2", &[Action::Sub]), local),
            Decision::Deny
        );
        assert_eq!(
            d(check(ResourceType::Cluster, "c", &[Action::Update]), local),
            Decision::Deny
        );
        // A v4 caller seen through a dual-stack socket.
        let mapped: Option<IpAddr> = Some("::ffff:10.0.0.9".parse().unwrap());
        assert_eq!(
            d(check(ResourceType::Group, "g1", &[Action::Sub]), mapped),
            Decision::Allow
        );
        let all = vec![entry("*", &[Action::All], &[], Decision::Allow)];
        assert_eq!(
            decide(&all, &check(ResourceType::Cluster, "c", &[Action::Delete]), None),
            Decision::Allow
        );
        assert_eq!(
            decide(&[], &check(ResourceType::Topic, "t", &[Action::Pub]), None),
            Decision::Deny
        );
    }

    fn user(name: &str) -> User {
        User {
            name: name.into(),
            password: "secret-1".into(),
            user_type: UserType::Normal,
            status: UserStatus::Enable,
        }
    }

    #[test]
    fn users_and_policies_change_as_mqadmin_says() {
        let (mut users, mut acls) = (Users::new(), Acls::new());
        let run = |c: AclCommand, users: &mut Users, acls: &mut Acls| c.apply(users, acls);
        run(AclCommand::InitUser(user("root")), &mut users, &mut acls).unwrap();
        run(AclCommand::InitUser(user("other")), &mut users, &mut acls).unwrap();
        assert_eq!(
            users.keys().collect::<Vec<_>>(),
            ["root"],
            "init applies only to no users"
        );
        run(AclCommand::CreateUser(user("alice")), &mut users, &mut acls).unwrap();
        assert!(run(AclCommand::CreateUser(user("alice")), &mut users, &mut acls).is_err());
        let put = |r: &str, a: Action, d: Decision| AclCommand::PutAcl {
            subject: "User:alice".into(),
            entries: vec![entry(r, &[a], &[], d)],
        };
        run(put("Topic:t", Action::Pub, Decision::Allow), &mut users, &mut acls).unwrap();
        run(put("Group:g", Action::Sub, Decision::Allow), &mut users, &mut acls).unwrap();
        // The same resource again replaces its entry.
        run(put("Topic:t", Action::Sub, Decision::Deny), &mut users, &mut acls).unwrap();
        let p = &acls["User:alice"];
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].actions.as_slice(), p[0].decision),
            (&[Action::Sub][..], Decision::Deny)
        );
        assert!(
            run(
                AclCommand::PutAcl {
                    subject: "User:nobody".into(),
                    entries: vec![entry("*", &[Action::All], &[], Decision::Allow)]
                },
                &mut users,
                &mut acls
            )
            .is_err(),
            "a policy needs its user"
        );
        let del = |r: Option<&str>| AclCommand::DeleteAcl {
            subject: "User:alice".into(),
            resource: r.map(|r| Resource::parse(r).unwrap()),
        };
        assert!(run(del(Some("Topic:x")), &mut users, &mut acls).is_err());
        run(del(Some("Topic:t")), &mut users, &mut acls).unwrap();
        assert_eq!(acls["User:alice"].len(), 1);
        run(
            AclCommand::UpdateUser {
                name: "alice".into(),
                password: None,
                user_type: None,
                status: Some(UserStatus::Disable),
            },
            &mut users,
            &mut acls,
        )
        .unwrap();
        assert_eq!(users["alice"].status, UserStatus::Disable);
        run(AclCommand::DeleteUser { name: "alice".into() }, &mut users, &mut acls).unwrap();
        assert!(!acls.contains_key("User:alice"), "a deleted user's policy goes with it");
        assert!(run(del(None), &mut users, &mut acls).is_err());
        assert!(
            run(
                AclCommand::CreateUser(User {
                    password: "short".into(),
                    ..user("bob")
                }),
                &mut users,
                &mut acls
            )
            .is_err()
        );
    }
}
