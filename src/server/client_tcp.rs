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
//! How: reads and writes are tried directly. The first read that would wait registers the socket
//! for reading (`EPOLLIN | EPOLLRDHUP`); the first write that would wait (or that is only partly
//! taken, which on epoll means the buffer is full) registers it for writing, or, when it is
//! registered for reading already, for both. tokio cannot change a registration's interest, so
//! widening removes the registration and adds the socket again (two `epoll_ctl` where HAProxy's
//! `EPOLL_CTL_MOD` takes one); adding reports the socket's state at once, so bytes (or room) that
//! came in between are not missed. A removed registration forgets the wakers waiting on it without
//! waking them, so widening wakes the connection's task itself: a read waiting when a write widened
//! polls again and waits on the new registration. (The socket is only ever polled from one task at
//! a time: its connection's, or its tunnel's after an upgrade.) One descriptor a connection,
//! whatever it waits for.

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
    /// The socket's registration, once a read or a write has had to wait. Declared before
    /// `socket`: fields drop in order, so the registration is removed while its descriptor is
    /// open.
    registered: Option<Registered>,
    socket: TcpStream,
}

/// A [`ClientTcp`]'s registration and what it was made for.
struct Registered {
    fd: AsyncFd<SocketFd>,
    interest: Interest,
}

/// The descriptor of a [`ClientTcp`]'s own socket, for its registration, which the `ClientTcp`
/// drops before the socket (see `registered`).
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
            registered: None,
            socket,
        }
    }

    /// Ready when a read would not wait (data, the end of the stream or an error), without
    /// reading.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.registered_for(Interest::READABLE, cx)?
            .poll_read_ready(cx)
            .map_ok(drop)
    }

    /// Whether bytes the client sent are waiting to be read, now, without waiting: closed with
    /// them unread, the socket would send a reset.
    pub fn has_unread_bytes(&self) -> bool {
        matches!(self.socket.peek(&mut [0u8; 1]), Ok(1))
    }

    /// Copies what has arrived without taking it off the socket, waiting until something has.
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_peek(cx, buf)).await
    }

    fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            let ready = match self.registered_only_for(Interest::READABLE) {
                Some(registered) => Some(ready!(registered.poll_read_ready(cx))?),
                None => None,
            };
            match (self.socket.peek(buf), ready) {
                (Err(e), Some(mut ready)) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready.clear_ready();
                }
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.registered_for(Interest::READABLE, cx)?;
                }
                (peeked, _) => return Poll::Ready(peeked),
            }
        }
    }

    /// The registration, made or widened so that it covers `interest`. Widening replaces it:
    /// `cx`'s task is woken, so that what it waited for on the old one it waits for again on
    /// the new (see the module's doc).
    fn registered_for(
        &mut self,
        interest: Interest,
        cx: &Context<'_>,
    ) -> io::Result<&AsyncFd<SocketFd>> {
        let wanted = match self.registered.take() {
            Some(had) if covers(had.interest, interest) => {
                return Ok(&self.registered.insert(had).fd);
            }
            Some(had) => {
                let wanted = had.interest.add(interest);
                // Removed before the socket is added again (epoll refuses a second add).
                drop(had);
                cx.waker().wake_by_ref();
                wanted
            }
            None => interest,
        };
        let fd = SocketFd(self.socket.as_raw_fd());
        // SAFETY: `registered` drops before `socket`, which stays open until then (field order).
        #[allow(unsafe_code)]
        let fd = unsafe { register(fd, wanted) }?;
        let registered = self.registered.insert(Registered {
            fd,
            interest: wanted,
        });
        Ok(&registered.fd)
    }

    /// The registration, if it covers `interest`.
    fn registered_only_for(&self, interest: Interest) -> Option<&AsyncFd<SocketFd>> {
        self.registered
            .as_ref()
            .filter(|r| covers(r.interest, interest))
            .map(|r| &r.fd)
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
            // Not registered for writing yet: the write goes straight ahead.
            let ready = match self.registered_only_for(Interest::WRITABLE) {
                Some(registered) => Some(ready!(registered.poll_write_ready(cx))?),
                None => None,
            };
            let written = write(&self.socket);
            if used_up_after(&written, offered) {
                match ready {
                    Some(mut ready) => ready.clear_ready(),
                    None => {
                        self.registered_for(Interest::WRITABLE, cx)?;
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

/// Whether a registration for `had` serves a wait for `wanted`.
fn covers(had: Interest, wanted: Interest) -> bool {
    (had.is_readable() || !wanted.is_readable()) && (had.is_writable() || !wanted.is_writable())
}

impl AsyncRead for ClientTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // Not registered for reading yet: the read goes straight ahead.
            let ready = match this.registered_only_for(Interest::READABLE) {
                Some(registered) => Some(ready!(registered.poll_read_ready(cx))?),
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
                        this.registered_for(Interest::READABLE, cx)?;
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
