//! The service wrapper every served connection gets: each request counts as activity (for the
//! idle timeout, the drain and parking) until its response body is done or dropped; while the
//! listener drains, HTTP/1 responses ask the client to close; the answer to a HEAD request
//! never carries a body; and for hyper's servers the request id the body carries
//! ([`LateId`]) goes into the head's map.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, EXPECT};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::service::Service;
use pin_project_lite::pin_project;

use super::idle::{Activity, InFlight};
use crate::vocab::headers::X_REQUEST_ID;
use crate::vocab::late_id::LateId;
use crate::vocab::request_body::{BoxError, FramedByHyper};
use crate::vocab::{ClientBody, StreamHeld};

/// Who writes the heads of a connection's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadWriter {
    /// aralez's own HTTP/1.1 side ([`super::h1`]): it writes the request id itself.
    Own,
    /// hyper: it writes the head from its map, so the id goes into the map.
    Hyper,
}

/// A connection's service: each request counts as activity until its response body is done;
/// while draining, HTTP/1 responses ask the client to close.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    writer: HeadWriter,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>, writer: HeadWriter) -> Tracked<S> {
        Tracked {
            inner,
            activity,
            writer,
        }
    }
}

/// Requests come from hyper (`Incoming` bodies) or from aralez's own HTTP/1.1 server side
/// ([`super::h1`]); the service sees a [`ClientBody`] either way.
impl<S, B, RB> Service<Request<RB>> for Tracked<S>
where
    S: Service<Request<ClientBody>, Response = Response<B>, Error = Infallible>,
    B: LateId + Body,
    RB: Body + Into<ClientBody>,
{
    type Response = Response<ActiveBody<B>>;
    type Error = Infallible;
    type Future = TrackedAnswer<S::Future>;

    fn call(&self, req: Request<RB>) -> Self::Future {
        let mut req: Request<ClientBody> = req.map(Into::into);
        let with_body = !req.body().is_end_stream();
        let in_flight = Some(self.activity.begin(with_body));
        let req_version = req.version();
        let http1 = req_version < Version::HTTP_2;
        let body_end = (http1 && with_body && self.writer == HeadWriter::Hyper)
            .then(|| note_body_end(&mut req));
        if !http1 {
            self.activity.mark_http2();
            if req.method() == Method::CONNECT {
                hold_for_a_tunnel(&self.activity, &mut req);
            }
        }
        let head = req.method() == Method::HEAD;
        // Only hyper serves HTTP/1.1 requests with `Expect` (aralez's own side hands them over).
        let expects =
            http1 && self.writer == HeadWriter::Hyper && req.headers().contains_key(EXPECT);
        TrackedAnswer {
            expects,
            body_end,
            inner: self.inner.call(req),
            in_flight,
            version: req_version,
            head,
            writer: self.writer,
        }
    }
}

/// Wraps `req`'s body (hyper's, HTTP/1) so that its end is noted. An answer that comes before
/// it and leaves the rest unread (a refusal, a backend's early answer; [`body_left_unread`])
/// ends the connection, as hyper will not read the rest: it must say `Connection: close` (RFC
/// 9112 §9.6), or a client that reuses the connection meets its end, and one that pipelined
/// loses the request. hyper writes the head before it finds out, and then closes without
/// saying so.
fn note_body_end(req: &mut Request<ClientBody>) -> Arc<AtomicBool> {
    let ended = Arc::new(AtomicBool::new(false));
    let inner = std::mem::replace(req.body_mut(), ClientBody::Empty);
    let noted = EndNoted {
        inner,
        ended: ended.clone(),
    };
    *req.body_mut() = ClientBody::Stream(http_body_util::BodyExt::boxed_unsync(noted));
    req.extensions_mut().insert(FramedByHyper);
    ended
}

/// Whether the rest of a request body, not read to its end when the answer came, will be left
/// unread: nobody holds the body any more (a refusal), or the answer is an error (a backend's
/// early 413, whose upload stops). A body still held under a success (a backend that streams
/// its answer while it reads, as an echo does) is read to its end by hyper, and the connection
/// goes on.
fn body_left_unread(ended: &Arc<AtomicBool>, status: StatusCode) -> bool {
    let dropped = Arc::strong_count(ended) == 1;
    !ended.load(Ordering::Relaxed) && (dropped || status.as_u16() >= 400)
}

pin_project! {
    /// A request body that notes when it has been read to its end.
    struct EndNoted {
        #[pin]
        inner: ClientBody,
        ended: Arc<AtomicBool>,
    }
}

impl Body for EndNoted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            // Trailers are a body's last frame: hyper's body still says "more" (chunked).
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            this.ended.store(true, Ordering::Relaxed);
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

/// An HTTP/2 CONNECT may become a tunnel that outlives its response: it holds a request's
/// place on the connection of its own ([`StreamHeld`]), counted as waiting (the tunnel's idle
/// timeout bounds it, not the connection's stall check).
fn hold_for_a_tunnel(activity: &Arc<Activity>, req: &mut Request<ClientBody>) {
    let mut held = activity.begin(false);
    held.set_waiting(true);
    req.extensions_mut().insert(StreamHeld(Arc::new(held)));
}

pin_project! {
    /// The inner service's answer, its body carrying the request's [`InFlight`] guard.
    pub struct TrackedAnswer<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        // The request's: HTTP/1 is told `Connection: close` when draining.
        version: Version,
        head: bool,
        // The request asked for `100 Continue` before sending its body.
        expects: bool,
        // hyper's HTTP/1 request body: whether it has been read to its end.
        body_end: Option<Arc<AtomicBool>>,
        writer: HeadWriter,
    }
}

impl<F, B> Future for TrackedAnswer<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: LateId + Body,
{
    type Output = Result<Response<ActiveBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Poll::Ready(Ok(mut resp)) = this.inner.poll(cx) else {
            if let Some(in_flight) = this.in_flight.as_mut() {
                in_flight.set_waiting(true);
            }
            return Poll::Pending;
        };
        if *this.writer == HeadWriter::Hyper {
            if let Some(id) = resp.body_mut().take_request_id() {
                resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
            }
        }
        let mut draining = false;
        if let Some(in_flight) = this.in_flight.as_mut() {
            in_flight.set_waiting(false);
            in_flight.progress();
            draining = in_flight.draining();
        }
        let body_left = this
            .body_end
            .as_ref()
            .is_some_and(|ended| body_left_unread(ended, resp.status()));
        let ends = body_left
            || ends_connection(&resp, *this.writer, *this.expects)
            || (*this.version == Version::HTTP_10 && ends_by_closing(&resp, *this.head));
        if *this.version < Version::HTTP_2 && (draining || ends) {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            // An HTTP/1.1 answer to an HTTP/1.0 request that asked to keep the connection gets
            // hyper's `keep-alive` added to the `close`; one marked HTTP/1.0 does not.
            if *this.version == Version::HTTP_10 {
                *resp.version_mut() = Version::HTTP_10;
            }
        }
        let in_flight = this.in_flight.take();
        let head = *this.head;
        Poll::Ready(Ok(resp.map(|inner| ActiveBody {
            inner,
            in_flight,
            head,
        })))
    }
}

/// Whether hyper is to close the connection after `resp`, saying so: a 408 (the request's body
/// stopped coming, so what follows on the connection is no request; aralez's own HTTP/1.1
/// writer does the same), or a refusal of a request that `expects` to be told to send its body
/// (the body was never asked for, and hyper closes rather than read it).
fn ends_connection<B>(resp: &Response<B>, writer: HeadWriter, expects: bool) -> bool {
    let status = resp.status();
    (writer == HeadWriter::Hyper && status == StatusCode::REQUEST_TIMEOUT)
        || (expects && status.as_u16() >= 400)
}

/// Whether an answer to an HTTP/1.0 client can end only by the connection's close: it has a
/// body of no known length (a backend's chunked or close-delimited answer, streamed). HTTP/1.0
/// has no chunked coding, so hyper sends such a body until it closes, and said `keep-alive`
/// before it: a client's next request on the connection was lost.
fn ends_by_closing<B: Body>(resp: &Response<B>, head: bool) -> bool {
    let no_body = head || matches!(resp.status().as_u16(), 204 | 304);
    !no_body
        && resp.body().size_hint().exact().is_none()
        && !resp.headers().contains_key(http::header::CONTENT_LENGTH)
}

pin_project! {
    /// A response body that keeps its request counted as activity until it is done or dropped.
    /// The answer to a HEAD request has no body whoever wrote it (RFC 9110 §9.3.2): hyper leaves
    /// it out on HTTP/1.1 but would send it as DATA on HTTP/2, which clients take as a protocol
    /// error. Its length still describes the body a GET would get.
    pub struct ActiveBody<B> {
        #[pin]
        inner: B,
        in_flight: Option<InFlight>,
        head: bool,
    }
}

impl<B: LateId> LateId for ActiveBody<B> {
    fn take_request_id(&mut self) -> Option<HeaderValue> {
        self.inner.take_request_id()
    }
}

impl<B: Body> Body for ActiveBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.head {
            return Poll::Ready(None);
        }
        let polled = this.inner.poll_frame(cx);
        if let Some(in_flight) = this.in_flight.as_mut() {
            in_flight.set_waiting(polled.is_pending());
            if let Poll::Ready(Some(Ok(_))) = &polled {
                in_flight.progress();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.head || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
