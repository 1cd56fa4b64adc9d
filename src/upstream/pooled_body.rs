//! The backend's response body on its way to the client: it gives its HTTP/1.1 connection back
//! to the worker's pool once read to the end, and says which backend answered ([`ServedBy`]).
//! Trailer fields unfit to cross are taken out ([`trailers`]), whichever client read them.
//!
//! The backend travels in the body, not in the response's extensions: the first extension of a
//! response allocates a map, an entry and a box, which every proxied request would pay. Where
//! the proxy replaces a backend's body with an empty one of its own (a 204 or 304, an upgrade, a
//! HEAD kept for the cache), [`keep_served_by`] moves the backend to the extensions, and
//! [`served_by`] looks in both.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;

use super::backend::Backend;
use super::connector::UpBody;
use super::inline::{self, InlineBody, InlineConn, InlineError};
use super::slot::StreamTicket;
use super::stall::StallTimer;
use crate::vocab::request_body::BoxError;
use crate::vocab::trailers;
use crate::vocab::WorkerId;

/// The backend that answered (for metrics, the access log and sticky cookies), and when the
/// exchange with it began (the access log's `upstream_ms` runs from there to the response head).
#[derive(Clone, Debug)]
pub struct ServedBy(pub Arc<Backend>, pub std::time::Instant);

/// On the proxy's own answer to an exchange that failed: the backend it failed with (the last
/// one tried), for the access log (nginx's `$upstream_addr` on a 502 or 504). Not an answer of
/// the backend's: metrics and sticky sessions leave it alone.
#[derive(Clone, Debug)]
pub struct FailedAt(pub Arc<Backend>);

/// Bodies that may come from a backend: which one answered, if any did.
pub trait Served {
    fn served_by(&self) -> Option<&ServedBy>;
}

/// The backend that answered `resp`, if one did.
pub fn served_by<B: Served>(resp: &Response<B>) -> Option<&ServedBy> {
    resp.body()
        .served_by()
        .or_else(|| resp.extensions().get::<ServedBy>())
}

/// Before `body` is replaced by the proxy's own: keeps the backend that answered in the head.
pub fn keep_served_by(head: &mut http::response::Parts, body: &impl Served) {
    if let Some(served) = body.served_by() {
        head.extensions.insert(served.clone());
    }
}

impl<L: Served, R: Served> Served for Either<L, R> {
    fn served_by(&self) -> Option<&ServedBy> {
        match self {
            Either::Left(body) => body.served_by(),
            Either::Right(body) => body.served_by(),
        }
    }
}

/// A body the proxy wrote itself.
impl Served for Full<Bytes> {
    fn served_by(&self) -> Option<&ServedBy> {
        None
    }
}

/// The pool an inline connection goes back to: its backend, in the sending worker's slot.
pub struct PoolHome {
    pub backend: Arc<Backend>,
    pub worker: WorkerId,
}

impl inline::Home for PoolHome {
    fn keep(self, conn: Box<InlineConn>) {
        self.backend.keep_inline(self.worker, conn);
    }
}

/// An HTTP/1.1 connection that goes back to its worker's pool, under its server name, once its
/// response has been read.
pub struct Reusable {
    pub conn: http1::SendRequest<UpBody>,
    pub backend: Arc<Backend>,
    /// The worker's number ([`WorkerId`]) and the backend's count of address changes when the
    /// request was sent on it ([`Backend::addrs_generation`]): one that changed meanwhile is
    /// not pooled again. Two `u32`s in one word: a larger body made every move of a response
    /// dearer (about 90 instructions a request more in `memcpy`).
    pub worker_and_generation: (u32, u32),
    pub sni: Option<Arc<str>>,
}

/// A backend's response body that hands its HTTP/1.1 connection back to the pool once read to
/// the end.
pub struct PooledBody {
    inner: Inner,
    conn: Option<Reusable>,
    /// The stream's place on a shared HTTP/2 connection, freed with the body.
    _stream: Option<StreamTicket>,
    served_by: Option<ServedBy>,
}

/// Where the body comes from: hyper's client connection, or a connection this body reads
/// itself (which goes home on its own).
enum Inner {
    Hyper(Incoming, StallTimer),
    Inline(InlineBody<PoolHome, UpBody>),
}

impl PooledBody {
    /// hyper's response, with the HTTP/1.1 connection to give back or the HTTP/2 stream's place;
    /// the body is cut when nothing of it comes for `stall_limit` ([`StallTimer`]).
    pub fn wrap(
        resp: Response<Incoming>,
        (conn, stream): (Option<Reusable>, Option<StreamTicket>),
        stall_limit: Duration,
    ) -> Response<PooledBody> {
        resp.map(|inner| {
            let mut body = PooledBody {
                inner: Inner::Hyper(inner, StallTimer::new(stall_limit)),
                conn,
                _stream: stream,
                served_by: None,
            };
            body.release_if_done();
            body
        })
    }

    /// A body the inline client reads.
    pub fn inline(body: InlineBody<PoolHome, UpBody>) -> PooledBody {
        PooledBody {
            inner: Inner::Inline(body),
            conn: None,
            _stream: None,
            served_by: None,
        }
    }

    /// Whether the answer's hop-by-hop fields are out of its map already: the inline client
    /// takes them out as it reads the head ([`crate::vocab::hop_by_hop::AnswerHopByHop`]).
    pub fn hop_by_hop_gone(&self) -> bool {
        matches!(self.inner, Inner::Inline(_))
    }

    /// The inline client's body failed: said unless the client's side failed it.
    #[cold]
    fn inline_failed(&self, error: InlineError) -> BoxError {
        let client_side = matches!(
            error,
            InlineError::RequestBody(_) | InlineError::ClientStalled
        );
        if !client_side {
            self.say_cut(&error);
        }
        BoxError::from(error)
    }

    /// Says that the backend's answer was cut after its head (the client gets what came, then
    /// the connection ends; the access log has the head's status): nginx's "upstream
    /// prematurely closed connection while reading upstream".
    #[cold]
    fn say_cut(&self, error: &dyn std::fmt::Display) {
        let backend = self.served_by.as_ref().map(|s| &s.0);
        let label = backend.map_or("-", |b| &*b.label);
        tracing::warn!(
            backend = label,
            "the backend's answer was cut after its head: {error}"
        );
        if let Some(backend) = backend {
            // The body is read where the client's connection is served: no worker of its own
            // here, so the count goes to the shard threads that are no worker share.
            let anywhere = WorkerId(usize::MAX);
            let cut = crate::metrics::UpstreamFailure::Cut;
            backend.metrics.upstream_failed(anywhere, label, cut);
        }
    }

    pub fn set_served_by(&mut self, served_by: ServedBy) {
        self.served_by = Some(served_by);
    }

    fn release_if_done(&mut self) {
        if self.inner.is_end_stream() {
            if let Some(r) = self.conn.take() {
                let (worker, generation) = r.worker_and_generation;
                let worker = WorkerId(worker as usize);
                r.backend.keep_hyper(worker, (r.sni, generation), r.conn);
            }
        }
    }
}

impl Served for PooledBody {
    fn served_by(&self) -> Option<&ServedBy> {
        self.served_by.as_ref()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        self.release_if_done();
    }
}

impl Inner {
    fn is_end_stream(&self) -> bool {
        match self {
            Inner::Hyper(b, _) => b.is_end_stream(),
            Inner::Inline(b) => b.is_end_stream(),
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = match &mut self.inner {
            Inner::Hyper(b, stall) => {
                let polled = Pin::new(b).poll_frame(cx).map_err(BoxError::from);
                if stall.stalled(polled.is_ready(), cx) {
                    Poll::Ready(Some(Err(stall.error().into())))
                } else {
                    polled
                }
            }
            Inner::Inline(b) => {
                let polled = match Pin::new(b).poll_frame(cx) {
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(self.inline_failed(e)))),
                    other => other.map_err(BoxError::from),
                };
                return trailers::fit_frame(polled);
            }
        };
        let polled = trailers::fit_frame(polled);
        match &polled {
            Poll::Ready(None) => self.release_if_done(),
            Poll::Ready(Some(Ok(_))) => self.release_if_done(),
            Poll::Ready(Some(Err(e))) => {
                self.say_cut(e);
                self.conn = None;
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Hyper(b, _) => b.size_hint(),
            Inner::Inline(b) => b.size_hint(),
        }
    }
}
