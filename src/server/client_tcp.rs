//! A client's TCP socket as the runtime sees it: registered for reading only once a read has
//! had to wait, and for writing only once a write has. Also the listener that accepts such
//! sockets.
//!
//! tokio registers every `TcpStream` for reading and writing as it is accepted: one
//! `epoll_ctl` to add it and one to remove it at the end, and one `EPOLLOUT` event a
//! connection that wakes nobody (a new socket is writable at once). HAProxy registers a
//! client only when a read or write would wait, and nginx asks for `EPOLLOUT` only then; this
//! does the same. Behind a deferred accept (`tcp_defer_accept`) the first read finds the
//! request, and a client that sends `Connection: close` is answered and closed without its
//! socket ever being in epoll; a keep-alive client is registered when its second request is
//! not there yet. Most answers fit the socket's send buffer, so most connections are never
//! registered for writing at all.
//!
//! How: reads and writes are tried directly. The first read that would wait registers the
//! socket for reading (`EPOLLIN | EPOLLRDHUP`); the first write that would wait (or that is
//! only partly taken, which on epoll means the buffer is full) registers a duplicate
//! descriptor of the same socket for writing. The connection keeps each registration from
//! then on and waits on it. A duplicate descriptor is a registration of its own in epoll, so
//! neither replaces the other, and adding either reports the socket's state at once: bytes
//! (or room) that came between the failed call and the registration are not missed. A
//! connection registered for writing holds two descriptors until it closes (the process
//! raises its descriptor limit to the hard one at start).

use std::io::{self, IoSlice, Write as _};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// An accepted client socket; see the module's doc.
pub struct ClientTcp {
    /// The socket registered for reading, once a read has waited. Declared before `socket`:
    /// fields drop in order, so the registration is removed while its descriptor is open.
    reading: Option<AsyncFd<SocketFd>>,
    /// A duplicate of the socket registered for writing, once a write has waited. Boxed:
    /// most connections never need it, and every connection's task holds this type.
    writing: Option<Box<AsyncFd<TcpStream>>>,
    socket: TcpStream,
}

/// The descriptor of a [`ClientTcp`]'s own socket, for its read registration, which the
/// `ClientTcp` drops before the socket (see `reading`).
struct SocketFd(RawFd);

impl AsRawFd for SocketFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl ClientTcp {
    /// A connected, non-blocking socket, not yet registered with the runtime.
    pub fn new(socket: TcpStream) -> ClientTcp {
        ClientTcp {
            reading: None,
            writing: None,
            socket,
        }
    }

    /// Ready when a read would not wait (data, the end of the stream or an error), without
    /// reading.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        registered_for_reading(&mut self.reading, &self.socket)?
            .poll_read_ready(cx)
            .map_ok(drop)
    }

    /// Copies what has arrived without taking it off the socket, waiting until something has.
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.socket.peek(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            peeked => return peeked,
        }
        let socket = &self.socket;
        let reading = registered_for_reading(&mut self.reading, socket)?;
        loop {
            let mut ready = reading.readable().await?;
            if let Ok(peeked) = ready.try_io(|_| socket.peek(buf)) {
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
            let written = write(&self.socket);
            if used_up_after(&written, offered) {
                match ready {
                    Some(mut ready) => ready.clear_ready(),
                    None => {
                        let registered = register_for_writing(&self.socket)?;
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

/// Whether a read's or a write's outcome shows the socket used up: nothing more to read, or no
/// more room to write. It would have waited, or did only part of what it was asked (epoll is
/// edge-triggered: no event comes for what is already known).
fn used_up_after(outcome: &io::Result<usize>, asked: usize) -> bool {
    match outcome {
        Ok(n) => *n > 0 && *n < asked,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// Registers `socket`'s descriptor with the current runtime for `interest`.
///
/// # Safety
///
/// The descriptor must stay open, and the same socket, for as long as the `AsyncFd` lives.
#[allow(unsafe_code)]
unsafe fn register<S: AsRawFd>(socket: S, interest: Interest) -> io::Result<AsyncFd<S>> {
    // SAFETY: the caller's promise.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(|e| e.into_parts().1)
}

/// `socket`'s read registration, `reading`, made if there is none yet.
#[allow(unsafe_code)]
fn registered_for_reading<'a>(
    reading: &'a mut Option<AsyncFd<SocketFd>>,
    socket: &TcpStream,
) -> io::Result<&'a AsyncFd<SocketFd>> {
    if let Some(registered) = reading {
        return Ok(registered);
    }
    let fd = SocketFd(socket.as_raw_fd());
    // SAFETY: `reading` is the `reading` field of the `ClientTcp` whose `socket` this is: the
    // socket stays open until that `ClientTcp` drops, and `reading` drops before it (field
    // order).
    Ok(reading.insert(unsafe { register(fd, Interest::READABLE) }?))
}

/// A duplicate descriptor of `socket`, registered for writing.
#[allow(unsafe_code)]
fn register_for_writing(socket: &TcpStream) -> io::Result<AsyncFd<TcpStream>> {
    // SAFETY: the `AsyncFd` owns the duplicate, which closes only when it drops.
    unsafe { register(socket.try_clone()?, Interest::WRITABLE) }
}

impl AsyncRead for ClientTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // No registration yet: the read goes straight ahead.
            let ready = match this.reading.as_ref() {
                Some(reading) => Some(ready!(reading.poll_read_ready(cx))?),
                None => None,
            };
            let room = buf.remaining();
            let read = read_into(&this.socket, buf);
            if used_up_after(&read, room) {
                match ready {
                    Some(mut ready) => ready.clear_ready(),
                    // Only a read that would wait needs the registration; one that took all
                    // there was may be the connection's last.
                    None if read.is_err() => {
                        registered_for_reading(&mut this.reading, &this.socket)?;
                    }
                    None => {}
                }
            }
            match read {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                read => return Poll::Ready(read.map(drop)),
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
        Poll::Ready(self.socket.shutdown(std::net::Shutdown::Write))
    }
}

impl AsFd for ClientTcp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// A listening socket whose accepted connections are [`ClientTcp`]s.
pub struct ClientListener(AsyncFd<TcpListener>);

impl ClientListener {
    /// Registers a non-blocking listening socket with the current runtime.
    #[allow(unsafe_code)]
    pub fn new(listener: TcpListener) -> io::Result<ClientListener> {
        // SAFETY: the `AsyncFd` owns the listener, which closes only when it drops.
        unsafe { register(listener, Interest::READABLE) }.map(ClientListener)
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
    Ok((ClientTcp::new(socket.into()), peer))
}

#[cfg(test)]
mod tests;
