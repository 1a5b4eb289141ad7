//! Which CommitLog segments to delete, by age and disk-use watermarks.
//!
//! The rules are RocketMQ's. [`plan`] is pure: it is given the segment list
//! (from the CommitLog), the disk usage, the time and the local hour, and it
//! returns a [`RetentionPlan`]; the caller deletes and logs. The two probes
//! ([`Clock`], [`DiskProbe`]) are traits so tests can fake them.
//!
//! A segment is *expired* when its last write is at least
//! `file_reserved_hours` old (`last_modified + reserved <= now`).
//!
//! | disk use (`used / total`)        | what happens                                                   | [`Reason`]          |
//! |----------------------------------|----------------------------------------------------------------|---------------------|
//! | `< disk_warn_ratio` (75 %)       | the leading run of expired segments goes, only at `delete_when_hour` (4 h local) | [`Reason::Expired`] |
//! | `>= disk_warn_ratio` (75 %)      | the leading run of expired segments goes, at any hour          | [`Reason::ExpiredDiskWarn`] |
//! | `>= disk_force_ratio` (85 %)     | also the oldest segments, expired or not, until usage is back under 85 % (at least one) | [`Reason::DiskForce`] |
//! | `>= disk_refuse_ratio` (90 %)    | as above (when force is not higher), and [`RetentionPlan::refuse_writes`]: the log is marked full, and the broker refuses new sends | [`Reason::DiskForce`] |
//!
//! Whatever the rule, deletion is always a prefix ("every segment before
//! offset X"), and it never takes
//! - the newest (active) segment, even if it is expired or the disk is full;
//! - a segment holding any offset at or above the caller's `limit` (the
//!   offset below which the Raft layer has snapshotted/applied), i.e. a
//!   segment is deletable only if `end <= limit`.
//!
//! The number of segments the force rule deletes is computed from bytes:
//! `used - round(total * disk_force_ratio)` bytes must be freed, and the
//! oldest segments are counted (by their size, `end - start`) until that many
//! bytes are covered. When both the expiry rule and the force rule apply, the
//! longer prefix wins.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::RetentionConfig;
use crate::error::{Result, StoreError};

const MS_PER_HOUR: u64 = 3_600_000;

/// Wall clock and local hour, injectable so tests are deterministic.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// The local hour of the day (0-23) at `at_ms` (milliseconds since the
    /// Unix epoch).
    fn local_hour(&self, at_ms: u64) -> u8;
}

/// The host's clock and time zone.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 is a broken host; treat it as the epoch.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Uses `localtime_r`, which reads the time zone (`TZ`, else
    /// `/etc/localtime`) the first time it is needed. Falls back to the UTC
    /// hour if the conversion fails.
    fn local_hour(&self, at_ms: u64) -> u8 {
        let utc_hour = ((at_ms / MS_PER_HOUR) % 24) as u8;
        let Ok(secs) = libc::time_t::try_from(at_ms / 1000) else {
            return utc_hour;
        };
        // SAFETY: `tm` is plain old data, so all-zero is a valid value.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the duration of the call (a
        // local and a stack value) and do not alias. `localtime_r` is the
        // re-entrant variant: it writes only into `tm`, not into a shared
        // static buffer. (Like every libc time-zone function it reads the
        // environment; the store never calls `setenv`.)
        let res = unsafe { libc::localtime_r(&secs, &mut tm) };
        if res.is_null() || !(0..24).contains(&tm.tm_hour) {
            return utc_hour;
        }
        tm.tm_hour as u8
    }
}

/// Bytes of the file system holding the store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskUsage {
    pub total_bytes: u64,
    pub used_bytes: u64,
}

impl DiskUsage {
    /// `used / total`, 0 when `total` is 0.
    pub fn ratio(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            self.used_bytes as f64 / self.total_bytes as f64
        }
    }
}

/// Disk usage of the file system holding the store, injectable.
pub trait DiskProbe: Send + Sync {
    fn usage(&self, path: &Path) -> Result<DiskUsage>;
}

/// [`DiskProbe`] backed by `statvfs(3)`.
///
/// Counts like `df`: `total = f_blocks * f_frsize` and
/// `used = (f_blocks - f_bavail) * f_frsize`, so blocks reserved for root
/// count as used (the broker cannot write into them).
#[derive(Debug, Clone, Copy, Default)]
pub struct StatvfsProbe;

impl DiskProbe for StatvfsProbe {
    // `u64::from`: the `statvfs` fields are `u64` here but narrower on some
    // 32-bit targets.
    #[allow(clippy::useless_conversion)]
    fn usage(&self, path: &Path) -> Result<DiskUsage> {
        let io_err = |source: io::Error| StoreError::Io {
            path: path.to_path_buf(),
            source,
        };
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io_err(io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte")))?;
        // SAFETY: `statvfs` is plain old data, so all-zero is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c_path` is a NUL-terminated string alive for the call and
        // `st` is a valid, exclusively borrowed out-parameter.
        let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
        if rc != 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        let frsize = u64::from(st.f_frsize);
        let blocks = u64::from(st.f_blocks);
        let avail = u64::from(st.f_bavail);
        Ok(DiskUsage {
            total_bytes: blocks.saturating_mul(frsize),
            used_bytes: blocks.saturating_sub(avail).saturating_mul(frsize),
        })
    }
}

/// One CommitLog segment as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First offset of the segment (its file name).
    pub start: u64,
    /// `start + segment size`.
    pub end: u64,
    /// Last write, in milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
}

/// Which rule decided a [`RetentionPlan`], for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Nothing is deleted.
    Nothing,
    /// Expired segments, at the configured hour.
    Expired,
    /// Expired segments, at any hour because disk use is past the warn ratio.
    ExpiredDiskWarn,
    /// The oldest segments, expired or not, because disk use is past the
    /// force ratio.
    DiskForce,
}

impl Reason {
    /// A stable lower-case name, e.g. for a metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Nothing => "nothing",
            Reason::Expired => "expired",
            Reason::ExpiredDiskWarn => "expired_disk_warn",
            Reason::DiskForce => "disk_force",
        }
    }
}

/// What [`plan`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionPlan {
    /// Delete every segment with `end <= delete_before` (this is the start
    /// of the first kept segment); `None` = delete nothing.
    pub delete_before: Option<u64>,
    /// How many leading segments that is.
    pub segments_to_delete: usize,
    /// Disk use is at or past `disk_refuse_ratio`: new sends must be
    /// refused (the log is marked full, see `CommitLog::disk_full`).
    pub refuse_writes: bool,
    pub reason: Reason,
    /// `used / total` of the disk when planned.
    pub disk_ratio: f64,
}

/// Decides which leading segments to delete. Pure; see the module docs for
/// the rules.
///
/// `segments` must be sorted by `start` (checked in debug builds); the last
/// one is the active segment. `local_hour` is the local hour at `now_ms`.
/// Nothing holding an offset `>= limit` is deleted.
pub fn plan(
    cfg: &RetentionConfig,
    segments: &[SegmentInfo],
    usage: DiskUsage,
    now_ms: u64,
    local_hour: u8,
    limit: u64,
) -> RetentionPlan {
    debug_assert!(
        segments
            .windows(2)
            .all(|w| w[0].start < w[1].start && w[0].end <= w[1].start),
        "segments must be sorted by start and not overlap"
    );
    let disk_ratio = usage.ratio();
    let refuse_writes = disk_ratio >= cfg.disk_refuse_ratio;
    let warn = disk_ratio >= cfg.disk_warn_ratio;
    let force = disk_ratio >= cfg.disk_force_ratio;

    // The deletable prefix: never the active (last) segment, never a segment
    // reaching past `limit`.
    let candidates = &segments[..segments.len().saturating_sub(1)];
    let deletable = candidates.iter().take_while(|s| s.end <= limit).count();
    let candidates = &candidates[..deletable];

    let expired_count = if warn || local_hour == cfg.delete_when_hour {
        let reserved_ms = cfg.file_reserved_hours.saturating_mul(MS_PER_HOUR);
        candidates
            .iter()
            .take_while(|s| s.last_modified_ms.saturating_add(reserved_ms) <= now_ms)
            .count()
    } else {
        0
    };

    let force_count = if force {
        // Round: `total * ratio` in floating point can land a hair below the
        // exact byte count, which would cost a whole extra segment.
        let target_used = (usage.total_bytes as f64 * cfg.disk_force_ratio).round() as u64;
        let mut need = usage.used_bytes.saturating_sub(target_used);
        let mut count = 0;
        for s in candidates {
            // At least one, even if the ratio is exactly at the watermark.
            if count > 0 && need == 0 {
                break;
            }
            need = need.saturating_sub(s.end - s.start);
            count += 1;
        }
        count
    } else {
        0
    };

    let count = expired_count.max(force_count);
    let reason = if count == 0 {
        Reason::Nothing
    } else if force {
        Reason::DiskForce
    } else if local_hour == cfg.delete_when_hour {
        Reason::Expired
    } else {
        Reason::ExpiredDiskWarn
    };
    RetentionPlan {
        // `count < segments.len()` because the last segment is never a
        // candidate.
        delete_before: (count > 0).then(|| segments[count].start),
        segments_to_delete: count,
        refuse_writes,
        reason,
        disk_ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const HOUR: u64 = MS_PER_HOUR;
    /// A fixed "now": 1000 hours after the epoch.
    const NOW: u64 = 1000 * HOUR;

    struct FakeClock {
        now_ms: u64,
        hour: u8,
    }

    impl Clock for FakeClock {
        fn now_ms(&self) -> u64 {
            self.now_ms
        }
        fn local_hour(&self, _at_ms: u64) -> u8 {
            self.hour
        }
    }

    struct FakeDisk(DiskUsage);

    impl DiskProbe for FakeDisk {
        fn usage(&self, _path: &Path) -> Result<DiskUsage> {
            Ok(self.0)
        }
    }

    /// Usage of a 100 GiB disk at `percent` % (whole GiB).
    fn disk(percent: u64) -> FakeDisk {
        FakeDisk(DiskUsage {
            total_bytes: 100 * GIB,
            used_bytes: percent * GIB,
        })
    }

    fn clock(hour: u8) -> FakeClock {
        FakeClock { now_ms: NOW, hour }
    }

    /// 1 GiB segments; `ages_h[i]` is segment i's age in hours.
    fn segs(ages_h: &[u64]) -> Vec<SegmentInfo> {
        ages_h
            .iter()
            .enumerate()
            .map(|(i, &age)| SegmentInfo {
                start: i as u64 * GIB,
                end: (i as u64 + 1) * GIB,
                last_modified_ms: NOW - age * HOUR,
            })
            .collect()
    }

    /// Plans through the probes, as the caller will.
    fn run(segments: &[SegmentInfo], clock: &dyn Clock, probe: &dyn DiskProbe, limit: u64) -> RetentionPlan {
        let cfg = RetentionConfig::default();
        let usage = probe.usage(Path::new("/store")).unwrap();
        let now = clock.now_ms();
        plan(&cfg, segments, usage, now, clock.local_hour(now), limit)
    }

    fn assert_nothing(p: &RetentionPlan) {
        assert_eq!(p.delete_before, None, "{p:?}");
        assert_eq!(p.segments_to_delete, 0, "{p:?}");
        assert_eq!(p.reason, Reason::Nothing, "{p:?}");
    }

    #[test]
    fn nothing_expired_below_warn_deletes_nothing_at_any_hour() {
        let s = segs(&[71, 50, 10, 0]);
        for hour in 0..24 {
            for pct in [0, 50, 74] {
                let p = run(&s, &clock(hour), &disk(pct), u64::MAX);
                assert_nothing(&p);
                assert!(!p.refuse_writes);
            }
        }
    }

    #[test]
    fn expired_at_wrong_hour_below_warn_deletes_nothing() {
        let s = segs(&[100, 90, 80, 0]);
        for hour in (0..24).filter(|&h| h != 4) {
            assert_nothing(&run(&s, &clock(hour), &disk(74), u64::MAX));
        }
    }

    #[test]
    fn expired_at_delete_hour_deletes_leading_run_and_keeps_active() {
        // Segment 2 is not expired, so segment 3 (expired) must stay too.
        let s = segs(&[100, 72, 10, 90, 0]);
        let p = run(&s, &clock(4), &disk(10), u64::MAX);
        assert_eq!(p.segments_to_delete, 2);
        assert_eq!(p.delete_before, Some(2 * GIB));
        assert_eq!(p.reason, Reason::Expired);
        assert!(!p.refuse_writes);

        // All expired: everything but the active segment goes.
        let s = segs(&[100, 90, 80, 75]);
        let p = run(&s, &clock(4), &disk(10), u64::MAX);
        assert_eq!(p.segments_to_delete, 3);
        assert_eq!(p.delete_before, Some(3 * GIB));
    }

    #[test]
    fn expired_at_wrong_hour_above_warn_is_deleted() {
        let s = segs(&[100, 90, 10, 0]);
        let p = run(&s, &clock(13), &disk(75), u64::MAX);
        assert_eq!(p.segments_to_delete, 2);
        assert_eq!(p.delete_before, Some(2 * GIB));
        assert_eq!(p.reason, Reason::ExpiredDiskWarn);
        assert!(!p.refuse_writes);
    }

    #[test]
    fn force_deletes_oldest_unexpired_by_bytes_needed() {
        // 90 of 100 GiB used, 1 GiB segments: 5 must go to get to 85 %.
        let s = segs(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let p = run(&s, &clock(13), &disk(90), u64::MAX);
        assert_eq!(p.segments_to_delete, 5);
        assert_eq!(p.delete_before, Some(5 * GIB));
        assert_eq!(p.reason, Reason::DiskForce);

        // 87 %: 2 segments; exactly 85 %: still at least one.
        assert_eq!(run(&s, &clock(13), &disk(87), u64::MAX).segments_to_delete, 2);
        assert_eq!(run(&s, &clock(13), &disk(85), u64::MAX).segments_to_delete, 1);
        // Just below the force ratio and nothing expired: nothing.
        assert_nothing(&run(&s, &clock(13), &disk(84), u64::MAX));
    }

    #[test]
    fn force_uses_segment_sizes_and_longer_expired_run() {
        // 4 GiB segments: 5 GiB needed -> 2 segments.
        let s: Vec<_> = (0..5)
            .map(|i| SegmentInfo {
                start: i * 4 * GIB,
                end: (i + 1) * 4 * GIB,
                last_modified_ms: NOW,
            })
            .collect();
        let p = run(&s, &clock(13), &disk(90), u64::MAX);
        assert_eq!(p.segments_to_delete, 2);
        assert_eq!(p.delete_before, Some(8 * GIB));

        // A longer expired run than the force rule needs: all of it goes.
        let s = segs(&[100, 99, 98, 97, 96, 95, 94, 1, 0]);
        let p = run(&s, &clock(13), &disk(86), u64::MAX);
        assert_eq!(p.segments_to_delete, 7);
        assert_eq!(p.reason, Reason::DiskForce);
    }

    #[test]
    fn force_never_deletes_active_segment_or_past_limit() {
        // Needs 5, only 2 besides the active one.
        let s = segs(&[2, 1, 0]);
        let p = run(&s, &clock(13), &disk(90), u64::MAX);
        assert_eq!(p.segments_to_delete, 2);
        assert_eq!(p.delete_before, Some(2 * GIB));

        // Needs 5, but the limit lets only 3 go.
        let s = segs(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let p = run(&s, &clock(13), &disk(90), 3 * GIB);
        assert_eq!(p.segments_to_delete, 3);
        assert_eq!(p.delete_before, Some(3 * GIB));

        // Limit 0: nothing, but writes are still refused at 95 %.
        let p = run(&s, &clock(13), &disk(95), 0);
        assert_nothing(&p);
        assert!(p.refuse_writes);
    }

    #[test]
    fn refuse_writes_at_90_percent_and_still_deletes() {
        let s = segs(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let p = run(&s, &clock(13), &disk(89), u64::MAX);
        assert!(!p.refuse_writes);
        let p = run(&s, &clock(13), &disk(90), u64::MAX);
        assert!(p.refuse_writes);
        assert_eq!(p.segments_to_delete, 5);
        assert_eq!(p.reason, Reason::DiskForce);
        assert!((p.disk_ratio - 0.90).abs() < 1e-9);
    }

    #[test]
    fn single_segment_is_never_deleted() {
        let s = segs(&[1000]);
        for pct in [0, 80, 90, 100] {
            let p = run(&s, &clock(4), &disk(pct), u64::MAX);
            assert_nothing(&p);
            assert_eq!(p.refuse_writes, pct >= 90);
        }
        assert_nothing(&run(&[], &clock(4), &disk(100), u64::MAX));
    }

    #[test]
    fn limit_inside_a_segment_keeps_that_segment() {
        let s = segs(&[100, 100, 100, 100, 0]);
        // The limit falls inside segment 2: segments 0 and 1 go.
        let p = run(&s, &clock(4), &disk(10), 2 * GIB + 1);
        assert_eq!(p.segments_to_delete, 2);
        assert_eq!(p.delete_before, Some(2 * GIB));
        // A limit exactly at a segment's end lets that segment go.
        let p = run(&s, &clock(4), &disk(10), 3 * GIB);
        assert_eq!(p.segments_to_delete, 3);
        // A limit inside the first segment: nothing.
        assert_nothing(&run(&s, &clock(4), &disk(10), GIB - 1));
    }

    #[test]
    fn zero_total_disk_has_ratio_zero() {
        let u = DiskUsage {
            total_bytes: 0,
            used_bytes: 5,
        };
        assert_eq!(u.ratio(), 0.0);
        let p = run(&segs(&[1, 0]), &clock(13), &FakeDisk(u), u64::MAX);
        assert_nothing(&p);
        assert!(!p.refuse_writes);
    }

    #[test]
    fn statvfs_probe_smoke() {
        let dir = tempfile::tempdir().unwrap();
        let u = StatvfsProbe.usage(dir.path()).unwrap();
        assert!(u.total_bytes > 0, "{u:?}");
        assert!(u.used_bytes <= u.total_bytes, "{u:?}");
        assert!((0.0..=1.0).contains(&u.ratio()));

        let missing = dir.path().join("missing");
        match StatvfsProbe.usage(&missing) {
            Err(StoreError::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn system_clock_smoke() {
        let now = SystemClock.now_ms();
        assert!(now > 1_600_000_000_000);
        assert!(SystemClock.local_hour(now) < 24);
        assert!(SystemClock.local_hour(0) < 24);
    }
}
