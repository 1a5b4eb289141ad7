//! An accepted connection, plain or TLS, and what a handler can learn of
//! the peer at its other end.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;

use super::identity::{self, NodeIdentity};
use super::material::{ClientAuth, Material};
use crate::idle::Activity;

/// A TLS handshake must finish within this time; a peer that opens a
/// connection and says nothing holds its connection slot no longer.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What tonic puts in every request's extensions for a connection served
/// by [`crate::serve`] (in place of tonic's own `TcpConnectInfo`): made
/// once per connection, so the peer's certificate is read once, not on
/// every call.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The member the peer's verified certificate names: `Ok(None)` on a
    /// plain connection, without a certificate, or with one naming no
    /// member; an error for a certificate that cannot be read as one.
    node: Arc<Result<Option<NodeIdentity>, String>>,
    /// The connection's open calls ([`crate::idle`]).
    activity: Option<Arc<Activity>>,
}

impl Default for PeerInfo {
    fn default() -> PeerInfo {
        PeerInfo {
            remote_addr: None,
            node: Arc::new(Ok(None)),
            activity: None,
        }
    }
}

impl PeerInfo {
    pub fn of<T>(r: &tonic::Request<T>) -> Option<&PeerInfo> {
        r.extensions().get::<PeerInfo>()
    }

    /// The caller's IP address, if the request came over the network.
    pub fn ip<T>(r: &tonic::Request<T>) -> Option<IpAddr> {
        PeerInfo::of(r).and_then(|p| p.remote_addr).map(|a| a.ip())
    }

    /// The member the caller's certificate names: `Ok(None)` when it
    /// showed none (or the connection is plain).
    pub fn node(&self) -> Result<Option<NodeIdentity>, String> {
        (*self.node).clone()
    }

    /// [`PeerInfo::node`] of a request's connection.
    pub fn node_of<T>(r: &tonic::Request<T>) -> Result<Option<NodeIdentity>, String> {
        PeerInfo::of(r).map_or(Ok(None), PeerInfo::node)
    }
}

/// The connection's open calls, counted by [`crate::idle::CountCallsLayer`].
impl crate::idle::WithActivity for PeerInfo {
    fn activity(&self) -> Option<&Arc<Activity>> {
        self.activity.as_ref()
    }
}

/// One accepted connection, and the calls open on it.
pub struct Conn {
    io: Io,
    activity: Arc<Activity>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Conn {
    /// Completes the TLS handshake of an accepted socket (bounded by
    /// [`HANDSHAKE_TIMEOUT`]), or passes a plain one through.
    pub async fn accept(tcp: TcpStream, tls: Option<(&Material, ClientAuth)>) -> std::io::Result<Conn> {
        let Some((material, auth)) = tls else {
            return Ok(Conn::new(Io::Plain(tcp)));
        };
        let config = material
            .current()
            .server(auth)
            .ok_or_else(|| std::io::Error::other("TLS is on but this process has no certificate to serve with"))?;
        let handshake = tokio_rustls::TlsAcceptor::from(config).accept(tcp);
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(r) => r.map(|s| Conn::new(Io::Tls(Box::new(s)))),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }

    fn new(io: Io) -> Conn {
        Conn {
            io,
            activity: Activity::new(),
        }
    }

    /// The calls open on this connection.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    fn tcp(&self) -> &TcpStream {
        match &self.io {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    /// Called once per connection; every call on it gets a copy.
    fn connect_info(&self) -> PeerInfo {
        let leaf = match &self.io {
            Io::Plain(_) => None,
            Io::Tls(s) => s.get_ref().1.peer_certificates().and_then(|c| c.first()),
        };
        PeerInfo {
            remote_addr: self.tcp().peer_addr().ok(),
            node: Arc::new(leaf.map_or(Ok(None), identity::of_cert)),
            activity: Some(self.activity.clone()),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}
