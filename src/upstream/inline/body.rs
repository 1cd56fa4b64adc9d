//! The response body of an inline exchange: the [`InlineBody`] that reads it off the
//! connection as it is polled, as its framing says (a length, chunks, or the end of the
//! connection), then hands the connection back to its pool.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::framing::{Framing, State};
use super::upload::Upload;
use super::{Home, InlineConn, InlineError};
use crate::vocab::request_body::BoxError;

/// The longest chunk-size line (size, extensions and CRLF) read.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes of trailer fields read after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;
/// The most trailer fields read.
const MAX_TRAILER_FIELDS: usize = 32;

/// A backend's response body read straight off its connection.
pub struct InlineBody<H, B> {
    conn: Option<Box<InlineConn>>,
    state: State,
    keep_alive: bool,
    home: Option<H>,
    /// What is left of the request, when the backend answered before it had all of it.
    upload: Option<Box<Upload<B>>>,
    /// A read waits for the backend (since the last piece): the stall deadline is armed.
    waiting: bool,
}

impl<H, B> InlineBody<H, B>
where
    H: Home,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    pub(super) fn new(
        conn: Box<InlineConn>,
        framing: Framing,
        home: H,
        upload: Option<Box<Upload<B>>>,
    ) -> InlineBody<H, B> {
        let mut body = InlineBody {
            conn: Some(conn),
            state: framing.state,
            keep_alive: framing.keep_alive,
            home: Some(home),
            upload,
            waiting: false,
        };
        if body.state == State::Length(0) {
            body.finish();
        }
        body
    }

    /// The end of the body: the connection goes home when nothing followed the response.
    fn finish(&mut self) {
        self.state = State::Done;
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // An answer that ended before its request did leaves half a request on the wire.
        let reusable = self.keep_alive && conn.buf.is_empty() && self.upload.is_none();
        self.upload = None;
        if !reusable {
            return;
        }
        conn.trim_for_idle();
        if let Some(home) = self.home.take() {
            home.keep(conn);
        }
    }

    /// One step of the body; the connection is dropped at an error and goes home at the end.
    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, InlineError>>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(upload) = self.upload.as_mut() {
            match upload.poll(conn, cx) {
                Poll::Ready(Err(error)) => {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(Some(Err(error)));
                }
                _ if upload.is_done() => self.upload = None,
                _ => {}
            }
        }
        let decoded = decode(conn, &mut self.state, cx);
        if decoded.is_ready() {
            self.waiting = false;
        } else if conn.body_stalled(cx, &mut self.waiting) {
            // A backend that stops sending mid-body (`stall`, as for hyper's client).
            self.state = State::Done;
            self.conn = None;
            return Poll::Ready(Some(Err(InlineError::Stalled)));
        }
        match ready!(decoded) {
            Err(error) => {
                self.state = State::Done;
                self.conn = None;
                Poll::Ready(Some(Err(error)))
            }
            Ok(frame) => {
                if self.state == State::Done {
                    self.finish();
                }
                Poll::Ready(frame.map(Ok))
            }
        }
    }
}

/// Decodes the next frame off `conn`; `state` becomes `Done` with the last one.
fn decode(
    conn: &mut InlineConn,
    state: &mut State,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Frame<Bytes>>, InlineError>> {
    loop {
        match *state {
            State::Done => return Poll::Ready(Ok(None)),
            State::Length(left) | State::ChunkData(left) => {
                if !ready!(poll_want(conn, cx, 1))? {
                    return Poll::Ready(Err(InlineError::ClosedMidway));
                }
                let n = conn
                    .buf
                    .len()
                    .min(usize::try_from(left).unwrap_or(usize::MAX));
                let data = conn.buf.split_to(n).freeze();
                let left = left - n as u64;
                *state = match *state {
                    State::Length(_) if left == 0 => State::Done,
                    State::Length(_) => State::Length(left),
                    _ if left == 0 => State::ChunkEnd,
                    _ => State::ChunkData(left),
                };
                return Poll::Ready(Ok(Some(Frame::data(data))));
            }
            State::UntilClose => {
                if !ready!(poll_want(conn, cx, 1))? {
                    *state = State::Done;
                    return Poll::Ready(Ok(None));
                }
                return Poll::Ready(Ok(Some(Frame::data(conn.buf.split().freeze()))));
            }
            State::ChunkSize => match ready!(poll_chunk_size(conn, cx))? {
                0 => *state = State::Trailers,
                size => *state = State::ChunkData(size),
            },
            State::ChunkEnd => {
                if !ready!(poll_want(conn, cx, 2))? {
                    return Poll::Ready(Err(InlineError::ClosedMidway));
                }
                if &conn.buf[..2] != b"\r\n" {
                    return Poll::Ready(Err(InlineError::Invalid("chunk not followed by CRLF")));
                }
                conn.buf.advance(2);
                *state = State::ChunkSize;
            }
            State::Trailers => {
                let trailers = ready!(poll_trailers(conn, cx))?;
                *state = State::Done;
                return Poll::Ready(Ok(trailers.map(Frame::trailers)));
            }
        }
    }
}

/// Fills the buffer until it holds `want` bytes; `Ok(false)` if the stream ends first.
fn poll_want(
    conn: &mut InlineConn,
    cx: &mut Context<'_>,
    want: usize,
) -> Poll<Result<bool, InlineError>> {
    while conn.buf.len() < want {
        if ready!(conn.poll_fill(cx))? == 0 {
            return Poll::Ready(Ok(false));
        }
    }
    Poll::Ready(Ok(true))
}

/// Reads a chunk-size line: hex digits, then optional extensions (ignored), then CRLF.
fn poll_chunk_size(conn: &mut InlineConn, cx: &mut Context<'_>) -> Poll<Result<u64, InlineError>> {
    loop {
        if let Some(end) = conn.buf.iter().position(|&b| b == b'\n') {
            let line = conn.buf.split_to(end + 1);
            return Poll::Ready(parse_chunk_size(&line));
        }
        if conn.buf.len() >= MAX_CHUNK_LINE {
            return Poll::Ready(Err(InlineError::Invalid("chunk-size line too long")));
        }
        let want = conn.buf.len() + 1;
        if !ready!(poll_want(conn, cx, want))? {
            return Poll::Ready(Err(InlineError::ClosedMidway));
        }
    }
}

/// Reads the trailer section; `None` when it is empty.
fn poll_trailers(
    conn: &mut InlineConn,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<HeaderMap>, InlineError>> {
    loop {
        if conn.buf.starts_with(b"\r\n") {
            conn.buf.advance(2);
            return Poll::Ready(Ok(None));
        }
        let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
        match httparse::parse_headers(&conn.buf, &mut fields) {
            Ok(httparse::Status::Complete((len, fields))) => {
                let trailers = trailer_map(fields)?;
                conn.buf.advance(len);
                return Poll::Ready(Ok(Some(trailers)));
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return Poll::Ready(Err(InlineError::Invalid("trailer fields"))),
        }
        if conn.buf.len() >= MAX_TRAILERS {
            return Poll::Ready(Err(InlineError::Invalid("trailer section too large")));
        }
        let want = conn.buf.len() + 1;
        if !ready!(poll_want(conn, cx, want))? {
            return Poll::Ready(Err(InlineError::ClosedMidway));
        }
    }
}

fn trailer_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, InlineError> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = http::HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| InlineError::Invalid("trailer field name"))?;
        let value = http::HeaderValue::from_bytes(field.value)
            .map_err(|_| InlineError::Invalid("trailer field value"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// The size of a chunk-size line (`1a;name=value\r\n`).
fn parse_chunk_size(line: &[u8]) -> Result<u64, InlineError> {
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or(InlineError::Invalid("chunk-size line without CRLF"))?;
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    if digits.is_empty() || digits.len() > 15 {
        return Err(InlineError::Invalid("chunk size"));
    }
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(InlineError::Invalid("chunk size"));
    }
    let text = std::str::from_utf8(digits).map_err(|_| InlineError::Invalid("chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| InlineError::Invalid("chunk size"))
}

impl<H, B> Body for InlineBody<H, B>
where
    H: Home,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = InlineError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, InlineError>>> {
        self.poll_step(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(left) => SizeHint::with_exact(left),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
