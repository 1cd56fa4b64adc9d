//! HTTP/1.1 to a plain backend, driven from the request's own task.
//!
//! hyper's client runs each backend connection as a task of its own and hands it requests,
//! responses and body chunks through channels: two task hand-overs per exchange and a third of
//! a proxied request's instructions. Here the request's task writes the head and reads the
//! answer itself, and the response body reads the socket as the client's side polls it. When
//! the body has been read to its end the connection goes back to its worker's pool
//! ([`super::slot`]); one dropped early is closed.
//!
//! Request bodies go up as the client sends them (`upload`), full duplex: an answer that
//! begins before the body ends is read at once while the rest goes up beside it. Upgrades,
//! requests with `Expect`, TLS and HTTP/2 backends stay on hyper's client (`pool` decides).
//!
//! Framing follows RFC 9112 §6.3: no body for HEAD, 1xx, 204 and 304; `Transfer-Encoding`
//! before `Content-Length` (and a response that carries both never reuses its connection);
//! differing or malformed `Content-Length` values are an invalid response, as is a head over
//! [`MAX_HEAD`] bytes or more than [`MAX_HEADERS`] fields. Informational answers before the
//! real one (100, 103) are skipped; a 101 nobody asked for is invalid.

mod body;
mod framing;
mod head;
mod upload;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use http::request::Parts;
use http::Response;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

pub use body::InlineBody;
use framing::{Framing, FramingFields};
pub use head::BodyLength;
use upload::Upload;

use crate::vocab::forwarded::Deferred;
use crate::vocab::request_body::BoxError;
use crate::vocab::CountedSlot;

/// The largest response head read (status line and fields), as hyper's client was configured.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a response head may have (hyper's default).
pub const MAX_HEADERS: usize = 100;
/// Room made in the read buffer before a read: it starts at 4 KiB (one page, nginx's
/// `proxy_buffer_size`: every request in flight holds one, and most answers are smaller) and
/// doubles each time a read fills it, up to 64 KiB (hyper's client was bounded the same way),
/// so large bodies are read in large reads.
const READ_ROOM: usize = 4 * 1024;
const MAX_READ_ROOM: usize = 64 * 1024;
/// A buffer larger than this is not kept by an idle connection.
const MAX_IDLE_BUFFER: usize = 16 * 1024;

/// Why an exchange on an inline connection failed.
#[derive(Debug, thiserror::Error)]
pub enum InlineError {
    #[error("the backend closed the connection before answering")]
    ClosedEarly,
    #[error("the backend closed the connection before the end of the response")]
    ClosedMidway,
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// The client's body failed (malformed, cut short, or not the length it declared): the
    /// client's fault, never the backend's.
    #[error("the request body: {0}")]
    RequestBody(BoxError),
    #[error("no response head within the response timeout")]
    TimedOut,
    /// The upload waited on the client for the response timeout: the client's stall, not the
    /// backend's.
    #[error("the client sent nothing more of its body for the response timeout")]
    ClientStalled,
    #[error("the backend sent no more of the body for the response timeout")]
    Stalled,
}

impl InlineError {
    /// The backend answered with something that is not an HTTP/1.1 response.
    pub fn is_bad_response(&self) -> bool {
        matches!(self, InlineError::Invalid(_))
    }
}

/// How far a failed exchange got.
#[derive(Debug)]
pub struct SendFailure<B> {
    pub error: InlineError,
    /// The request body, when no byte of the request reached the connection: it may go on
    /// another one, whatever its method.
    pub unsent: Option<B>,
}

/// Where a connection goes when its response has been read to the end and it can carry
/// another request (the pool, for the worker that sent the request).
pub trait Home: Send + Unpin + 'static {
    fn keep(self, conn: Box<InlineConn>);
}

/// A plain TCP connection to a backend, with what was read past the last response. It lives
/// boxed, so the response and the futures that carry it move a pointer.
pub struct InlineConn {
    io: TcpStream,
    buf: BytesMut,
    /// The room the next read is given.
    room: usize,
    /// How much of `buf` the last try at a response head saw.
    head_tried: usize,
    /// The encoded request head, its allocation kept for the next request.
    out: Vec<u8>,
    /// How long the next exchange may take until its response head is read.
    response_limit: Option<Duration>,
    /// That deadline, one timer for the connection's life: a later deadline only moves it
    /// (an atomic store in tokio), where a timer per exchange was registered in and removed
    /// from the timer wheel each time (callgrind: 340 instructions a request). Left armed
    /// while the connection idles in the pool, it may wake the last exchange's task once,
    /// for nothing.
    deadline: Option<Pin<Box<Sleep>>>,
    /// This connection's place in its backend's count of open connections.
    _counted: Option<CountedSlot>,
    /// Its backend's count of address changes when it was opened.
    addrs_changed_at_open: u32,
}

impl InlineConn {
    pub fn new(io: TcpStream, counted: Option<CountedSlot>) -> Box<InlineConn> {
        Box::new(InlineConn {
            io,
            buf: BytesMut::new(),
            room: READ_ROOM,
            head_tried: 0,
            out: Vec::new(),
            response_limit: None,
            deadline: None,
            _counted: counted,
            addrs_changed_at_open: 0,
        })
    }

    /// Notes its backend's count of address changes as the connection opens.
    pub fn note_addrs_changed_at_open(&mut self, count: u32) {
        self.addrs_changed_at_open = count;
    }

    pub fn addrs_changed_at_open(&self) -> u32 {
        self.addrs_changed_at_open
    }

    /// Whether an idle connection can carry a request: the backend has neither closed it nor
    /// sent bytes nobody asked for since its last response. Costs a system call only when the
    /// socket became readable while idle.
    pub fn is_reusable_now(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// The next exchanges fail with [`InlineError::TimedOut`] when their response head has not
    /// been read `limit` after their request was sent, or when their upload does not move for
    /// `limit` (nginx's `proxy_read_timeout` and `proxy_send_timeout`): a slow upload that
    /// keeps moving is not cut.
    pub fn respond_within(&mut self, limit: Duration) {
        self.response_limit = Some(limit);
    }

    /// Sets the deadline of an exchange starting now.
    fn arm_deadline(&mut self) {
        let Some(limit) = self.response_limit else {
            return;
        };
        let at = Instant::now() + limit;
        match &mut self.deadline {
            Some(deadline) => deadline.as_mut().reset(at),
            None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// `step`'s result, or [`InlineError::TimedOut`] once it is pending past the deadline.
    fn poll_by_deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        step: Poll<Result<T, InlineError>>,
    ) -> Poll<Result<T, InlineError>> {
        if step.is_ready() {
            return step;
        }
        let expired = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if expired {
            Poll::Ready(Err(InlineError::TimedOut))
        } else {
            Poll::Pending
        }
    }

    /// For a body read that has to wait (`waiting`: this wait began before): the response
    /// limit runs again from the wait's start (the clock read once a wait); whether it passed.
    fn body_stalled(&mut self, cx: &mut Context<'_>, waiting: &mut bool) -> bool {
        if !*waiting {
            *waiting = true;
            self.arm_deadline();
        }
        self.poll_by_deadline(cx, Poll::<Result<(), InlineError>>::Pending)
            .is_ready()
    }

    /// Sends `head` (HTTP/1.1 form, with the `X-Forwarded-*` and `X-Request-Id` still to add)
    /// and `body` (framed as `length` says) and reads the response head; the response body
    /// reads the rest from this connection (and writes what is left of the request, if the
    /// backend answered early) and sends it `home` when done.
    pub async fn send<H, B>(
        mut self: Box<Self>,
        (head, deferred): (&Parts, Option<&Deferred>),
        body: B,
        length: BodyLength,
        home: H,
    ) -> Result<Response<InlineBody<H, B>>, SendFailure<B>>
    where
        H: Home,
        B: http_body::Body<Data = bytes::Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        head::encode_request(&mut self.out, head, deferred, length);
        self.arm_deadline();
        let mut upload = Upload::new(body, length);
        // The deadline runs again from each move after a wait (the clock read once a wait):
        // an upload that had to wait is timed from its last move, the head from its end.
        let mut waited_at = None;
        let uploaded = std::future::poll_fn(|cx| {
            let step = upload.poll(&mut self, cx);
            if waited_at.is_some_and(|moves| moves != upload.moves()) {
                self.arm_deadline();
                waited_at = None;
            }
            if step.is_pending() {
                waited_at.get_or_insert(upload.moves());
            }
            self.poll_by_deadline(cx, step)
        });
        if let Err(mut error) = uploaded.await {
            if matches!(error, InlineError::TimedOut) && upload.awaits_client() {
                error = InlineError::ClientStalled;
            }
            if matches!(error, InlineError::RequestBody(_)) && upload.wrote_nothing() {
                // The client's body failed before a byte went out: the connection is as the
                // last response left it, and goes home for the next request.
                home.keep(self);
                return Err(SendFailure {
                    error,
                    unsent: None,
                });
            }
            let unsent = upload.into_unsent_body();
            return Err(SendFailure { error, unsent });
        }
        let failed = |error| SendFailure {
            error,
            unsent: None,
        };
        let (parts, fields) = std::future::poll_fn(|cx| {
            let step = self.poll_head(&mut upload, cx);
            self.poll_by_deadline(cx, step)
        })
        .await
        .map_err(failed)?;
        let headless = head.method == http::Method::HEAD;
        let framing = Framing::of(parts.status, &fields, headless).map_err(failed)?;
        let rest = (!upload.is_done()).then(|| Box::new(upload));
        Ok(Response::from_parts(
            parts,
            InlineBody::new(self, framing, home, rest),
        ))
    }

    /// Reads until a final response head is complete (informational ones skipped), writing
    /// the rest of the request as the backend takes it.
    fn poll_head<B>(
        &mut self,
        upload: &mut Upload<B>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(http::response::Parts, FramingFields), InlineError>>
    where
        B: http_body::Body<Data = bytes::Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        loop {
            if !upload.is_done() {
                if let Poll::Ready(Err(error)) = upload.poll(self, cx) {
                    return Poll::Ready(Err(error));
                }
            }
            // Parsed again only when bytes came since the last try.
            if self.buf.len() > self.head_tried {
                if let Some(parsed) = head::parse_response(&mut self.buf)? {
                    self.head_tried = 0;
                    return Poll::Ready(Ok(parsed));
                }
                self.head_tried = self.buf.len();
            }
            if self.buf.len() >= MAX_HEAD {
                return Poll::Ready(Err(InlineError::Invalid("response head too large")));
            }
            let had = self.buf.len();
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(if had == 0 {
                    InlineError::ClosedEarly
                } else {
                    InlineError::ClosedMidway
                }));
            }
        }
    }

    /// Reads what the socket has into the buffer; `Ok(0)` at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.room / 4 {
            self.buf.reserve(self.room);
        }
        let spare = self.buf.capacity() - self.buf.len();
        // `AsyncRead::poll_read` underneath: a short read marks the socket drained, so an idle
        // check after a response costs no system call.
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if n == spare && self.room < MAX_READ_ROOM {
            self.room *= 2;
        }
        Poll::Ready(Ok(n))
    }

    /// Lets go of large buffers before the connection idles in the pool.
    fn trim_for_idle(&mut self) {
        if self.buf.capacity() > MAX_IDLE_BUFFER {
            self.buf = BytesMut::new();
        }
        // The head buffer grows with coalesced body pieces (up to 16 KiB).
        if self.out.capacity() > MAX_IDLE_BUFFER / 4 {
            self.out = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests;
