//! Refusing a send before its body is read. Under overload most sends are
//! refused (`limits.max_inflight_sends`); a refusal that first decodes the
//! request, checks it and builds a full answer costs about what a send
//! does, so admitted sends wait behind refusals and throughput collapses.
//! This gate sits in front of `apache.rocketmq.v2.MessagingService` and of
//! `raftmq.v1.Broker`: a `SendMessage` (or v1 `Send`) that arrives while
//! every place is taken is answered at once (v2: a pre-encoded
//! `TOO_MANY_REQUESTS` response; v1: gRPC `RESOURCE_EXHAUSTED`, as its
//! handler would), its body read past but never decoded. The gate only looks: the place itself is taken by the
//! handler after the body is in and the caller checked, as before, so a
//! client that sends headers and no body holds nothing.
//!
//! The gate looks before the ACL checks: under overload a caller without
//! credentials is told the broker is busy rather than that it is unknown,
//! and its body is read past (bounded in bytes and time) unchecked. Telling
//! it more would cost the signature check the gate exists to skip.
//!
//! Wire layout of the v2 answer: HTTP 200, `content-type: application/grpc`,
//! one gRPC message (a 0 byte for "not compressed", the length as 4 bytes
//! big-endian, the protobuf `SendMessageResponse`), then trailers with
//! `grpc-status: 0` (the refusal is in the v2 status, as the handler's own
//! refusals are). The v1 answer is tonic's trailers-only status: HTTP 200
//! with `grpc-status: 8` and `grpc-message` in its headers, no body.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use hyper::body::Frame;
use prost::Message;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::broker::Broker;
use crate::proto::rocketmq::v2;

/// The paths of the calls the gate watches.
const SEND_PATH: &str = "/apache.rocketmq.v2.MessagingService/SendMessage";
const V1_SEND_PATH: &str = "/raftmq.v1.Broker/Send";

#[derive(Clone)]
pub struct SendGate<S> {
    inner: S,
    broker: Arc<Broker>,
}

impl<S> SendGate<S> {
    pub fn new(inner: S, broker: Arc<Broker>) -> SendGate<S> {
        SendGate { inner, broker }
    }
}

impl<S: NamedService> NamedService for SendGate<S> {
    const NAME: &'static str = S::NAME;
}

/// `status` as a whole gRPC answer to `SendMessage` (layout above).
fn refusal(status: v2::Status) -> http::Response<Body> {
    let answer = v2::SendMessageResponse {
        status: Some(status),
        entries: Vec::new(),
    };
    let len = answer.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Encoding into a buffer with room for it cannot fail.
    let _ = answer.encode(&mut buf);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames: [Result<Frame<Bytes>, Infallible>; 2] = [Ok(Frame::data(buf.freeze())), Ok(Frame::trailers(trailers))];
    let mut r = http::Response::new(Body::new(StreamBody::new(futures::stream::iter(frames))));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    r
}

/// Request bytes read past before a refusal: the largest message and its
/// gRPC prefix (a larger body is answered unread, its stream reset).
const MAX_DRAINED: usize = crate::MAX_MESSAGE_SIZE + 5;
/// How long a refusal waits for the rest of a body.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads `body` to its end, up to [`MAX_DRAINED`] bytes and for
/// [`DRAIN_TIME`], without decoding it: a client still sending the body of
/// a call already answered sees its stream reset, and some report that
/// instead of the answer. It holds no place meanwhile.
async fn drain(mut body: Body) {
    use http_body_util::BodyExt;
    let read_all = async {
        let mut read = 0;
        while read <= MAX_DRAINED {
            match body.frame().await {
                Some(Ok(f)) => read += f.data_ref().map_or(0, |d| d.len()),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read_all).await;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for SendGate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // Only a look: the place itself is taken by the handler once the
        // body is in and the caller checked (taking it here would let a
        // client that sends headers and never a body hold every place).
        let path = req.uri().path();
        let v2_send = path == SEND_PATH;
        if (v2_send || path == V1_SEND_PATH)
            && let Err(e) = self.broker.send_room()
        {
            let answer = if v2_send {
                let started = std::time::Instant::now();
                let status = e.v2_status();
                // A forwarded send was counted where the client sent it.
                if !req.headers().contains_key(crate::grpc::FORWARDED) {
                    let code = v2::Code::try_from(status.code).map_or("UNKNOWN", |c| c.as_str_name());
                    self.broker.metrics.rpc("SendMessage", code, started);
                }
                refusal(status)
            } else {
                tonic::Status::from(e).into_http()
            };
            return Box::pin(async move {
                drain(req.into_body()).await;
                Ok(answer)
            });
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn a_refusal_is_one_grpc_message_and_an_ok_grpc_status() {
        let status = v2::Status {
            code: v2::Code::TooManyRequests as i32,
            message: "busy".into(),
        };
        let r = refusal(status.clone());
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/grpc");
        let body = r.into_body().collect().await.unwrap();
        assert_eq!(body.trailers().unwrap()["grpc-status"], "0");
        let bytes = body.to_bytes();
        assert_eq!(bytes[0], 0, "not compressed");
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 5);
        let answer = v2::SendMessageResponse::decode(&bytes[5..]).unwrap();
        assert_eq!(answer.status, Some(status));
    }
}
