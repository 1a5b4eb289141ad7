//! The membership nemesis's moves, made the way an operator makes them:
//! with the `raftmq cluster` commands, through the NameServer.
//!
//! | move | start | stop |
//! |---|---|---|
//! | transfer | `transfer-leader` to another node | nothing to undo |
//! | remove, old disk | `remove-node` the leader or a follower, then `kill -9` it | start it on its old disk, `add-node` |
//! | remove, empty disk | as above, then empty its data directory | start it on the empty disk (never bootstrapping), `add-node` |
//!
//! After the run, [`read_members`] asks every node which members its
//! replicated configuration names, for the checker's `membership` check.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::Rng;
use rand::rngs::StdRng;

use crate::cluster::{CLIENT_PORT, Cli, Cluster, GROUP, RAFT_PORT};
use crate::observations::MemberView;

/// One `raftmq cluster` command: `add-node` waits for the new learner to
/// catch up, so it gets longer than a client call.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the stop side keeps retrying `add-node` (a leader may be
/// changing hands meanwhile).
const READD_WITHIN: Duration = Duration::from_secs(60);

/// What the stop side must undo.
pub enum Undo {
    Nothing,
    /// The node was removed and killed; `wiped` when its disk was emptied.
    Readd {
        id: u64,
        wiped: bool,
    },
}

fn lock(c: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `raftmq <args>` from the harness's namespace, killed after
/// [`COMMAND_TIMEOUT`]; the error carries what it printed.
pub async fn raftmq(cli: &Cli, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::from(cli.command(args));
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
        .await
        .with_context(|| format!("`raftmq {}` did not finish in {COMMAND_TIMEOUT:?}", args.join(" ")))?
        .with_context(|| format!("running {}", cli.bin.display()))?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `raftmq cluster <verb> --namesrv <ns> --broker jepsen <args>`.
async fn cluster_command(cli: &Cli, ns: &str, verb: &str, args: &[&str]) -> anyhow::Result<String> {
    let all = [&["cluster", verb, "--namesrv", ns, "--broker", GROUP][..], args].concat();
    raftmq(cli, &all).await
}

fn cli_and_namesrv(cluster: &Mutex<Cluster>) -> (Cli, String) {
    let c = lock(cluster);
    (c.cli(), c.namesrv_addr())
}

/// Starts one move; returns what to undo and the history's description.
/// Leadership moves to a node of `free` (the nodes no other fault holds);
/// `claim` picks the node to remove and holds it for the nemesis.
pub async fn start(
    cluster: &Mutex<Cluster>,
    rng: &mut StdRng,
    leader: Option<u64>,
    n: u64,
    free: &[u64],
    claim: impl FnOnce(&mut StdRng) -> Option<(u64, &'static str)>,
) -> anyhow::Result<(Undo, String)> {
    let (cli, ns) = cli_and_namesrv(cluster);
    let move_kind = rng.random_range(0..3);
    if move_kind == 0 {
        let Some(from) = leader else {
            return Ok((Undo::Nothing, "no leader to transfer leadership from".to_string()));
        };
        if !free.iter().any(|&to| to != from) {
            return Ok((
                Undo::Nothing,
                format!("no free node to transfer leadership to from node {from}"),
            ));
        }
        // Drawn as before faults could overlap, skipping held nodes.
        let to = loop {
            let to = rng.random_range(1..=n);
            if to != from && free.contains(&to) {
                break to;
            }
        };
        let out = cluster_command(&cli, &ns, "transfer-leader", &["--to", &to.to_string()]).await;
        let what = match out {
            Ok(_) => "done".to_string(),
            Err(e) => format!("failed: {e:#}"),
        };
        return Ok((
            Undo::Nothing,
            format!("leadership from node {from} to node {to}: {what}"),
        ));
    }
    let Some((id, why)) = claim(rng) else {
        return Ok((Undo::Nothing, "no free node to remove".to_string()));
    };
    let removed = cluster_command(&cli, &ns, "remove-node", &["--node-id", &id.to_string()]).await;
    // Killed whatever the answer: a removal that failed half-way (after
    // the voter went, before the learner did) is still undone by add-node.
    // The disk is emptied only once the removal is certain: a voter that
    // forgot its vote could vote twice in one term, which no operator
    // should do and Raft does not survive.
    let wiped = move_kind == 2 && removed.is_ok();
    let mut c = lock(cluster);
    c.kill(id)?;
    if wiped {
        c.wipe(id)?;
    }
    let disk = if wiped { "disk emptied" } else { "disk kept" };
    let what = match removed {
        Ok(_) => format!("node {id} ({why}) removed, killed, {disk}"),
        Err(e) => format!("node {id} ({why}) removal failed ({e:#}), killed, {disk}"),
    };
    Ok((Undo::Readd { id, wiped }, what))
}

/// Undoes a move: starts the removed node and adds it back, retrying for
/// up to [`READD_WITHIN`]. Returns what happened, for the history.
pub async fn stop(cluster: &Mutex<Cluster>, undo: &Undo) -> anyhow::Result<String> {
    let &Undo::Readd { id, wiped } = undo else {
        return Ok(String::new());
    };
    lock(cluster).restart(id)?;
    let (cli, ns) = cli_and_namesrv(cluster);
    let ip = lock(cluster).nodes[id as usize - 1].host.ip.clone();
    let (raft_addr, client_addr) = (format!("{ip}:{RAFT_PORT}"), format!("{ip}:{CLIENT_PORT}"));
    let deadline = Instant::now() + READD_WITHIN;
    let mut tries = 0;
    loop {
        tries += 1;
        let out = cluster_command(
            &cli,
            &ns,
            "add-node",
            &[
                "--node-id",
                &id.to_string(),
                "--raft-addr",
                &raft_addr,
                "--client-addr",
                &client_addr,
            ],
        )
        .await;
        let disk = if wiped { "empty disk" } else { "old disk" };
        match out {
            Ok(_) => {
                return Ok(format!(
                    "node {id} restarted on its {disk} and added back (try {tries})"
                ));
            }
            Err(e) if Instant::now() >= deadline => {
                return Ok(format!(
                    "node {id} restarted on its {disk}; adding it back failed {tries} times, last: {e:#}"
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Every node's view of the members, from `raftmq node status`.
pub async fn read_members(cluster: &Mutex<Cluster>) -> Vec<MemberView> {
    let (cli, _) = cli_and_namesrv(cluster);
    let nodes: Vec<(u64, String)> = lock(cluster).nodes.iter().map(|n| (n.id, n.client_addr())).collect();
    let mut out = Vec::new();
    for (node, addr) in nodes {
        let view = match raftmq(&cli, &["node", "status", "--endpoint", &addr]).await {
            Ok(text) => {
                let (voters, learners) = parse_members(&text);
                MemberView {
                    node,
                    voters: Some(voters),
                    learners,
                }
            }
            Err(e) => {
                eprintln!("warning: node {node}'s members could not be read: {e:#}");
                MemberView {
                    node,
                    voters: None,
                    learners: Vec::new(),
                }
            }
        };
        out.push(view);
    }
    out
}

/// The voters and learners in `raftmq node status`'s member lines
/// (`  node 2  voter    raft ...`).
fn parse_members(text: &str) -> (Vec<u64>, Vec<u64>) {
    let (mut voters, mut learners) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|l| l.starts_with("  node ")) {
        let mut words = line.split_whitespace().skip(1);
        let (Some(id), Some(kind)) = (words.next().and_then(|w| w.parse().ok()), words.next()) else {
            continue;
        };
        match kind {
            "voter" => voters.push(id),
            "learner" => learners.push(id),
            _ => {}
        }
    }
    voters.sort_unstable();
    learners.sort_unstable();
    (voters, learners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lines_are_read_from_node_status() {
        let text = "group jepsen  node 2  role follower  term 3\n\
                    leader 1  last log 9  committed 9  applied 9\n\
                    \x20 node 3  voter    raft 10.0.0.3:9091  client 10.0.0.3:8081\n\
                    \x20 node 1  voter    raft 10.0.0.1:9091  client 10.0.0.1:8081\n\
                    \x20 node 2  learner  raft 10.0.0.2:9091  client 10.0.0.2:8081\n";
        assert_eq!(parse_members(text), (vec![1, 3], vec![2]));
    }
}
