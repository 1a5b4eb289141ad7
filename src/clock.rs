//! The broker's wall clock: the host's time plus an offset that is zero
//! unless `clock_offset_file` names a file. That file is for fault
//! injection: the jepsen harness skews one node's clock by writing a signed
//! number of milliseconds into it, and the broker follows it within
//! [`FOLLOW_EVERY`].
//!
//! Raft's timers run on the monotonic clock and never see the offset. What
//! does see it is every time the broker stamps or compares: store times of
//! messages, pop invisibility deadlines, retention ages.
//!
//! The offset is one per process (a broker is one per process; tests that
//! run several in one process leave it at zero).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// How often the offset file is read again.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// Milliseconds since the Unix epoch, by this broker's clock.
pub fn now_ms() -> u64 {
    // A host clock before 1970 is a broken host; treat it as the epoch.
    let system = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    system.saturating_add_signed(OFFSET_MS.load(Ordering::Relaxed))
}

/// Parses the offset file's content: a signed integer of milliseconds
/// (surrounding whitespace allowed; empty means zero).
pub fn parse_offset(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    t.parse::<i64>()
        .map_err(|_| format!("{t:?} is not a signed number of milliseconds"))
}

/// Follows `path` for the life of the runtime: a missing file means no
/// offset; content that does not parse is reported once per change and
/// leaves the offset at zero.
pub fn follow_offset_file(path: PathBuf) {
    tokio::spawn(async move {
        let mut last_error = None;
        loop {
            let offset = match tokio::fs::read_to_string(&path).await {
                Ok(text) => match parse_offset(&text) {
                    Ok(ms) => {
                        last_error = None;
                        ms
                    }
                    Err(e) => {
                        if last_error.as_ref() != Some(&e) {
                            tracing::warn!(file = %path.display(), error = %e, "ignoring the clock offset file");
                            last_error = Some(e);
                        }
                        0
                    }
                },
                Err(_) => 0,
            };
            if OFFSET_MS.swap(offset, Ordering::Relaxed) != offset {
                tracing::warn!(offset_ms = offset, "the wall clock offset changed (fault injection)");
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_as_signed_milliseconds() {
        assert_eq!(parse_offset(" 30000\n"), Ok(30_000));
        assert_eq!(parse_offset("-5000"), Ok(-5_000));
        assert_eq!(parse_offset("\n"), Ok(0));
        assert!(parse_offset("+5s").unwrap_err().contains("milliseconds"));
        assert!(parse_offset("99999999999999999999").is_err());
    }

    #[test]
    fn the_clock_reads_the_host_time_without_an_offset() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let now = now_ms();
        assert!(now >= before && now < before + 60_000, "{before} {now}");
    }
}
