//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on a bound
//! listener, answering with whatever `render` returns (text format 0.0.4).
//! Anything else is a 404. HTTP/1.1 only; one small response per request.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Produces the metrics text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `/metrics` on `listener` until `stop` turns true.
pub fn spawn(listener: TcpListener, render: Render, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("metrics listener: {e}");
                        continue;
                    }
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            let render = render.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let render = render.clone();
                    async move { Ok::<_, Infallible>(answer(&req, &render)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
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
