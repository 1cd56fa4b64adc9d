//! A client's TCP socket as the runtime sees it: registered for reading only, and for writing
//! only once a write has had to wait. Also the listener that accepts such sockets.
//!
//! tokio registers every `TcpStream` for reading and writing at once. A new socket is writable
//! as soon as it is registered, so epoll reports it at the next turn: one event a connection
//! that wakes nobody (the proxy writes an answer only after reading a request, and by then it
//! just writes). nginx registers a client for reading and asks for `EPOLLOUT` only when a write
//! would wait; this does the same. Most answers fit the socket's send buffer and never wait, so
//! most connections are never registered for writing at all.
//!
//! How: reads go through the socket's own registration (`EPOLLIN | EPOLLRDHUP`). Writes are
//! tried directly; the first one that would wait (or that is only partly taken, which on epoll
//! means the buffer is full) registers a duplicate descriptor of the same socket for writing,
//! which the connection keeps from then on. A duplicate descriptor is a registration of its
//! own in epoll, so neither replaces the other, and adding it reports the socket's state at
//! once: a socket that became writable in between is not missed. Such a connection holds two
//! descriptors until it closes (the process raises its descriptor limit to the hard one at
//! start).
//!
//! A new socket's first read is tried before epoll has said anything, as tokio's own sockets
//! do: the client's first bytes are often there by the time it is accepted.

use std::io::{self, IoSlice, Write as _};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// An accepted client socket; see the module's doc.
pub struct ClientTcp {
    /// Registered for reading.
    socket: AsyncFd<TcpStream>,
    /// The same socket registered for writing, once a write has waited. Boxed: most
    /// connections never need it, and every connection's task holds this type.
    writing: Option<Box<AsyncFd<TcpStream>>>,
    /// No read was tried yet: the first one goes ahead before epoll says anything. Over a
    /// network a client's first bytes come right behind its handshake's last ACK, so they are
    /// usually there when the connection is accepted, and waiting for the event would cost
    /// the connection's task a turn (callgrind: about 1,300 instructions a connection).
    unread: bool,
}

impl ClientTcp {
    /// Registers a connected, non-blocking socket with the current runtime, for reading.
    pub fn new(socket: TcpStream) -> io::Result<ClientTcp> {
        Ok(ClientTcp {
            socket: register(socket, Interest::READABLE)?,
            writing: None,
            unread: true,
        })
    }

    /// Ready when a read would not wait (data, the end of the stream or an error), without
    /// reading.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.socket.poll_read_ready(cx).map_ok(drop)
    }

    /// Copies what has arrived without taking it off the socket, waiting until something has.
    /// The first try goes ahead before epoll says anything: behind a deferred accept the bytes
    /// are there.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.socket.get_ref().peek(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            peeked => return peeked,
        }
        loop {
            let mut ready = self.socket.readable().await?;
            if let Ok(peeked) = ready.try_io(|socket| socket.get_ref().peek(buf)) {
                return peeked;
            }
        }
    }

    /// Writes with `write` (one system call), waiting on the write registration, made the
    /// first time the socket's buffer is full.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        offered: usize,
        write: impl Fn(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            // No registration yet: the write goes straight ahead.
            let ready = match self.writing.as_deref() {
                Some(writing) => Some(ready!(writing.poll_write_ready(cx))?),
                None => None,
            };
            let written = write(self.socket.get_ref());
            if full_after(&written, offered) {
                match ready {
                    Some(mut ready) => ready.clear_ready(),
                    None => {
                        let registered = register_for_writing(self.socket.get_ref())?;
                        self.writing = Some(Box::new(registered));
                    }
                }
            }
            match written {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }
}

/// Whether a write's outcome shows the socket's buffer full: it would have waited, or took
/// only part of what it was offered (epoll is edge-triggered: no event comes for what is
/// already known).
fn full_after(written: &io::Result<usize>, offered: usize) -> bool {
    match written {
        Ok(n) => *n > 0 && *n < offered,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// Registers a socket with the current runtime for `interest`.
#[allow(unsafe_code)]
fn register<S: AsRawFd>(socket: S, interest: Interest) -> io::Result<AsyncFd<S>> {
    // SAFETY: a std socket owns its descriptor: it stays open and the same for as long as the
    // `AsyncFd` holds the socket, and closes only when the socket is dropped.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(|e| e.into_parts().1)
}

/// A duplicate descriptor of `socket`, registered for writing.
fn register_for_writing(socket: &TcpStream) -> io::Result<AsyncFd<TcpStream>> {
    register(socket.try_clone()?, Interest::WRITABLE)
}

impl AsyncRead for ClientTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if std::mem::take(&mut self.unread) {
            match read_into(self.socket.get_ref(), buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                read => return Poll::Ready(read.map(drop)),
            }
        }
        loop {
            let mut ready = ready!(self.socket.poll_read_ready(cx))?;
            let room = buf.remaining();
            match read_into(self.socket.get_ref(), buf) {
                Ok(n) => {
                    // A read that did not fill the room took all there was (epoll: no event
                    // comes for what is already known).
                    if n > 0 && n < room {
                        ready.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One `recv` into the unfilled part of `buf`, which it fills by as much as it read.
#[allow(unsafe_code)]
fn read_into(socket: &TcpStream, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // SAFETY: `recv` only writes into the slice, never de-initialises it.
    let room: &mut [MaybeUninit<u8>] = unsafe { buf.unfilled_mut() };
    let n = SockRef::from(socket).recv(room)?;
    // SAFETY: the kernel initialised the first `n` bytes of the unfilled part.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

impl AsyncWrite for ClientTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, buf.len(), |mut socket| socket.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let offered = bufs.iter().map(|b| b.len()).sum();
        self.get_mut()
            .poll_write_with(cx, offered, |mut socket| socket.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

impl AsFd for ClientTcp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.get_ref().as_fd()
    }
}

/// A listening socket whose accepted connections are [`ClientTcp`]s.
pub struct ClientListener(AsyncFd<TcpListener>);

impl ClientListener {
    /// Registers a non-blocking listening socket with the current runtime.
    pub fn new(listener: TcpListener) -> io::Result<ClientListener> {
        register(listener, Interest::READABLE).map(ClientListener)
    }

    /// The next connection and its peer's address, waiting until one comes.
    pub async fn accept(&self) -> io::Result<(ClientTcp, SocketAddr)> {
        loop {
            let mut ready = self.0.readable().await?;
            if let Ok(accepted) = ready.try_io(|listener| accept_one(listener.get_ref())) {
                return accepted;
            }
        }
    }
}

/// One `accept4`, whose socket is non-blocking and closed on exec from the start (no system
/// call of its own for either).
fn accept_one(listener: &TcpListener) -> io::Result<(ClientTcp, SocketAddr)> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    let (socket, peer) = SockRef::from(listener).accept4(flags)?;
    let peer = peer.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "accepted a peer with no IP address",
        )
    })?;
    Ok((ClientTcp::new(socket.into())?, peer))
}

#[cfg(test)]
mod tests;
