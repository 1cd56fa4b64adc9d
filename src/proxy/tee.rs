//! A response body that streams to the client as it comes and keeps a copy on the side, for
//! whoever wants the whole body once it has passed (the cache). The copy is bounded: past
//! `limit` bytes, on a trailer or an error it is given up and the body streams on untouched.
//! The client never waits for the copy.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::upstream::{Served, ServedBy};

/// Receives the whole body when it has passed in full. Dropped unused when the copy is given
/// up or the body is dropped early (the client went away).
pub trait TeeSink: Send {
    fn complete(self: Box<Self>, body: Bytes);
}

pin_project_lite::pin_project! {
    /// `inner`, copied into `sink` when it ends within `limit` bytes.
    pub struct Tee<B> {
        #[pin]
        inner: B,
        sink: Option<Box<dyn TeeSink>>,
        chunks: Vec<Bytes>,
        size: usize,
        limit: usize,
    }
}

impl<B: Body> Tee<B> {
    /// A body announced larger than `limit` is not copied at all; an empty one is copied at
    /// once (its writer never polls a body that says it has ended, so it would never be).
    pub fn new(inner: B, sink: Box<dyn TeeSink>, limit: usize) -> Tee<B> {
        let too_large = inner.size_hint().lower() > limit as u64;
        let sink = match inner.is_end_stream() {
            true => {
                sink.complete(Bytes::new());
                None
            }
            false => Some(sink),
        };
        Tee {
            inner,
            sink: sink.filter(|_| !too_large),
            chunks: Vec::new(),
            size: 0,
            limit,
        }
    }
}

impl<B: Served> Served for Tee<B> {
    fn served_by(&self) -> Option<&ServedBy> {
        self.inner.served_by()
    }
}

impl<B> Tee<B> {
    /// The copy is still being made: the body has neither ended nor outgrown the limit.
    pub fn keeping(&self) -> bool {
        self.sink.is_some()
    }
}

impl<B: Body<Data = Bytes>> Body for Tee<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        if this.sink.is_none() {
            return polled;
        }
        let ended = match &polled {
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                Some(data) if *this.size + data.len() <= *this.limit => {
                    *this.size += data.len();
                    this.chunks.push(data.clone());
                    // A body of known length ends with its last byte: its reader may never
                    // poll again for the end.
                    this.inner.is_end_stream()
                }
                // Too large, or trailers: the copy is given up.
                _ => {
                    give_up(this.sink, this.chunks);
                    false
                }
            },
            Poll::Ready(Some(Err(_))) => {
                give_up(this.sink, this.chunks);
                false
            }
            Poll::Ready(None) => true,
            Poll::Pending => false,
        };
        if ended {
            if let Some(sink) = this.sink.take() {
                sink.complete(concat(std::mem::take(this.chunks), *this.size));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn give_up(sink: &mut Option<Box<dyn TeeSink>>, chunks: &mut Vec<Bytes>) {
    *sink = None;
    *chunks = Vec::new();
}

fn concat(chunks: Vec<Bytes>, size: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.into_iter().next().unwrap_or_default();
    }
    let mut all = BytesMut::with_capacity(size);
    for chunk in chunks {
        all.extend_from_slice(&chunk);
    }
    all.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::sync::{Arc, Mutex};

    struct Keep(Arc<Mutex<Option<Bytes>>>);
    impl TeeSink for Keep {
        fn complete(self: Box<Self>, body: Bytes) {
            *self.0.lock().unwrap() = Some(body);
        }
    }

    fn chunks(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn the_copy_is_the_whole_body_within_the_limit() {
        let kept = Arc::new(Mutex::new(None));
        let tee = Tee::new(chunks(&["ab", "cd", "e"]), Box::new(Keep(kept.clone())), 5);
        let streamed = tee.collect().await.unwrap().to_bytes();
        assert_eq!(streamed, "abcde");
        assert_eq!(kept.lock().unwrap().as_deref(), Some(&b"abcde"[..]));
    }

    #[tokio::test]
    async fn past_the_limit_the_body_streams_and_nothing_is_kept() {
        let kept = Arc::new(Mutex::new(None));
        let tee = Tee::new(chunks(&["ab", "cd", "ef"]), Box::new(Keep(kept.clone())), 5);
        assert_eq!(tee.collect().await.unwrap().to_bytes(), "abcdef");
        assert!(kept.lock().unwrap().is_none());
        let one = Tee::new(Full::new(Bytes::from("x")), Box::new(Keep(kept.clone())), 5);
        assert_eq!(one.collect().await.unwrap().to_bytes(), "x");
        assert_eq!(kept.lock().unwrap().as_deref(), Some(&b"x"[..]));
        // Announced too large: never copied, and says so before the first byte.
        let big = Tee::new(
            Full::new(Bytes::from("abcdef")),
            Box::new(Keep(kept.clone())),
            5,
        );
        assert!(!big.keeping());
    }

    #[tokio::test]
    async fn an_empty_body_is_copied_without_being_polled() {
        let kept = Arc::new(Mutex::new(None));
        let tee = Tee::new(Full::new(Bytes::new()), Box::new(Keep(kept.clone())), 5);
        assert!(tee.is_end_stream() && !tee.keeping());
        assert_eq!(kept.lock().unwrap().as_deref(), Some(&b""[..]));
    }
}
