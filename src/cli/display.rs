//! How the commands show times to people: local date-times and ages (the
//! `--json` outputs keep epoch milliseconds).

use chrono::{Local, TimeZone};

/// Epoch milliseconds as a local date-time, `2026-12-01 20:40:01.123`.
pub fn local_time(ms: u64) -> String {
    match Local.timestamp_millis_opt(i64::try_from(ms).unwrap_or(i64::MAX)) {
        chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
            t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
        }
        chrono::LocalResult::None => format!("{ms} ms since the epoch"),
    }
}

/// A duration in milliseconds as a short age: `850 ms`, `3.2 s`, `4 min`, `2 h`.
pub fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min", ms / 60_000),
        _ => format!("{} h", ms / 3_600_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(850), "850 ms");
        assert_eq!(age(3_240), "3.2 s");
        assert_eq!(age(240_000), "4 min");
        assert_eq!(age(7_300_000), "2 h");
    }

    #[test]
    fn local_times_have_date_and_milliseconds() {
        let s = local_time(1_764_620_401_123);
        assert_eq!(s.len(), "2025-12-01 20:20:01.123".len(), "{s}");
        assert!(s.ends_with(".123"), "{s}");
        assert!(local_time(u64::MAX).contains("epoch") || !local_time(u64::MAX).is_empty());
    }
}
