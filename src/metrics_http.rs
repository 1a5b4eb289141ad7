//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on a bound
//! listener, answering with whatever `render` returns (text format 0.0.4).
//! Anything else is a 404. HTTP/1.1 only; one small response per request.
//!
//! Bounded like every port: at most [`MAX_CONNECTIONS`] connections at once
//! (more wait to be accepted), a request's headers must arrive within
//! [`HEADER_TIMEOUT`] (so does the next one on a kept-alive connection), and
//! a failing accept (out of file descriptors) backs off instead of spinning.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Wait after a failed accept.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Produces the metrics text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `/metrics` on `listener` until `stop` turns true.
pub fn spawn(listener: TcpListener, render: Render, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => match s {
                    Ok(s) => s,
                    Err(_) => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("metrics listener: {e}; accepting again in {ACCEPT_BACKOFF:?}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let render = render.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let render = render.clone();
                    async move { Ok::<_, Infallible>(answer(&req, &render)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

fn answer(req: &Request<hyper::body::Incoming>, render: &Render) -> Response<Full<Bytes>> {
    let mut resp = if req.uri().path() == "/metrics" && req.method() == hyper::Method::GET {
        let mut r = Response::new(Full::new(Bytes::from(render())));
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        r
    } else {
        Response::new(Full::new(Bytes::from_static(b"not found: try GET /metrics\n")))
    };
    if req.uri().path() != "/metrics" || req.method() != hyper::Method::GET {
        *resp.status_mut() = StatusCode::NOT_FOUND;
    }
    resp
}
