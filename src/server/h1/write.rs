//! Writing a response body behind its head: data pieces framed by length or chunked, small
//! ones copied behind the head (or chunk header) to go out in one write, large ones written as
//! they are (with the head in one vectored write), and what is buffered always written out
//! before the body is waited on.

use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::Body;
use tokio::io::AsyncWrite;

use super::{response, H1Error, Socket};
use crate::vocab::request_body::BoxError;

/// The most body bytes copied behind a head (or a chunk header) to go out in one write.
const COALESCE_MAX: usize = 16 * 1024;

/// How much of the body is still to go, by its framing.
pub enum Sending {
    Length {
        left: u64,
    },
    Chunked {
        /// A chunk's data went out or is buffered; its closing CRLF has not.
        chunk_open: bool,
    },
}

/// What is buffered for the client: `out` (from `written` on), then `piece`.
pub struct Outbox<'a> {
    pub out: &'a mut Vec<u8>,
    pub written: &'a mut usize,
    pub piece: &'a mut Bytes,
}

impl Outbox<'_> {
    /// Writes everything out; the buffer is empty again when ready.
    fn poll_drain<IO: Socket>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), H1Error>> {
        ready!(flush_all(io, cx, self.out, self.written, self.piece, false))?;
        self.out.clear();
        *self.written = 0;
        Poll::Ready(Ok(()))
    }
}

/// Sends `body` behind what `out` holds, to its end.
pub fn poll_body<IO, B>(
    io: &mut IO,
    cx: &mut Context<'_>,
    body: &mut B,
    sending: &mut Sending,
    mut outbox: Outbox<'_>,
) -> Poll<Result<(), H1Error>>
where
    IO: Socket,
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
            Sending::Chunked { .. } => {
                response::last_chunk(out, fields);
                Ok(())
            }
        }
    }
}

/// Writes `out[written..]`, then `piece`, then flushes. The connection's `last` bytes go
/// through [`Socket::poll_write_last`], so that what ends the connection (TLS's
/// `close_notify`) leaves with them.
pub fn flush_all<IO: Socket>(
    io: &mut IO,
    cx: &mut Context<'_>,
    out: &[u8],
    written: &mut usize,
    piece: &mut Bytes,
    last: bool,
) -> Poll<Result<(), H1Error>> {
    while *written < out.len() || !piece.is_empty() {
        let slices = [io::IoSlice::new(&out[*written..]), io::IoSlice::new(piece)];
        let both = *written < out.len() && !piece.is_empty();
        let io = Pin::new(&mut *io);
        let n = if last {
            let pending = match (both, *written < out.len()) {
                (true, _) => &slices[..],
                (false, true) => &slices[..1],
                (false, false) => &slices[1..],
            };
            ready!(io.poll_write_last(cx, pending))?
        } else if both && io.is_write_vectored() {
            ready!(io.poll_write_vectored(cx, &slices))?
        } else if *written < out.len() {
            ready!(io.poll_write(cx, &out[*written..]))?
        } else {
            ready!(io.poll_write(cx, piece))?
        };
        consume(n, out, written, piece)?;
    }
    ready!(Pin::new(io).poll_flush(cx))?;
    Poll::Ready(Ok(()))
}

/// Counts `n` bytes written off `out` (from `written` on), then off `piece`.
fn consume(n: usize, out: &[u8], written: &mut usize, piece: &mut Bytes) -> Result<(), H1Error> {
    if n == 0 {
        return Err(H1Error::Io(io::ErrorKind::WriteZero.into()));
    }
    let from_out = n.min(out.len() - *written);
    *written += from_out;
    piece.advance(n - from_out);
    Ok(())
}
