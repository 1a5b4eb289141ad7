//! Receives waiting on a node at once, counted per node and per client id
//! (`limits.max_long_polls`, `limits.max_long_polls_per_client`). Each
//! waiting receive is re-planned whenever something it could take
//! changes, so their number is what a node's consumption work grows with;
//! one more than the limits allow is refused at once with
//! `TOO_MANY_REQUESTS`, which the official clients retry after a back-off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

pub struct LongPolls {
    inner: Arc<Mutex<Counts>>,
    max: usize,
    max_per_client: usize,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_client: HashMap<String, usize>,
}

/// A waiting receive's place; given back when dropped.
pub struct Slot {
    inner: Arc<Mutex<Counts>>,
    client: String,
}

fn lock(m: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LongPolls {
    pub fn new(max: usize, max_per_client: usize) -> LongPolls {
        LongPolls {
            inner: Arc::default(),
            max,
            max_per_client,
        }
    }

    /// A place for one more receive of `client`, if the limits allow it.
    pub fn acquire(&self, client: &str) -> Result<Slot, BrokerError> {
        let mut c = lock(&self.inner);
        if c.total >= self.max {
            return Err(BrokerError::Refused(
                Code::TooManyRequests,
                format!(
                    "{} receives are waiting on this node, its limit (limits.max_long_polls)",
                    c.total
                ),
            ));
        }
        let mine = c.per_client.get(client).copied().unwrap_or(0);
        if mine >= self.max_per_client {
            return Err(BrokerError::Refused(
                Code::TooManyRequests,
                format!("this client has {mine} receives waiting, the limit (limits.max_long_polls_per_client)"),
            ));
        }
        c.total += 1;
        *c.per_client.entry(client.to_string()).or_default() += 1;
        Ok(Slot {
            inner: self.inner.clone(),
            client: client.to_string(),
        })
    }

    /// Receives waiting now.
    pub fn waiting(&self) -> usize {
        lock(&self.inner).total
    }

    /// Receives of `client` waiting now.
    pub fn waiting_of(&self, client: &str) -> usize {
        lock(&self.inner).per_client.get(client).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = lock(&self.inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                c.per_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_node_and_per_client_and_given_back() {
        let p = LongPolls::new(3, 2);
        let a1 = p.acquire("a").unwrap();
        let _a2 = p.acquire("a").unwrap();
        let e = p.acquire("a").err().unwrap();
        assert_eq!(e.v2_status().code, Code::TooManyRequests as i32);
        let _b1 = p.acquire("b").unwrap();
        assert!(p.acquire("c").is_err(), "the node's limit");
        drop(a1);
        assert_eq!(p.waiting(), 2);
        let _c1 = p.acquire("c").unwrap();
    }
}
