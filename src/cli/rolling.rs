//! `raftmq cluster rolling-restart`: restarts every node of a broker group
//! one at a time, the way an operator would by hand, so the group never
//! loses its quorum and clients never wait out an election timeout.
//!
//! The command does not know how nodes run (systemd, a container, a shell):
//! `--exec` restarts one, with `{node}` and `{group}` replaced, e.g.
//! `systemctl restart raftmq-broker@node{node}`. In order:
//!
//! 1. Every member must be ready (it answers, knows a leader and has applied
//!    what the leader had committed) before anything is restarted: a
//!    restart beside a node that is already down would leave no quorum.
//! 2. Followers first, lowest id first: run `--exec`, then wait until the
//!    node answers again and has caught up.
//! 3. The leader last: leadership moves to the most caught-up follower
//!    first (a stopping leader would also hand over on SIGTERM; doing it
//!    here makes it visible and bounded), then it is restarted like the
//!    others.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::connect::{group_endpoints, node_status};
use crate::proto::pb;

#[derive(Debug, clap::Args)]
pub struct RollingArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// The broker group.
    #[arg(long)]
    pub broker: String,
    /// Restarts one node and returns when it has (a shell command; `{node}`
    /// is the node id, `{group}` the group), e.g.
    /// 'systemctl restart raftmq-broker@node{node}'.
    #[arg(long)]
    pub exec: String,
    /// How long each node may take to come back and catch up.
    #[arg(long, default_value = "120s", value_parser = crate::cli::produce::parse_duration)]
    pub timeout: Duration,
}

/// A member of the group and where it answers.
struct Member {
    id: u64,
    client_addr: String,
}

/// The group's voters (from a node's replicated membership) and its leader.
async fn members(namesrv: &str, group: &str) -> anyhow::Result<(Vec<Member>, u64)> {
    let (_, addr) = group_endpoints(namesrv, Some(group))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no broker group named {group}"))?;
    let s = node_status(&addr)
        .await
        .ok_or_else(|| anyhow::anyhow!("group {group}: its node at {addr} does not answer"))?;
    let leader = s
        .leader_id
        .ok_or_else(|| anyhow::anyhow!("group {group} has no leader now; restart nothing until it has"))?;
    let members = s
        .members
        .into_iter()
        .filter(|m| m.voter)
        .map(|m| Member {
            id: m.node_id,
            client_addr: m.client_addr,
        })
        .collect();
    Ok((members, leader))
}

/// Waits until node `m` answers, follows or leads a leader, and has applied
/// everything its leader had committed when the node answered.
async fn wait_ready(m: &Member, within: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut target = None;
    loop {
        if let Some(s) = node_status(&m.client_addr).await
            && let Some(leader) = s.leader_id
        {
            let goal = match target {
                Some(t) => t,
                None => {
                    let leader_commit = if leader == s.node_id {
                        Some(s.commit_index)
                    } else {
                        let addr = s.members.iter().find(|x| x.node_id == leader).map(|x| &x.client_addr);
                        match addr {
                            Some(a) => node_status(a).await.map(|l| l.commit_index),
                            None => None,
                        }
                    };
                    target = leader_commit;
                    leader_commit.unwrap_or(u64::MAX)
                }
            };
            if s.applied_index >= goal {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > within {
            bail!(
                "node {} ({}) did not come back and catch up within {within:?}",
                m.id,
                m.client_addr
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `--exec` for node `id`; its output goes to ours.
async fn restart(exec: &str, group: &str, id: u64) -> anyhow::Result<()> {
    let cmd = exec.replace("{node}", &id.to_string()).replace("{group}", group);
    println!("node {id}: {cmd}");
    let run = cmd.clone();
    let status = tokio::task::spawn_blocking(move || std::process::Command::new("sh").args(["-c", &run]).status())
        .await?
        .context("cannot run sh")?;
    if !status.success() {
        bail!("node {id}: `{cmd}` failed ({status}); stopped before the next node");
    }
    Ok(())
}

pub async fn run(a: RollingArgs) -> anyhow::Result<()> {
    let (members, leader) = members(&a.namesrv, &a.broker).await?;
    for m in &members {
        wait_ready(m, Duration::from_secs(5))
            .await
            .with_context(|| format!("group {} is not healthy; restarting nothing", a.broker))?;
    }
    let started = Instant::now();
    let followers = members.iter().filter(|m| m.id != leader);
    for m in followers {
        restart(&a.exec, &a.broker, m.id).await?;
        let took = wait_ready(m, a.timeout).await?;
        println!("node {}: back and caught up ({:.1} s)", m.id, took.as_secs_f64());
    }
    let Some(old) = members.iter().find(|m| m.id == leader) else {
        bail!("the leader, node {leader}, is not a voter of group {}", a.broker);
    };
    if members.len() > 1 {
        hand_over(&members, old).await?;
    }
    restart(&a.exec, &a.broker, old.id).await?;
    let took = wait_ready(old, a.timeout).await?;
    println!("node {}: back and caught up ({:.1} s)", old.id, took.as_secs_f64());
    println!(
        "broker group {}: {} nodes restarted in {:.1} s",
        a.broker,
        members.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Moves leadership from `old` to the follower that has applied the most,
/// and waits (10 s at most) until it leads.
async fn hand_over(members: &[Member], old: &Member) -> anyhow::Result<()> {
    let mut best: Option<(u64, &Member)> = None;
    for m in members.iter().filter(|m| m.id != old.id) {
        if let Some(s) = node_status(&m.client_addr).await
            && best.is_none_or(|(applied, _)| s.applied_index > applied)
        {
            best = Some((s.applied_index, m));
        }
    }
    let (_, to) = best.ok_or_else(|| anyhow::anyhow!("no follower answers; the leader is not restarted"))?;
    crate::cli::connect::broker(&old.client_addr)?
        .transfer_leader(pb::TransferLeaderToRequest { node_id: to.id })
        .await
        .map_err(|s| anyhow::anyhow!("moving leadership to node {}: {}", to.id, s.message()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if node_status(&to.client_addr).await.is_some_and(|s| s.role == "leader") {
            println!("node {}: leads now (was node {})", to.id, old.id);
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {} did not take over leadership within 10 s", to.id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
