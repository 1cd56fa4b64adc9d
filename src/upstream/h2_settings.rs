//! Learning a backend's HTTP/2 stream limit. hyper keeps the peer's SETTINGS to itself, so the
//! IO under an upstream HTTP/2 connection follows the backend's frames on their way to hyper:
//! RFC 9113 §3.4 makes the first a SETTINGS frame, and its `SETTINGS_MAX_CONCURRENT_STREAMS` is
//! how many requests the pool may put on that connection before it opens another; a later
//! SETTINGS frame may change it. Only frame heads and SETTINGS payloads are looked at; other
//! payloads pass by.

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
/// The ACK flag of a SETTINGS frame (its payload is empty).
const ACK: u8 = 0x1;
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

    /// What the backend's first SETTINGS frame said (or nothing, when there was none).
    fn learn(&self, streams: Option<usize>) {
        self.change(streams);
        self.known.notify_one();
    }

    /// A limit a later SETTINGS frame names.
    fn change(&self, streams: Option<usize>) {
        if let Some(streams) = streams {
            // Zero would stop all requests; one at a time is the closest honest reading.
            self.streams.store(streams.max(1), Ordering::Relaxed);
        }
    }
}

/// An upstream connection's IO that reads the backend's SETTINGS frames in passing.
pub struct SettingsWatch<IO> {
    inner: IO,
    frames: Frames,
    limit: Arc<StreamLimit>,
}

/// Where the reading is in the backend's frames: every frame head is read, SETTINGS payloads
/// kept, other payloads skipped. A backend may lower (or raise) its stream limit in any later
/// SETTINGS frame (RFC 9113 §6.5): read in the first only, requests queued past a lowered
/// limit waited in h2's queue into 504s instead of going to another connection.
struct Frames {
    head: [u8; FRAME_HEAD],
    head_len: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame's payload, when it is a SETTINGS frame to read.
    settings: Option<Vec<u8>>,
    /// No frame is finished yet (the first must be SETTINGS, RFC 9113 §3.4).
    first: bool,
    /// The bytes are not HTTP/2 frames (the first was no SETTINGS frame): nothing more is read.
    lost: bool,
}

impl<IO> SettingsWatch<IO> {
    pub fn new(inner: IO) -> (SettingsWatch<IO>, Arc<StreamLimit>) {
        let limit = StreamLimit::new();
        let watch = SettingsWatch {
            inner,
            frames: Frames {
                head: [0; FRAME_HEAD],
                head_len: 0,
                left: 0,
                settings: None,
                first: true,
                lost: false,
            },
            limit: limit.clone(),
        };
        (watch, limit)
    }

    fn observe(&mut self, mut read: &[u8]) {
        let frames = &mut self.frames;
        if frames.lost {
            return;
        }
        if read.is_empty() {
            self.end();
            return;
        }
        while !read.is_empty() {
            if frames.left == 0 && frames.settings.is_none() {
                let take = (FRAME_HEAD - frames.head_len).min(read.len());
                frames.head[frames.head_len..frames.head_len + take].copy_from_slice(&read[..take]);
                frames.head_len += take;
                read = &read[take..];
                if frames.head_len < FRAME_HEAD {
                    return;
                }
                frames.head_len = 0;
                let length = u24(&frames.head[..3]);
                let settings = frames.head[3] == SETTINGS && frames.head[4] & ACK == 0;
                if frames.first && (!settings || length > LARGEST_SETTINGS) {
                    // Not HTTP/2, or a first frame too large to be one: the default stays.
                    frames.lost = true;
                    frames.first = false;
                    self.limit.learn(None);
                    return;
                }
                frames.left = length;
                if settings && length <= LARGEST_SETTINGS {
                    frames.settings = Some(Vec::with_capacity(length));
                }
            }
            let take = frames.left.min(read.len());
            if let Some(payload) = frames.settings.as_mut() {
                payload.extend_from_slice(&read[..take]);
            }
            frames.left -= take;
            read = &read[take..];
            if frames.left == 0 {
                if let Some(payload) = frames.settings.take() {
                    let streams = max_concurrent_streams(&payload);
                    if frames.first {
                        frames.first = false;
                        self.limit.learn(streams);
                    } else if streams.is_some() {
                        self.limit.change(streams);
                    }
                }
            }
        }
    }

    /// The connection ended or failed: whoever waits for the first frame stops waiting.
    fn end(&mut self) {
        if self.frames.first {
            self.frames.first = false;
            self.limit.learn(None);
        }
        self.frames.lost = true;
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
        match &polled {
            Poll::Ready(Ok(())) => self.observe(&buf.filled()[before..]),
            Poll::Ready(Err(_)) => self.end(),
            Poll::Pending => {}
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
            tail.extend_from_slice(&data_frame(300));
            assert_eq!(watch_reads(&[&frame[..cut], &tail]), 10, "cut at {cut}");
        }
    }

    #[test]
    fn a_later_settings_frame_changes_the_limit() {
        // 10 first; DATA, an ACK and other frames between; then 3, split at every point.
        let mut bytes = settings_frame(&[(0x3, 10)]);
        bytes.extend_from_slice(&data_frame(1000));
        bytes.extend_from_slice(&[0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0]);
        bytes.extend_from_slice(&settings_frame(&[(0x4, 1)]));
        assert_eq!(
            watch_reads(&[&bytes]),
            10,
            "a SETTINGS frame without the limit keeps it"
        );
        let later = settings_frame(&[(0x3, 3)]);
        let mut all = bytes.clone();
        all.extend_from_slice(&later);
        // (An empty read is the connection's end: every cut leaves something in the first.)
        for cut in 1..all.len() {
            assert_eq!(watch_reads(&[&all[..cut], &all[cut..]]), 3, "cut at {cut}");
        }
    }

    fn data_frame(length: usize) -> Vec<u8> {
        let mut frame = vec![0, (length >> 8) as u8, length as u8, 0x0, 0, 0, 0, 0, 1];
        frame.resize(FRAME_HEAD + length, b'x');
        frame
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
