//! Writing a request: its head, then its body as the client sends it, either of declared length
//! or chunked (with trailers, when the client sent some). A small piece of body goes out in
//! the same write as what precedes it. While the body waits (on the client, or on a backend
//! that reads slowly) the connection is watched: a backend that begins to answer before it
//! has the whole body (a 413, or an echo that streams back as it reads) is heard at once, and
//! the rest of the body goes on being sent beside the answer, full duplex, as long as the
//! backend takes it. A connection whose answer ended before its request did is not reused;
//! nor one whose backend stopped taking the request, whose answer is read all the same.

use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::Body;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::head::{write_fields, BodyLength};
use super::{InlineConn, InlineError};
use crate::vocab::request_body::BoxError;

/// The most body bytes copied behind a head (or a chunk header) to go out in one write.
const COALESCE_MAX: usize = 16 * 1024;

/// An upload in progress: `conn.out` holds bytes to write before `piece` (the head, a chunk
/// header), then `piece` (body data not copied into `out`).
pub struct Upload<B> {
    body: B,
    framing: Framing,
    /// How much of `conn.out` is written.
    written: usize,
    piece: Bytes,
    /// A byte went out, a piece was taken from the client, or the client's body failed: the
    /// request cannot go elsewhere.
    committed: bool,
    /// A byte went out: the connection carries part of this request.
    wrote: bool,
    done: bool,
    /// Counts writes to the backend and pieces taken from the client: whether the upload moved.
    moves: u32,
    /// The upload waits for the client's next piece (not for the backend to read).
    awaits_client: bool,
    /// A write failed after part of the request went out ([`Upload::write_failed`]): nothing
    /// more is sent, and the backend's answer, if it sent one, is read.
    cut: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length { left: u64 },
    Chunked { chunks: u64 },
    Finished,
}

impl<B> Upload<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    pub fn new(body: B, length: BodyLength) -> Upload<B> {
        let framing = match length {
            BodyLength::Known(0) => Framing::Finished,
            BodyLength::Known(left) => Framing::Length { left },
            BodyLength::Chunked => Framing::Chunked { chunks: 0 },
        };
        Upload {
            body,
            framing,
            written: 0,
            piece: Bytes::new(),
            committed: false,
            wrote: false,
            moves: 0,
            awaits_client: false,
            done: false,
            cut: false,
        }
    }

    /// Moves the upload on as far as the socket and the client allow; ready when it is done
    /// ([`Upload::is_done`]) or must wait while the backend has begun to answer.
    pub fn poll(
        &mut self,
        conn: &mut InlineConn,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), InlineError>> {
        if self.cut {
            return Poll::Ready(Ok(()));
        }
        if !self.committed && self.framing != Framing::Finished {
            // The first piece, when the client has sent it already, joins the head.
            if let Poll::Ready(next) = self.poll_next(conn, cx) {
                next?;
            }
        }
        loop {
            let step = if self.written < conn.out.len() {
                match poll_write(&mut conn.io, cx, &conn.out[self.written..]) {
                    Poll::Ready(Ok(n)) => {
                        self.written += n;
                        self.committed = true;
                        self.wrote = true;
                        self.moves = self.moves.wrapping_add(1);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(error)) => return self.write_failed(error),
                    Poll::Pending => Poll::Pending,
                }
            } else if !self.piece.is_empty() {
                match poll_write(&mut conn.io, cx, &self.piece) {
                    Poll::Ready(Ok(n)) => {
                        self.piece.advance(n);
                        self.wrote = true;
                        self.moves = self.moves.wrapping_add(1);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(error)) => return self.write_failed(error),
                    Poll::Pending => Poll::Pending,
                }
            } else if self.framing == Framing::Finished {
                self.done = true;
                return Poll::Ready(Ok(()));
            } else {
                conn.out.clear();
                self.written = 0;
                let next = self.poll_next(conn, cx);
                self.awaits_client = next.is_pending();
                next
            };
            match step {
                Poll::Ready(Ok(())) => self.awaits_client = false,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    // Waiting: has the backend begun to answer?
                    if conn.io.poll_read_ready(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// A write the backend refused. With part of the request sent, its answer may be waiting:
    /// a backend that refuses an upload (413) or its credentials (401) answers, closes without
    /// reading the rest, and the next write meets the reset (RFC 9112 §9.5: the client stops
    /// sending and reads the answer). The upload stops there and the answer is read; without
    /// one, reading fails as the write did. With nothing sent, the error as it is: the request
    /// may still go on another connection.
    fn write_failed(&mut self, error: InlineError) -> Poll<Result<(), InlineError>> {
        if !self.wrote {
            return Poll::Ready(Err(error));
        }
        tracing::debug!("the backend stopped taking the request ({error}); reading its answer");
        self.cut = true;
        self.piece = Bytes::new();
        Poll::Ready(Ok(()))
    }

    /// Whether the whole request is written.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The body back, when nothing of the request went out and no piece was taken from it:
    /// the request can still go on another connection. Never after the body failed: a body
    /// polled to its error may end cleanly when polled again (hyper's does), and another
    /// connection would carry the request with its body cut short.
    pub fn into_unsent_body(self) -> Option<B> {
        (!self.committed).then_some(self.body)
    }

    /// Whether no byte of the request reached the connection.
    pub fn wrote_nothing(&self) -> bool {
        !self.wrote
    }

    /// Whether the upload last waited for the client's body rather than for the backend.
    pub fn awaits_client(&self) -> bool {
        self.awaits_client
    }

    /// A count that changes whenever the upload moves (a write, a piece from the client).
    pub fn moves(&self) -> u32 {
        self.moves
    }

    /// Takes the next frame from the client and frames it behind what `conn.out` holds.
    fn poll_next(
        &mut self,
        conn: &mut InlineConn,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), InlineError>> {
        loop {
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Err(e)) => {
                    self.committed = true;
                    return Poll::Ready(Err(InlineError::RequestBody(e.into())));
                }
                Some(Ok(frame)) => frame,
                None => return Poll::Ready(self.end(&mut conn.out, None)),
            };
            self.committed = true;
            self.moves = self.moves.wrapping_add(1);
            let data = match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => data,
                Err(frame) => {
                    let trailers = frame.into_trailers().ok();
                    return Poll::Ready(self.end(&mut conn.out, trailers.as_ref()));
                }
            };
            return Poll::Ready(self.frame_data(&mut conn.out, data));
        }
    }

    fn frame_data(&mut self, out: &mut Vec<u8>, data: Bytes) -> Result<(), InlineError> {
        let len = data.len() as u64;
        match &mut self.framing {
            Framing::Length { left } => {
                if len > *left {
                    let error = "longer than its Content-Length".into();
                    return Err(InlineError::RequestBody(error));
                }
                *left -= len;
                if *left == 0 {
                    self.framing = Framing::Finished;
                }
            }
            Framing::Chunked { chunks } => {
                if *chunks > 0 {
                    out.extend_from_slice(b"\r\n");
                }
                *chunks += 1;
                let _ = write!(out, "{len:x}\r\n");
            }
            Framing::Finished => {
                return Err(InlineError::RequestBody("data after its end".into()));
            }
        }
        if data.len() <= COALESCE_MAX {
            out.extend_from_slice(&data);
        } else {
            self.piece = data;
        }
        Ok(())
    }

    /// The end of the client's body (with its trailers): the last chunk, or a length check.
    fn end(&mut self, out: &mut Vec<u8>, trailers: Option<&HeaderMap>) -> Result<(), InlineError> {
        match self.framing {
            Framing::Length { .. } => {
                let error = "shorter than its Content-Length".into();
                return Err(InlineError::RequestBody(error));
            }
            Framing::Chunked { chunks } => {
                if chunks > 0 {
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n");
                if let Some(trailers) = trailers {
                    write_fields(out, trailers);
                }
                out.extend_from_slice(b"\r\n");
            }
            Framing::Finished => {}
        }
        self.framing = Framing::Finished;
        Ok(())
    }
}

fn poll_write(
    io: &mut TcpStream,
    cx: &mut Context<'_>,
    bytes: &[u8],
) -> Poll<Result<usize, InlineError>> {
    match ready!(Pin::new(io).poll_write(cx, bytes)) {
        Ok(0) => Poll::Ready(Err(InlineError::Io(io::ErrorKind::WriteZero.into()))),
        Ok(n) => Poll::Ready(Ok(n)),
        Err(e) => Poll::Ready(Err(e.into())),
    }
}
