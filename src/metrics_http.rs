//! The HTTP port of brokers and NameServers, for Prometheus and for
//! orchestrators (HTTP/1.1 only; one small response per request):
//!
//! | request        | answer                                                     |
//! |----------------|------------------------------------------------------------|
//! | `GET /metrics` | 200, the metrics text (Prometheus text format 0.0.4)        |
//! | `GET /healthz` | 200 `ok`: the process answers (a liveness probe)            |
//! | `GET /readyz`  | 200 and why when ready to take traffic, 503 and why not     |
//! | anything else  | 404                                                        |
//!
//! What "ready" means is the caller's [`Probes::ready`]: for a broker,
//! [`crate::broker::health::readiness`]; a NameServer is ready once it
//! serves.
//!
//! HTTPS when the process has `[tls]` (the same certificate as its other
//! ports). Bounded like every port: at most [`MAX_CONNECTIONS`] connections at once
//! (more wait to be accepted), a request's headers must arrive within
//! [`HEADER_TIMEOUT`] (so does the next one on a kept-alive connection), and
//! a failing accept (out of file descriptors) backs off instead of spinning.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use raftmq_raft::tls::conn::Conn;
use raftmq_raft::tls::{ClientAuth, Material};
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
/// Says whether the process is ready for traffic: `Ok(detail)` or
/// `Err(reason)`.
pub type Ready = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the port answers with.
#[derive(Clone)]
pub struct Probes {
    pub metrics: Render,
    pub ready: Ready,
}

/// Serves the port on `listener` until `stop` turns true; HTTPS when
/// `tls` is given (no client certificate asked for: Prometheus and probes
/// read only).
pub fn spawn(
    listener: TcpListener,
    probes: Probes,
    tls: Option<Arc<Material>>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
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
            let (probes, tls) = (probes.clone(), tls.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(stream) = Conn::accept(stream, tls.as_deref().map(|m| (m, ClientAuth::None))).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let probes = probes.clone();
                    async move { Ok::<_, Infallible>(answer(req.method(), req.uri().path(), &probes)) }
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

fn answer(method: &hyper::Method, path: &str, probes: &Probes) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if method != hyper::Method::GET {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try GET /metrics, /healthz or /readyz\n".into(),
        );
    }
    match path {
        "/metrics" => {
            let mut r = text(StatusCode::OK, (probes.metrics)());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match (probes.ready)() {
            Ok(why) => text(StatusCode::OK, format!("ready: {why}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try GET /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes(ready: bool) -> Probes {
        Probes {
            metrics: Arc::new(|| "m 1\n".to_string()),
            ready: Arc::new(move || {
                if ready {
                    Ok("leader".into())
                } else {
                    Err("no known leader".into())
                }
            }),
        }
    }

    #[test]
    fn each_path_gets_its_answer() {
        let get = hyper::Method::GET;
        assert_eq!(answer(&get, "/metrics", &probes(true)).status(), StatusCode::OK);
        assert_eq!(answer(&get, "/healthz", &probes(false)).status(), StatusCode::OK);
        assert_eq!(answer(&get, "/readyz", &probes(true)).status(), StatusCode::OK);
        assert_eq!(
            answer(&get, "/readyz", &probes(false)).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answer(&get, "/", &probes(true)).status(), StatusCode::NOT_FOUND);
        assert_eq!(
            answer(&hyper::Method::POST, "/metrics", &probes(true)).status(),
            StatusCode::NOT_FOUND
        );
    }
}
