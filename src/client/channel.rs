//! How raftmq's clients (forwarding, registration, route lookups, the CLI)
//! open gRPC channels: HTTP/2 to `host:port`, plain or TLS (a
//! [`Dialer`]), TCP_NODELAY (Nagle's algorithm with delayed ACKs stalls
//! small calls for 40 ms), and a bounded connect time.

use std::time::Duration;

use raftmq_raft::tls::Dialer;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// An endpoint for `addr` (`host:port`, or a full `http://` URL).
pub fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, String> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{}", crate::hosts::rewrite(addr))
    };
    Endpoint::from_shared(url)
        .map(|e| e.tcp_nodelay(true).connect_timeout(connect_timeout))
        .map_err(|e| format!("{addr:?} is not a host:port address: {e}"))
}

/// A lazily connected channel for `endpoint`, made from `addr` by
/// [`endpoint`]: a TLS server must show a certificate for `addr`'s host as
/// written (not the address `RAFTMQ_HOSTS` rewrites it to).
pub fn lazy(endpoint: Endpoint, addr: &str, dialer: &Dialer) -> Channel {
    let host = tls_host(&endpoint, addr);
    dialer.channel(endpoint, &host)
}

/// As [`lazy`], connected now.
pub async fn connect(endpoint: Endpoint, addr: &str, dialer: &Dialer) -> Result<Channel, tonic::transport::Error> {
    let host = tls_host(&endpoint, addr);
    dialer.connect(endpoint, &host).await
}

/// The name a TLS server at `addr` must show a certificate for.
fn tls_host(endpoint: &Endpoint, addr: &str) -> String {
    if addr.contains("://") {
        endpoint.uri().host().unwrap_or("").to_string()
    } else {
        raftmq_raft::tls::dial::host_of(addr).to_string()
    }
}

/// `host:port` with a port number and a host name or IP (`[v6]:port`), at
/// most 261 bytes (a DNS name's 253, a colon, a port): what nodes may
/// advertise and dial.
pub fn is_host_port(a: &str) -> bool {
    match a.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && a.len() <= 261
                && port.parse::<u16>().is_ok()
                && !a.contains("://")
                && endpoint(a, Duration::from_secs(1)).is_ok()
        }
        None => false,
    }
}

/// Whether a call failed before the request left this node (the server
/// could not be reached), so it is safe to send it again.
pub fn not_delivered(s: &Status) -> bool {
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    // tonic keeps the transport error as the source: a connect error
    // means the request never left this node.
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        source = e.source();
    }
    s.message().contains("tcp connect error")
}

/// The innermost cause of an error chain ("Connection refused (os error
/// 111)"), which is what a person needs; tonic's outer layers repeat
/// "transport error" and "tcp connect error".
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// A failed call to `addr`, said so that a person knows what was reached
/// and what it is: `expected` names the service the call needed ("a
/// broker's client port", "a NameServer").
pub fn explain(addr: &str, s: &Status, expected: &str) -> String {
    match s.code() {
        // No such service at that address: something else answers there.
        tonic::Code::Unimplemented => {
            format!("{addr} answers, but not as {expected} (it does not serve the call; check the address and port)")
        }
        tonic::Code::Unavailable if not_delivered(s) => {
            let cause = std::error::Error::source(s).map_or_else(|| s.message().to_string(), root_cause);
            // rustls reading a plaintext answer.
            if cause.contains("corrupt message") {
                return format!("{addr}: the TLS handshake got no TLS answer ({cause}); does it serve plaintext?");
            }
            if cause.contains("certificate") {
                return format!("{addr}: TLS: {cause} (is --ca-cert the CA that issued the cluster's certificates?)");
            }
            format!("{addr}: nothing reachable there ({cause}); is {expected} running at that address?")
        }
        code => {
            let message = if s.message().is_empty() {
                code.description()
            } else {
                s.message()
            };
            // tonic says only "transport error"; the cause is what a person
            // can act on (a reset connection, a refused certificate).
            let said = match std::error::Error::source(s).map(root_cause) {
                Some(cause) if !message.contains(&cause) => format!("{message} ({cause})"),
                _ => message.to_string(),
            };
            // HTTP/2 spoken to a port that expects a TLS handshake first:
            // the server answers garbage or hangs up, which h2 reports in
            // several ways.
            if [
                "h2 protocol error",
                "operation was canceled",
                "connection closed",
                "broken pipe",
                "connection reset",
            ]
            .iter()
            .any(|m| said.contains(m))
            {
                return format!(
                    "{addr}: {said}; if it serves TLS, pass --ca-cert <the cluster's CA> (or set RAFTMQ_CA_CERT)"
                );
            }
            format!("{addr}: {said}")
        }
    }
}
