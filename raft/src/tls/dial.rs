//! The client side: channels whose connections are TLS, checked against
//! the cluster's CA and the name that was dialled, and showing this
//! process's certificate when it has one (a member dialling a peer).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::material::Material;

/// How a process opens its connections: plain, or TLS with [`Material`].
#[derive(Clone, Default, Debug)]
pub struct Dialer {
    tls: Option<Arc<Material>>,
}

impl Dialer {
    pub fn plain() -> Dialer {
        Dialer { tls: None }
    }

    pub fn tls(material: Arc<Material>) -> Dialer {
        Dialer { tls: Some(material) }
    }

    /// TLS with `material` when there is some, plain otherwise.
    pub fn new(material: Option<Arc<Material>>) -> Dialer {
        Dialer { tls: material }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A lazily connected channel for `endpoint`. `host` is the name the
    /// server's certificate must carry: the host as configured, before any
    /// rewriting of the endpoint's address (a DNS name or an IP address).
    pub fn channel(&self, endpoint: Endpoint, host: &str) -> Channel {
        match &self.tls {
            None => endpoint.connect_lazy(),
            Some(material) => endpoint.connect_with_connector_lazy(Connector::new(material, host)),
        }
    }

    /// As [`Dialer::channel`], connected now: a failure is the caller's to
    /// report at once.
    pub async fn connect(&self, endpoint: Endpoint, host: &str) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            None => endpoint.connect().await,
            Some(material) => endpoint.connect_with_connector(Connector::new(material, host)).await,
        }
    }
}

/// The host of a `host:port` address (`[v6]:port` gives the bare v6).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Connects TCP to the URI's address, then TLS for `host`.
#[derive(Clone)]
struct Connector {
    material: Arc<Material>,
    host: Arc<str>,
}

impl Connector {
    fn new(material: &Arc<Material>, host: &str) -> Connector {
        Connector {
            material: material.clone(),
            host: Arc::from(host.trim_start_matches('[').trim_end_matches(']')),
        }
    }
}

type Connecting =
    Pin<Box<dyn Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let (material, host) = (self.material.clone(), self.host.clone());
        Box::pin(async move {
            let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
            let addr = uri
                .host()
                .ok_or_else(|| bad(format!("{uri} names no host")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().ok_or_else(|| bad(format!("{uri} names no port")))?;
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| bad(format!("{host:?} cannot be checked against a certificate: {e}")))?;
            let tcp = TcpStream::connect((addr.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(material.current().client())
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_of_addresses() {
        assert_eq!(super::host_of("127.0.0.1:80"), "127.0.0.1");
        assert_eq!(super::host_of("[::1]:80"), "::1");
        assert_eq!(super::host_of("broker-a-0.broker-a:8081"), "broker-a-0.broker-a");
    }
}
