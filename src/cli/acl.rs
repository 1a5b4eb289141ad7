//! `raftmq user` and `raftmq acl`: ACL 2.0 users and policies, as mqadmin's
//! createUser/updateUser/deleteUser/getUser/listUser and
//! createAcl/updateAcl/deleteAcl/getAcl/listAcl. Users and policies are
//! each group's replicated state: a change goes to every group the
//! NameServer knows (or `--broker G` only), through its leader.

use anyhow::bail;
use clap::Subcommand;
use raftmq_raft::acl::{self, AclCommand, Action, Decision, PolicyEntry, Resource, User, UserStatus, UserType};

use crate::cli::connect::{broker, group_endpoints};
use crate::proto::pb;

#[derive(Debug, clap::Args)]
pub struct Target {
    /// NameServers (host:port, separated by `,` or `;`) that know the groups.
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// Only this broker group (default: every group the NameServer knows).
    #[arg(long)]
    broker: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// A new user (mqadmin createUser).
    Create {
        #[command(flatten)]
        target: Target,
        /// The user name: its access key.
        #[arg(long, short = 'u')]
        username: String,
        /// Its secret key.
        #[arg(long, short = 'p')]
        password: String,
        /// Super (passes every check) or Normal.
        #[arg(long, short = 't', default_value = "Normal")]
        user_type: String,
    },
    /// Changes a user's secret key, type or status (mqadmin updateUser).
    Update {
        #[command(flatten)]
        target: Target,
        /// The user to change.
        #[arg(long, short = 'u')]
        username: String,
        /// A new secret key.
        #[arg(long, short = 'p')]
        password: Option<String>,
        /// Super or Normal.
        #[arg(long, short = 't')]
        user_type: Option<String>,
        /// enable or disable.
        #[arg(long, short = 's')]
        status: Option<String>,
    },
    /// Removes a user and its policy (mqadmin deleteUser).
    Delete {
        #[command(flatten)]
        target: Target,
        /// The user name.
        #[arg(long, short = 'u')]
        username: String,
    },
    /// One user (mqadmin getUser); secret keys are never shown.
    Get {
        #[command(flatten)]
        target: Target,
        /// The user name.
        #[arg(long, short = 'u')]
        username: String,
    },
    /// Every user, or those whose name contains the filter (mqadmin listUser).
    List {
        #[command(flatten)]
        target: Target,
        /// Only names containing this.
        #[arg(long, short = 'f')]
        filter: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    target: Target,
    /// User:<name>
    #[arg(long, short = 's')]
    subject: String,
    /// Comma-separated: `*`, `Topic:t`, `Topic:order-*`, `Group:g`, `Cluster:c`, `Namespace:n`.
    #[arg(long, short = 'r')]
    resources: String,
    /// Comma-separated: All, Pub, Sub, Create, Update, Delete, Get, List.
    #[arg(long, short = 'a')]
    actions: String,
    /// Allow or Deny.
    #[arg(long, short = 'd')]
    decision: String,
    /// Comma-separated addresses or CIDR ranges the entries hold for
    /// (default: any).
    #[arg(long, short = 'i')]
    source_ips: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AclCommandLine {
    /// Adds entries to a user's policy, one per resource; an entry for a
    /// resource already there is replaced (mqadmin createAcl).
    Create(PolicyArgs),
    /// The same as create (mqadmin updateAcl).
    Update(PolicyArgs),
    /// Removes the entry for one resource, or the whole policy (mqadmin deleteAcl).
    Delete {
        #[command(flatten)]
        target: Target,
        /// User:<name>
        #[arg(long, short = 's')]
        subject: String,
        /// The one resource whose entry goes (default: the whole policy).
        #[arg(long, short = 'r')]
        resource: Option<String>,
    },
    /// One subject's policy (mqadmin getAcl).
    Get {
        #[command(flatten)]
        target: Target,
        /// User:<name>
        #[arg(long, short = 's')]
        subject: String,
    },
    /// Every policy, or those whose subject or a resource contains the
    /// filters (mqadmin listAcl).
    List {
        #[command(flatten)]
        target: Target,
        /// Only subjects containing this.
        #[arg(long, short = 's')]
        subject: Option<String>,
        /// Only entries whose resource contains this.
        #[arg(long, short = 'r')]
        resource: Option<String>,
    },
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| parse(x).map_err(anyhow::Error::msg))
        .collect()
}

/// Sends `cmd` to every targeted group; says what each answered.
async fn change(t: &Target, cmd: AclCommand) -> anyhow::Result<()> {
    cmd.check().map_err(anyhow::Error::msg)?;
    let json = serde_json::to_string(&cmd)?;
    let mut failed = 0;
    for (group, addr) in group_endpoints(&t.namesrv, t.broker.as_deref()).await? {
        let r = broker(&addr)?
            .change_acl(pb::ChangeAclRequest {
                command_json: json.clone(),
            })
            .await;
        match r {
            Ok(_) => println!("{group}: done"),
            Err(s) => {
                failed += 1;
                println!("{group}: {}", s.message());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} group(s) refused the change");
    }
    Ok(())
}

/// The users and policies of every targeted group, by group.
async fn read(t: &Target) -> anyhow::Result<Vec<(String, pb::ReadAclResponse)>> {
    let mut out = Vec::new();
    for (group, addr) in group_endpoints(&t.namesrv, t.broker.as_deref()).await? {
        let r = broker(&addr)?
            .read_acl(pb::ReadAclRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("{group}: {}", s.message()))?;
        out.push((group, r.into_inner()));
    }
    Ok(out)
}

pub async fn run_user(cmd: UserCommand) -> anyhow::Result<()> {
    match cmd {
        UserCommand::Create {
            target,
            username,
            password,
            user_type,
        } => {
            let user = User {
                name: username,
                password,
                user_type: UserType::parse(&user_type).map_err(anyhow::Error::msg)?,
                status: UserStatus::Enable,
            };
            change(&target, AclCommand::CreateUser(user)).await
        }
        UserCommand::Update {
            target,
            username,
            password,
            user_type,
            status,
        } => {
            if password.is_none() && user_type.is_none() && status.is_none() {
                bail!("nothing to change: give --password, --user-type or --status");
            }
            let cmd = AclCommand::UpdateUser {
                name: username,
                password,
                user_type: user_type
                    .map(|t| UserType::parse(&t))
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
                status: status
                    .map(|s| UserStatus::parse(&s))
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
            };
            change(&target, cmd).await
        }
        UserCommand::Delete { target, username } => change(&target, AclCommand::DeleteUser { name: username }).await,
        UserCommand::Get { target, username } => show_users(&target, |u| u == username, true).await,
        UserCommand::List { target, filter } => {
            show_users(&target, |u| filter.as_deref().is_none_or(|f| u.contains(f)), false).await
        }
    }
}

async fn show_users(t: &Target, keep: impl Fn(&str) -> bool, must_exist: bool) -> anyhow::Result<()> {
    let mut found = false;
    for (group, r) in read(t).await? {
        for u in r.users.iter().filter(|u| keep(&u.name)) {
            found = true;
            println!("{group}\t{}\t{}\t{}", u.name, u.user_type, u.status);
        }
    }
    if must_exist && !found {
        bail!("no such user");
    }
    Ok(())
}

fn entries(a: &PolicyArgs) -> anyhow::Result<Vec<PolicyEntry>> {
    let actions = list(&a.actions, Action::parse)?;
    let decision = Decision::parse(&a.decision).map_err(anyhow::Error::msg)?;
    let source_ips: Vec<String> = a
        .source_ips
        .as_deref()
        .map(|s| list(s, |x| Ok(x.to_string())))
        .transpose()?
        .unwrap_or_default();
    Ok(list(&a.resources, Resource::parse)?
        .into_iter()
        .map(|resource| PolicyEntry {
            resource,
            actions: actions.clone(),
            source_ips: source_ips.clone(),
            decision,
        })
        .collect())
}

pub async fn run_acl(cmd: AclCommandLine) -> anyhow::Result<()> {
    match cmd {
        AclCommandLine::Create(a) | AclCommandLine::Update(a) => {
            let cmd = AclCommand::PutAcl {
                subject: a.subject.clone(),
                entries: entries(&a)?,
            };
            change(&a.target, cmd).await
        }
        AclCommandLine::Delete {
            target,
            subject,
            resource,
        } => {
            let resource = resource
                .map(|r| Resource::parse(&r))
                .transpose()
                .map_err(anyhow::Error::msg)?;
            change(&target, AclCommand::DeleteAcl { subject, resource }).await
        }
        AclCommandLine::Get { target, subject } => {
            let user = acl::user_of(&subject).map_err(anyhow::Error::msg)?;
            let subject = acl::subject_of(user);
            show_policies(&target, |s, _| s == subject, true).await
        }
        AclCommandLine::List {
            target,
            subject,
            resource,
        } => {
            let keep = |s: &str, e: &pb::AclEntry| {
                subject.as_deref().is_none_or(|f| s.contains(f))
                    && resource.as_deref().is_none_or(|f| e.resource.contains(f))
            };
            show_policies(&target, keep, false).await
        }
    }
}

async fn show_policies(t: &Target, keep: impl Fn(&str, &pb::AclEntry) -> bool, must_exist: bool) -> anyhow::Result<()> {
    let mut found = false;
    for (group, r) in read(t).await? {
        for p in &r.policies {
            for e in p.entries.iter().filter(|e| keep(&p.subject, e)) {
                found = true;
                let ips = if e.source_ips.is_empty() {
                    "*".to_string()
                } else {
                    e.source_ips.join(",")
                };
                println!(
                    "{group}\t{}\t{}\t{}\t{}\t{}",
                    p.subject,
                    e.resource,
                    e.actions.join(","),
                    ips,
                    e.decision
                );
            }
        }
    }
    if must_exist && !found {
        bail!("no such policy");
    }
    Ok(())
}
