//! What an operator trips over, against real broker processes: a peer
//! that is down must not flood the leader's log or spin its CPU.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Cluster, check_reads, send_retrying, wait_applied_equal};

/// CPU time (user + system) a process has used so far, from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in parentheses.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A follower that is down costs the leader next to nothing: replication
/// to it backs off instead of reconnecting as fast as connects fail, and
/// openraft's repeated warnings are logged once per window with a count.
/// (Before: ~3.6 MB of log per second and most of a core.) The follower
/// catches up when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_follower_neither_floods_the_leaders_log_nor_spins_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, "async");
    let leader = c.leader().await;
    c.create_topic("T", 1, "").await;
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    c.kill(follower);
    let pid = c.node(leader).child.as_ref().unwrap().id();
    let log = dir.path().join(format!("node{leader}.log"));
    // Let the leader notice, then measure 10 s of it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (size0, cpu0) = (std::fs::metadata(&log).unwrap().len(), cpu_secs(pid));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (size1, cpu1) = (std::fs::metadata(&log).unwrap().len(), cpu_secs(pid));
    let grown = size1 - size0;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(grown < 16 * 1024, "the leader logged {grown} bytes in 10 s:\n{text}");
    assert!(
        text.contains("were not logged in the last"),
        "the dropped repeats are counted:\n{text}"
    );
    assert!(!text.contains('\u{1b}'), "a log file carries no ANSI colour codes");
    let cpu = cpu1 - cpu0;
    // An idle debug-build leader uses about 1.2 s of CPU in 10 s; spinning
    // on reconnects (before the backoff) it used 11 s.
    assert!(
        cpu < 4.0,
        "the leader used {cpu:.2} s of CPU in 10 s with a follower down"
    );
    // The group keeps committing through the two that are up...
    let mut client = c.client(leader).await;
    let mut acked = BTreeMap::new();
    for i in 0..100u64 {
        // A loaded machine may see an election meanwhile.
        let offset = send_retrying(&mut client, 0, i).await;
        acked.insert((0, offset), i);
    }
    // ...and the follower catches up once it is back.
    c.spawn(follower);
    wait_applied_equal(&c, &[1, 2, 3]).await;
    check_reads(&c, follower, &acked, 1).await;
    c.check_alive();
}
