//! The client's request body on its way to a backend, counting the bytes that pass when the
//! access log asked for them (`bytes_in`): [`BytesIn`] is the request extension that asks,
//! [`RequestBody`] the body that counts. Without the extension nothing is counted and the body
//! is the client's, frame for frame, but for trailers unfit to cross ([`super::trailers`]). The counter is held until the body is dropped, so whoever
//! counts can tell when the request side is over. [`ClientBody`] is what a client connection
//! hands the router: hyper's body (HTTP/1.1, HTTP/2), an HTTP/3 stream's, or none (a request
//! aralez's own HTTP/1.1 server side read).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;

use super::kept_body::{KeptBody, KeptHome};

/// An error of a client's body, whatever its protocol.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body: hyper's (HTTP/1.1, HTTP/2), or another protocol's stream (HTTP/3).
pub enum ClientBody {
    Hyper(Incoming),
    Stream(UnsyncBoxBody<Bytes, BoxError>),
    /// A request without a body (aralez's own HTTP/1.1 server side), or whose body had ended
    /// by the time it reached the router.
    Empty,
    /// A body kept to be sent again to an HTTP/2 backend that may refuse it ([`KeptBody`]).
    Kept(Box<KeptBody>),
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Hyper(inner) => inner.fmt(f),
            ClientBody::Stream(_) => f.write_str("ClientBody::Stream"),
            ClientBody::Empty => f.write_str("ClientBody::Empty"),
            ClientBody::Kept(_) => f.write_str("ClientBody::Kept"),
        }
    }
}

/// A body that has already ended (an HTTP/2 request whose HEADERS frame carried END_STREAM)
/// becomes [`ClientBody::Empty`]: asking h2 whether a stream has ended takes its lock, and the
/// request path asks several times.
impl From<Incoming> for ClientBody {
    fn from(body: Incoming) -> ClientBody {
        if body.is_end_stream() {
            ClientBody::Empty
        } else {
            ClientBody::Hyper(body)
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Hyper(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
            ClientBody::Stream(inner) => Pin::new(inner).poll_frame(cx),
            ClientBody::Empty => Poll::Ready(None),
            ClientBody::Kept(inner) => Pin::new(inner.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(inner) => inner.is_end_stream(),
            ClientBody::Stream(inner) => inner.is_end_stream(),
            ClientBody::Empty => true,
            ClientBody::Kept(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(inner) => inner.size_hint(),
            ClientBody::Stream(inner) => inner.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
            ClientBody::Kept(inner) => inner.size_hint(),
        }
    }
}

/// What counts a request's body bytes.
pub trait BodyCounter: Send + Sync {
    fn add(&self, bytes: u64);
}

/// Request extension: where the request's body bytes are counted.
#[derive(Clone)]
pub struct BytesIn(pub Arc<dyn BodyCounter>);

/// The client's body, counted into a [`BytesIn`] when there is one.
pub struct RequestBody {
    inner: ClientBody,
    counter: Option<Arc<dyn BodyCounter>>,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("inner", &self.inner)
            .field("counted", &self.counter.is_some())
            .finish()
    }
}

impl RequestBody {
    pub fn new(inner: ClientBody, counter: Option<BytesIn>) -> RequestBody {
        RequestBody {
            inner,
            counter: counter.map(|c| c.0),
        }
    }

    /// Keeps what this body passes on, to send it again if the attempt it goes on is refused
    /// unprocessed; `None` for a body that has none to pass on.
    pub fn keep_for_replay(&mut self) -> Option<KeptHome> {
        match &mut self.inner {
            ClientBody::Empty => return None,
            ClientBody::Kept(kept) => return Some(kept.rehome()),
            ClientBody::Hyper(_) | ClientBody::Stream(_) => {}
        }
        let inner = std::mem::replace(&mut self.inner, ClientBody::Empty);
        let (kept, home) = KeptBody::new(inner, self.counter.take());
        self.inner = ClientBody::Kept(Box::new(kept));
        Some(home)
    }

    /// A kept body back from a refused attempt, to be sent again (it counts its bytes itself).
    pub fn replaying(kept: KeptBody) -> RequestBody {
        RequestBody {
            inner: ClientBody::Kept(Box::new(kept)),
            counter: None,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = super::trailers::fit_frame(Pin::new(&mut this.inner).poll_frame(cx));
        if let (Some(counter), Poll::Ready(Some(Ok(frame)))) = (&this.counter, &polled) {
            if let Some(data) = frame.data_ref() {
                counter.add(data.len() as u64);
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
