//! The test network: one network namespace per host (the NameServer and
//! each broker node), joined by veth pairs to a bridge in a namespace of its
//! own, with one more veth pair from the bridge to the harness's namespace so
//! the harness reaches every host (as Jepsen's control node does).
//!
//! ```text
//!   harness (root ns) 10.X.Y.254 ─┐
//!   namesrv ns        10.X.Y.10  ─┤  bridge ns: br0
//!   node i ns         10.X.Y.(10+i) ─┘
//! ```
//!
//! Faults are made inside the hosts' namespaces, so they are real packet
//! drops: a partition adds `iptables -A INPUT -s <peer> -j DROP` on both
//! sides (Jepsen's way); packet loss adds a `statistic --mode random` drop.
//! Without iptables, partitions fall back to blackhole routes (connects fail
//! at once instead of hanging) and loss is unavailable. The harness's own
//! traffic to the nodes is never cut: clients see nodes as the network
//! between nodes breaks.
//!
//! Names carry a per-run tag so runs can overlap and leftovers can be found
//! (`raftmq-jepsen clean` removes every `rmqj*` namespace).

use std::process::Command;

use anyhow::{Context, bail};

/// Prefix of every namespace and host-side interface the harness makes.
pub const PREFIX: &str = "rmqj";

/// A host of the test network.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    /// The namespace the host's processes run in.
    pub ns: String,
    pub ip: String,
}

pub struct Network {
    tag: u32,
    bridge_ns: String,
    host_if: String,
    pub harness_ip: String,
    pub namesrv: Host,
    /// Broker nodes, node id `i` at index `i - 1`.
    pub nodes: Vec<Host>,
    pub iptables: bool,
    torn_down: bool,
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..]);
    output(cmd, &args.join(" "))
}

/// Runs `cmd` (shown as `shown` in errors); its stdout, or an error with
/// its stderr.
pub fn output(mut cmd: Command, shown: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!("`{shown}` failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ns_exec(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["ip", "netns", "exec", ns];
    all.extend_from_slice(args);
    run(&all)
}

impl Network {
    /// Builds the network for `nodes` broker nodes. `tag` (0..=255) names
    /// the run's namespaces and picks its subnet, 10.201.<tag>.0/24.
    pub fn create(tag: u32, nodes: usize) -> anyhow::Result<Network> {
        let tag = tag % 256;
        let subnet = format!("10.201.{tag}");
        let bridge_ns = format!("{PREFIX}{tag}-br");
        let host = |name: &str, last: usize| Host {
            name: name.to_string(),
            ns: format!("{PREFIX}{tag}-{name}"),
            ip: format!("{subnet}.{last}"),
        };
        let mut net = Network {
            tag,
            bridge_ns: bridge_ns.clone(),
            host_if: format!("{PREFIX}{tag}h"),
            harness_ip: format!("{subnet}.254"),
            namesrv: host("ns", 10),
            nodes: (1..=nodes).map(|i| host(&format!("n{i}"), 10 + i)).collect(),
            iptables: false,
            torn_down: false,
        };
        // Leftovers of an earlier run with the same tag would collide.
        net.teardown();
        net.torn_down = false;
        net.build().context(
            "building the test network (needs root or CAP_NET_ADMIN, and iproute2; \
             `raftmq-jepsen clean` removes leftovers)",
        )?;
        net.iptables = ns_exec(&net.nodes[0].ns, &["iptables", "-L", "INPUT", "-n"]).is_ok();
        if !net.iptables {
            eprintln!(
                "warning: iptables is missing or unusable: partitions use blackhole routes, and loss is unavailable"
            );
        }
        Ok(net)
    }

    fn build(&self) -> anyhow::Result<()> {
        let br = &self.bridge_ns;
        run(&["ip", "netns", "add", br])?;
        run(&["ip", "-n", br, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", br, "link", "set", "br0", "up"])?;
        for (i, h) in std::iter::once(&self.namesrv).chain(&self.nodes).enumerate() {
            run(&["ip", "netns", "add", &h.ns])?;
            let (inner, outer) = (format!("{PREFIX}{}i{i}", self.tag), format!("{PREFIX}{}o{i}", self.tag));
            run(&["ip", "link", "add", &inner, "type", "veth", "peer", "name", &outer])?;
            run(&["ip", "link", "set", &inner, "netns", &h.ns])?;
            run(&["ip", "link", "set", &outer, "netns", br])?;
            run(&["ip", "-n", br, "link", "set", &outer, "master", "br0"])?;
            run(&["ip", "-n", br, "link", "set", &outer, "up"])?;
            run(&["ip", "-n", &h.ns, "addr", "add", &format!("{}/24", h.ip), "dev", &inner])?;
            run(&["ip", "-n", &h.ns, "link", "set", &inner, "up"])?;
            run(&["ip", "-n", &h.ns, "link", "set", "lo", "up"])?;
        }
        let outer = format!("{PREFIX}{}hb", self.tag);
        run(&[
            "ip",
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &outer,
        ])?;
        run(&["ip", "link", "set", &outer, "netns", br])?;
        run(&["ip", "-n", br, "link", "set", &outer, "master", "br0"])?;
        run(&["ip", "-n", br, "link", "set", &outer, "up"])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.harness_ip),
            "dev",
            &self.host_if,
        ])?;
        run(&["ip", "link", "set", &self.host_if, "up"])?;
        Ok(())
    }

    fn node(&self, id: u64) -> &Host {
        &self.nodes[(id as usize).saturating_sub(1).min(self.nodes.len() - 1)]
    }

    /// Cuts every link between the two sides (in both directions). Links
    /// to the NameServer and the harness stay.
    pub fn cut(&self, a: &[u64], b: &[u64]) -> anyhow::Result<()> {
        for &x in a {
            for &y in b {
                if x != y {
                    self.drop_from(x, y)?;
                    self.drop_from(y, x)?;
                }
            }
        }
        Ok(())
    }

    /// Node `at` stops hearing node `from`.
    fn drop_from(&self, at: u64, from: u64) -> anyhow::Result<()> {
        let (at, from) = (self.node(at), self.node(from));
        if self.iptables {
            ns_exec(&at.ns, &["iptables", "-A", "INPUT", "-s", &from.ip, "-j", "DROP"])?;
        } else {
            run(&[
                "ip",
                "-n",
                &at.ns,
                "route",
                "add",
                "blackhole",
                &format!("{}/32", from.ip),
            ])?;
        }
        Ok(())
    }

    /// Drops each packet arriving at every node with probability `p`.
    pub fn lose(&self, p: f64) -> anyhow::Result<()> {
        if !self.iptables {
            bail!("packet loss needs iptables in the node namespaces");
        }
        let p = format!("{:.3}", p.clamp(0.0, 1.0));
        for h in &self.nodes {
            ns_exec(
                &h.ns,
                &[
                    "iptables",
                    "-A",
                    "INPUT",
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &p,
                    "-j",
                    "DROP",
                ],
            )?;
        }
        Ok(())
    }

    /// Removes every drop rule and blackhole route.
    pub fn heal(&self) -> anyhow::Result<()> {
        for h in &self.nodes {
            if self.iptables {
                ns_exec(&h.ns, &["iptables", "-F", "INPUT"])?;
            }
            let routes = run(&["ip", "-n", &h.ns, "route", "show", "type", "blackhole"])?;
            for line in routes.lines() {
                if let Some(dst) = line.split_whitespace().nth(1) {
                    run(&["ip", "-n", &h.ns, "route", "del", "blackhole", dst])?;
                }
            }
        }
        Ok(())
    }

    /// Deletes the namespaces (their interfaces go with them). Idempotent;
    /// errors are ignored, since this also runs on the way out of a failure.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for h in std::iter::once(&self.namesrv).chain(&self.nodes) {
            let _ = run(&["ip", "netns", "del", &h.ns]);
        }
        let _ = run(&["ip", "netns", "del", &self.bridge_ns]);
        let _ = run(&["ip", "link", "del", &self.host_if]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Removes every namespace and host interface a run left behind: those
/// whose tag no running harness process has. A running test's are kept;
/// removing them would cut its cluster off mid-run.
pub fn clean_all() -> anyhow::Result<usize> {
    let live = live_tags();
    let mut n = 0;
    for line in run(&["ip", "netns", "list"])?.lines() {
        if let Some(name) = line.split_whitespace().next().filter(|n| left_behind(n, &live)) {
            run(&["ip", "netns", "del", name])?;
            n += 1;
        }
    }
    for line in run(&["ip", "-o", "link", "show"])?.lines() {
        if let Some(name) = line.split(':').nth(1).map(str::trim).and_then(|n| n.split('@').next())
            && left_behind(name, &live)
        {
            let _ = run(&["ip", "link", "del", name]);
            n += 1;
        }
    }
    Ok(n)
}

/// The tags of the runs still going: those of the other harness
/// processes (a run's tag is its process id modulo 256).
fn live_tags() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("raftmq-jepsen"))
        })
        .map(|pid| pid % 256)
        .collect()
}

/// Whether `name` is one of ours and no running harness owns its tag.
fn left_behind(name: &str, live: &[u32]) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<u32>() {
        Ok(tag) => !live.contains(&tag),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_keeps_what_a_live_run_owns() {
        let live = [120, 241];
        assert!(
            !left_behind(&format!("{PREFIX}120-n1"), &live),
            "a live run's namespace"
        );
        assert!(!left_behind(&format!("{PREFIX}241h"), &live), "a live run's interface");
        assert!(left_behind(&format!("{PREFIX}7-br"), &live), "a run long gone");
        assert!(!left_behind("eth0", &live), "not ours");
    }
}
