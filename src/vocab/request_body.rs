//! The client's request body on its way to a backend, counting the bytes that pass when the
//! access log asked for them (`bytes_in`): [`BytesIn`] is the request extension that asks,
//! [`RequestBody`] the body that counts. Without the extension nothing is counted and the body
//! is the client's, frame for frame, but for trailers unfit to cross ([`super::trailers`]). The counter is held until the body is dropped, so whoever
//! counts can tell when the request side is over. [`ClientBody`] is what a client connection
//! hands the router: hyper's body (HTTP/1.1, HTTP/2), an HTTP/3 stream's, or none (a request
//! aralez's own HTTP/1.1 server side read).
//!
//! A client's body that can be sent again ([`KeptBody`]): while it goes to a backend it keeps a
//! copy of the frames it passes on, up to a bound, and when whoever sends it drops it (hyper's
//! client does, on a stream the backend refused) it goes back to the one waiting for it
//! ([`KeptHome`]), which sends the kept frames again, followed by the rest of the body.
//!
//! An HTTP/2 backend that refuses a stream (REFUSED_STREAM, or a GOAWAY below it) has processed
//! none of it, so the request may go again whatever its method (RFC 9113 §8.7); hyper's client
//! has taken the body by then, and may have sent part of it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use tokio::sync::oneshot;

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
    /// A body read whole before a backend was chosen (`proxy::read_ahead`).
    Whole(WholeBody),
}

/// Marks a request whose body hyper's HTTP/1 side framed, now carried as another variant (its
/// end noted, `server::tracked`): it may have come with `Transfer-Encoding`, which routing
/// checks only on such requests.
#[derive(Clone, Copy, Debug)]
pub struct FramedByHyper;

/// A client's body read to its end: its data in one piece, and its trailers if it had any.
pub struct WholeBody {
    pub data: Bytes,
    pub trailers: Option<Box<http::HeaderMap>>,
}

impl WholeBody {
    fn poll_frame(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if !self.data.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut self.data)))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(*t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.trailers.is_none()
    }
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Hyper(inner) => inner.fmt(f),
            ClientBody::Stream(_) => f.write_str("ClientBody::Stream"),
            ClientBody::Empty => f.write_str("ClientBody::Empty"),
            ClientBody::Kept(_) => f.write_str("ClientBody::Kept"),
            ClientBody::Whole(whole) => write!(f, "ClientBody::Whole({})", whole.data.len()),
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
            ClientBody::Whole(whole) => whole.poll_frame(),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(inner) => inner.is_end_stream(),
            ClientBody::Stream(inner) => inner.is_end_stream(),
            ClientBody::Empty => true,
            ClientBody::Kept(inner) => inner.is_end_stream(),
            ClientBody::Whole(whole) => whole.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(inner) => inner.size_hint(),
            ClientBody::Stream(inner) => inner.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
            ClientBody::Kept(inner) => inner.size_hint(),
            ClientBody::Whole(whole) => SizeHint::with_exact(whole.data.len() as u64),
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
            ClientBody::Hyper(_) | ClientBody::Stream(_) | ClientBody::Whole(_) => {}
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

/// The most of a body kept for sending it again; a larger body is not sent again.
pub const KEPT_BODY_LIMIT: usize = 64 * 1024;

/// How long a refused request waits for its body to come back from hyper's client (it comes as
/// soon as the refused stream's task sees the reset).
const RETURN_DEADLINE: Duration = Duration::from_secs(1);

/// The client's body, with the frames it passed on kept for another attempt.
pub struct KeptBody {
    inner: ClientBody,
    /// Counts the bytes the client sent, once: frames sent again are not counted again.
    counter: Option<Arc<dyn BodyCounter>>,
    kept: Vec<Frame<Bytes>>,
    kept_bytes: usize,
    /// More than [`KEPT_BODY_LIMIT`] went by: what is kept is not the whole of it.
    overflowed: bool,
    /// How many kept frames this attempt has sent again.
    replayed: usize,
    home: Option<oneshot::Sender<KeptBody>>,
}

/// Where a [`KeptBody`] comes back to when its attempt drops it.
pub struct KeptHome(oneshot::Receiver<KeptBody>);

impl KeptBody {
    /// Keeps `inner` (counted into `counter`); the body comes back to the home when dropped.
    pub fn new(inner: ClientBody, counter: Option<Arc<dyn BodyCounter>>) -> (KeptBody, KeptHome) {
        let (home, waiting) = oneshot::channel();
        let body = KeptBody {
            inner,
            counter,
            kept: Vec::new(),
            kept_bytes: 0,
            overflowed: false,
            replayed: 0,
            home: Some(home),
        };
        (body, KeptHome(waiting))
    }

    /// A new home for a body that is going again as it is (its attempt never took it).
    pub fn rehome(&mut self) -> KeptHome {
        let (home, waiting) = oneshot::channel();
        self.home = Some(home);
        KeptHome(waiting)
    }

    fn keep(&mut self, frame: &Frame<Bytes>) {
        if self.overflowed {
            return;
        }
        let Some(copy) = copy_frame(frame) else {
            return;
        };
        self.kept_bytes += frame.data_ref().map_or(0, Bytes::len);
        if self.kept_bytes > KEPT_BODY_LIMIT {
            self.overflowed = true;
            self.kept = Vec::new();
        } else {
            self.kept.push(copy);
        }
    }

    fn replay_frame(&mut self) -> Option<Frame<Bytes>> {
        let frame = self.kept.get(self.replayed)?;
        self.replayed += 1;
        copy_frame(frame)
    }

    fn to_replay(&self) -> usize {
        let left = self.kept.get(self.replayed..).unwrap_or_default();
        left.iter()
            .filter_map(|f| f.data_ref().map(Bytes::len))
            .sum()
    }
}

/// A copy of a data or trailers frame (`Frame` is not `Clone`); data is shared, not copied.
fn copy_frame(frame: &Frame<Bytes>) -> Option<Frame<Bytes>> {
    match (frame.data_ref(), frame.trailers_ref()) {
        (Some(data), _) => Some(Frame::data(data.clone())),
        (None, Some(trailers)) => Some(Frame::trailers(trailers.clone())),
        (None, None) => None,
    }
}

impl KeptHome {
    /// The body back from an attempt that processed none of it, to be sent again from its first
    /// byte; `None` if it is not whole (past the bound) or does not come back in time.
    pub async fn take_back(self) -> Option<KeptBody> {
        let body = tokio::time::timeout(RETURN_DEADLINE, self.0)
            .await
            .ok()?
            .ok()?;
        (!body.overflowed).then_some(body)
    }
}

impl Drop for KeptBody {
    fn drop(&mut self) {
        let Some(home) = self.home.take() else {
            return;
        };
        if home.is_closed() || self.overflowed {
            return;
        }
        let back = KeptBody {
            inner: std::mem::replace(&mut self.inner, ClientBody::Empty),
            counter: self.counter.take(),
            kept: std::mem::take(&mut self.kept),
            kept_bytes: self.kept_bytes,
            overflowed: false,
            replayed: 0,
            home: None,
        };
        let _ = home.send(back);
    }
}

impl Body for KeptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.replay_frame() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(counter), Some(data)) = (&this.counter, frame.data_ref()) {
                counter.add(data.len() as u64);
            }
            this.keep(frame);
            this.replayed = this.kept.len();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.replayed >= self.kept.len() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let to_replay = self.to_replay() as u64;
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + to_replay);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + to_replay);
        }
        hint
    }
}
