//! Refuses HTTP/2 control-frame floods on client connections. hyper answers every PING and
//! SETTINGS frame and skips PRIORITY and empty DATA frames, so a client can make a connection
//! work for ever without asking for anything (PING flood, SETTINGS flood: CVE-2019-9512,
//! -9515, -9516, -9518). The IO under a client connection reads the frame heads in passing, both
//! ways, and keeps gRPC's "ping strike" account: a control frame that comes within
//! [`STRIKE_WINDOW`] of the previous one, with no HEADERS or DATA frame sent to the client in
//! between, is a strike; more than [`MAX_STRIKES`] in a row close the connection (the read
//! fails, hyper drops it). A request (HEADERS) from the client clears the account as an answer
//! does. Keep-alive PINGs seconds apart, a client's SETTINGS at start, gRPC's bandwidth probes
//! during a download (answered by DATA) and its WINDOW_UPDATE after each call's HEADERS never
//! strike.
//!
//! HTTP/1 connections are recognised by their first bytes (no connection preface) and from then
//! on only passed through.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Control frames in a row that come close together with nothing sent to the client between
/// them. A browser sends a handful at the start; a flood sends thousands.
pub const MAX_STRIKES: u32 = 100;
/// A control frame this long after the previous one is never a strike (keep-alive PINGs).
pub const STRIKE_WINDOW: Duration = Duration::from_secs(1);

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
#[cfg(test)]
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;

/// The type, flags and payload length of one frame.
#[derive(Clone, Copy)]
struct FrameHead {
    kind: u8,
    flags: u8,
    length: usize,
}

impl FrameHead {
    /// A frame that asks work of the server and carries nothing for it to pass on.
    fn is_control(self) -> bool {
        match self.kind {
            // Acknowledgements too: a client acknowledges the server's few PINGs and its one
            // SETTINGS, and a flood of unasked ones cost as much CPU as a PING flood.
            PING | SETTINGS | PRIORITY => true,
            // A client grants window as it receives DATA (which resets the strikes); a flood
            // of WINDOW_UPDATEs with nothing sent is work for nothing.
            WINDOW_UPDATE => true,
            DATA => self.length == 0 && self.flags & END_STREAM == 0,
            _ => false,
        }
    }
}

/// Finds frame boundaries in a byte stream fed in arbitrary pieces.
#[derive(Default)]
struct FrameCursor {
    head: [u8; FRAME_HEAD],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

impl FrameCursor {
    /// Calls `on_frame` for each frame head completed by `bytes`; stops early (and says so) when
    /// it returns false.
    fn feed(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(FrameHead) -> bool) -> bool {
        loop {
            if self.skip > 0 {
                let passed = self.skip.min(bytes.len());
                self.skip -= passed;
                bytes = &bytes[passed..];
            }
            if bytes.is_empty() {
                return true;
            }
            let take = (FRAME_HEAD - self.have).min(bytes.len());
            self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
            self.have += take;
            bytes = &bytes[take..];
            if self.have < FRAME_HEAD {
                return true;
            }
            self.have = 0;
            let h = &self.head;
            let head = FrameHead {
                length: (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]),
                kind: h[3],
                flags: h[4],
            };
            self.skip = head.length;
            if !on_frame(head) {
                return false;
            }
        }
    }
}

/// What the client has shown itself to be so far.
enum Mode {
    /// Matching the connection preface; this many bytes matched.
    Sniffing(usize),
    /// HTTP/2: frames are read both ways.
    Http2,
    /// Anything else: bytes pass untouched.
    Other,
}

/// The strike account of one HTTP/2 connection.
struct Strikes {
    count: u32,
    last_control: Option<Instant>,
    /// A HEADERS or DATA frame went to the client since the last control frame.
    answered: bool,
}

impl Strikes {
    /// Counts one control frame; false once the client is over its allowance.
    fn control_frame(&mut self) -> bool {
        let now = Instant::now();
        let close_to_last = self
            .last_control
            .is_some_and(|last| now.saturating_duration_since(last) < STRIKE_WINDOW);
        if self.answered || !close_to_last {
            self.count = 0;
        } else {
            self.count += 1;
        }
        self.answered = false;
        self.last_control = Some(now);
        self.count <= MAX_STRIKES
    }
}

/// A client connection's IO, watching for control-frame floods.
pub struct FloodGuard<IO> {
    inner: IO,
    peer: SocketAddr,
    mode: Mode,
    read: FrameCursor,
    written: FrameCursor,
    strikes: Strikes,
}

impl<IO> FloodGuard<IO> {
    pub fn new(inner: IO, peer: SocketAddr) -> FloodGuard<IO> {
        FloodGuard {
            inner,
            peer,
            mode: Mode::Sniffing(0),
            read: FrameCursor::default(),
            written: FrameCursor::default(),
            strikes: Strikes {
                count: 0,
                last_control: None,
                answered: false,
            },
        }
    }

    /// Looks at bytes read from the client; false when they end its allowance.
    fn observe_read(&mut self, mut bytes: &[u8]) -> bool {
        if let Mode::Sniffing(matched) = self.mode {
            let take = (PREFACE.len() - matched).min(bytes.len());
            if bytes[..take] != PREFACE[matched..matched + take] {
                self.mode = Mode::Other;
                return true;
            }
            self.mode = if matched + take == PREFACE.len() {
                Mode::Http2
            } else {
                Mode::Sniffing(matched + take)
            };
            bytes = &bytes[take..];
        }
        if !matches!(self.mode, Mode::Http2) {
            return true;
        }
        let strikes = &mut self.strikes;
        let within = self.read.feed(bytes, |head| {
            if head.kind == HEADERS {
                // A request is work the client asks for, answered or not yet: gRPC's C core
                // sends HEADERS, a stream WINDOW_UPDATE and DATA for each call, and 100 calls
                // at once to a backend yet to answer were a flood.
                strikes.answered = true;
            }
            !head.is_control() || strikes.control_frame()
        });
        if !within {
            tracing::info!(peer = %self.peer, "HTTP/2 control-frame flood: closing the connection");
        }
        within
    }

    fn observe_written(&mut self, bytes: &[u8]) {
        if !matches!(self.mode, Mode::Http2) {
            return;
        }
        let strikes = &mut self.strikes;
        self.written.feed(bytes, |head| {
            if matches!(head.kind, HEADERS | DATA) {
                strikes.answered = true;
            }
            true
        });
    }
}

fn flood() -> io::Error {
    io::Error::other("HTTP/2 control-frame flood")
}

impl<IO: AsyncRead + Unpin> AsyncRead for FloodGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if matches!(this.mode, Mode::Other) {
            return Poll::Ready(Ok(()));
        }
        if !this.observe_read(&buf.filled()[before..]) {
            buf.set_filled(before);
            return Poll::Ready(Err(flood()));
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FloodGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.observe_written(&buf[..n.min(buf.len())]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let part = left.min(buf.len());
            this.observe_written(&buf[..part]);
            left -= part;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: usize) -> Vec<u8> {
        let mut out = vec![
            0,
            (payload >> 8) as u8,
            payload as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        out.resize(FRAME_HEAD + payload, 0);
        out
    }

    fn guard() -> FloodGuard<()> {
        FloodGuard::new((), "127.0.0.1:1".parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_flood_fed_a_byte_at_a_time_is_refused_after_the_allowance() {
        let mut g = guard();
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(SETTINGS, 0, 6));
        for _ in 0..=MAX_STRIKES + 1 {
            stream.extend(frame(PING, 0, 8));
        }
        let verdicts: Vec<bool> = stream.chunks(1).map(|b| g.observe_read(b)).collect();
        let refused_at = verdicts.iter().position(|ok| !ok);
        // The SETTINGS frame is free, then MAX_STRIKES PINGs strike; the next one's head ends it.
        let allowed = PREFACE.len() + (FRAME_HEAD + 6) + MAX_STRIKES as usize * (FRAME_HEAD + 8);
        assert_eq!(refused_at, Some(allowed + FRAME_HEAD - 1));
    }

    #[tokio::test(start_paused = true)]
    async fn pings_answered_by_data_or_spaced_out_never_strike() {
        let mut g = guard();
        assert!(g.observe_read(PREFACE));
        for _ in 0..10 * MAX_STRIKES {
            assert!(g.observe_read(&frame(PING, 0, 8)));
            g.observe_written(&frame(DATA, 0, 100));
        }
        for _ in 0..3 * MAX_STRIKES {
            assert!(g.observe_read(&frame(PING, 0, 8)));
            tokio::time::advance(STRIKE_WINDOW).await;
        }
        // Requests are not control frames.
        for _ in 0..3 * MAX_STRIKES {
            assert!(g.observe_read(&frame(HEADERS, 0x5, 20)));
        }
    }

    /// A burst of gRPC calls as the C core sends them (HEADERS, a stream WINDOW_UPDATE, DATA),
    /// none answered yet, is no flood: 100 at once closed the connection.
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_grpc_calls_never_strikes() {
        let mut g = guard();
        assert!(g.observe_read(PREFACE));
        assert!(g.observe_read(&frame(SETTINGS, 0, 6)));
        assert!(g.observe_read(&frame(WINDOW_UPDATE, 0, 4)));
        for call in 0..5 * MAX_STRIKES {
            assert!(g.observe_read(&frame(HEADERS, 0x4, 20)), "call {call}");
            assert!(g.observe_read(&frame(WINDOW_UPDATE, 0, 4)), "call {call}");
            assert!(g.observe_read(&frame(DATA, END_STREAM, 10)), "call {call}");
        }
    }

    /// Unasked acknowledgements and WINDOW_UPDATEs with nothing sent are floods too (they
    /// passed, and two such connections slowed every other client tenfold).
    #[tokio::test(start_paused = true)]
    async fn ack_and_window_update_floods_are_refused() {
        for (kind, flags, payload) in [(PING, ACK, 8), (SETTINGS, ACK, 0), (WINDOW_UPDATE, 0, 4)] {
            let mut g = guard();
            assert!(g.observe_read(PREFACE));
            let refused =
                (0..=MAX_STRIKES + 1).any(|_| !g.observe_read(&frame(kind, flags, payload)));
            assert!(refused, "frame type {kind} flags {flags}");
        }
    }

    #[test]
    fn http1_passes_untouched() {
        let mut g = guard();
        assert!(g.observe_read(b"GET / HTTP/1.1\r\n"));
        assert!(matches!(g.mode, Mode::Other));
    }
}
