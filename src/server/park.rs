//! Parking: an HTTP/1 client connection that has carried no request for a while gives back
//! everything its server side keeps for it (aralez's own, [`super::h1`]: a 4 KiB read buffer
//! and a write buffer; hyper's, for connections handed to it: 8 KiB read and 8 KiB write
//! buffers; over TLS, rustls's 4 KiB receive buffer, [`ClientSocket::release_idle_buffers`])
//! and waits as a bare socket until the client sends again. Then aralez's own side
//! serves it again on the same socket. nginx does the same when a connection goes to
//! keep-alive; hyper keeps its buffers for a connection's whole life and has no way to give
//! them back, hence this.
//!
//! How: the connection's timer ([`super::idle::drive`]) asks for parking once the connection
//! has been idle for [`super::idle::Timers::park`] with nothing read since its last request
//! ended, and that request had no body: hyper may still be reading a body after the response
//! has gone (a proxy streams it upstream as it comes), and a connection parked in the middle of
//! one would read the rest of it as a request (a desync). A connection whose last request had a
//! body therefore stays in hyper until its next request or its deadline.
//!
//! The IO under the server side ([`Parkable`]) then answers its next read that would wait with
//! an end of stream: the server, idle between requests, takes it as the client closing, ends the
//! connection cleanly and drops the IO, which hands its socket to a [`Dock`] instead of closing
//! it. Bytes that come before that read cancel the parking, and so does an answer still
//! waiting in hyper's buffer for the client to read (hyper's last write waited on the socket):
//! ending the connection then would cut the answer.
//!
//! A connection hyper shut down (the end of a request it served, its own refusal, the client's
//! `Connection: close`) is left in the dock too when [`Parkable::linger_when_ended`] asked for it,
//! for a lingering close ([`super::h1::linger`]): hyper drops its IO as soon as the answer is
//! out, and a client still sending a body the answer came before (a chunked upload refused
//! early) would otherwise meet a reset that loses the answer.
//!
//! A parked connection closes at the same deadline as an idle one (`client_header_timeout` or
//! `client_idle_timeout` after its last request, whichever is first) and at once when the
//! listener drains. A client that pipelined half a request head and then went quiet cannot be
//! told from one that sent nothing (the half head sits in hyper's buffer); its connection is
//! closed instead of parked, and a pipelining client resends unanswered requests on a new one.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::client_tcp::ClientTcp;
use super::h1::Socket;
use super::idle::{Activity, Timers};
use crate::vocab::CountedSlot;

/// A client socket: plain TCP, or TLS over it.
pub trait ClientSocket: Socket + Send + 'static {
    /// The TCP socket underneath, to wait on while parked.
    fn tcp(&mut self) -> &mut ClientTcp;

    /// Gives back the buffers an idle connection need not keep (TLS: rustls's receive buffer,
    /// `vendor/rustls/PATCHED.md`); they come back when needed.
    fn release_idle_buffers(&mut self) {}
}

impl ClientSocket for ClientTcp {
    fn tcp(&mut self) -> &mut ClientTcp {
        self
    }
}

impl ClientSocket for tokio_rustls::server::TlsStream<ClientTcp> {
    fn tcp(&mut self) -> &mut ClientTcp {
        self.get_mut().0
    }

    fn release_idle_buffers(&mut self) {
        self.get_mut().1.release_idle_buffers();
    }
}

/// A boxed socket: a TLS session (over a kilobyte) moves as a pointer, so a parked connection
/// keeps it once, not in both its task and its dock.
impl<S: ClientSocket> ClientSocket for Box<S> {
    fn tcp(&mut self) -> &mut ClientTcp {
        (**self).tcp()
    }

    fn release_idle_buffers(&mut self) {
        (**self).release_idle_buffers();
    }
}

/// What was left in a [`Dock`].
pub enum Left<S> {
    /// The connection parked: wait until the client sends again.
    Parked(S),
    /// hyper shut the connection down: end it with a lingering close.
    Ended(S),
}

/// Where a parking connection's socket is left when hyper drops its IO.
pub struct Dock<S>(Mutex<Option<Left<S>>>);

impl<S: ClientSocket> Dock<S> {
    pub fn new() -> Arc<Dock<S>> {
        Arc::new(Dock(Mutex::new(None)))
    }

    /// The socket left here, if any; if the connection parked, without the buffers it need
    /// not keep while it waits.
    pub fn take(&self) -> Option<Left<S>> {
        let mut left = self.0.lock().ok()?.take()?;
        if let Left::Parked(socket) = &mut left {
            socket.release_idle_buffers();
        }
        Some(left)
    }
}

impl<S> Dock<S> {
    fn leave(&self, left: Left<S>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(left);
        }
    }
}

/// The IO under a hyper connection that may park: passes everything through until parking is
/// asked and a read would wait; from then on reads see the end of the stream, shutting down
/// does nothing, and dropping it leaves the socket in the dock.
pub struct Parkable<S> {
    socket: Option<S>,
    /// Bytes read off the socket by aralez's own HTTP/1.1 side and handed to hyper with the
    /// connection ([`super::h1::Handoff`]): read again before the socket.
    unread: Bytes,
    activity: Arc<Activity>,
    dock: Arc<Dock<S>>,
    parked: bool,
    /// hyper's last write or flush waited on the socket: part of an answer is still in its
    /// buffer, and ending the connection now would cut it.
    write_blocked: bool,
    /// Once shut down, the socket is left in the dock when dropped, for a lingering close.
    linger_when_ended: bool,
    shut: bool,
}

impl<S> Parkable<S> {
    pub fn new(socket: S, activity: Arc<Activity>, dock: Arc<Dock<S>>) -> Parkable<S> {
        Parkable {
            socket: Some(socket),
            unread: Bytes::new(),
            activity,
            dock,
            parked: false,
            write_blocked: false,
            linger_when_ended: false,
            shut: false,
        }
    }

    /// Asks that the socket be left in the dock if it is dropped after a shutdown, for the
    /// caller to close it lingering: set for hyper, which closes at once; aralez's own side
    /// lingers itself.
    pub fn linger_when_ended(&mut self) {
        self.linger_when_ended = true;
    }

    /// Puts `bytes` back in front of what the socket has still to give.
    pub fn unread(&mut self, bytes: Bytes) {
        self.unread = bytes;
    }

    /// A write or flush, remembering whether it waited on the socket; an error once parked.
    fn write_with<T>(
        &mut self,
        op: impl FnOnce(Pin<&mut S>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        let polled = match self.socket.as_mut() {
            Some(socket) if !self.parked => op(Pin::new(socket)),
            _ => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        };
        self.write_blocked = polled.is_pending();
        polled
    }
}

impl<S> Drop for Parkable<S> {
    fn drop(&mut self) {
        let Some(socket) = self.socket.take() else {
            return;
        };
        if self.parked {
            self.dock.leave(Left::Parked(socket));
        } else if self.shut && self.linger_when_ended {
            self.dock.leave(Left::Ended(socket));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Parkable<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        if this.parked {
            return Poll::Ready(Ok(()));
        }
        let Some(socket) = this.socket.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let before = buf.filled().len();
        match Pin::new(socket).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.activity.note_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if !this.write_blocked && this.activity.take_park_ask() => {
                this.parked = true;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Parkable<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_with(|s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_with(|s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.parked {
            return Poll::Ready(Ok(()));
        }
        this.write_with(|s| s.poll_flush(cx))
    }

    /// A parking connection is not shut down: its socket goes on.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.socket.as_mut() {
            Some(socket) if !this.parked => {
                let shut = ready!(Pin::new(socket).poll_shutdown(cx));
                this.shut = true;
                Poll::Ready(shut)
            }
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// Ends as its socket does, unless it parked: then the socket goes on.
impl<S: ClientSocket> Socket for Parkable<S> {
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_with(|s| s.poll_write_last(cx, bufs))
    }

    fn poll_end(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.socket.as_mut() {
            Some(socket) if !this.parked => Pin::new(socket).poll_end(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// What ended a parked wait.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// The client sent something (or closed): serve it again.
    Readable,
    /// The idle or head deadline passed, or the listener drains: close.
    Close,
}

/// Waits, parked, until the client sends again, counted in `parked`; or until the connection's
/// idle deadline passes or `drain` turns true (or its sender is gone).
pub async fn wait_parked<S: ClientSocket>(
    socket: &mut S,
    activity: &Activity,
    timers: Timers,
    drain: &mut watch::Receiver<bool>,
    parked: &Arc<AtomicUsize>,
) -> Wake {
    let _counted = CountedSlot::take(parked);
    let deadline = activity.parked_until(timers);
    // Readiness polled rather than awaited as `readable()`'s future: 150 bytes less in every
    // parked connection's task.
    let readable = std::future::poll_fn(|cx| socket.tcp().poll_read_ready(cx));
    tokio::select! {
        biased;
        _ = drain.wait_for(|d| *d) => Wake::Close,
        ready = readable => match ready {
            Ok(()) => Wake::Readable,
            Err(_) => Wake::Close,
        },
        () = tokio::time::sleep_until(deadline) => Wake::Close,
    }
}
