//! Serving gRPC on an already bound listener, the way every raftmq server
//! does it (Raft transport, broker, NameServer), plain or TLS.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tonic::transport::server::{Connected, Router};

use crate::idle::{Activity, CountCallsLayer};
use crate::tls::conn::{Conn, PeerInfo};
use crate::tls::{ClientAuth, Material};

/// HTTP/2 keepalive: an idle connection is pinged every `interval`, and
/// dropped when a ping goes unanswered for `timeout`, so a peer that
/// vanished (power loss, a cut network) does not hold its connection and
/// streams forever. TCP keepalive probes at the same interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(20),
        }
    }
}

/// Largest header block a request may carry (h2's default is 16 MiB).
pub const MAX_HEADER_LIST_SIZE: u32 = 64 << 10;
/// Streams a peer may reset before the connection is closed (h2's guards
/// against rapid-reset and MadeYouReset floods, which tonic's defaults
/// leave unset or off).
pub const MAX_PENDING_ACCEPT_RESETS: usize = 20;
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// HTTP/2 flow-control windows a raftmq server grants its peers (hyper's
/// defaults are 1 MiB each): one Raft entry may be 4 MiB, and a producer
/// runs many batch sends of ~100 KiB at once on one connection, so with
/// 1 MiB the sender stalls mid-request until the receiver's WINDOW_UPDATE.
/// They are how much a peer may have sent and this server not yet read:
/// unary bodies are read as they arrive (bounded by the decode limits and
/// `max_streams` anyway), and a stream a handler reads slowly holds at most
/// its window.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 8 << 20;
/// Largest HTTP/2 frame a peer may send (h2's default is 16 KiB): a 1 MiB
/// entry then takes 4 frames, not 64.
pub const MAX_FRAME_SIZE: u32 = 256 << 10;

/// The tower layers of every raftmq server, as [`builder`] stacks them.
pub type Layers = tower_layer::Stack<CountCallsLayer<PeerInfo>, tower_layer::Identity>;

/// A tonic server with the limits every raftmq port keeps: at most
/// `max_streams` concurrent streams per connection (tonic's default is
/// unlimited), HTTP/2 and TCP keepalive, a header size bound, the reset
/// flood guards, and the count of each connection's open calls that its
/// idle timeout reads ([`crate::idle`]).
pub fn builder(max_streams: u32, keepalive: Keepalive) -> tonic::transport::Server<Layers> {
    tonic::transport::Server::builder()
        .max_concurrent_streams(max_streams)
        .http2_keepalive_interval(Some(keepalive.interval))
        .http2_keepalive_timeout(Some(keepalive.timeout))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_SIZE))
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .max_frame_size(Some(MAX_FRAME_SIZE))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .tcp_keepalive(Some(keepalive.interval))
        .layer(CountCallsLayer::<PeerInfo>::default())
}

/// How a port holds connections: `total` at once, and `per_ip` from any
/// one address, so that one host cannot take every place (one more is
/// closed as soon as it is accepted); and for how long one with no call
/// open keeps its place (`idle_timeout`; RocketMQ's servers close a
/// channel idle for 120 s). Keepalive pings do not count as use.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub total: usize,
    pub per_ip: usize,
    pub idle_timeout: Duration,
}

/// RocketMQ's `serverChannelMaxIdleTimeSeconds`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// TLS for a port: the material, and which client certificates it asks for.
#[derive(Clone)]
pub struct Tls {
    pub material: Arc<Material>,
    pub auth: ClientAuth,
}

/// Serves `router` on `listener` until `stop` turns true, holding at most
/// `capacity` connections at once, with TLS when `tls` is given.
///
/// Accepted sockets get TCP_NODELAY here: tonic's `Server::tcp_nodelay`
/// does not reach the sockets of a custom incoming stream, and without it
/// Nagle's algorithm with delayed ACKs stalls small messages for 40 ms.
pub fn spawn(
    listener: TcpListener,
    router: Router<Layers>,
    stop: watch::Receiver<bool>,
    what: &'static str,
    capacity: Capacity,
    tls: Option<Tls>,
) -> tokio::task::JoinHandle<()> {
    spawn_wrapped(listener, router, stop, what, capacity, tls, |c| c)
}

/// As [`spawn`], with each accepted connection (decrypted, when TLS) wrapped
/// by `wrap` before tonic sees it.
///
/// The accept loop is ours, not tonic's: tonic retries a failed accept at
/// once, which spins a core while the process is out of file descriptors;
/// here failures back off (10 ms, doubling to 1 s). A connection past
/// `capacity` is closed as soon as it is accepted. TLS handshakes
/// run each in its own task, bounded by [`crate::tls::HANDSHAKE_TIMEOUT`],
/// so a slow or silent peer delays nobody else's connection.
pub fn spawn_wrapped<IO, F>(
    listener: TcpListener,
    router: Router<Layers>,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
    capacity: Capacity,
    tls: Option<Tls>,
    wrap: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Conn) -> IO + Send + Sync + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let (ready, incoming) = tokio::sync::mpsc::channel::<Counted<IO>>(64);
    let accepting = tokio::spawn(accept_loop(
        listener,
        stop.clone(),
        what,
        capacity,
        tls,
        Arc::new(wrap),
        ready,
    ));
    let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    tokio::spawn(async move {
        let mut stopping = stop.clone();
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let serve = router.serve_with_incoming_shutdown(incoming, shutdown);
        // Graceful: GOAWAY, then the open calls finish. A client's
        // Telemetry stream (or a long poll) never ends by itself, so the
        // drain is bounded and what is left is dropped; clients reconnect
        // to another node.
        let drained = async move {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN_WAIT).await;
        };
        tokio::select! {
            r = serve => if let Err(e) = r {
                tracing::error!(error = %e, "{what} server failed");
            },
            _ = drained => tracing::info!("{what}: calls still open after {DRAIN_WAIT:?}; closing their connections"),
        }
        accepting.abort();
    })
}

/// Accepts connections until `stop`, handing them to the server through
/// `ready` (after their handshake, when TLS).
async fn accept_loop<IO, F>(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
    capacity: Capacity,
    tls: Option<Tls>,
    wrap: Arc<F>,
    ready: tokio::sync::mpsc::Sender<Counted<IO>>,
) where
    F: Fn(Conn) -> IO + Send + Sync + 'static,
    IO: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(capacity.total));
    let per_ip = PerIp::new(capacity.per_ip);
    let mut refused = 0u64;
    let failed_handshakes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (s, peer) = match accepted {
            Ok(a) => {
                backoff = ACCEPT_BACKOFF_MIN;
                a
            }
            Err(e) => {
                tracing::warn!(error = %e, "{what}: accept failed; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if refused.is_multiple_of(1000) {
                tracing::warn!(%peer, refused = refused + 1, "{what}: {} connections open, the limit: closing new ones", capacity.total);
            }
            refused += 1;
            drop(s);
            continue;
        };
        let Some(slot) = per_ip.take(peer.ip()) else {
            if refused.is_multiple_of(1000) {
                tracing::warn!(%peer, refused = refused + 1, "{what}: {} connections open from {}, the limit per address: closing new ones", capacity.per_ip, peer.ip());
            }
            refused += 1;
            drop(s);
            continue;
        };
        let _ = s.set_nodelay(true);
        let handshake = tls.is_some();
        let (tls, wrap, ready) = (tls.clone(), wrap.clone(), ready.clone());
        let failed = Arc::clone(&failed_handshakes);
        let connect = async move {
            match Conn::accept(s, tls.as_ref().map(|t| (&*t.material, t.auth))).await {
                Ok(conn) => {
                    let idle = (conn.activity().clone(), capacity.idle_timeout);
                    let _ = ready.send(Counted::new(wrap(conn), (permit, slot), idle)).await;
                }
                Err(e) => {
                    // Port scanners and plaintext clients: said once in a
                    // while, not once per attempt.
                    let n = failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n.is_multiple_of(100) {
                        tracing::warn!(%peer, error = %e, failed = n + 1, "{what}: TLS handshake failed");
                    }
                }
            }
        };
        if handshake {
            tokio::spawn(connect);
        } else {
            connect.await;
        }
    }
}

/// Open connections per address; an address with none has no entry.
type OpenPerIp = Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// Connections per address, counted while they are open.
#[derive(Clone)]
struct PerIp {
    open: OpenPerIp,
    max: usize,
}

/// One connection's place among its address's; given back on drop.
struct IpSlot {
    open: OpenPerIp,
    ip: std::net::IpAddr,
}

impl PerIp {
    fn new(max: usize) -> PerIp {
        PerIp {
            open: Arc::default(),
            max,
        }
    }

    /// A place for one more connection from `ip`, if it has fewer than the
    /// limit open.
    fn take(&self, ip: std::net::IpAddr) -> Option<IpSlot> {
        let ip = host_of(ip);
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            open: self.open.clone(),
            ip,
        })
    }
}

/// The address a connection counts against: an IPv4 address as it is (also
/// when it comes IPv4-mapped), an IPv6 one by its /64, which one host
/// usually has whole.
fn host_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => std::net::Ipv6Addr::from(v6.to_bits() & !((1u128 << 64) - 1)).into(),
        },
        v4 => v4,
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            // The map holds only addresses with connections open.
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// How long a stopping server lets open calls finish.
pub const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// First and longest wait after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long an accepted connection (after its TLS handshake, if any) may
/// take to send the HTTP/2 client preface. hyper waits for the preface
/// with no timer, and its keepalive pings start only after it, so a peer
/// that connects and says nothing would hold a connection slot for good.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);
/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: usize = 24;

/// A connection that holds its place among the port's connections until
/// it closes, and fails its reads (hyper then drops it, and the place with
/// it) if its first [`PREFACE_LEN`] bytes do not come within
/// [`PREFACE_TIMEOUT`], or once it has had no call open for its idle
/// timeout.
struct Counted<IO> {
    inner: IO,
    _places: (OwnedSemaphorePermit, IpSlot),
    /// Until the preface is in: its deadline, and the bytes seen so far.
    preface: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    /// When to look at `activity` again; a read never touches it, so
    /// the cost is one timer per idle timeout, not one per read.
    idle_check: Pin<Box<tokio::time::Sleep>>,
    /// Bytes came in since the last look: maybe a request whose call is
    /// not counted yet (hyper's stream task has not run it).
    read_since_check: bool,
}

/// How long an idle connection that just sent bytes is given before it
/// is closed: a request that came as the timer fired gets its call
/// counted, instead of being dropped with its connection.
const IDLE_GRACE: Duration = Duration::from_secs(1);

impl<IO> Counted<IO> {
    fn new(inner: IO, places: (OwnedSemaphorePermit, IpSlot), idle: (Arc<Activity>, Duration)) -> Counted<IO> {
        let (activity, idle_timeout) = idle;
        Counted {
            inner,
            _places: places,
            preface: Some((Box::pin(tokio::time::sleep(PREFACE_TIMEOUT)), 0)),
            activity,
            idle_timeout,
            idle_check: Box::pin(tokio::time::sleep(idle_timeout)),
            read_since_check: false,
        }
    }

    /// Whether the connection has been idle too long; else arms the timer
    /// for the next look (and registers the waker).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle_check.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            let fresh = std::mem::take(&mut self.read_since_check);
            match self.activity.idle_deadline(self.idle_timeout) {
                Some(at) if at <= now && !fresh => return true,
                Some(at) if at <= now => self.idle_check.as_mut().reset(now + IDLE_GRACE),
                Some(at) => self.idle_check.as_mut().reset(at),
                // In use: a call may last long; look again a timeout later.
                None => self.idle_check.as_mut().reset(now + self.idle_timeout),
            }
        }
        false
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.read_since_check = true;
        }
        if read.is_pending() && this.idle_expired(cx) {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no call on the connection within the idle timeout",
            )));
        }
        let Some((deadline, seen)) = &mut this.preface else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                *seen += n;
                // In, or the peer closed: either way no more waiting.
                if *seen >= PREFACE_LEN || n == 0 {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 preface in time",
            ))),
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn counted(io: tokio::io::DuplexStream) -> Counted<tokio::io::DuplexStream> {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let slot = PerIp::new(1).take([127, 0, 0, 1].into()).unwrap();
        Counted::new(io, (permit, slot), (Activity::new(), IDLE_TIMEOUT))
    }

    #[test]
    fn each_address_has_its_own_places() {
        let per_ip = PerIp::new(2);
        let (a, b): (std::net::IpAddr, std::net::IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let first = per_ip.take(a).unwrap();
        let _second = per_ip.take(a).unwrap();
        assert!(per_ip.take(a).is_none(), "a third from one address");
        let _other = per_ip.take(b).expect("another address has its own");
        drop(first);
        let _again = per_ip.take(a).expect("a closed connection gives its place back");
        drop((_second, _again, _other));
        assert!(
            per_ip.open.lock().unwrap().is_empty(),
            "nothing kept for addresses with none open"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_preface_timeout() {
        let (_peer, ours) = tokio::io::duplex(64);
        let mut c = counted(ours);
        let started = tokio::time::Instant::now();
        let e = c.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), PREFACE_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sent_its_preface_may_then_idle() {
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut c = counted(ours);
        // In two pieces, the second just before the deadline.
        peer.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(c.read(&mut buf).await.unwrap(), 16);
        tokio::time::sleep(PREFACE_TIMEOUT - Duration::from_millis(1)).await;
        peer.write_all(b"\r\nSM\r\n\r\n").await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 8);
        // Long after the preface timeout, within the idle timeout.
        let idle = tokio::spawn(async move { c.read(&mut buf).await.map(|_| ()) });
        tokio::time::sleep(PREFACE_TIMEOUT * 3).await;
        assert!(!idle.is_finished());
        drop(peer);
        assert!(idle.await.unwrap().is_ok(), "the peer closed: end of stream, no error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_closed_when_no_call_was_open_for_the_idle_timeout() {
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut c = counted(ours);
        let activity = c.activity.clone();
        peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(c.read(&mut buf).await.unwrap(), 24);
        // A call open for longer than the timeout keeps the connection;
        // bytes alone (keepalive pings) do not.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let call = activity.begin();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                if let Err(e) = c.read(&mut buf).await {
                    return e;
                }
            }
        });
        tokio::time::sleep(IDLE_TIMEOUT * 3).await;
        peer.write_all(b"ping").await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!reader.is_finished(), "a call is open");
        let ended = tokio::time::Instant::now();
        drop(call);
        peer.write_all(b"ping").await.unwrap();
        let e = reader.await.unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        let waited = ended.elapsed();
        assert!(
            waited >= IDLE_TIMEOUT && waited <= IDLE_TIMEOUT + IDLE_GRACE,
            "closed {waited:?} after its last call ended"
        );
    }
}
