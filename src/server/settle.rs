//! The socket under an HTTP/2 connection over TLS, giving back rustls's buffers once the
//! connection settles: [`super::idle::drive`] asks for it when the connection has carried no
//! request for two `park`s (when h2 gives back its own, `vendor/h2/PATCHED.md`), and from then
//! on until its next request, every read that waits on the socket frees rustls's receive
//! buffer and empty record queues (`vendor/rustls/PATCHED.md`): 4 KiB a connection. A frame
//! that comes meanwhile (a PING) has rustls allocate them again, and they are freed again once
//! it is read. An HTTP/1 connection gives them back when it parks ([`super::park`]).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::idle::Activity;
use super::park::ClientSocket;

/// Passes everything through; a read that waits while the connection is settled gives back
/// the socket's idle buffers.
pub struct ReleaseWhenSettled<S> {
    socket: S,
    activity: Arc<Activity>,
}

impl<S> ReleaseWhenSettled<S> {
    pub fn new(socket: S, activity: Arc<Activity>) -> ReleaseWhenSettled<S> {
        ReleaseWhenSettled { socket, activity }
    }
}

impl<S: ClientSocket> AsyncRead for ReleaseWhenSettled<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.socket).poll_read(cx, buf);
        if polled.is_pending() && this.activity.settled() {
            this.socket.release_idle_buffers();
        }
        polled
    }
}

impl<S: ClientSocket> AsyncWrite for ReleaseWhenSettled<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
    }
}
