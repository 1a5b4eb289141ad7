//! What the deduplication window costs: memory per id and time per
//! message on the apply path, for windows of a million ids.
//!
//!   cargo run --release -p raftmq-raft --example dedup_window [IDS]
//!
//! Ids are as the official clients make them (34 characters), topics of
//! 10 characters; memory is the process's anonymous resident set before
//! and after filling the window (Linux).

use std::time::Instant;

use raftmq_raft::dedup::{DedupConfig, DedupWindow, Original};

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn id(i: u64) -> String {
    format!(
        "01{:032X}",
        u128::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    )
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let cfg = DedupConfig {
        window_ms: 120_000,
        max_ids: n,
    };
    let ids: Vec<String> = (0..2 * n).map(id).collect();
    let before = rss_anon_kib();
    let mut w = DedupWindow::default();
    let t = Instant::now();
    for (i, id) in ids[..n as usize].iter().enumerate() {
        let i = i as u64;
        w.evict(&cfg, i / 100);
        assert!(w.find("TopicTest0", id).is_none());
        let at = Original {
            queue_id: (i % 8) as u32,
            queue_offset: i / 8,
            phys: i * 1100,
        };
        w.insert("TopicTest0", id, at);
    }
    let fill = t.elapsed();
    let after = rss_anon_kib();
    // Full: every new id now evicts the oldest, the steady state of a busy group.
    let t = Instant::now();
    for (i, id) in ids[n as usize..].iter().enumerate() {
        let i = n + i as u64;
        w.evict(&cfg, i / 100);
        assert!(w.find("TopicTest0", id).is_none());
        let at = Original {
            queue_id: 0,
            queue_offset: i,
            phys: i,
        };
        w.insert("TopicTest0", id, at);
    }
    let steady = t.elapsed();
    let t = Instant::now();
    let hits = ids[n as usize..]
        .iter()
        .filter(|id| w.find("TopicTest0", id).is_some())
        .count();
    let lookups = t.elapsed();
    let t = Instant::now();
    let json = serde_json::to_vec(&w).unwrap();
    let ser = t.elapsed();
    let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
    println!(
        "{n} ids: {:.0} bytes/id ({:.1} MiB), {:.0} ns/message filling, {:.0} ns/message full (evicting), \
         {:.0} ns/lookup ({hits} hits); snapshot {:.1} MiB in {:.0} ms",
        (after.saturating_sub(before) * 1024) as f64 / n as f64,
        after.saturating_sub(before) as f64 / 1024.0,
        per(fill),
        per(steady),
        per(lookups),
        json.len() as f64 / (1 << 20) as f64,
        ser.as_secs_f64() * 1e3,
    );
}
