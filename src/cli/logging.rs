//! Logging of every `raftmq` process: the filter (RUST_LOG, default
//! `info,openraft=warn`), text or JSON on stderr (colour only on a
//! terminal, so log files stay plain), and [`RepeatLimit`], which keeps a
//! repeating openraft warning (a peer that is down, say) from flooding the
//! log.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use super::LogFormat;

/// How often one openraft warning (one place in its code) is logged at most.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(5);

/// Sets up logging for this process.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(RepeatLimit::start(REPEAT_WINDOW));
    match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(ansi),
            )
            .init(),
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr))
            .init(),
    }
}

/// Lets each openraft warning or error through once per window (per place
/// in openraft's code, whatever its message), and drops its repeats. A
/// background thread then logs how many were dropped, once per window, so
/// nothing goes unnoticed. Events of raftmq itself are never dropped.
pub struct RepeatLimit {
    window: Duration,
    seen: Arc<Mutex<HashMap<Identifier, Seen>>>,
}

struct Seen {
    /// When this place last got an event through.
    logged: Instant,
    /// Repeats dropped since, not yet reported.
    dropped: u64,
    /// `file:line` of the place, for the report.
    place: String,
}

impl RepeatLimit {
    /// A limit with its reporting thread.
    pub fn start(window: Duration) -> RepeatLimit {
        let limit = RepeatLimit::new(window);
        let seen = limit.seen.clone();
        let spawned = std::thread::Builder::new()
            .name("raftmq-log-repeats".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(window);
                    for (place, n) in take_dropped(&seen) {
                        tracing::warn!(
                            target: "raftmq::log",
                            dropped = n,
                            "{n} repeats of the openraft warning at {place} were not logged in the last {} s",
                            window.as_secs()
                        );
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("log repeat reports unavailable: {e}");
        }
        limit
    }

    /// A limit without the reporting thread (tests).
    pub fn new(window: Duration) -> RepeatLimit {
        RepeatLimit {
            window,
            seen: Arc::default(),
        }
    }

    /// Whether an event at this place, now, is logged.
    fn admit(&self, id: Identifier, place: impl FnOnce() -> String, now: Instant) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get_mut(&id) {
            Some(s) if now.saturating_duration_since(s.logged) < self.window => {
                s.dropped += 1;
                false
            }
            Some(s) => {
                s.logged = now;
                true
            }
            None => {
                seen.insert(
                    id,
                    Seen {
                        logged: now,
                        dropped: 0,
                        place: place(),
                    },
                );
                true
            }
        }
    }

    /// Dropped counts not yet reported, by place (for tests).
    pub fn dropped(&self) -> Vec<(String, u64)> {
        take_dropped(&self.seen)
    }
}

fn take_dropped(seen: &Mutex<HashMap<Identifier, Seen>>) -> Vec<(String, u64)> {
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out: Vec<(String, u64)> = seen
        .values_mut()
        .filter(|s| s.dropped > 0)
        .map(|s| (s.place.clone(), std::mem::take(&mut s.dropped)))
        .collect();
    out.sort();
    out
}

impl<S: Subscriber> Layer<S> for RepeatLimit {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !meta.target().starts_with("openraft") {
            return true;
        }
        let place = || {
            // From the crate's directory on ("openraft-0.10.0/src/..."), not
            // the whole path into the cargo registry.
            let file = meta.file().unwrap_or("?");
            let short = file.rfind("openraft").map_or(file, |i| &file[i..]);
            format!("{short}:{}", meta.line().unwrap_or(0))
        };
        self.admit(meta.callsite(), place, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts the events that reach it.
    struct Count(Arc<AtomicUsize>);

    impl<S: Subscriber> Layer<S> for Count {
        fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn an_openraft_warning_repeating_is_logged_once_per_window_and_counted() {
        let got = Arc::new(AtomicUsize::new(0));
        let limit = RepeatLimit::new(Duration::from_secs(3600));
        let seen = limit.seen.clone();
        let subscriber = tracing_subscriber::registry().with(limit).with(Count(got.clone()));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..1000 {
                tracing::warn!(target: "openraft::replication", "Unreachable node 2");
            }
            // Another place is limited on its own.
            tracing::warn!(target: "openraft::engine", "update progress error");
            // raftmq's own warnings and openraft's info are never limited.
            for _ in 0..10 {
                tracing::warn!(target: "raftmq::broker", "something");
                tracing::info!(target: "openraft::core", "became leader");
            }
        });
        assert_eq!(got.load(Ordering::Relaxed), 1 + 1 + 20);
        let dropped = take_dropped(&seen);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(dropped[0].1, 999);
        assert!(dropped[0].0.contains("logging.rs:"), "{dropped:?}");
        // Reported once: the count starts again.
        assert!(take_dropped(&seen).is_empty());
    }

    /// Keeps the callsite of the last event it sees.
    struct Capture(Arc<Mutex<Option<Identifier>>>);

    impl<S: Subscriber> Layer<S> for Capture {
        fn on_event(&self, e: &Event<'_>, _: Context<'_, S>) {
            *self.0.lock().unwrap() = Some(e.metadata().callsite());
        }
    }

    #[test]
    fn the_window_lets_the_next_one_through() {
        let limit = RepeatLimit::new(Duration::from_secs(5));
        let seen = Arc::new(Mutex::new(None));
        let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
        tracing::subscriber::with_default(subscriber, || tracing::warn!(target: "openraft::x", "x"));
        let id = seen.lock().unwrap().clone().expect("the event's callsite");
        let t0 = Instant::now();
        assert!(limit.admit(id.clone(), String::new, t0));
        assert!(!limit.admit(id.clone(), String::new, t0 + Duration::from_secs(4)));
        assert!(limit.admit(id.clone(), String::new, t0 + Duration::from_secs(5)));
        assert!(!limit.admit(id, String::new, t0 + Duration::from_secs(6)));
        assert_eq!(limit.dropped().iter().map(|(_, n)| n).sum::<u64>(), 2);
    }
}
