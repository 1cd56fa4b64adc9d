//! aralez's own HTTP/1.1 server side, for the common case: a keep-alive HTTP/1.1 request
//! without a body. It reads heads with `httparse` into one 4 KiB buffer, calls the service,
//! and writes the head and the body's first pieces in one write, all from the connection's
//! task, with no channel between the socket and the service.
//!
//! hyper's server spends about 11,500 instructions on each such request (its dispatcher,
//! body channel and encoder) and holds 16 KiB of buffers per connection; this path does the
//! same work in a fraction of that, with one 4 KiB read buffer and a write buffer that grows
//! only to the size of the heads it writes.
//!
//! Everything else goes to hyper, unchanged: when a head is not of the common case
//! ([`request::Head::Unusual`]: HTTP/1.0, CONNECT, upgrades, `Expect`, a request body, a
//! malformed, oversized or HTTP/2 head) the connection ends with a [`Handoff`]: its IO and the
//! bytes read but not yet served, for hyper to serve from there (its answers to bad requests,
//! 400 and 431, stay hyper's). Pipelined requests are answered one after another.

mod request;
mod response;
mod rewind;

pub use rewind::Rewind;

use std::future::Future;
use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::Body;
use hyper::service::Service;
use tokio::io::{AsyncRead, AsyncWrite};

use super::idle::Graceful;
use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;
use request::Head;
use response::{CachedDate, Framing, Shape};

/// The read buffer: a request head larger than this goes to hyper (whose limit is
/// `max_header_bytes`).
const READ_ROOM: usize = 4 * 1024;
/// The most body bytes copied behind a head (or a chunk header) to go out in one write.
const COALESCE_MAX: usize = 16 * 1024;
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
    /// Shutting the connection down.
    Close,
    Done,
}

/// How much of the body is still to go, by its framing.
enum Sending {
    Length {
        left: u64,
    },
    Chunked {
        trailers: Vec<http::HeaderName>,
        /// A chunk's data went out or is buffered; its closing CRLF has not.
        chunk_open: bool,
    },
}

/// One client connection served by this module, until it ends, fails or is handed to hyper.
pub struct Connection<IO, S, F, B> {
    io: Option<IO>,
    service: S,
    read: BytesMut,
    /// Bytes to write before `piece`: a head, chunk framing, small body pieces.
    out: Vec<u8>,
    written: usize,
    /// A large body piece, written as it is.
    piece: Bytes,
    state: State<F, B>,
    date: CachedDate,
    shutdown_asked: bool,
    served: u64,
}

impl<IO, S, B> Connection<IO, S, S::Future, B>
where
    S: Service<Request<ClientBody>, Response = Response<B>>,
{
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
            date: CachedDate::new(),
            shutdown_asked: false,
            served: 0,
        }
    }
}

impl<IO, S, B> Future for Connection<IO, S, S::Future, B>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<ClientBody>, Response = Response<B>, Error = std::convert::Infallible>
        + Unpin,
    S::Future: Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Option<Handoff<IO>>, H1Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
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
                    let Ok(resp) = ready!(Pin::new(answer).poll(cx));
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
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                State::Finish { close } => {
                    let close = *close || this.shutdown_asked;
                    ready!(flush_all(
                        io,
                        cx,
                        &this.out,
                        &mut this.written,
                        &mut this.piece
                    ))?;
                    this.out.clear();
                    this.written = 0;
                    if this.out.capacity() > MAX_KEPT_OUT {
                        this.out = Vec::new();
                    }
                    this.state = if close { State::Close } else { State::Head };
                }
                State::Close => {
                    // Errors do not matter any more: the connection is over either way.
                    let _ = ready!(Pin::new(io).poll_shutdown(cx));
                    this.state = State::Done;
                }
                State::Done => return Poll::Ready(Ok(None)),
            }
        }
    }
}

/// Graceful shutdown: an idle connection closes at once, a busy one after its response.
impl<IO, S, B> Graceful for Connection<IO, S, S::Future, B>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<ClientBody>, Response = Response<B>, Error = std::convert::Infallible>
        + Unpin,
    S::Future: Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    fn shut_down(self: Pin<&mut Self>) {
        self.get_mut().shutdown_asked = true;
    }
}

impl<IO, S, B> Connection<IO, S, S::Future, B>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<ClientBody>, Response = Response<B>, Error = std::convert::Infallible>
        + Unpin,
    S::Future: Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
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

    fn call(&mut self, parsed: request::Parsed) {
        let method = parsed.request.method().clone();
        let request = parsed.request.map(|()| ClientBody::Empty);
        let answer = self.service.call(request);
        self.served += 1;
        self.state = State::Answer {
            answer,
            method,
            close: parsed.close,
        };
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
        resp: Response<B>,
        method: &Method,
        close: bool,
    ) -> Result<(), H1Error> {
        let (parts, body) = resp.into_parts();
        let shape = if body.is_end_stream() {
            Shape::Empty
        } else {
            match body.size_hint().exact() {
                Some(len) => Shape::Known(len),
                None => Shape::Unknown,
            }
        };
        let written = response::encode(&mut self.out, &parts, shape, method, &mut self.date)?;
        let close = close || written.close;
        self.written = 0;
        self.state = match written.framing {
            Framing::Length(0) => State::Finish { close },
            Framing::Length(left) => State::Body {
                body,
                sending: Sending::Length { left },
                close,
            },
            Framing::Chunked { trailers } => State::Body {
                body,
                sending: Sending::Chunked {
                    trailers,
                    chunk_open: false,
                },
                close,
            },
        };
        Ok(())
    }
}

/// What is buffered for the client: `out` (from `written` on), then `piece`.
struct Outbox<'a> {
    out: &'a mut Vec<u8>,
    written: &'a mut usize,
    piece: &'a mut Bytes,
}

impl Outbox<'_> {
    /// Writes everything out; the buffer is empty again when ready.
    fn poll_drain<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), H1Error>> {
        ready!(flush_all(io, cx, self.out, self.written, self.piece))?;
        self.out.clear();
        *self.written = 0;
        Poll::Ready(Ok(()))
    }
}

/// Sends `body` behind what `out` holds, to its end.
fn poll_body<IO, B>(
    io: &mut IO,
    cx: &mut Context<'_>,
    body: &mut B,
    sending: &mut Sending,
    mut outbox: Outbox<'_>,
) -> Poll<Result<(), H1Error>>
where
    IO: AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    loop {
        if outbox.out.len() - *outbox.written > COALESCE_MAX || !outbox.piece.is_empty() {
            ready!(outbox.poll_drain(io, cx))?;
            sending.after_piece(outbox.out);
        }
        let frame = match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(H1Error::Body(e.into()))),
            Poll::Ready(None) => return Poll::Ready(sending.end(outbox.out, None)),
            Poll::Pending => {
                // The body waits: what is buffered goes out meanwhile.
                ready!(outbox.poll_drain(io, cx))?;
                sending.after_piece(outbox.out);
                if outbox.out.is_empty() {
                    return Poll::Pending;
                }
                continue;
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let trailers = frame.into_trailers().ok();
                return Poll::Ready(sending.end(outbox.out, trailers.as_ref()));
            }
        };
        if data.is_empty() {
            continue;
        }
        let last = sending.frame(outbox.out, data.len())?;
        if data.len() <= COALESCE_MAX {
            outbox.out.extend_from_slice(&data);
            sending.after_piece(outbox.out);
        } else {
            *outbox.piece = data;
        }
        if last {
            return Poll::Ready(Ok(()));
        }
    }
}

impl Sending {
    /// Frames `len` more bytes of body (a chunk header); whether they are the last ones.
    fn frame(&mut self, out: &mut Vec<u8>, len: usize) -> Result<bool, H1Error> {
        match self {
            Sending::Length { left } => {
                let len = len as u64;
                if len > *left {
                    return Err(H1Error::BodyLength);
                }
                *left -= len;
                Ok(*left == 0)
            }
            Sending::Chunked { chunk_open, .. } => {
                let _ = write!(out, "{len:x}\r\n");
                *chunk_open = true;
                Ok(false)
            }
        }
    }

    /// A chunk's data is buffered or written: its end follows.
    fn after_piece(&mut self, out: &mut Vec<u8>) {
        if let Sending::Chunked { chunk_open, .. } = self {
            if *chunk_open {
                out.extend_from_slice(b"\r\n");
                *chunk_open = false;
            }
        }
    }

    /// The body ended (with its trailers): the last chunk, or a length check.
    fn end(&mut self, out: &mut Vec<u8>, fields: Option<&http::HeaderMap>) -> Result<(), H1Error> {
        match self {
            Sending::Length { left: 0 } => Ok(()),
            Sending::Length { .. } => Err(H1Error::BodyLength),
            Sending::Chunked { trailers, .. } => {
                response::last_chunk(out, trailers, fields);
                Ok(())
            }
        }
    }
}

/// Writes `out[written..]`, then `piece`, then flushes.
fn flush_all<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    cx: &mut Context<'_>,
    out: &[u8],
    written: &mut usize,
    piece: &mut Bytes,
) -> Poll<Result<(), H1Error>> {
    while *written < out.len() || !piece.is_empty() {
        let n = if *written < out.len() && !piece.is_empty() && io.is_write_vectored() {
            let slices = [io::IoSlice::new(&out[*written..]), io::IoSlice::new(piece)];
            ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?
        } else if *written < out.len() {
            ready!(Pin::new(&mut *io).poll_write(cx, &out[*written..]))?
        } else {
            ready!(Pin::new(&mut *io).poll_write(cx, piece))?
        };
        if n == 0 {
            return Poll::Ready(Err(H1Error::Io(io::ErrorKind::WriteZero.into())));
        }
        let from_out = n.min(out.len() - *written);
        *written += from_out;
        piece.advance(n - from_out);
    }
    ready!(Pin::new(io).poll_flush(cx))?;
    Poll::Ready(Ok(()))
}

#[cfg(test)]
mod tests;
