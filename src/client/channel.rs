//! How raftmq's clients (forwarding, registration, route lookups, the CLI)
//! open gRPC channels: plain HTTP/2 to `host:port`, TCP_NODELAY (Nagle's
//! algorithm with delayed ACKs stalls small calls for 40 ms), and a bounded
//! connect time.

use std::time::Duration;

use tonic::transport::Endpoint;

/// An endpoint for `addr` (`host:port`, or a full `http://` URL).
pub fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, String> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(url)
        .map(|e| e.tcp_nodelay(true).connect_timeout(connect_timeout))
        .map_err(|e| format!("{addr:?} is not a host:port address: {e}"))
}
