//! Whether a connection is in use: the calls open on it, counted by a tower
//! layer every server carries, and when the last one ended. [`crate::serve`]
//! closes a connection that has had no call open for the port's idle
//! timeout, so a client that connects and then only answers keepalive
//! pings does not hold a connection place for good.
//!
//! A call counts as open from its request until its response body is
//! dropped: a Telemetry stream or a long poll keeps its connection in use
//! for as long as it lasts.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};

/// One connection's calls: how many are open, and when the count last
/// changed (milliseconds since the connection was accepted).
#[derive(Debug)]
pub struct Activity {
    since: Instant,
    open: AtomicUsize,
    last_change_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            since: Instant::now(),
            open: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = self.since.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.last_change_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Counts a call as open until the guard is dropped.
    pub fn begin(self: &Arc<Activity>) -> OpenCall {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.touch();
        OpenCall(self.clone())
    }

    /// When the connection, idle since then, may be closed: `None` while a
    /// call is open.
    pub fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_change_ms.load(Ordering::Relaxed));
        Some(self.since + last + idle)
    }
}

/// A call open on a connection; it ends when this is dropped.
#[derive(Debug)]
pub struct OpenCall(Arc<Activity>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        // The time first, then the count (released): whoever sees the
        // count drop also sees the time it dropped at.
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::Release);
    }
}

/// What a connection's `ConnectInfo` (which tonic puts in every request's
/// extensions) tells of its calls.
pub trait WithActivity: Send + Sync + 'static {
    fn activity(&self) -> Option<&Arc<Activity>>;
}

/// The tower layer that counts calls into their connection's [`Activity`],
/// found through the connection's `ConnectInfo` `I` in the request's
/// extensions ([`crate::tls::PeerInfo`] on every raftmq port).
#[derive(Debug)]
pub struct CountCallsLayer<I>(std::marker::PhantomData<fn() -> I>);

impl<I> Default for CountCallsLayer<I> {
    fn default() -> Self {
        CountCallsLayer(std::marker::PhantomData)
    }
}

impl<I> Clone for CountCallsLayer<I> {
    fn clone(&self) -> Self {
        CountCallsLayer::default()
    }
}

impl<S, I> tower_layer::Layer<S> for CountCallsLayer<I> {
    type Service = CountCalls<S, I>;

    fn layer(&self, inner: S) -> CountCalls<S, I> {
        CountCalls(inner, std::marker::PhantomData)
    }
}

#[derive(Debug)]
pub struct CountCalls<S, I>(S, std::marker::PhantomData<fn() -> I>);

impl<S: Clone, I> Clone for CountCalls<S, I> {
    fn clone(&self) -> Self {
        CountCalls(self.0.clone(), std::marker::PhantomData)
    }
}

impl<S, I, B, RB> Service<Request<B>> for CountCalls<S, I>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
    I: WithActivity,
{
    type Response = Response<CountedBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Response<CountedBody<RB>>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let call = req
            .extensions()
            .get::<I>()
            .and_then(|p| p.activity())
            .map(|a| a.begin());
        let answer = self.0.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| CountedBody { body, _call: call }))
        })
    }
}

/// A response body that keeps its call open until it is dropped.
#[derive(Debug)]
pub struct CountedBody<B> {
    body: B,
    _call: Option<OpenCall>,
}

impl<B: http_body::Body + Unpin> http_body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_end_of_the_last_call() {
        let idle = Duration::from_secs(60);
        let a = Activity::new();
        let start = Instant::now();
        assert_eq!(
            a.idle_deadline(idle),
            Some(start + idle),
            "no call yet: idle since accepted"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        let call = a.begin();
        let other = a.begin();
        assert_eq!(a.idle_deadline(idle), None, "a call is open");
        tokio::time::sleep(Duration::from_secs(100)).await;
        drop(call);
        assert_eq!(a.idle_deadline(idle), None, "another is still open");
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(other);
        assert_eq!(a.idle_deadline(idle), Some(start + Duration::from_secs(115) + idle));
    }
}
