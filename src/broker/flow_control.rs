//! Per-client request rate (`limits.max_requests_per_client_per_s`): a
//! token bucket per client id (per address for callers that send none),
//! holding as many tokens as the rate, refilled continuously. A request
//! that finds the bucket empty is refused with `TOO_MANY_REQUESTS`,
//! RocketMQ's flow-control answer, which the official clients retry after
//! a back-off. Off (rate 0) by default.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

const SWEEP_EVERY: Duration = Duration::from_secs(1);

pub struct FlowControl {
    /// Requests per second per caller (0: no limit); changes at run time.
    rate: AtomicU32,
    /// Buckets kept at most; idle (full) ones are dropped first.
    max_buckets: usize,
    buckets: Mutex<Buckets>,
}

struct Buckets {
    by_caller: HashMap<String, Bucket>,
    /// When idle buckets were last looked for (the sweep walks them all,
    /// so it runs at most once a second however many callers arrive).
    swept: Option<Instant>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl FlowControl {
    /// `rate` requests per second per caller; 0: no limit.
    pub fn new(rate: u32, max_buckets: usize) -> FlowControl {
        FlowControl {
            rate: AtomicU32::new(rate),
            max_buckets: max_buckets.max(1),
            buckets: Mutex::new(Buckets {
                by_caller: HashMap::new(),
                swept: None,
            }),
        }
    }

    /// A new rate from the next request on (buckets keep their tokens, up
    /// to the new burst).
    pub fn set_rate(&self, rate: u32) {
        self.rate.store(rate, Ordering::Relaxed);
    }

    /// Admits one request of `caller`, or refuses it.
    pub fn admit(&self, caller: &str) -> Result<(), BrokerError> {
        self.admit_at(caller, Instant::now())
    }

    fn admit_at(&self, caller: &str, now: Instant) -> Result<(), BrokerError> {
        let rate = f64::from(self.rate.load(Ordering::Relaxed));
        if rate == 0.0 {
            return Ok(());
        }
        let mut guard = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = &mut *guard;
        if !b.by_caller.contains_key(caller) && b.by_caller.len() >= self.max_buckets {
            if b.swept.is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY) {
                b.by_caller
                    .retain(|_, k| k.tokens + now.duration_since(k.at).as_secs_f64() * rate < rate);
                b.swept = Some(now);
            }
            if b.by_caller.len() >= self.max_buckets {
                return Err(refusal("too many callers at once"));
            }
        }
        let k = b
            .by_caller
            .entry(caller.to_string())
            .or_insert(Bucket { tokens: rate, at: now });
        k.tokens = (k.tokens + now.duration_since(k.at).as_secs_f64() * rate).min(rate);
        k.at = now;
        if k.tokens < 1.0 {
            return Err(refusal(&format!(
                "more than {rate} requests per second from this client (limits.max_requests_per_client_per_s)",
            )));
        }
        k.tokens -= 1.0;
        Ok(())
    }
}

fn refusal(why: &str) -> BrokerError {
    BrokerError::Refused(Code::TooManyRequests, format!("{why}; retry later"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_up_to_the_rate_then_refills() {
        let f = FlowControl::new(10, 2);
        let t0 = Instant::now();
        for _ in 0..10 {
            f.admit_at("a", t0).unwrap();
        }
        let e = f.admit_at("a", t0).unwrap_err();
        assert_eq!(e.v2_status().code, Code::TooManyRequests as i32);
        // Others have their own bucket.
        for _ in 0..5 {
            f.admit_at("b", t0).unwrap();
        }
        // 100 ms later one token is back.
        let t1 = t0 + Duration::from_millis(100);
        f.admit_at("a", t1).unwrap();
        assert!(f.admit_at("a", t1).is_err());
        // A third caller while two buckets are busy: refused; once one is
        // idle (full again) it makes room.
        assert!(f.admit_at("c", t1).is_err());
        f.admit_at("c", t1 + Duration::from_secs(2)).unwrap();
        // Off: anything goes.
        let off = FlowControl::new(0, 1);
        for _ in 0..1000 {
            off.admit_at("x", t0).unwrap();
        }
    }

    #[test]
    fn a_rate_set_at_run_time_holds_from_the_next_request() {
        let f = FlowControl::new(0, 8);
        let t0 = Instant::now();
        f.admit_at("a", t0).unwrap();
        f.set_rate(2);
        f.admit_at("b", t0).unwrap();
        f.admit_at("b", t0).unwrap();
        assert!(f.admit_at("b", t0).is_err());
        f.set_rate(0);
        f.admit_at("b", t0).unwrap();
    }
}
