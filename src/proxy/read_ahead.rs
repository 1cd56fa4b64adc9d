//! A small request body read whole before a backend is chosen, as nginx reads bodies by
//! default (`proxy_request_buffering on`) and HAProxy with `option http-buffer-request`: a
//! client that sends its body slowly, or stops, holds no backend connection meanwhile. A
//! backend that serves one request per worker (gunicorn, PHP-FPM, a thread pool) is then not
//! tied up by slow uploads, and `upstream_max_connections` is not used up by clients that
//! stall.
//!
//! Only bodies of declared length up to [`READ_AHEAD_LIMIT`] are read ahead, gRPC's never
//! (a stream whose messages may wait for answers), nor an upgrade's. A larger body streams as
//! before, bounded by the upload's own stall deadline. The body is read while each piece comes
//! within `stall` of the last one (the response timeout, as for an upload that stalls); past
//! that the client gets a 408, no backend having seen the request.
//!
//! What it holds stays within what a client could make the proxy hold before: over HTTP/1.1
//! one body a connection (its connection held a piece of up to 64 KiB); over HTTP/2 at most
//! `MAX_CLIENT_STREAMS` (100) bodies of 64 KiB, 6.4 MiB, under the 16 MiB connection window a
//! client may fill ahead of the backends' reading.
//!
//! Most bodies arrive with their head: [`read_now`] takes them at once, without waiting or
//! allocating, and only a body still on its way gets a future of its own ([`ReadAhead`]).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::Body;

use crate::vocab::request_body::{BoxError, WholeBody};
use crate::vocab::{ClientBody, ProxyError};

/// The largest body read whole before a backend is chosen (nginx's `client_body_buffer_size`
/// is 16 KiB on 64-bit systems, past which it writes the body to disk; bodies are kept in
/// memory here, and this is what HTTP/2 backends' refused streams are replayed from too,
/// `KEPT_BODY_LIMIT`). Covers form posts and JSON API calls; uploads of files stream.
pub const READ_AHEAD_LIMIT: u64 = 64 * 1024;

/// Whether `req`'s body is read whole before a backend is chosen: it has a declared length of
/// at most [`READ_AHEAD_LIMIT`], and the request is not gRPC (`grpc`).
pub fn wanted(req: &Request<ClientBody>, grpc: bool) -> bool {
    if grpc || matches!(req.body(), ClientBody::Empty | ClientBody::Whole(_)) {
        return false;
    }
    matches!(req.body().size_hint().exact(), Some(1..=READ_AHEAD_LIMIT))
}

/// What has been read of a body so far.
#[derive(Default)]
pub struct ReadAhead {
    first: Bytes,
    /// The pieces after the first, joined (a body that came in several pieces).
    more: Option<BytesMut>,
    trailers: Option<Box<HeaderMap>>,
    /// The body's declared length.
    declared: u64,
}

impl ReadAhead {
    /// Reads `body` until it ends (ready) or has to wait (pending); a body that fails or brings
    /// more than it declared is the client's fault.
    fn poll_read(
        &mut self,
        body: &mut ClientBody,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ProxyError>> {
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                // Every declared byte is in: the body goes whole without waiting for its end
                // to be said (an HTTP/2 END_STREAM, an HTTP/3 FIN held back got a 408 here,
                // while a larger body went on at once).
                Poll::Pending if self.len() == self.declared => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(body_failed(&error))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.add(data)?,
                    Err(frame) => {
                        // Trailers end a body.
                        self.trailers = frame.into_trailers().ok().map(Box::new);
                        return Poll::Ready(Ok(()));
                    }
                },
            }
            // Asked after a piece, not before each poll: HTTP/2 takes a lock to answer.
            if body.is_end_stream() {
                return Poll::Ready(Ok(()));
            }
        }
    }

    fn add(&mut self, data: Bytes) -> Result<(), ProxyError> {
        if self.len() + data.len() as u64 > READ_AHEAD_LIMIT {
            // The body's parser bounds it by its declared length: never here.
            return Err(ProxyError::ClientBody);
        }
        if self.first.is_empty() {
            self.first = data;
        } else {
            let more = self.more.get_or_insert_with(BytesMut::new);
            more.extend_from_slice(&data);
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        (self.first.len() + self.more.as_ref().map_or(0, BytesMut::len)) as u64
    }

    /// The body read, whole.
    fn into_body(self) -> ClientBody {
        let data = match self.more {
            None => self.first,
            Some(more) => {
                let mut data = BytesMut::with_capacity(self.first.len() + more.len());
                data.extend_from_slice(&self.first);
                data.extend_from_slice(&more);
                data.freeze()
            }
        };
        ClientBody::Whole(WholeBody {
            data,
            trailers: self.trailers,
        })
    }
}

/// Reads `req`'s body whole if all of it is there: `None` when done (the request now carries
/// the body read), else what was read, for [`read_rest`] to go on from.
pub fn read_now(req: &mut Request<ClientBody>) -> Result<Option<ReadAhead>, ProxyError> {
    let declared = req.body().size_hint().exact().unwrap_or(READ_AHEAD_LIMIT);
    let mut ahead = ReadAhead {
        declared,
        ..ReadAhead::default()
    };
    // Nothing is woken by this poll: a body still on its way is polled again by `read_rest`,
    // with the request's waker, before it waits.
    let mut cx = Context::from_waker(Waker::noop());
    match ahead.poll_read(req.body_mut(), &mut cx) {
        Poll::Ready(read) => {
            read?;
            *req.body_mut() = ahead.into_body();
            Ok(None)
        }
        Poll::Pending => Ok(Some(ahead)),
    }
}

/// Reads the rest of `req`'s body after `ahead`, each piece due within `stall` of the one
/// before: past that the request is the client's 408.
pub async fn read_rest(
    req: &mut Request<ClientBody>,
    mut ahead: ReadAhead,
    stall: Duration,
) -> Result<(), ProxyError> {
    let mut deadline = Box::pin(tokio::time::sleep(stall));
    let mut read_before = ahead.len();
    poll_fn(|cx| {
        let read = ahead.poll_read(req.body_mut(), cx);
        if read.is_ready() {
            return read;
        }
        if ahead.len() != read_before {
            read_before = ahead.len();
            deadline.as_mut().reset(tokio::time::Instant::now() + stall);
        }
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(ProxyError::ClientBodyTimeout)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await?;
    *req.body_mut() = ahead.into_body();
    Ok(())
}

fn body_failed(error: &BoxError) -> ProxyError {
    tracing::debug!("request body failed before a backend was chosen: {error}");
    ProxyError::ClientBody
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn post(body: ClientBody) -> Request<ClientBody> {
        Request::post("/").body(body).unwrap()
    }

    fn stream_of(pieces: &'static [&'static [u8]]) -> ClientBody {
        let frames = pieces
            .iter()
            .map(|p| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from_static(p))));
        let stream = futures_util::stream::iter(frames);
        let body = http_body_util::StreamBody::new(stream);
        let sized = Sized(body, pieces.iter().map(|p| p.len() as u64).sum());
        ClientBody::Stream(http_body_util::combinators::UnsyncBoxBody::new(sized))
    }

    /// A body with a declared length, as a client's is.
    struct Sized<B>(B, u64);

    impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Body for Sized<B> {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
            Pin::new(&mut self.0).poll_frame(cx)
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.1)
        }
    }

    #[tokio::test]
    async fn a_body_that_is_all_there_is_read_at_once_and_whole() {
        let mut req = post(stream_of(&[b"abc", b"def", b"g"]));
        assert!(wanted(&req, false));
        assert!(read_now(&mut req).unwrap().is_none());
        assert!(matches!(req.body(), ClientBody::Whole(w) if w.data == "abcdefg"));
        assert!(!wanted(&req, false), "read once");
        let body = req.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "abcdefg");
    }

    #[test]
    fn only_declared_small_non_grpc_bodies_are_read_ahead() {
        assert!(!wanted(&post(stream_of(&[b"abc"])), true), "gRPC");
        assert!(!wanted(&post(ClientBody::Empty), false));
        let big = vec![b'x'; READ_AHEAD_LIMIT as usize + 1].leak();
        let big: &'static [&'static [u8]] = vec![&*big].leak();
        assert!(!wanted(&post(stream_of(big)), false));
        let unsized_body = http_body_util::StreamBody::new(futures_util::stream::empty::<
            Result<http_body::Frame<Bytes>, BoxError>,
        >());
        let unsized_body = ClientBody::Stream(http_body_util::combinators::UnsyncBoxBody::new(
            unsized_body,
        ));
        assert!(!wanted(&post(unsized_body), false), "no declared length");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_coming_is_the_clients_408() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
        let stream = tokio_stream_from(rx);
        let body = Sized(http_body_util::StreamBody::new(stream), 10);
        let mut req = post(ClientBody::Stream(
            http_body_util::combinators::UnsyncBoxBody::new(body),
        ));
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"01234"))))
            .await
            .unwrap();
        let ahead = read_now(&mut req)
            .unwrap()
            .expect("half of it is still to come");
        let started = tokio::time::Instant::now();
        let read = read_rest(&mut req, ahead, Duration::from_secs(3)).await;
        assert!(
            matches!(read, Err(ProxyError::ClientBodyTimeout)),
            "{read:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_whose_declared_bytes_are_in_goes_without_waiting_for_its_end() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
        let body = Sized(http_body_util::StreamBody::new(tokio_stream_from(rx)), 5);
        let mut req = post(ClientBody::Stream(
            http_body_util::combinators::UnsyncBoxBody::new(body),
        ));
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"abcde"))))
            .await
            .unwrap();
        assert!(
            read_now(&mut req).unwrap().is_none(),
            "nothing left to wait for"
        );
        assert!(matches!(req.body(), ClientBody::Whole(w) if w.data == "abcde"));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_is_read_however_long_it_takes() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
        let body = Sized(http_body_util::StreamBody::new(tokio_stream_from(rx)), 5);
        let mut req = post(ClientBody::Stream(
            http_body_util::combinators::UnsyncBoxBody::new(body),
        ));
        let sender = tokio::spawn(async move {
            for piece in [b"a", b"b", b"c", b"d", b"e"] {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let frame = http_body::Frame::data(Bytes::from_static(piece));
                tx.send(Ok(frame)).await.unwrap();
            }
        });
        let ahead = read_now(&mut req).unwrap().expect("nothing came yet");
        read_rest(&mut req, ahead, Duration::from_secs(3))
            .await
            .unwrap();
        sender.await.unwrap();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "abcde");
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin + Send {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
