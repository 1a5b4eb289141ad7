//! A lane for blocking work reached from requests: so many run at once, so
//! many more wait in line, and one more is refused at once with
//! `TOO_MANY_REQUESTS`, so callers cannot pile up without bound behind a
//! slow one. The permits are owned, so that they can go with the work onto
//! a blocking thread and be freed only when it ends, even if its caller
//! gave up.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::BrokerError;
use crate::proto::rocketmq::v2::Code;

pub struct Lane {
    /// What runs in it, for the refusal ("store scans").
    what: &'static str,
    waiting: usize,
    /// Places in line, running or waiting.
    line: Arc<Semaphore>,
    /// Places to run.
    run: Arc<Semaphore>,
}

impl Lane {
    pub fn new(what: &'static str, running: usize, waiting: usize) -> Lane {
        Lane {
            what,
            waiting,
            line: Arc::new(Semaphore::new(running + waiting)),
            run: Arc::new(Semaphore::new(running)),
        }
    }

    /// A place in line, or the refusal when the line is full.
    pub fn join(&self) -> Result<OwnedSemaphorePermit, BrokerError> {
        self.line.clone().try_acquire_owned().map_err(|_| {
            BrokerError::Refused(
                Code::TooManyRequests,
                format!("{} {} already wait on this node; retry later", self.waiting, self.what),
            )
        })
    }

    /// Waits for a place to run.
    pub async fn turn(&self) -> Result<OwnedSemaphorePermit, BrokerError> {
        self.run
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BrokerError::Unavailable("the node is shutting down".into()))
    }

    /// Runs `f` on a blocking thread once it has a place in line and then
    /// to run; refused at once when the line is full.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
    ) -> Result<T, BrokerError> {
        let in_line = self.join()?;
        let place = self.turn().await?;
        blocking(move || {
            let _held = (in_line, place);
            f()
        })
        .await
    }
}

/// Runs `f` on a blocking thread. The places it holds should go with it:
/// a caller that gives up does not free them while `f` still runs.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| match e.is_cancelled() {
            true => BrokerError::Unavailable("the node is shutting down".into()),
            false => BrokerError::Internal(format!("a read failed: {e}")),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_line_refuses_and_frees_as_places_go() {
        let lane = Lane::new("scans", 1, 1);
        let first = lane.join().unwrap();
        let running = lane.turn().await.unwrap();
        let second = lane.join().unwrap();
        let e = lane.join().unwrap_err();
        assert_eq!(e.v2_code(), Code::TooManyRequests);
        assert!(e.to_string().contains("1 scans already wait"), "{e}");
        drop((first, running));
        let _third = lane.join().unwrap();
        let _turn = lane.turn().await.unwrap();
        drop(second);
    }
}
