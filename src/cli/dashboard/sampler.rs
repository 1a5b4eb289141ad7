//! The dashboard's background sampler: every `--sample-ms` it reads each
//! node's `Status` (its `rocketmq_messages_in_total` and
//! `rocketmq_messages_out_total` sums) and each broker group's
//! `GroupProgress` (consumer offsets and lag), and keeps the last
//! [`WINDOW`] samples for the charts and the consume rates. Rates are the
//! differences between two readings, as Prometheus' `rate` takes them: a
//! counter that went down (its node restarted) counts from zero. It signs
//! as the user `raftmq dashboard` was given (`--access-key`), which with ACL
//! on must be allowed to read the cluster and its groups.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::caller::{Caller, call};
use crate::proto::pb;

/// Samples kept (at the default 2 s: ten minutes).
pub const WINDOW: usize = 300;

/// One sample of the whole cluster.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub at: Instant,
    pub in_per_s: f64,
    pub out_per_s: f64,
    pub lag: u64,
}

/// A queue of a consumer group in a broker group.
type QueueKey = (String, String, String, u32);

#[derive(Default)]
struct Inner {
    samples: VecDeque<Sample>,
    /// Each node's (in, out) totals at the last sample, by (group, node).
    totals: HashMap<(String, u64), (u64, u64)>,
    /// Each queue's consumer offset at the last sample.
    offsets: HashMap<QueueKey, u64>,
    /// Consumed per second by consumer group, over the last interval.
    group_rates: HashMap<String, f64>,
    last: Option<Instant>,
    /// Why the last sample is incomplete, if it is.
    problem: Option<String>,
}

#[derive(Default)]
pub struct Charts(Mutex<Inner>);

/// How much a counter grew: all of `now` when it went back (a restart).
fn growth(before: Option<u64>, now: u64) -> u64 {
    match before {
        Some(b) if now >= b => now - b,
        Some(_) => now,
        None => 0,
    }
}

impl Charts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.lock().samples.iter().copied().collect()
    }

    pub fn group_rates(&self) -> HashMap<String, f64> {
        self.lock().group_rates.clone()
    }

    pub fn problem(&self) -> Option<String> {
        self.lock().problem.clone()
    }

    /// Folds one reading of the cluster in: node totals by (group, node),
    /// queue offsets and the total lag.
    fn record(
        &self,
        at: Instant,
        totals: HashMap<(String, u64), (u64, u64)>,
        offsets: HashMap<QueueKey, u64>,
        lag: u64,
        problem: Option<String>,
    ) {
        let mut s = self.lock();
        let secs = s.last.map_or(0.0, |l| at.duration_since(l).as_secs_f64());
        let (mut grew_in, mut grew_out) = (0, 0);
        for (node, (i, o)) in &totals {
            let before = s.totals.get(node).copied();
            grew_in += growth(before.map(|b| b.0), *i);
            grew_out += growth(before.map(|b| b.1), *o);
        }
        let mut consumed: HashMap<String, u64> = HashMap::new();
        for (key, off) in &offsets {
            let before = s.offsets.get(key).copied();
            // A reset moves an offset back: that is no consumption.
            let grew = before.map_or(0, |b| off.saturating_sub(b));
            *consumed.entry(key.1.clone()).or_default() += grew;
        }
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        s.group_rates = consumed.into_iter().map(|(g, n)| (g, per_s(n))).collect();
        if s.last.is_some() {
            let sample = Sample {
                at,
                in_per_s: per_s(grew_in),
                out_per_s: per_s(grew_out),
                lag,
            };
            s.samples.push_back(sample);
            if s.samples.len() > WINDOW {
                s.samples.pop_front();
            }
        }
        s.totals = totals;
        s.offsets = offsets;
        s.last = Some(at);
        s.problem = problem;
    }
}

/// Samples the cluster every `every` as `caller`, for as long as the
/// dashboard runs.
pub async fn sample(charts: Arc<Charts>, caller: Caller, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (totals, offsets, lag, problem) = read(&caller).await;
        charts.record(Instant::now(), totals, offsets, lag, problem);
    }
}

type Reading = (
    HashMap<(String, u64), (u64, u64)>,
    HashMap<QueueKey, u64>,
    u64,
    Option<String>,
);

async fn read(caller: &Caller) -> Reading {
    let mut problems = Vec::new();
    let mut totals = HashMap::new();
    match caller.cluster().await {
        Ok(info) => {
            let answers = futures::future::join_all(info.nodes.iter().map(|n| async move {
                let mut c = caller.broker(&n.client_addr).ok()?;
                call("status", c.status(pb::StatusRequest { with_digest: false }))
                    .await
                    .ok()
            }))
            .await;
            for (n, s) in info.nodes.iter().zip(answers) {
                match s {
                    Some(s) => {
                        totals.insert(
                            (n.group.clone(), n.node_id),
                            (s.messages_in_total, s.messages_out_total),
                        );
                    }
                    None => problems.push(format!("{} node {} did not answer", n.group, n.node_id)),
                }
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    let mut offsets = HashMap::new();
    let mut lag = 0;
    let (progress, failed) = caller.progress("").await;
    problems.extend(failed);
    for (g, q) in progress {
        lag += q.lag;
        offsets.insert((g, q.group, q.topic, q.queue), q.consumer_offset);
    }
    let problem = (!problems.is_empty()).then(|| problems.join("; "));
    (totals, offsets, lag, problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u64, o: u64) -> HashMap<(String, u64), (u64, u64)> {
        HashMap::from([(("g".to_string(), 1), (i, o))])
    }

    #[test]
    fn rates_are_differences_and_restarts_count_from_zero() {
        let c = Charts::default();
        let t0 = Instant::now();
        c.record(t0, node(100, 10), HashMap::new(), 0, None);
        assert!(c.samples().is_empty(), "the first reading only sets the base");
        c.record(t0 + Duration::from_secs(2), node(300, 50), HashMap::new(), 7, None);
        let s = c.samples()[0];
        assert_eq!((s.in_per_s, s.out_per_s, s.lag), (100.0, 20.0, 7));
        // The node restarted: its counter went back to 40.
        c.record(t0 + Duration::from_secs(4), node(40, 0), HashMap::new(), 0, None);
        assert_eq!(c.samples()[1].in_per_s, 20.0);
    }

    #[test]
    fn group_rates_ignore_resets_backwards() {
        let c = Charts::default();
        let t0 = Instant::now();
        let key = ("g".to_string(), "cg".to_string(), "T".to_string(), 0);
        c.record(t0, HashMap::new(), HashMap::from([(key.clone(), 10)]), 0, None);
        c.record(
            t0 + Duration::from_secs(1),
            HashMap::new(),
            HashMap::from([(key.clone(), 15)]),
            0,
            None,
        );
        assert_eq!(c.group_rates()["cg"], 5.0);
        c.record(
            t0 + Duration::from_secs(2),
            HashMap::new(),
            HashMap::from([(key, 0)]),
            0,
            None,
        );
        assert_eq!(c.group_rates()["cg"], 0.0);
    }
}
