//! Content codings on the way to the client: [`Coding`] (gzip, br, zstd) and [`Encoded`], a
//! response body compressed as it streams. It never holds the whole body: what the backend has
//! sent is compressed as it arrives, and whenever the backend has nothing more for the moment the
//! encoder is flushed, so the client receives everything the backend sent so far (a server-sent
//! event, a streamed page) as soon as it would without compression. Trailers pass after the
//! compressed data.
//!
//! Which responses are compressed, and the headers that go with it, is `layers::compress`'s
//! business; this module only encodes.

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::upstream::{Served, ServedBy};

/// gzip level: zlib's default, the usual trade of speed for size.
const GZIP_LEVEL: u32 = 6;
/// brotli quality: fast enough for on-the-fly compression (11 is meant for static files).
const BROTLI_QUALITY: u32 = 4;
/// zstd level: the library's default.
const ZSTD_LEVEL: i32 = 3;
/// brotli and zstd windows of 512 KiB (ngx_brotli's default): bounded memory per response.
const WINDOW_LOG: u32 = 19;
/// Compressed output is handed on in frames of about this size.
const OUTPUT_CHUNK: usize = 32 * 1024;
/// Input read in one poll before giving the worker back to other tasks (a few hundred
/// microseconds of gzip at most).
const INPUT_BUDGET: usize = 64 * 1024;
/// The smallest brotli and zstd window (1 KiB).
const MIN_WINDOW_LOG: u32 = 10;

/// A content coding the proxy can apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Brotli,
    Zstd,
}

impl Coding {
    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }

    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.token())
    }
}

/// One response's compressor, writing into a buffer that is handed on frame by frame.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    /// Boxed: brotli's state is some 5 KiB, the others' well under 1 KiB.
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    /// `length`, when known, bounds the window: a small body gets small tables (zstd sizes its
    /// hash and chain tables to the window), not the 512 KiB window's megabyte and more.
    fn new(coding: Coding, length: Option<u64>) -> io::Result<Encoder> {
        let out = Vec::new();
        let window = length.map_or(WINDOW_LOG, |n| {
            let bits = u64::BITS - n.saturating_sub(1).leading_zeros();
            bits.clamp(MIN_WINDOW_LOG, WINDOW_LOG)
        });
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::new(GZIP_LEVEL),
            )),
            Coding::Brotli => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                out,
                4096,
                BROTLI_QUALITY,
                window,
            ))),
            Coding::Zstd => {
                let mut z = zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?;
                z.window_log(window)?;
                Encoder::Zstd(z)
            }
        })
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Encoder::Gzip(e) => e,
            Encoder::Brotli(e) => &mut **e,
            Encoder::Zstd(e) => e,
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Brotli(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        }
    }

    /// The compressed bytes produced so far, leaving an empty buffer behind.
    fn take(&mut self) -> Bytes {
        let out = self.output();
        if out.is_empty() {
            return Bytes::new();
        }
        // The next frame's buffer grows to what is written into it (an SSE event stays small).
        Bytes::from(std::mem::take(out))
    }

    /// Ends the stream; the last compressed bytes.
    fn finish(self) -> io::Result<Bytes> {
        let out = match self {
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Brotli(e) => e.into_inner(),
            Encoder::Zstd(e) => e.finish()?,
        };
        Ok(Bytes::from(out))
    }
}

/// What an [`Encoded`] body keeps apart from its source (boxed, so a response body that is not
/// compressed stays small).
struct State {
    /// `None` once the stream is finished.
    encoder: Option<Encoder>,
    /// Data written since the last flush.
    unflushed: bool,
    /// The source's trailers, sent once the compressed data is out.
    trailers: Option<HeaderMap>,
}

pin_project! {
    /// A response body compressed as it streams.
    pub struct Encoded<B> {
        #[pin]
        inner: B,
        state: Box<State>,
    }
}

impl<B> Encoded<B> {
    /// Compresses `inner` (of `length` bytes, when known) with `coding`; `Err(inner)` when the
    /// encoder cannot be made (zstd could not allocate its context), so the body can still go
    /// out as it is.
    pub fn new(inner: B, coding: Coding, length: Option<u64>) -> Result<Encoded<B>, B> {
        match Encoder::new(coding, length) {
            Ok(encoder) => Ok(Encoded {
                inner,
                state: Box::new(State {
                    encoder: Some(encoder),
                    unflushed: false,
                    trailers: None,
                }),
            }),
            Err(error) => {
                tracing::warn!(%error, coding = coding.token(), "cannot start a compressor; response sent uncompressed");
                Err(inner)
            }
        }
    }
}

impl<B: Served> Served for Encoded<B> {
    fn served_by(&self) -> Option<&ServedBy> {
        self.inner.served_by()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

impl<B> Body for Encoded<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let mut this = self.project();
        let state = &mut **this.state;
        if state.encoder.is_none() {
            return Poll::Ready(state.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        let mut budget = INPUT_BUDGET;
        loop {
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return state.flush(),
                Poll::Ready(None) => return state.finish(),
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    state.trailers = frame.into_trailers().ok();
                    return state.finish();
                }
            };
            budget = budget.saturating_sub(data.len());
            // Only `finish` takes the encoder, and it returns.
            let Some(encoder) = state.encoder.as_mut() else {
                return Poll::Ready(None);
            };
            if let Err(error) = encoder.writer().write_all(&data) {
                return Poll::Ready(Some(Err(error.into())));
            }
            state.unflushed = true;
            if encoder.output().len() >= OUTPUT_CHUNK {
                return Poll::Ready(Some(Ok(Frame::data(encoder.take()))));
            }
            if budget == 0 {
                // Plenty read without a frame's worth of output: let other tasks run first.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state.encoder.is_none() && self.state.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl State {
    /// The source has nothing more for now: what it sent goes out now.
    fn flush(&mut self) -> Polled {
        let Some(encoder) = self.encoder.as_mut() else {
            return Poll::Pending;
        };
        if self.unflushed {
            if let Err(error) = encoder.writer().flush() {
                return Poll::Ready(Some(Err(error.into())));
            }
            self.unflushed = false;
        }
        let out = encoder.take();
        if out.is_empty() {
            return Poll::Pending;
        }
        Poll::Ready(Some(Ok(Frame::data(out))))
    }

    /// The source ended: the rest of the compressed stream, then the trailers, if any.
    fn finish(&mut self) -> Polled {
        let Some(encoder) = self.encoder.take() else {
            return Poll::Ready(None);
        };
        match encoder.finish() {
            Ok(out) if !out.is_empty() => Poll::Ready(Some(Ok(Frame::data(out)))),
            Ok(_) => Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t)))),
            Err(error) => Poll::Ready(Some(Err(error.into()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;
    use std::io::Read;

    fn decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => {
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Coding::Brotli => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Coding::Zstd => out = zstd::stream::decode_all(data).unwrap(),
        }
        out
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| b"<p>lorem ipsum dolor sit amet</p>\n"[i % 34] ^ (((i / 997) % 2) as u8))
            .collect()
    }

    #[tokio::test]
    async fn every_coding_round_trips_in_chunks_with_trailers() {
        let body = text(300_000);
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = body
                .chunks(7_000)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            let mut trailers = HeaderMap::new();
            trailers.insert("x-sum", HeaderValue::from_static("1"));
            frames.push(Ok(Frame::trailers(trailers)));
            let source = StreamBody::new(stream::iter(frames));
            let Ok(encoded) = Encoded::new(source, coding, None) else {
                panic!("encoder")
            };
            let collected = encoded.collect().await.unwrap();
            assert_eq!(
                collected.trailers().and_then(|t| t.get("x-sum")),
                Some(&HeaderValue::from_static("1")),
                "{coding:?}"
            );
            let compressed = collected.to_bytes();
            assert!(compressed.len() < body.len() / 4, "{coding:?}");
            assert_eq!(decode(coding, &compressed), body, "{coding:?}");
        }
    }

    #[tokio::test]
    async fn a_body_that_compresses_to_nothing_still_yields_to_other_tasks() {
        // 4 MiB of zeros, all ready at once: the input budget, not the output size, ends each poll.
        let zeros = Bytes::from(vec![0u8; 64 * 1024]);
        let frames = (0..64).map(|_| Ok::<_, Infallible>(Frame::data(zeros.clone())));
        let source = StreamBody::new(stream::iter(frames));
        let Ok(mut encoded) = Encoded::new(source, Coding::Gzip, None) else {
            panic!("encoder")
        };
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut pending = 0;
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut encoded).poll_frame(&mut cx) {
                Poll::Pending => pending += 1,
                Poll::Ready(Some(frame)) => {
                    out.extend_from_slice(&frame.unwrap().into_data().unwrap());
                }
                Poll::Ready(None) => break,
            }
        }
        assert!(pending >= 4 * 1024 * 1024 / INPUT_BUDGET - 1, "{pending}");
        assert_eq!(decode(Coding::Gzip, &out), vec![0u8; 4 * 1024 * 1024]);
    }

    #[tokio::test]
    async fn an_empty_body_is_a_valid_empty_stream() {
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let Ok(encoded) = Encoded::new(http_body_util::Empty::<Bytes>::new(), coding, None)
            else {
                panic!("encoder")
            };
            let out = encoded.collect().await.unwrap().to_bytes();
            assert_eq!(decode(coding, &out), b"", "{coding:?}");
        }
    }

    #[tokio::test]
    async fn what_arrived_is_flushed_when_the_source_waits() {
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            let source = StreamBody::new(Box::pin(futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            )));
            let Ok(mut encoded) = Encoded::new(source, coding, None) else {
                panic!("encoder")
            };
            tx.send(Ok(Frame::data(Bytes::from_static(b"data: one\n\n"))))
                .await
                .unwrap();
            // The source now waits: the event must come out whole before the body ends.
            let first = encoded.frame().await.unwrap().unwrap().into_data().unwrap();
            let mut seen = first.to_vec();
            let partial = match coding {
                Coding::Gzip => {
                    let mut out = Vec::new();
                    let mut d = flate2::write::GzDecoder::new(&mut out);
                    d.write_all(&seen).unwrap();
                    d.flush().unwrap();
                    drop(d);
                    out
                }
                Coding::Brotli => {
                    let mut out = Vec::new();
                    let mut d = brotli::DecompressorWriter::new(&mut out, 4096);
                    d.write_all(&seen).unwrap();
                    d.flush().unwrap();
                    drop(d);
                    out
                }
                Coding::Zstd => {
                    let mut out = Vec::new();
                    let mut d = zstd::stream::write::Decoder::new(&mut out).unwrap();
                    d.write_all(&seen).unwrap();
                    d.flush().unwrap();
                    drop(d);
                    out
                }
            };
            assert_eq!(partial, b"data: one\n\n", "{coding:?}");
            drop(tx);
            while let Some(frame) = encoded.frame().await {
                seen.extend_from_slice(&frame.unwrap().into_data().unwrap());
            }
            assert_eq!(decode(coding, &seen), b"data: one\n\n", "{coding:?}");
        }
    }
}
