//! How raftmq's clients (forwarding, registration, route lookups, the CLI)
//! open gRPC channels: plain HTTP/2 to `host:port`, TCP_NODELAY (Nagle's
//! algorithm with delayed ACKs stalls small calls for 40 ms), and a bounded
//! connect time.

use std::time::Duration;

use tonic::Status;
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
