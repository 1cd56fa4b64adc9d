//! aralez's own HTTP/1.1 server side, for the common case: a keep-alive HTTP/1.1 request
//! without a body or with one of declared length. It reads heads with `httparse` into one
//! 4 KiB buffer, calls the service, feeds it the request body as it takes it ([`body`]), and
//! writes the head and the body's first pieces in one write ([`write`]), all from the
//! connection's task, with no channel between the socket and the service.
//!
//! hyper's server holds 16 KiB of buffers per connection (8 KiB read, 8 KiB write) for its
//! whole life and hands each request's body through a channel to its dispatcher; this side
//! holds one 4 KiB read buffer and a write buffer as large as the heads it writes.
//!
//! Everything else goes to hyper, unchanged: when a head is not of the common case
//! ([`request::Head::Unusual`]: HTTP/1.0, CONNECT, upgrades, `Expect`, a chunked body, a
//! malformed, oversized or HTTP/2 head) the connection ends with a [`Handoff`]: its IO and the
//! bytes read but not yet served, for hyper to serve from there (its answers to bad requests,
//! 400 and 431, stay hyper's). Pipelined requests are answered one after another.

mod body;
mod ending;
mod request;
mod response;
mod write;

use std::convert::Infallible;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::Body;
use hyper::service::Service;
use tokio::io::{AsyncRead, AsyncWrite};

use super::idle::Graceful;
use crate::vocab::late_id::LateId;
use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;
use ending::client_left;
pub(super) use ending::{linger, lingering_close};
use request::Head;
use response::{CachedDate, Framing, Shape};
use write::{flush_all, poll_body, Outbox, Sending};

/// The read buffer: a request head larger than this goes to hyper (whose limit is
/// `max_header_bytes`).
const READ_ROOM: usize = 4 * 1024;
/// A write buffer larger than this is not kept between requests.
const MAX_KEPT_OUT: usize = 16 * 1024;

/// A connection handed to hyper: its IO and the bytes read from it but not served.
pub struct Handoff<IO> {
    pub io: IO,
    pub read: Bytes,
    /// Requests this module answered on the connection before.
    pub served: u64,
}

impl<IO> std::fmt::Debug for Handoff<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("read", &self.read)
            .field("served", &self.served)
            .finish_non_exhaustive()
    }
}

/// Why a connection ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the client closed the connection in the middle of a request head")]
    IncompleteHead,
    #[error("the response body failed: {0}")]
    Body(BoxError),
    #[error("the response body is not as long as its Content-Length")]
    BodyLength,
    #[error(transparent)]
    Head(#[from] response::HeadError),
    #[error("{0}")]
    Refused(Refusal),
}

/// A request this side answers itself, ending the connection, as nginx does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A request line longer than the whole head may be (nginx's 414; hyper, which takes heads
    /// over [`READ_ROOM`], answered it 431, as a head of too many fields).
    #[error("the request line is longer than max_request_header_bytes; answered 414")]
    TargetTooLong,
    /// A `Content-Length` above 2^63 − 1 (nginx's 400; [`request`] says what hyper did).
    #[error("the request's Content-Length is above 2^63 - 1; answered 400")]
    ContentLengthTooLarge,
    /// `HTTP/2.0` or later in an HTTP/1 request line (nginx's 505; hyper's 400).
    #[error("the request line names HTTP/2 or later; answered 505")]
    VersionNotSupported,
}

impl Refusal {
    pub fn status(self) -> http::StatusCode {
        match self {
            Refusal::TargetTooLong => http::StatusCode::URI_TOO_LONG,
            Refusal::ContentLengthTooLarge => http::StatusCode::BAD_REQUEST,
            Refusal::VersionNotSupported => http::StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        }
    }

    fn answer(self) -> &'static [u8] {
        match self {
            Refusal::TargetTooLong => {
                b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
            Refusal::ContentLengthTooLarge => {
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
            Refusal::VersionNotSupported => {
                b"HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
        }
    }
}

/// The socket this side serves: read and written as any, and ended by its last write. The
/// defaults suit any stream; a client's TCP or TLS socket does better
/// (`server::ending`).
pub trait Socket: AsyncRead + AsyncWrite + Unpin {
    /// Writes some or all of `bufs` as the connection's last bytes (the last call is the one
    /// that takes all it is given). TLS puts its `close_notify` behind them, to leave in the
    /// same write.
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, bufs)
    }

    /// Sends what the peer must still get before the connection is dropped for good.
    fn poll_end(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_shutdown(cx)
    }
}

/// What this side serves: a service whose answers are never errors (errors are responses), and
/// whose answer and body are polled where they lie.
pub trait Serve:
    Service<Request<ClientBody>, Response = Response<Self::Body>, Error = Infallible, Future: Unpin>
    + Unpin
{
    type Body: Body<Data = Bytes, Error: Into<BoxError>> + LateId + Unpin;
}

impl<S, B> Serve for S
where
    S: Service<Request<ClientBody>, Response = Response<B>, Error = Infallible> + Unpin,
    S::Future: Unpin,
    B: Body<Data = Bytes, Error: Into<BoxError>> + LateId + Unpin,
{
    type Body = B;
}

/// What the connection is doing.
enum State<F, B> {
    /// Reading the next request head.
    Head,
    /// Waiting for the service's answer.
    Answer {
        answer: F,
        method: Method,
        close: bool,
    },
    /// Sending the response body.
    Body {
        body: B,
        sending: Sending,
        close: bool,
    },
    /// Writing out what is buffered, then the next request (or the end).
    Finish {
        close: bool,
    },
    /// Reading and dropping the rest of a request body nobody took ([`body`]).
    Discard,
    /// Shutting the connection down.
    Close,
    /// Ending a connection whose client is still sending a body nobody reads ([`linger`]);
    /// whether its side is shut down yet.
    Linger {
        shut: bool,
    },
    Done,
}

/// One client connection served by this module, until it ends, fails or is handed to hyper.
pub struct Connection<IO, S: Serve> {
    io: Option<IO>,
    service: S,
    read: BytesMut,
    /// Bytes to write before `piece`: a head, chunk framing, small body pieces.
    out: Vec<u8>,
    written: usize,
    /// A large body piece, written as it is.
    piece: Bytes,
    state: State<S::Future, S::Body>,
    /// The body of the request being answered, while it is still read.
    feed: Option<body::Feed>,
    date: CachedDate,
    shutdown_asked: bool,
    /// The connection's timer saw the request wait for its backend: a client that leaves
    /// meanwhile ends the request ([`client_left`]).
    watching: bool,
    served: u64,
    /// `max_request_header_bytes`: a request line longer than this is answered 414 here.
    max_head: usize,
    /// A request was answered here: the connection ends with [`H1Error::Refused`].
    refused: Option<Refusal>,
}

impl<IO, S: Serve> Connection<IO, S> {
    /// Serves `io`, starting with the bytes already read from it.
    pub fn new(io: IO, service: S, read: BytesMut) -> Self {
        Connection {
            io: Some(io),
            service,
            read,
            out: Vec::new(),
            written: 0,
            piece: Bytes::new(),
            state: State::Head,
            feed: None,
            date: CachedDate::new(),
            shutdown_asked: false,
            watching: false,
            served: 0,
            max_head: usize::MAX,
            refused: None,
        }
    }

    /// Answers 414 to a request line longer than `max_head` bytes (the head's own limit): a
    /// longer head goes to hyper, which cannot tell a long target from many fields.
    pub fn with_head_limit(mut self, max_head: usize) -> Self {
        self.max_head = max_head;
        self
    }
}

impl<IO: Socket, S: Serve> Future for Connection<IO, S> {
    type Output = Result<Option<Handoff<IO>>, H1Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            if matches!(this.state, State::Answer { .. } | State::Body { .. }) {
                this.feed_body(cx);
            }
            let Some(io) = this.io.as_mut() else {
                return Poll::Ready(Ok(None));
            };
            match &mut this.state {
                State::Head => match ready!(this.poll_head(cx)) {
                    Ok(None) => {}
                    Ok(Some(handoff)) => return Poll::Ready(Ok(Some(handoff))),
                    Err(e) => return Poll::Ready(Err(e)),
                },
                State::Answer {
                    answer,
                    method,
                    close,
                } => {
                    let Poll::Ready(Ok(resp)) = Pin::new(answer).poll(cx) else {
                        if this.watching && client_left(io, &mut this.read, &this.feed, cx) {
                            tracing::debug!("the client left before its answer came");
                            // Dropping the answer cancels the backend's exchange (nginx's 499).
                            this.state = State::Done;
                            this.io = None;
                            return Poll::Ready(Ok(None));
                        }
                        return Poll::Pending;
                    };
                    let (method, close) = (method.clone(), *close);
                    this.start_response(resp, &method, close)?;
                }
                State::Body {
                    body,
                    sending,
                    close,
                } => {
                    let close = *close;
                    let outbox = Outbox {
                        out: &mut this.out,
                        written: &mut this.written,
                        piece: &mut this.piece,
                    };
                    let step = poll_body(io, cx, body, sending, outbox);
                    match ready!(step) {
                        Ok(()) => this.state = State::Finish { close },
                        // What came of the body still goes out, without its end, and the
                        // connection closes: the client sees the answer cut short (nginx does
                        // the same). Failing at once, it lost the head already buffered and
                        // got an empty reply, logged as a 200.
                        Err(H1Error::Body(e)) => {
                            tracing::debug!(
                                "the answer's body failed: {e}; closing after what came"
                            );
                            this.state = State::Finish { close: true };
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                State::Finish { close } => {
                    let close = *close || this.shutdown_asked;
                    let (out, written, piece) = (&this.out, &mut this.written, &mut this.piece);
                    ready!(flush_all(io, cx, out, written, piece, close))?;
                    this.out.clear();
                    this.written = 0;
                    if this.out.capacity() > MAX_KEPT_OUT {
                        this.out = Vec::new();
                    }
                    this.state = this.after_response(close);
                }
                State::Discard => match ready!(this.poll_discard(cx)) {
                    Ok(true) => this.state = State::Head,
                    Ok(false) => this.state = State::Close,
                    Err(e) => return Poll::Ready(Err(e)),
                },
                State::Close => {
                    // Errors do not matter any more: the connection is over either way.
                    let _ = ready!(Pin::new(io).poll_end(cx));
                    this.state = State::Done;
                }
                State::Linger { shut } => {
                    ready!(linger(io, &mut this.read, shut, cx));
                    this.state = State::Done;
                }
                State::Done => {
                    return Poll::Ready(match this.refused {
                        Some(refusal) => Err(H1Error::Refused(refusal)),
                        None => Ok(None),
                    })
                }
            }
        }
    }
}

/// Graceful shutdown: an idle connection closes at once, a busy one after its response.
impl<IO: Socket, S: Serve> Graceful for Connection<IO, S> {
    fn shut_down(self: Pin<&mut Self>) {
        self.get_mut().shutdown_asked = true;
    }

    fn watch_client(self: Pin<&mut Self>) {
        let this = self.get_mut();
        if matches!(this.state, State::Answer { .. }) {
            this.watching = true;
        }
    }
}

impl<IO: Socket, S: Serve> Connection<IO, S> {
    /// Reads until a head is complete and calls the service with it (`Ok(None)`), or hands the
    /// connection to hyper, or ends it (the state says which).
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Handoff<IO>>, H1Error>> {
        loop {
            if !self.read.is_empty() {
                match request::parse(&mut self.read) {
                    Head::Usual(parsed) => {
                        self.call(parsed);
                        return Poll::Ready(Ok(None));
                    }
                    Head::Unusual => return Poll::Ready(Ok(self.handoff())),
                    Head::Refused(refusal) => {
                        self.refuse(refusal);
                        return Poll::Ready(Ok(None));
                    }
                    // Still in the request line: read on here, up to the head's limit.
                    Head::Partial
                        if self.read.len() >= READ_ROOM && !self.read.contains(&b'\n') =>
                    {
                        if self.read.len() >= self.max_head {
                            self.refuse(Refusal::TargetTooLong);
                            return Poll::Ready(Ok(None));
                        }
                    }
                    Head::Partial if self.read.len() >= READ_ROOM => {
                        return Poll::Ready(Ok(self.handoff()))
                    }
                    Head::Partial => {}
                }
            } else if self.shutdown_asked {
                self.state = State::Close;
                return Poll::Ready(Ok(None));
            }
            let Some(io) = self.io.as_mut() else {
                return Poll::Ready(Ok(None));
            };
            // Below READ_ROOM here (a longer partial head went to hyper): room up to it, in the
            // buffer's own allocation again once the last request has let go of its head.
            self.read
                .reserve(READ_ROOM.saturating_sub(self.read.len()).max(1));
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(io),
                cx,
                &mut self.read
            ))?;
            if n == 0 {
                if !self.read.is_empty() {
                    return Poll::Ready(Err(H1Error::IncompleteHead));
                }
                // The client closed, or the connection parks ([`super::park`]).
                self.state = State::Close;
                return Poll::Ready(Ok(None));
            }
        }
    }

    /// Answers `refusal` and ends the connection, reading what the client still sends meanwhile
    /// (a close with it unread would reset the connection under the answer).
    fn refuse(&mut self, refusal: Refusal) {
        self.read.clear();
        self.out.clear();
        self.out.extend_from_slice(refusal.answer());
        self.refused = Some(refusal);
        self.state = State::Finish { close: true };
    }

    fn call(&mut self, parsed: request::Parsed) {
        let method = parsed.request.method().clone();
        let body = if parsed.body_length > 0 {
            let (feed, body) = body::channel(parsed.body_length);
            feed.give(&mut self.read);
            self.feed = Some(feed);
            ClientBody::Stream(http_body_util::BodyExt::boxed_unsync(body))
        } else {
            ClientBody::Empty
        };
        let request = parsed.request.map(|()| body);
        let answer = self.service.call(request);
        self.served += 1;
        self.watching = false;
        self.state = State::Answer {
            answer,
            method,
            close: parsed.close,
        };
    }

    /// Moves request body bytes from the socket to the service as far as both allow; `cx` is
    /// woken when either can take more. A client that closes (or fails) cuts the body.
    fn feed_body(&mut self, cx: &mut Context<'_>) {
        let Connection { feed, io, read, .. } = self;
        let (Some(feed), Some(io)) = (feed.as_ref(), io.as_mut()) else {
            return;
        };
        while let body::Need::Bytes = feed.need(cx) {
            if !read.is_empty() {
                feed.give(read);
                continue;
            }
            read.reserve(feed.read_room());
            match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, read) {
                Poll::Ready(Ok(n)) if n > 0 => {}
                Poll::Pending => return,
                Poll::Ready(_) => {
                    feed.cut();
                    return;
                }
            }
        }
    }

    /// What follows a complete response: the next request, the rest of its request body
    /// dropped first, or the end.
    fn after_response(&mut self, close: bool) -> State<S::Future, S::Body> {
        match self.feed.take() {
            Some(feed) if !feed.is_done() => {
                if feed.abandon() && !close {
                    self.feed = Some(feed);
                    State::Discard
                } else {
                    // The rest of the body is still coming: closed now, the connection would be
                    // reset under the answer.
                    State::Linger { shut: false }
                }
            }
            _ if self.refused.is_some() => State::Linger { shut: false },
            _ if close => State::Close,
            _ => State::Head,
        }
    }

    /// Reads and drops the rest of an abandoned request body: whether it all came.
    fn poll_discard(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, H1Error>> {
        let Connection { feed, io, read, .. } = self;
        let (Some(taken), Some(io)) = (feed.as_ref(), io.as_mut()) else {
            return Poll::Ready(Ok(true));
        };
        loop {
            if taken.is_done() {
                *feed = None;
                return Poll::Ready(Ok(true));
            }
            if !read.is_empty() {
                taken.give(read);
                continue;
            }
            read.reserve(taken.read_room());
            if ready!(tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, read))? == 0 {
                return Poll::Ready(Ok(false));
            }
        }
    }

    /// The connection and what it read, for hyper.
    fn handoff(&mut self) -> Option<Handoff<IO>> {
        self.state = State::Done;
        let io = self.io.take()?;
        let read = std::mem::take(&mut self.read).freeze();
        Some(Handoff {
            io,
            read,
            served: self.served,
        })
    }

    /// Writes the head of `resp` into the write buffer and moves on to its body.
    fn start_response(
        &mut self,
        resp: Response<S::Body>,
        method: &Method,
        close: bool,
    ) -> Result<(), H1Error> {
        let (parts, mut body) = resp.into_parts();
        let request_id = body.take_request_id();
        let shape = if body.is_end_stream() {
            Shape::Empty
        } else {
            match body.size_hint().exact() {
                Some(len) => Shape::Known(len),
                None => Shape::Unknown,
            }
        };
        // A body too long to discard, still coming as the answer starts, ends the connection
        // after it unless the service reads it all meanwhile: the client is told at once.
        let body_left = self
            .feed
            .as_ref()
            .is_some_and(body::Feed::more_than_discardable);
        // A 408 ends the connection (RFC 9110 §15.5.9, as nginx does): its body stopped coming,
        // and what comes late is no request.
        let timed_out = parts.status == http::StatusCode::REQUEST_TIMEOUT;
        let closing = close || self.shutdown_asked || body_left || timed_out;
        let written = response::encode(
            &mut self.out,
            (&parts, request_id.as_ref()),
            shape,
            method,
            closing,
            &mut self.date,
        )?;
        let close = written.close;
        self.written = 0;
        self.state = match written.framing {
            Framing::Length(0) => State::Finish { close },
            Framing::Length(left) => State::Body {
                body,
                sending: Sending::Length { left },
                close,
            },
            Framing::Chunked => State::Body {
                body,
                sending: Sending::Chunked { chunk_open: false },
                close,
            },
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests;
