//! Serving gRPC on an already bound listener, the way every raftmq server
//! does it (Raft transport, broker, NameServer).

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::server::{Connected, Router};

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
