//! Learning a backend's HTTP/2 stream limit. hyper keeps the peer's SETTINGS to itself, so the
//! IO under an upstream HTTP/2 connection reads the backend's first frame on its way to hyper:
//! RFC 9113 §3.4 makes it a SETTINGS frame, and its `SETTINGS_MAX_CONCURRENT_STREAMS` is how
//! many requests the pool may put on that connection before it opens another. After that frame
//! the wrapper only passes bytes through.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// The limit assumed until the backend's SETTINGS arrive, and when they name none (RFC 9113
/// §6.5.2 recommends that servers allow at least 100).
pub const DEFAULT_STREAM_LIMIT: usize = 100;

/// SETTINGS frame type and the identifier of SETTINGS_MAX_CONCURRENT_STREAMS.
const SETTINGS: u8 = 0x4;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// A first SETTINGS frame larger than this is not parsed (the default limit stays).
const LARGEST_SETTINGS: usize = 6 * 32;
const FRAME_HEAD: usize = 9;

/// How many streams one connection may carry, as the backend announced it.
pub struct StreamLimit {
    streams: AtomicUsize,
    known: Notify,
}

impl StreamLimit {
    fn new() -> Arc<StreamLimit> {
        Arc::new(StreamLimit {
            streams: AtomicUsize::new(DEFAULT_STREAM_LIMIT),
            known: Notify::new(),
        })
    }

    pub fn get(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Waits until the backend's first frame has been read (or the connection ended).
    pub async fn learned(&self) {
        self.known.notified().await;
    }

    fn learn(&self, streams: Option<usize>) {
        if let Some(streams) = streams {
            // Zero would stop all requests; one at a time is the closest honest reading.
            self.streams.store(streams.max(1), Ordering::Relaxed);
        }
        self.known.notify_one();
    }
}

/// An upstream connection's IO that reads the backend's first SETTINGS frame in passing.
pub struct SettingsWatch<IO> {
    inner: IO,
    /// The bytes of the first frame read so far; `None` once it has been seen.
    first_frame: Option<Vec<u8>>,
    limit: Arc<StreamLimit>,
}

impl<IO> SettingsWatch<IO> {
    pub fn new(inner: IO) -> (SettingsWatch<IO>, Arc<StreamLimit>) {
        let limit = StreamLimit::new();
        let watch = SettingsWatch {
            inner,
            first_frame: Some(Vec::with_capacity(FRAME_HEAD + 36)),
            limit: limit.clone(),
        };
        (watch, limit)
    }

    fn observe(&mut self, read: &[u8]) {
        let Some(frame) = self.first_frame.as_mut() else {
            return;
        };
        if read.is_empty() {
            self.finish(None);
            return;
        }
        let wanted = match frame.get(..3) {
            Some(len) if frame.len() >= FRAME_HEAD => FRAME_HEAD + u24(len),
            _ => FRAME_HEAD,
        };
        let take = wanted.saturating_sub(frame.len()).min(read.len());
        frame.extend_from_slice(&read[..take]);
        if frame.len() < FRAME_HEAD {
            return;
        }
        let length = u24(&frame[..3]);
        if frame[3] != SETTINGS || length > LARGEST_SETTINGS {
            self.finish(None);
            return;
        }
        if frame.len() >= FRAME_HEAD + length {
            let streams = max_concurrent_streams(&frame[FRAME_HEAD..FRAME_HEAD + length]);
            self.finish(streams);
        } else if take < read.len() {
            // The head told how long the frame is; take the rest of this read too.
            self.observe(&read[take..]);
        }
    }

    fn finish(&mut self, streams: Option<usize>) {
        self.first_frame = None;
        self.limit.learn(streams);
    }
}

fn u24(bytes: &[u8]) -> usize {
    (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2])
}

/// SETTINGS_MAX_CONCURRENT_STREAMS from a SETTINGS payload (6-byte entries), if present.
fn max_concurrent_streams(payload: &[u8]) -> Option<usize> {
    // The last occurrence wins (RFC 9113 §6.5.3 processes settings in order).
    payload
        .chunks_exact(6)
        .rev()
        .find(|entry| u16::from_be_bytes([entry[0], entry[1]]) == MAX_CONCURRENT_STREAMS)
        .map(|entry| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
        .and_then(|v| usize::try_from(v).ok())
}

impl<IO: AsyncRead + Unpin> AsyncRead for SettingsWatch<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.first_frame.is_some() {
            match &polled {
                Poll::Ready(Ok(())) => self.observe(&buf.filled()[before..]),
                Poll::Ready(Err(_)) => self.finish(None),
                Poll::Pending => {}
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SettingsWatch<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
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

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_frame(entries: &[(u16, u32)]) -> Vec<u8> {
        let len = entries.len() * 6;
        let mut frame = vec![0, 0, len as u8, SETTINGS, 0, 0, 0, 0, 0];
        for (id, value) in entries {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    fn watch_reads(reads: &[&[u8]]) -> usize {
        let (mut watch, limit) = SettingsWatch::new(());
        for read in reads {
            watch.observe(read);
        }
        limit.get()
    }

    #[test]
    fn reads_the_limit_from_the_first_settings_frame() {
        let frame = settings_frame(&[(0x4, 65535), (0x3, 10), (0x6, 16384)]);
        assert_eq!(watch_reads(&[&frame]), 10);
        // Split across reads at every point, with more frames after it in the same read.
        for cut in 1..frame.len() {
            let mut tail = frame[cut..].to_vec();
            tail.extend_from_slice(&settings_frame(&[(0x3, 99)]));
            assert_eq!(watch_reads(&[&frame[..cut], &tail]), 10, "cut at {cut}");
        }
    }

    #[test]
    fn keeps_the_default_when_no_limit_is_announced() {
        assert_eq!(
            watch_reads(&[&settings_frame(&[(0x4, 1)])]),
            DEFAULT_STREAM_LIMIT
        );
        // Not a SETTINGS frame first (not HTTP/2 at all): nothing learned.
        assert_eq!(
            watch_reads(&[b"HTTP/1.1 400 Bad Request\r\n"]),
            DEFAULT_STREAM_LIMIT
        );
        assert_eq!(watch_reads(&[&[]]), DEFAULT_STREAM_LIMIT);
    }

    #[test]
    fn a_zero_limit_allows_one_stream() {
        assert_eq!(watch_reads(&[&settings_frame(&[(0x3, 0)])]), 1);
    }
}
