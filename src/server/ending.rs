//! How a client's socket ends after aralez's own HTTP/1.1 side's last answer
//! ([`super::h1::Socket`]): with as few system calls and packets as the protocol allows.
//!
//! - Plain TCP: nothing before the close. Dropping the socket closes it, and the kernel sends
//!   the FIN behind the data already written; a `shutdown(2)` first would only be one more
//!   system call (nginx, too, closes without one).
//! - TLS: the `close_notify` alert goes into the same write as the answer's last bytes instead
//!   of a write of its own, and no `shutdown(2)` either. A client that closes as soon as it has
//!   read the answer then finds nothing unread behind it (a lone alert arriving after its
//!   close would have it answer with a reset).

use std::io::{self, IoSlice, Write as _};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

use super::client_tcp::ClientTcp;
use super::h1::Socket;

impl Socket for ClientTcp {
    fn poll_end(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Socket for TlsStream<IO> {
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let (tcp, tls) = self.get_mut().get_mut();
        let offered: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let taken = tls.writer().write_vectored(bufs)?;
            if taken == offered {
                tls.send_close_notify();
            }
            if taken > 0 || offered == 0 {
                // What the socket does not take now goes out with the flush that follows.
                if let Poll::Ready(Err(e)) = poll_send_records(tcp, tls, cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(taken));
            }
            // rustls holds as much as it may: send some of it, then try again.
            ready!(poll_send_records(tcp, tls, cx))?;
        }
    }

    fn poll_end(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (tcp, tls) = self.get_mut().get_mut();
        // Once only: it does nothing if the last write carried it.
        tls.send_close_notify();
        poll_send_records(tcp, tls, cx)
    }
}

/// A boxed socket ends as the socket in it.
impl<S: Socket> Socket for Box<S> {
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self.get_mut()).poll_write_last(cx, bufs)
    }

    fn poll_end(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **self.get_mut()).poll_end(cx)
    }
}

/// Writes out every record rustls holds for the socket, in as few writes as it takes.
fn poll_send_records<IO: AsyncWrite + Unpin>(
    tcp: &mut IO,
    tls: &mut ServerConnection,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while tls.wants_write() {
        match tls.write_tls(&mut SocketWriter { tcp, cx }) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
    Poll::Ready(Ok(()))
}

/// The socket as rustls writes to it: a write that would wait is `WouldBlock`, with the task
/// woken when the socket takes more.
struct SocketWriter<'a, 'b, IO> {
    tcp: &'a mut IO,
    cx: &'a mut Context<'b>,
}

impl<IO: AsyncWrite + Unpin> io::Write for SocketWriter<'_, '_, IO> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        would_block(Pin::new(&mut *self.tcp).poll_write(self.cx, buf))
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        would_block(Pin::new(&mut *self.tcp).poll_write_vectored(self.cx, bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn would_block(polled: Poll<io::Result<usize>>) -> io::Result<usize> {
    match polled {
        Poll::Ready(result) => result,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

#[cfg(test)]
mod tests;
