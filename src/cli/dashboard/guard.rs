//! What keeps other web pages away from the dashboard, which can change
//! the cluster (and, with ACL off, needs no login to):
//!
//! - **Host**: only the names the dashboard is served as (its listen
//!   address, `localhost`/`127.0.0.1`/`[::1]` with its port, and
//!   `--allowed-host`): a page of another site whose name was made to
//!   resolve to 127.0.0.1 (DNS rebinding) is refused before any handler.
//! - **Changes** (POST) must come from the dashboard's own pages: the
//!   `Origin` is this `Host`, and the browser does not call it cross-site.
//! - **Framing and scripts**: no page may frame it (clickjacking), and
//!   only its own script runs (`Content-Security-Policy`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The `Host` values the dashboard answers to, lower-case.
pub struct Hosts(Vec<String>);

impl Hosts {
    /// The names `addr` is reached by on this machine, and `extra`
    /// (`name` or `name:port`; a bare name takes the listen port).
    pub fn new(addr: SocketAddr, extra: &[String]) -> Hosts {
        let port = addr.port();
        let mut v = vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        if !addr.ip().is_unspecified() {
            v.push(addr.to_string());
        }
        for h in extra {
            let h = h.trim().to_ascii_lowercase();
            if h.contains(':') && !h.ends_with(']') {
                v.push(h);
            } else {
                v.push(format!("{h}:{port}"));
            }
        }
        Hosts(v)
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.0.contains(&host)
    }
}

/// Only the dashboard's own pages run scripts and styles; nobody frames it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

fn refuse(why: &'static str) -> Response {
    (StatusCode::FORBIDDEN, why).into_response()
}

pub async fn guard(State(hosts): State<Arc<Hosts>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !hosts.allows(host) {
        return refuse("refused: this dashboard does not answer to that host name (--allowed-host adds one)");
    }
    if req.method() == Method::POST {
        let origin_ok = match h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            None => true,
            Some(o) => o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|o| o.eq_ignore_ascii_case(host)),
        };
        let site_ok = h
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_none_or(|s| s == "same-origin" || s == "none");
        if !origin_ok || !site_ok {
            return refuse("refused: a change must come from the dashboard's own pages");
        }
    }
    let mut r = next.run(req).await;
    let out = r.headers_mut();
    out.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    out.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    out.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Same-origin requests keep their Origin (no-referrer would send "null").
    out.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_listen_port_on_loopback_names_and_the_extras() {
        let h = Hosts::new(
            "0.0.0.0:8080".parse().unwrap(),
            &["Dash.Example".into(), "proxy:443".into()],
        );
        for ok in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "dash.example:8080",
            "PROXY:443",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for no in ["0.0.0.0:8080", "evil.example:8080", "localhost:8081", "", "localhost"] {
            assert!(!h.allows(no), "{no}");
        }
        let h = Hosts::new("10.1.2.3:80".parse().unwrap(), &[]);
        assert!(h.allows("10.1.2.3:80"));
    }
}
