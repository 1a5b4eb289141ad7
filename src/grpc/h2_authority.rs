//! Makes gRPC requests with a multi-address `:authority` acceptable to h2.
//!
//! The official clients open one channel over all of a broker's endpoints
//! (the Python client's target is `ipv4:a:p,b:p,c:p`), and gRPC's C core
//! then sends the whole list as the `:authority` pseudo-header, for example
//! `127.0.0.1:8081,127.0.0.1:8082`. h2, under tonic, refuses such a request
//! with RST_STREAM PROTOCOL_ERROR (its maintainers keep the check strict).
//! Java's Netty does not check, which is why RocketMQ's own proxy never saw
//! the problem.
//!
//! [`LenientAuthority`] sits between the socket and h2 on the client port
//! and fixes the request headers the client sends. It keeps the first
//! address of a comma-separated `:authority`, and drops an authority that
//! is still invalid (HTTP/2 makes it optional; one the client adds to its
//! HPACK table becomes a placeholder instead, see [`super::hpack`]).
//! Everything else passes through byte for byte.
//!
//! # What is parsed (RFC 9113 §4.1, §6.2, §6.10)
//!
//! After the 24-byte connection preface, the client sends frames, each with a
//! 9-byte header:
//!
//! | size | field                                   |
//! |-----:|-----------------------------------------|
//! |    3 | payload length (big-endian)             |
//! |    1 | type (1 = HEADERS, 9 = CONTINUATION)    |
//! |    1 | flags (0x1 END_STREAM, 0x4 END_HEADERS, 0x8 PADDED, 0x20 PRIORITY) |
//! |    4 | stream id (high bit reserved)           |
//!
//! Only HEADERS and CONTINUATION frames are collected: their header block
//! goes through [`AuthorityFix`], which leaves the client's encoding as it
//! is and changes only a bad `:authority` field, and is framed again
//! (without padding). Frames of other types stream through without being
//! buffered.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::AuthorityFix;

/// The client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 1;
const TYPE_CONTINUATION: u8 = 9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload h2 accepts before SETTINGS say otherwise (the
/// protocol's minimum maximum, which our servers never raise): a HEADERS
/// or CONTINUATION frame claiming more is refused before its payload is
/// buffered, and re-encoded blocks are cut to fit.
const MAX_FRAME: usize = 16_384;
/// Largest header block accepted: h2's own limit on the decoded list on
/// our servers ([`raftmq_raft::serve::MAX_HEADER_LIST_SIZE`]), which no
/// encoded block it accepts exceeds, so nothing h2 would refuse is
/// buffered here first. (h2 checks the decoded size itself.)
const MAX_BLOCK: usize = raftmq_raft::serve::MAX_HEADER_LIST_SIZE as usize;
/// Most CONTINUATION frames one header block may have. A full-size block
/// needs `MAX_BLOCK / MAX_FRAME` (4); more means empty or tiny frames sent
/// to keep the connection busy (the "CONTINUATION flood").
const MAX_CONTINUATIONS: usize = 2 * MAX_BLOCK / MAX_FRAME;

/// A stream whose incoming HTTP/2 request headers get a valid `:authority`.
pub struct LenientAuthority<S> {
    inner: S,
    fixer: Fixer,
}

impl<S> LenientAuthority<S> {
    pub fn new(inner: S) -> Self {
        LenientAuthority {
            inner,
            fixer: Fixer::new(),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

struct Fixer {
    /// Received, not yet processed.
    input: BytesMut,
    /// Processed, for h2 to read.
    output: BytesMut,
    preface_seen: bool,
    /// Payload bytes of a passing-through frame still to come.
    passing: usize,
    /// A header block waiting for its CONTINUATION frames.
    pending: Option<PendingBlock>,
    hpack: AuthorityFix,
}

struct PendingBlock {
    stream_id: u32,
    /// END_STREAM of the HEADERS frame.
    end_stream: bool,
    /// The 5 priority bytes, if the HEADERS frame had them.
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
    /// CONTINUATION frames received so far.
    continuations: usize,
}

fn invalid(m: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.into())
}

impl Fixer {
    fn new() -> Fixer {
        Fixer {
            input: BytesMut::with_capacity(8 * 1024),
            output: BytesMut::with_capacity(8 * 1024),
            preface_seen: false,
            passing: 0,
            pending: None,
            hpack: AuthorityFix::default(),
        }
    }

    /// Moves what can be processed from `input` to `output`.
    fn process(&mut self) -> io::Result<()> {
        loop {
            if !self.preface_seen {
                if self.input.len() < PREFACE.len() {
                    // Not HTTP/2 with prior knowledge: leave it to h2 to refuse.
                    if PREFACE.starts_with(&self.input) {
                        return Ok(());
                    }
                    self.preface_seen = true;
                    self.passing = usize::MAX;
                    continue;
                }
                if &self.input[..PREFACE.len()] != PREFACE {
                    self.preface_seen = true;
                    self.passing = usize::MAX;
                    continue;
                }
                let p = self.input.split_to(PREFACE.len());
                self.output.extend_from_slice(&p);
                self.preface_seen = true;
            }
            if self.passing > 0 {
                let n = self.passing.min(self.input.len());
                if n == 0 {
                    return Ok(());
                }
                let chunk = self.input.split_to(n);
                self.output.extend_from_slice(&chunk);
                if self.passing != usize::MAX {
                    self.passing -= n;
                }
                continue;
            }
            if self.input.len() < FRAME_HEADER_LEN {
                return Ok(());
            }
            let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            let kind = self.input[3];
            if kind != TYPE_HEADERS && kind != TYPE_CONTINUATION {
                if self.pending.is_some() {
                    return Err(invalid("HTTP/2: a header block was interrupted by another frame"));
                }
                let header = self.input.split_to(FRAME_HEADER_LEN);
                self.output.extend_from_slice(&header);
                self.passing = len;
                continue;
            }
            if len > MAX_FRAME {
                return Err(invalid("HTTP/2: header frame larger than the 16 KiB frame size"));
            }
            // Wait for the payload without reserving room for it up front:
            // the claim is the peer's, and `poll_read` grows the buffer as
            // bytes actually arrive.
            if self.input.len() < FRAME_HEADER_LEN + len {
                return Ok(());
            }
            let mut frame = self.input.split_to(FRAME_HEADER_LEN + len);
            let flags = frame[4];
            let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
            frame.advance(FRAME_HEADER_LEN);
            self.header_frame(kind, flags, stream_id, frame)?;
        }
    }

    fn header_frame(&mut self, kind: u8, flags: u8, stream_id: u32, mut payload: BytesMut) -> io::Result<()> {
        if kind == TYPE_HEADERS {
            if self.pending.is_some() {
                return Err(invalid("HTTP/2: HEADERS inside another header block"));
            }
            let mut pad = 0usize;
            if flags & FLAG_PADDED != 0 {
                if payload.is_empty() {
                    return Err(invalid("HTTP/2: padded HEADERS without a pad length"));
                }
                pad = payload[0] as usize;
                payload.advance(1);
            }
            let priority = if flags & FLAG_PRIORITY != 0 {
                if payload.len() < 5 {
                    return Err(invalid("HTTP/2: HEADERS too short for its priority"));
                }
                let p = [payload[0], payload[1], payload[2], payload[3], payload[4]];
                payload.advance(5);
                Some(p)
            } else {
                None
            };
            if pad > payload.len() {
                return Err(invalid("HTTP/2: HEADERS padding exceeds the payload"));
            }
            payload.truncate(payload.len() - pad);
            self.pending = Some(PendingBlock {
                stream_id,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                block: payload.to_vec(),
                continuations: 0,
            });
        } else {
            let Some(p) = self.pending.as_mut().filter(|p| p.stream_id == stream_id) else {
                return Err(invalid("HTTP/2: CONTINUATION without its HEADERS"));
            };
            if p.block.len() + payload.len() > MAX_BLOCK {
                return Err(invalid("HTTP/2: header block too large"));
            }
            p.continuations += 1;
            if p.continuations > MAX_CONTINUATIONS {
                return Err(invalid("HTTP/2: too many CONTINUATION frames in one header block"));
            }
            p.block.extend_from_slice(&payload);
        }
        if flags & FLAG_END_HEADERS != 0
            && let Some(p) = self.pending.take()
        {
            self.rewrite(p)?;
        }
        Ok(())
    }

    /// Fixes the authority of a complete header block and writes it out as
    /// HEADERS (and CONTINUATION) frames.
    fn rewrite(&mut self, p: PendingBlock) -> io::Result<()> {
        let block = match self.hpack.fix(&p.block) {
            Ok(None) => p.block,
            Ok(Some(fixed)) => fixed,
            Err(e) => return Err(invalid(format!("HTTP/2: undecodable header block: {}", e.0))),
        };
        let first_room = MAX_FRAME - if p.priority.is_some() { 5 } else { 0 };
        let first_len = block.len().min(first_room);
        let mut flags = if p.end_stream { FLAG_END_STREAM } else { 0 };
        if p.priority.is_some() {
            flags |= FLAG_PRIORITY;
        }
        if first_len == block.len() {
            flags |= FLAG_END_HEADERS;
        }
        let payload_len = first_len + if p.priority.is_some() { 5 } else { 0 };
        self.put_frame_header(payload_len, TYPE_HEADERS, flags, p.stream_id);
        if let Some(prio) = p.priority {
            self.output.extend_from_slice(&prio);
        }
        self.output.extend_from_slice(&block[..first_len]);
        let mut at = first_len;
        while at < block.len() {
            let n = (block.len() - at).min(MAX_FRAME);
            let flags = if at + n == block.len() { FLAG_END_HEADERS } else { 0 };
            self.put_frame_header(n, TYPE_CONTINUATION, flags, p.stream_id);
            self.output.extend_from_slice(&block[at..at + n]);
            at += n;
        }
        Ok(())
    }

    fn put_frame_header(&mut self, len: usize, kind: u8, flags: u8, stream_id: u32) {
        let len = len as u32;
        self.output.put_slice(&len.to_be_bytes()[1..]);
        self.output.put_u8(kind);
        self.output.put_u8(flags);
        self.output.put_u32(stream_id);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LenientAuthority<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.fixer.output.is_empty() {
                let n = this.fixer.output.len().min(buf.remaining());
                buf.put_slice(&this.fixer.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            let input = &mut this.fixer.input;
            input.reserve(16 * 1024);
            let spare = input.spare_capacity_mut();
            let mut rb = ReadBuf::uninit(spare);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        // End of stream: hand over whatever is left as it is.
                        let rest = this.fixer.input.split();
                        if rest.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        this.fixer.output.extend_from_slice(&rest);
                        continue;
                    }
                    // SAFETY: `poll_read` initialized the first `n` spare bytes.
                    unsafe { this.fixer.input.set_len(this.fixer.input.len() + n) };
                    this.fixer.process()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LenientAuthority<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for LenientAuthority<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// Runs bytes through a fixer in chunks of `chunk`; returns the output.
    fn run(input: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
        let mut f = Fixer::new();
        for c in input.chunks(chunk) {
            f.input.extend_from_slice(c);
            f.process()?;
        }
        Ok(f.output.to_vec())
    }

    /// Decodes the header blocks of the frames in `out` (after the preface).
    fn headers_of(out: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut d = loona_hpack::Decoder::new();
        let mut at = PREFACE.len();
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        while at < out.len() {
            let len = u32::from_be_bytes([0, out[at], out[at + 1], out[at + 2]]) as usize;
            let (kind, flags) = (out[at + 3], out[at + 4]);
            let mut p = &out[at + 9..at + 9 + len];
            if kind == TYPE_HEADERS && flags & FLAG_PRIORITY != 0 {
                p = &p[5..];
            }
            if kind == TYPE_HEADERS || kind == TYPE_CONTINUATION {
                block.extend_from_slice(p);
                if flags & FLAG_END_HEADERS != 0 {
                    blocks.push(d.decode(&block).unwrap());
                    block.clear();
                }
            }
            at += 9 + len;
        }
        blocks
    }

    #[test]
    fn multi_address_authority_is_cut_to_the_first() {
        let mut client = loona_hpack::Encoder::new();
        let req = |authority: &[u8], client: &mut loona_hpack::Encoder<'static>| {
            client.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage"),
                (b":authority", authority),
                (b"x-mq-client-id", b"c1"),
            ])
        };
        let mut input = PREFACE.to_vec();
        input.extend(frame(4, 0, 0, &[])); // SETTINGS
        let b1 = req(b"127.0.0.1:8081,127.0.0.1:8082", &mut client);
        // Padded, with priority, split over a CONTINUATION.
        let mut p = vec![2u8, 0, 0, 0, 0, 16];
        p.extend_from_slice(&b1[..5]);
        p.extend_from_slice(&[0, 0]);
        input.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_PRIORITY, 1, &p));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &b1[5..]));
        input.extend(frame(0, FLAG_END_STREAM, 1, b"body-bytes"));
        // The second request refers to the client's dynamic table.
        let b2 = req(b"127.0.0.1:8081,127.0.0.1:8082", &mut client);
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &b2));
        let b3 = req(b"not valid at all,", &mut client);
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, 5, &b3));
        for chunk in [1, 7, 4096] {
            let out = run(&input, chunk).unwrap();
            assert!(out.starts_with(PREFACE));
            let blocks = headers_of(&out);
            assert_eq!(blocks.len(), 3, "chunk {chunk}");
            for b in &blocks[..2] {
                assert!(b.contains(&(b":authority".to_vec(), b"127.0.0.1:8081".to_vec())));
                assert!(b.contains(&(b"x-mq-client-id".to_vec(), b"c1".to_vec())));
            }
            assert!(!blocks[2].iter().any(|(n, _)| n == b":authority"));
            // The DATA frame passed through untouched.
            assert!(out.windows(10).any(|w| w == b"body-bytes"));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        assert!(run(&input, 3).is_err());
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b"x"));
        assert!(run(&input, 100).is_err());
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[200, 1]));
        assert!(run(&input, 100).is_err());
        // Not HTTP/2: passed through for h2 to refuse.
        assert_eq!(run(b"GET / HTTP/1.1\r\n\r\n", 4).unwrap(), b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn oversized_and_flooding_header_frames_are_refused() {
        // A frame header claiming more than a frame may hold is refused
        // before any of its payload arrives (and nothing is reserved for it).
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0x10, 0, 0, TYPE_HEADERS, 0, 0, 0, 0, 1]);
        let mut f = Fixer::new();
        f.input.extend_from_slice(&input);
        assert!(f.process().is_err());
        // A frame of the largest size waits for its payload.
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0, 0x40, 0, TYPE_HEADERS, 0, 0, 0, 0, 1]);
        let mut f = Fixer::new();
        f.input.extend_from_slice(&input);
        f.process().unwrap();
        assert!(f.input.capacity() < 2 * MAX_FRAME);
        // Empty CONTINUATION frames cannot extend a block forever.
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[]));
        for _ in 0..=MAX_CONTINUATIONS {
            input.extend(frame(TYPE_CONTINUATION, 0, 1, &[]));
        }
        let err = run(&input, 4096).unwrap_err();
        assert!(err.to_string().contains("CONTINUATION"), "{err}");
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::super::*;
        use super::{frame, headers_of, run};

        /// One client frame: a type (mostly header frames), flags, a stream
        /// and a payload of raw bytes.
        fn any_frame() -> impl Strategy<Value = Vec<u8>> {
            (
                prop_oneof![Just(TYPE_HEADERS), Just(TYPE_CONTINUATION), Just(0u8), any::<u8>()],
                any::<u8>(),
                0u32..4,
                proptest::collection::vec(any::<u8>(), 0..64),
            )
                .prop_map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
        }

        proptest! {
            // PROPTEST_CASES sets the count (256 unless told): a longer run
            // is `PROPTEST_CASES=100000 cargo test h2_authority`.

            /// Whatever a client sends is an error or output, never a panic,
            /// and the output never holds more than the input can explain.
            #[test]
            fn arbitrary_frames_never_panic(
                frames in proptest::collection::vec(any_frame(), 0..24),
                raw in proptest::collection::vec(any::<u8>(), 0..256),
                chunk in 1usize..100,
            ) {
                let mut input = PREFACE.to_vec();
                for f in &frames {
                    input.extend_from_slice(f);
                }
                input.extend_from_slice(&raw);
                if let Ok(out) = run(&input, chunk) {
                    prop_assert!(out.len() <= input.len() * 2 + 64 * 1024);
                }
            }

            /// Valid requests come out with the same headers, the authority
            /// cut to its first address, however the bytes are split.
            #[test]
            fn valid_requests_survive_any_split(
                authorities in proptest::collection::vec("[a-z0-9.:,]{0,40}", 1..6),
                chunk in 1usize..200,
            ) {
                let mut enc = loona_hpack::Encoder::new();
                let mut input = PREFACE.to_vec();
                for (i, a) in authorities.iter().enumerate() {
                    let block = enc.encode([
                        (&b":method"[..], &b"POST"[..]),
                        (b":authority", a.as_bytes()),
                        (b"x-n", i.to_string().as_bytes()),
                    ]);
                    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 2 * i as u32 + 1, &block));
                }
                let out = run(&input, chunk).unwrap();
                let blocks = headers_of(&out);
                prop_assert_eq!(blocks.len(), authorities.len());
                for (i, b) in blocks.iter().enumerate() {
                    prop_assert!(b.contains(&(b"x-n".to_vec(), i.to_string().into_bytes())));
                    if let Some((_, a)) = b.iter().find(|(n, _)| n == b":authority") {
                        prop_assert!(tonic::codegen::http::uri::Authority::try_from(a.as_slice()).is_ok());
                        prop_assert!(authorities[i].as_bytes().starts_with(a));
                    }
                }
            }
        }
    }
}
