//! The checks together: whole histories through [`check`] and [`summary`].

use super::facts::MAX_DETAIL_CHARS;
use super::report::*;
use super::*;
use crate::checker::test_support::*;
use crate::history::{Call, OpType};
use crate::history::{NEMESIS, NemesisAction};
use crate::observations::{CommitSample, ReplicaLog};

#[test]
fn a_clean_history_passes_every_check() {
    let h = clean();
    let replicas = [
        replica(1, Some(3), &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc)]),
        replica(2, Some(3), &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc)]),
        // Uncommitted and different beyond the smallest committed index.
        replica(3, None, &[(1, 1, 0xa), (2, 1, 0xb), (3, 2, 0xc), (4, 3, 0xd)]),
    ];
    let commits = [
        sample(1, 1, 0, 1),
        sample(2, 1, 0, 2),
        sample(3, 1, 1, 2),
        sample(1, 2, 0, 3),
    ];
    let r = check(&Inputs {
        ops: &h.ops,
        replicas: &replicas,
        commits: &commits,
        ..Default::default()
    });
    let names: Vec<&str> = r.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "unique-offsets",
            "no-lost-writes",
            "duplicates",
            "monotonic-consumers",
            "replicas",
            "held-messages",
            "membership",
            "availability",
            "access"
        ]
    );
    assert!(r.valid, "{}", summary(&r));
    assert!(
        r.checks
            .iter()
            .all(|c| c.passed && c.anomalies.is_empty() && c.counts.is_empty())
    );
    assert!(!result(&r, "availability").judged);
    assert_eq!((r.passed(), r.failed()), (7, 0));
    let s = summary(&r);
    assert!(s.ends_with("\n7 passed, 0 failed"), "{s}");
    assert!(s.contains("PASS unique-offsets"), "{s}");
    assert!(s.contains("INFO availability"), "{s}");
    assert!(!result(&r, "replicas").description.contains("no replica logs"));
}

#[test]
fn an_empty_history_passes_with_notes() {
    let r = H::default().check();
    assert!(r.valid, "{}", summary(&r));
    assert_eq!((r.passed(), r.failed()), (7, 0));
    let d = &result(&r, "replicas").description;
    assert!(d.contains("no replica logs were collected"), "{d}");
    assert!(d.contains("no commit-index samples were collected"), "{d}");
    assert_eq!(r.stats, Stats::default());
}

#[test]
fn malformed_histories_do_not_panic() {
    let mut h = H::default();
    // Completions without invocations, of every kind.
    h.done(1, OpType::Ok, send("k", 1, Some(0)));
    h.done(2, OpType::Ok, poll("k", "g", 0, &[(0, 1), (0, 1), (u64::MAX, 9)]));
    h.done(3, OpType::Ok, assign("k", "g", Some(u64::MAX)));
    h.done(3, OpType::Info, drain("k", 1, &[]));
    h.push(NEMESIS, OpType::Ok, send("k", 2, None));
    // A stop with no start, a start never stopped, a nemesis invoke.
    h.nemesis(NemesisAction::Stop, "pause");
    h.push(
        NEMESIS,
        OpType::Invoke,
        Call::Nemesis {
            action: NemesisAction::Start,
            fault: "kill".into(),
            detail: String::new(),
        },
    );
    h.nemesis(NemesisAction::Start, "kill");
    // A completion of another f than its invocation, and invocations
    // never completed.
    h.invoke(4, send("k", 3, None));
    h.done(4, OpType::Ok, poll("k", "g", u64::MAX, &[(u64::MAX, 3)]));
    h.invoke(5, assign("k", "g", None));
    h.invoke(6, send("k", 4, None));
    // Duplicate indexes and times going backwards.
    let mut ops = h.ops.clone();
    for op in &mut ops {
        op.index = 7;
    }
    ops[3].time = 0;
    let weird = [
        replica(1, Some(0), &[]),
        replica(2, None, &[(5, 1, 1), (5, 2, 2), (u64::MAX, 1, 1)]),
    ];
    let commits = [sample(5, 1, 3, 9), sample(5, 1, 0, 2), sample(0, 9, u32::MAX, u64::MAX)];
    for (ops, replicas, commits) in [
        (&h.ops[..], &weird[..], &commits[..]),
        (&ops[..], &weird[..], &commits[..]),
        (&ops[..], &[][..], &[][..]),
    ] {
        let r = check(&Inputs {
            ops,
            replicas,
            commits,
            ..Default::default()
        });
        let s = summary(&r);
        assert!(s.lines().last().is_some_and(|l| l.ends_with(" failed")), "{s}");
        assert_eq!(r.stats.orphans, 6, "{s}");
        assert_eq!(r.stats.pending, 3, "{s}");
        assert_eq!(r.stats.faults.len(), 1, "{s}");
        assert!(r.stats.faults[0].stop_ms.is_none());
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Results>(&json).unwrap().checks, r.checks);
    }
}

#[test]
fn a_lone_ok_send_completion_still_counts() {
    let mut h = H::default();
    h.done(1, OpType::Ok, send("k", 1, Some(0)));
    drain_all(&mut h, "k", &[(0, 2)]);
    let r = h.check();
    assert!(
        count(&r, "unique-offsets", "inconsistent-offset") == 1,
        "{}",
        summary(&r)
    );
    assert_eq!(count(&r, "no-lost-writes", "lost-write"), 3);
    assert_eq!(count(&r, "no-lost-writes", "phantom-read"), 1);
}

#[test]
fn anomalies_are_capped_per_kind_but_all_counted() {
    let mut h = H::default();
    let n = MAX_ANOMALIES_PER_KIND as u64 + 50;
    for v in 0..n {
        h.ok_send(1, "k", v, v);
    }
    drain_all(&mut h, "k", &[]);
    let r = h.check();
    let c = result(&r, "no-lost-writes");
    assert_eq!(c.counts.get("lost-write"), Some(&(3 * n)));
    assert_eq!(c.anomalies.len(), MAX_ANOMALIES_PER_KIND);
    let s = summary(&r);
    assert!(s.contains(&format!("lost-write: {}", 3 * n)), "{s}");
    assert!(s.contains(&format!("... {} more", 3 * n - 3)), "{s}");
    assert!(s.ends_with("\n6 passed, 1 failed"), "{s}");
}

#[test]
fn long_details_are_clipped() {
    let mut h = H::default();
    let key = "é".repeat(MAX_DETAIL_CHARS);
    h.ok_send(1, &key, 1, 0);
    drain_all(&mut h, &key, &[]);
    let r = h.check();
    let a = anomaly(&r, "no-lost-writes", "lost-write");
    assert!(a.detail.len() <= MAX_DETAIL_CHARS + 3 && a.detail.ends_with("..."));
}

#[test]
fn a_large_clean_history_is_checked_in_linear_time() {
    // ~100k operations: 4 keys, interleaved sends, a consumer per key
    // polling in batches and committing, faults, drains from 3 nodes.
    let mut h = H::default();
    let keys = ["k0", "k1", "k2", "k3"];
    let mut queues: Vec<Vec<(u64, u64)>> = vec![Vec::new(); keys.len()];
    for (k, key) in keys.iter().enumerate() {
        h.assign(10 + k as u64, key, "g", OpType::Ok, None);
    }
    let mut read = vec![0u64; keys.len()];
    for v in 0..20_000u64 {
        let k = (v % 4) as usize;
        let offset = queues[k].len() as u64;
        h.ok_send(v % 8, keys[k], v, offset);
        queues[k].push((offset, v));
        if v % 1000 == 0 {
            let action = if v % 2000 == 0 {
                NemesisAction::Start
            } else {
                NemesisAction::Stop
            };
            h.nemesis(action, "partition");
        }
        if v % 16 == 15 {
            for (k, key) in keys.iter().enumerate() {
                let from = read[k];
                let msgs = &queues[k][from as usize..];
                h.poll(10 + k as u64, key, "g", from, msgs);
                read[k] = queues[k].len() as u64;
                h.commit(10 + k as u64, key, "g", read[k], OpType::Ok);
            }
        }
    }
    for (k, key) in keys.iter().enumerate() {
        drain_all(&mut h, key, &queues[k]);
    }
    assert!(h.ops.len() > 50_000, "{}", h.ops.len());
    let records: Vec<(u64, u64, u32)> = (1..=20_000).map(|i| (i, 1 + i / 5000, i as u32)).collect();
    let replicas: Vec<ReplicaLog> = (1..=3).map(|n| replica(n, Some(20_000), &records)).collect();
    let commits: Vec<CommitSample> = (0..30_000).map(|i| sample(i, 1 + i % 3, 0, i)).collect();
    let started = std::time::Instant::now();
    let r = check(&Inputs {
        ops: &h.ops,
        replicas: &replicas,
        commits: &commits,
        ..Default::default()
    });
    assert!(r.valid, "{}", summary(&r));
    assert_eq!(r.stats.sends_ok, 20_000);
    assert_eq!(r.stats.faults.len(), 10);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn results_round_trip_through_json() {
    let mut h = clean();
    h.ok_send(1, "k0", 12, 2);
    let r = h.check();
    let json = serde_json::to_string_pretty(&r).unwrap();
    assert!(json.contains("\"lost-write\""), "{json}");
    let back: Results = serde_json::from_str(&json).unwrap();
    // Floats may differ in the last digit (serde_json parses fast, not exact).
    assert_eq!(
        (back.valid, &back.checks, &back.stats.faults),
        (r.valid, &r.checks, &r.stats.faults)
    );
    assert_eq!(back.stats.sends_ok, r.stats.sends_ok);
    assert!((back.stats.send_rate_per_s - r.stats.send_rate_per_s).abs() < 1e-9);
    assert_eq!((back.passed(), back.failed()), (6, 1));
}
