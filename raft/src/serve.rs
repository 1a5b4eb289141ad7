//! Serving gRPC on an already bound listener, the way every raftmq server
//! does it (Raft transport, broker, NameServer).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::server::{Connected, Router};

/// Pings an idle HTTP/2 connection this often, and drops it when a ping
/// goes unanswered for [`KEEPALIVE_TIMEOUT`]: a peer that vanished (power
/// loss, a cut network) does not hold its connection and streams forever.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest header block a request may carry (h2's default is 16 MiB).
pub const MAX_HEADER_LIST_SIZE: u32 = 64 << 10;
/// Streams a peer may reset before the connection is closed (h2's guards
/// against rapid-reset and MadeYouReset floods, which tonic's defaults
/// leave unset or off).
pub const MAX_PENDING_ACCEPT_RESETS: usize = 20;
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// A tonic server with the limits every raftmq port keeps: at most
/// `max_streams` concurrent streams per connection (tonic's default is
/// unlimited), HTTP/2 and TCP keepalive, a header size bound and the reset
/// flood guards.
pub fn builder(max_streams: u32) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(max_streams)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_SIZE))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
}

/// Serves `router` on `listener` until `stop` turns true.
///
/// Accepted sockets get TCP_NODELAY here: tonic's `Server::tcp_nodelay`
/// does not reach the sockets of a custom incoming stream, and without it
/// Nagle's algorithm with delayed ACKs stalls small messages for 40 ms.
pub fn spawn(
    listener: TcpListener,
    router: Router,
    stop: watch::Receiver<bool>,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    spawn_wrapped(listener, router, stop, what, |s| s)
}

/// As [`spawn`], with each accepted socket wrapped by `wrap` before tonic
/// sees it.
pub fn spawn_wrapped<IO, F>(
    listener: TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
    wrap: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(TcpStream) -> IO + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let incoming =
            tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), move |s| {
                s.and_then(|s| s.set_nodelay(true).map(|()| wrap(s)))
            });
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
            tracing::error!(error = %e, "{what} server failed");
        }
    })
}
