//! The nemesis: faults scheduled from the seed, each logged in the history
//! when it starts and when it is healed.
//!
//! | fault | start | stop |
//! |---|---|---|
//! | `kill` | `kill -9` the leader or a random node | start it again |
//! | `pause` | SIGSTOP the leader or a random node | SIGCONT |
//! | `partition` | cut links: one node isolated, the leader isolated, random majority/minority halves, a ring of majorities, or a bridge (two halves both seeing one node) | remove every drop rule |
//! | `loss` | drop 20 % of the packets arriving at every node | remove the rule |
//! | `power` | `kill -9` the leader or a random node and drop every write it had not fsynced (its data directory is on `LazyFs`) | start it again |
//! | `corrupt` | `kill -9` the leader or a random node, then flip bits in or truncate one of its data files (see [`crate::corrupt`]) | start it again |
//! | `membership` | transfer leadership, or remove the leader or a random node from the group and kill it, keeping or emptying its disk (see [`crate::membership`]) | start it again, add it back |
//! | `disk-full` | fill the filesystem of the leader or a random node, to the last byte or past its write watermark (see [`crate::disk`]) | delete the filler |
//! | `clock` | skew the wall clock of the leader or a random node by ±0.1 s to ±10 min (log-uniform; the broker's `clock_offset_file`) | set it back |
//!
//! Faults come one at a time: one every `interval` on average, each held
//! for half to all of an interval. With `overlap`, membership moves run on
//! a schedule of their own beside the other faults, so a node is removed
//! or added back while another is killed, paused, cut off or damaged (the
//! mix that lost data in Redpanda and NATS); the two never pick the same
//! node, and while one holds a node the other leaves it alone. The order
//! and the targets come from the seed; when they happen depends on the
//! run, so a seed replays the same choices, not the same timing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, MetricsAddr, scrape};
use crate::history::{Call, NEMESIS, NemesisAction, OpType};
use crate::membership::{self, Undo};
use crate::recorder::Recorder;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill,
    Pause,
    Partition,
    Loss,
    Clock,
    Power,
    Corrupt,
    Membership,
    DiskFull,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Partition,
        Fault::Loss,
        Fault::Clock,
        Fault::Power,
        Fault::Corrupt,
        Fault::Membership,
        Fault::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Loss => "loss",
            Fault::Clock => "clock",
            Fault::Power => "power",
            Fault::Corrupt => "corrupt",
            Fault::Membership => "membership",
            Fault::DiskFull => "disk-full",
        }
    }

    /// Parses `kill,pause,...`, `all` or `none`.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Fault>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => out.extend(Fault::ALL),
                "none" => {}
                _ => match Fault::ALL.iter().find(|f| f.name() == part) {
                    Some(f) => out.push(*f),
                    None => bail!(
                        "unknown nemesis {part:?}: expected a comma-separated list of {}, or all, or none",
                        Fault::ALL.map(Fault::name).join(", ")
                    ),
                },
            }
        }
        out.dedup();
        Ok(out)
    }
}

/// What must be undone to heal the current fault.
enum Active {
    Killed(u64),
    Paused(u64),
    Cut,
    Skewed(u64),
    Members(Undo),
    Filled(u64),
}

impl Active {
    /// The node the fault holds, if it is on one node.
    fn node(&self) -> Option<u64> {
        match *self {
            Active::Killed(id) | Active::Paused(id) | Active::Skewed(id) | Active::Filled(id) => Some(id),
            Active::Members(Undo::Readd { id, .. }) => Some(id),
            Active::Cut | Active::Members(Undo::Nothing) => None,
        }
    }
}

pub struct Nemesis {
    pub cluster: Arc<Mutex<Cluster>>,
    pub faults: Vec<Fault>,
    pub interval: Duration,
    pub seed: u64,
    /// Membership moves on their own schedule, overlapping the others.
    pub overlap: bool,
    pub recorder: Recorder,
}

/// The nodes a running fault holds (killed, paused, removed, damaged,
/// skewed or filled), and by which fault; an overlapping fault picks among
/// the others.
#[derive(Default)]
struct Held(Mutex<Vec<(u64, Fault)>>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Fault)>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The nodes no fault holds.
    fn free(&self, n: u64) -> Vec<u64> {
        let held = self.lock();
        (1..=n).filter(|&id| held.iter().all(|&(h, _)| h != id)).collect()
    }

    /// Picks the node `fault` hits and holds it, in one step so that an
    /// overlapping fault cannot pick it meanwhile: the leader half the
    /// time (when it is free), otherwise a node drawn at random, or the
    /// next free one after it. With nothing held this draws exactly what
    /// the nemesis drew before faults could overlap, so a seed's schedule
    /// is unchanged without `--overlap`. `None` when no node is free, and
    /// to keep damage on a minority: `corrupt` only while no other fault
    /// holds a node, and no removal while a node is damaged.
    fn claim(&self, rng: &mut StdRng, leader: Option<u64>, n: u64, fault: Fault) -> Option<(u64, &'static str)> {
        let mut held = self.lock();
        let minority_rule = match fault {
            Fault::Corrupt => held.is_empty(),
            Fault::Membership => held.iter().all(|&(_, f)| f != Fault::Corrupt),
            _ => true,
        };
        if !minority_rule {
            return None;
        }
        let free = |id: u64| held.iter().all(|&(h, _)| h != id);
        let (drawn, why) = match leader {
            Some(l) if free(l) && rng.random_bool(0.5) => (l, "leader"),
            _ => (rng.random_range(1..=n), "random node"),
        };
        let id = (0..n).map(|i| (drawn - 1 + i) % n + 1).find(|&id| free(id))?;
        held.push((id, fault));
        Some((id, why))
    }

    fn release(&self, id: u64) {
        self.lock().retain(|&(h, _)| h != id);
    }
}

fn lock(c: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The node that leads (highest term among those saying so), if any
/// running node says so.
pub async fn leader(cluster: &Mutex<Cluster>) -> Option<u64> {
    let addrs: Vec<(u64, MetricsAddr)> = lock(cluster)
        .nodes
        .iter()
        .filter(|n| n.running() && !n.paused)
        .map(|n| (n.id, n.metrics_addr()))
        .collect();
    let mut best: Option<(u64, u64)> = None;
    for (id, addr) in addrs {
        if let Some(m) = scrape(&addr, Duration::from_millis(500)).await
            && m.role == "leader"
            && best.is_none_or(|(t, _)| m.term > t)
        {
            best = Some((m.term, id));
        }
    }
    best.map(|(_, id)| id)
}

impl Nemesis {
    /// Injects faults until `until`; each is healed before its schedule
    /// ends (the run heals anything left after).
    pub async fn run(self, until: Instant) -> anyhow::Result<()> {
        if self.faults.is_empty() {
            tokio::time::sleep_until(until.into()).await;
            return Ok(());
        }
        let held = Held::default();
        let rng = StdRng::seed_from_u64(self.seed ^ 0x006e_656d_6573_6973);
        let others: Vec<Fault> = self
            .faults
            .iter()
            .copied()
            .filter(|&f| f != Fault::Membership)
            .collect();
        if !self.overlap || others.is_empty() || others.len() == self.faults.len() {
            // Let the cluster settle and the workload start before the first.
            return self.schedule(&self.faults, rng, self.interval / 2, until, &held).await;
        }
        let members_rng = StdRng::seed_from_u64(self.seed ^ 0x006d_656d_6265_7273);
        // Both run to their end even if one fails, so that neither leaves
        // a fault unhealed (a removed node is added back only by its own
        // schedule).
        let (faults, members) = tokio::join!(
            self.schedule(&others, rng, self.interval / 2, until, &held),
            self.schedule(&[Fault::Membership], members_rng, self.interval, until, &held),
        );
        faults.and(members)
    }

    /// One schedule: after `first`, faults drawn from `faults` one at a
    /// time until `until`, each healed before the next.
    async fn schedule(
        &self,
        faults: &[Fault],
        mut rng: StdRng,
        first: Duration,
        until: Instant,
        held: &Held,
    ) -> anyhow::Result<()> {
        let n = lock(&self.cluster).nodes.len() as u64;
        tokio::time::sleep(first).await;
        while Instant::now() + self.interval < until {
            let fault = faults[rng.random_range(0..faults.len())];
            let started = self.start(fault, &mut rng, n, held).await;
            let Some((active, detail)) = started? else {
                tokio::time::sleep(self.interval / 2).await;
                continue;
            };
            let node = active.node();
            self.log(NemesisAction::Start, fault, &detail);
            let hold = self.interval.mul_f64(rng.random_range(0.5..=1.0));
            tokio::time::sleep(hold).await;
            let healed = match &active {
                Active::Members(undo) => membership::stop(&self.cluster, undo).await?,
                other => {
                    self.heal(other)?;
                    String::new()
                }
            };
            if let Some(id) = node {
                held.release(id);
            }
            let detail = if healed.is_empty() {
                detail
            } else {
                format!("{detail}; {healed}")
            };
            self.log(NemesisAction::Stop, fault, &detail);
            tokio::time::sleep(self.interval.mul_f64(rng.random_range(0.5..=1.0))).await;
        }
        Ok(())
    }
    /// Starts `fault`; a fault on one node holds it in `held` (released
    /// when healed). `None` when it needs a node and none is free.
    async fn start(
        &self,
        fault: Fault,
        rng: &mut StdRng,
        n: u64,
        held: &Held,
    ) -> anyhow::Result<Option<(Active, String)>> {
        // The node a fault on one node hits, held from here on.
        macro_rules! node {
            () => {
                match held.claim(rng, leader(&self.cluster).await, n, fault) {
                    Some(t) => t,
                    None => return Ok(None),
                }
            };
        }
        Ok(Some(match fault {
            Fault::Kill => {
                let (id, why) = node!();
                lock(&self.cluster).kill(id)?;
                (Active::Killed(id), format!("killed node {id} ({why})"))
            }
            Fault::Pause => {
                let (id, why) = node!();
                lock(&self.cluster).pause(id)?;
                (Active::Paused(id), format!("paused node {id} ({why})"))
            }
            Fault::Partition => {
                let l = leader(&self.cluster).await;
                let (sides, cuts, what) = partition(rng, n, l);
                let c = lock(&self.cluster);
                for &(x, y) in &cuts {
                    c.net.cut(&[x], &[y])?;
                }
                (Active::Cut, format!("{what}: {sides}"))
            }
            Fault::Loss => {
                lock(&self.cluster).net.lose(0.2)?;
                (Active::Cut, "20% of packets dropped at every node".to_string())
            }
            Fault::Power => {
                let (id, why) = node!();
                let lost = lock(&self.cluster).power_loss(id)?;
                (
                    Active::Killed(id),
                    format!(
                        "node {id} ({why}) lost power: up to {} un-fsynced bytes in {} files dropped",
                        lost.bytes, lost.files
                    ),
                )
            }
            Fault::Corrupt => {
                // Damage on one node only: a minority of any group of three
                // or more (and with `overlap`, the node a membership move
                // holds is never the one damaged).
                let (id, why) = node!();
                let damage = lock(&self.cluster).corrupt(id, rng)?;
                let what = match damage {
                    Some(d) => d.to_string(),
                    None => "no data file yet".to_string(),
                };
                (Active::Killed(id), format!("node {id} ({why}) killed, then {what}"))
            }
            Fault::Membership => {
                let l = leader(&self.cluster).await;
                let free = held.free(n);
                let (undo, what) = membership::start(&self.cluster, rng, l, n, &free, |rng| {
                    held.claim(rng, l, n, Fault::Membership)
                })
                .await?;
                (Active::Members(undo), what)
            }
            Fault::DiskFull => {
                let (id, why) = node!();
                let last_byte = rng.random_bool(0.5);
                let filled = lock(&self.cluster).fill_disk(id, last_byte)?;
                let how = if last_byte {
                    "to the last byte"
                } else {
                    "past the watermark"
                };
                (
                    Active::Filled(id),
                    format!("node {id}'s ({why}) disk filled {how}: {filled}"),
                )
            }
            Fault::Clock => {
                let (id, why) = node!();
                // Log-uniform from 100 ms to 10 min, either way.
                let magnitude = 10f64.powf(rng.random_range(2.0..=5.78)) as i64;
                let ms = if rng.random_bool(0.5) { magnitude } else { -magnitude };
                lock(&self.cluster).set_clock_offset(id, ms)?;
                (Active::Skewed(id), format!("node {id} ({why}) clock {ms:+} ms"))
            }
        }))
    }

    fn heal(&self, active: &Active) -> anyhow::Result<()> {
        let mut c = lock(&self.cluster);
        match *active {
            Active::Killed(id) => c.restart(id),
            Active::Paused(id) => c.resume(id),
            Active::Cut => c.net.heal(),
            Active::Skewed(id) => c.set_clock_offset(id, 0),
            Active::Members(_) => Ok(()),
            Active::Filled(id) => c.free_disk(id),
        }
    }

    fn log(&self, action: NemesisAction, fault: Fault, detail: &str) {
        eprintln!(
            "[{:>7.1}s] nemesis {} {}: {detail}",
            self.recorder.now() as f64 / 1e9,
            fault.name(),
            match action {
                NemesisAction::Start => "start",
                NemesisAction::Stop => "stop",
            }
        );
        self.recorder.record(
            NEMESIS,
            OpType::Ok,
            Call::Nemesis {
                action,
                fault: fault.name().to_string(),
                detail: detail.to_string(),
            },
            None,
            None,
        );
    }
}

/// Heals everything: frees filled disks, restarts killed nodes, resumes
/// paused ones, removes every drop rule.
pub fn heal_all(cluster: &Mutex<Cluster>) -> anyhow::Result<()> {
    let mut c = lock(cluster);
    // Room first: a node restarted on a full disk may not start.
    let mut freed = Ok(());
    for id in 1..=c.nodes.len() as u64 {
        freed = freed.and(c.free_disk(id));
    }
    for id in 1..=c.nodes.len() as u64 {
        c.resume(id)?;
        c.restart(id)?;
        c.set_clock_offset(id, 0)?;
    }
    c.net.heal()?;
    freed
}

/// Picks a partition: returns a description of the components, the links
/// to cut, and the kind.
fn partition(rng: &mut StdRng, n: u64, leader: Option<u64>) -> (String, Vec<(u64, u64)>, &'static str) {
    let mut nodes: Vec<u64> = (1..=n).collect();
    nodes.shuffle(rng);
    let cut_between =
        |a: &[u64], b: &[u64]| -> Vec<(u64, u64)> { a.iter().flat_map(|&x| b.iter().map(move |&y| (x, y))).collect() };
    let show = |parts: &[&[u64]]| parts.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(" | ");
    match rng.random_range(0..5) {
        0 => {
            let (one, rest) = nodes.split_at(1);
            (show(&[one, rest]), cut_between(one, rest), "one node isolated")
        }
        1 => {
            let l = leader.unwrap_or(nodes[0]);
            let rest: Vec<u64> = nodes.iter().copied().filter(|&x| x != l).collect();
            (show(&[&[l], &rest]), cut_between(&[l], &rest), "leader isolated")
        }
        2 => {
            let (minority, majority) = nodes.split_at((n as usize - 1) / 2);
            (
                show(&[minority, majority]),
                cut_between(minority, majority),
                "majority/minority halves",
            )
        }
        3 => {
            // Each node keeps its ring neighbours: every node sees a
            // majority, yet no two nodes see the same one (for n > 3).
            let mut cuts = Vec::new();
            for i in 0..nodes.len() {
                for j in i + 1..nodes.len() {
                    let d = j - i;
                    if d != 1 && d != nodes.len() - 1 {
                        cuts.push((nodes[i], nodes[j]));
                    }
                }
            }
            (format!("ring {nodes:?}"), cuts, "majorities ring")
        }
        _ => {
            // Two halves that both see one bridge node.
            let mid = nodes.len() / 2;
            let (a, rest) = nodes.split_at(mid);
            let b = &rest[1..];
            (
                format!("{a:?} | bridge {} | {b:?}", rest[0]),
                cut_between(a, b),
                "bridge",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_faults_never_claim_a_held_node() {
        let held = Held::default();
        let mut rng = StdRng::seed_from_u64(7);
        let (first, _) = held.claim(&mut rng, Some(1), 3, Fault::Kill).unwrap();
        for _ in 0..50 {
            let (second, _) = held.claim(&mut rng, Some(first), 3, Fault::Pause).unwrap();
            assert_ne!(second, first, "the held leader is not picked again");
            held.release(second);
        }
        let (second, _) = held.claim(&mut rng, None, 3, Fault::Membership).unwrap();
        let (third, _) = held.claim(&mut rng, None, 3, Fault::Clock).unwrap();
        assert_eq!(held.free(3), Vec::<u64>::new());
        assert_eq!(
            held.claim(&mut rng, Some(first), 3, Fault::Kill),
            None,
            "every node held"
        );
        let mut all = vec![first, second, third];
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3]);
        held.release(second);
        assert_eq!(held.free(3), vec![second]);
    }

    #[test]
    fn damage_stays_on_a_minority() {
        let held = Held::default();
        let mut rng = StdRng::seed_from_u64(7);
        let (removed, _) = held.claim(&mut rng, None, 3, Fault::Membership).unwrap();
        assert_eq!(
            held.claim(&mut rng, None, 3, Fault::Corrupt),
            None,
            "no damage beside a removal"
        );
        held.release(removed);
        let (damaged, _) = held.claim(&mut rng, None, 3, Fault::Corrupt).unwrap();
        assert_eq!(
            held.claim(&mut rng, None, 3, Fault::Membership),
            None,
            "no removal beside damage"
        );
        assert!(
            held.claim(&mut rng, None, 3, Fault::Kill)
                .is_some_and(|(id, _)| id != damaged)
        );
    }

    #[test]
    fn with_nothing_held_a_claim_draws_as_the_nemesis_always_did() {
        for seed in 0..20 {
            let held = Held::default();
            let (mut a, mut b) = (StdRng::seed_from_u64(seed), StdRng::seed_from_u64(seed));
            let leader = Some(seed % 3 + 1);
            let (id, _) = held.claim(&mut a, leader, 3, Fault::Kill).unwrap();
            let old = match leader {
                Some(l) if b.random_bool(0.5) => l,
                _ => b.random_range(1..=3),
            };
            assert_eq!(id, old, "seed {seed}");
            assert_eq!(a.random::<u64>(), b.random::<u64>(), "the same draws consumed");
        }
    }

    #[test]
    fn fault_lists_parse_and_reject_unknown_names() {
        assert_eq!(
            Fault::parse_list("kill,pause").unwrap(),
            vec![Fault::Kill, Fault::Pause]
        );
        assert_eq!(Fault::parse_list("all").unwrap(), Fault::ALL.to_vec());
        assert!(Fault::parse_list("none").unwrap().is_empty());
        let e = Fault::parse_list("kill,typo").unwrap_err().to_string();
        assert!(e.contains("typo") && e.contains("partition"), "{e}");
    }

    #[test]
    fn partitions_cut_only_between_distinct_nodes_and_leave_a_majority_side() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..200 {
            for n in [3u64, 5] {
                let (_, cuts, what) = partition(&mut rng, n, Some(1));
                assert!(cuts.iter().all(|&(a, b)| a != b && a <= n && b <= n), "{what}");
                if what == "leader isolated" {
                    assert!(cuts.iter().all(|&(a, _)| a == 1), "{cuts:?}");
                    assert_eq!(cuts.len() as u64, n - 1);
                }
                if what == "majorities ring" && n == 3 {
                    assert!(cuts.is_empty(), "a ring of three is complete");
                }
            }
        }
    }
}
