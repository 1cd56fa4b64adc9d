//! Accepting a listener's connections without the `accept` that fails.
//!
//! tokio's `TcpListener` calls `accept4` until it fails with `EAGAIN`: that is how it learns the
//! queue is empty. On Linux a failing `accept4` is not cheap: the kernel makes the new socket's
//! inode, dentry and file first, finds no connection, and frees them again (in the task work run
//! on the way back to user space). With a new connection per request, 0.3-0.6 such calls came with
//! every connection, and `perf` put aralez's accept work at 1.5 times nginx's (nginx accepts one
//! connection per `epoll_wait`, its listener level-triggered).
//!
//! Here, once a connection has been taken, a `poll` of the listener (no allocation: it only looks
//! at the accept queue) says whether another one waits; if none does, the listener's readiness is
//! cleared and the next connection comes with the next epoll event. tokio clears readiness only
//! if no event arrived since it was read, so a connection that lands between the look and the
//! clearing is not missed.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use socket2::Socket;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// A non-blocking listener registered with the worker's reactor.
pub struct Acceptor {
    listener: AsyncFd<Socket>,
    /// The last call took a connection: the queue is looked at before accepting again.
    took_one: bool,
}

impl Acceptor {
    /// Registers `listener` (made non-blocking here) with the current runtime.
    pub fn new(listener: TcpListener) -> io::Result<Acceptor> {
        listener.set_nonblocking(true)?;
        let listener = register(Socket::from(listener))?;
        Ok(Acceptor {
            listener,
            took_one: false,
        })
    }

    /// The next connection, non-blocking and registered with the reactor. Cancel-safe: a
    /// connection is taken from the kernel only in the step that returns it.
    pub async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            let mut ready = self.listener.readable().await?;
            if std::mem::take(&mut self.took_one) && !queue_has_one(ready.get_inner())? {
                ready.clear_ready();
                continue;
            }
            let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            let Ok(taken) = ready.try_io(|listener| listener.get_ref().accept4(flags)) else {
                // Would block: tokio cleared the readiness; wait for the next event.
                continue;
            };
            let (socket, peer) = taken?;
            self.took_one = true;
            let peer = peer.as_socket().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "accepted a non-IP connection")
            })?;
            let stream = TcpStream::from_std(socket.into())?;
            return Ok((stream, peer));
        }
    }
}

/// `listener` handed to the current runtime's reactor, readable interest only.
#[allow(unsafe_code)]
fn register(listener: Socket) -> io::Result<AsyncFd<Socket>> {
    // SAFETY: the `AsyncFd` owns the socket, so its descriptor stays open and the same until the
    // `AsyncFd` is dropped; nothing here replaces or closes the socket inside it.
    unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
        .map_err(io::Error::from)
}

/// Whether a connection waits in `listener`'s accept queue (a `poll` that does not wait).
fn queue_has_one(listener: &Socket) -> io::Result<bool> {
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    match nix::poll::poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => Ok(n > 0),
        // Interrupted: accepting (and maybe failing once) is always correct.
        Err(nix::errno::Errno::EINTR) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::time::timeout;

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(5);

    fn bound() -> (Acceptor, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("local address");
        (Acceptor::new(listener).expect("register"), addr)
    }

    /// Connections queued together before the first accept (one epoll event for all of them)
    /// are all taken: clearing readiness after the first must not strand the others.
    #[tokio::test]
    async fn connections_queued_together_are_all_taken() {
        let (mut acceptor, addr) = bound();
        let mut clients = Vec::new();
        for _ in 0..5 {
            clients.push(std::net::TcpStream::connect(addr).expect("connect"));
        }
        for i in 0..5 {
            let (_, peer) = timeout(DEADLINE, acceptor.accept())
                .await
                .unwrap_or_else(|_| panic!("connection {i} was never accepted"))
                .expect("accept");
            assert!(clients
                .iter()
                .any(|c| c.local_addr().expect("client address") == peer));
        }
    }

    /// After the queue was found empty and readiness cleared, a later connection still wakes
    /// the acceptor, and the stream it gets works both ways.
    #[tokio::test]
    async fn a_later_connection_wakes_it_and_its_stream_works() {
        let (mut acceptor, addr) = bound();
        let first = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = timeout(DEADLINE, acceptor.accept())
            .await
            .expect("first accepted")
            .expect("accept");
        // The queue is empty now: this call looks, clears readiness and waits.
        let waiting = tokio::spawn(async move {
            let (mut stream, _) = acceptor.accept().await.expect("accept");
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await.expect("read");
            stream.write_all(b"pong").await.expect("write");
            buf
        });
        tokio::task::yield_now().await;
        let mut second = tokio::net::TcpStream::connect(addr).await.expect("connect");
        second.write_all(b"ping").await.expect("write");
        let got = timeout(DEADLINE, waiting)
            .await
            .expect("second accepted")
            .expect("task");
        assert_eq!(&got, b"ping");
        let mut answer = [0u8; 4];
        second.read_exact(&mut answer).await.expect("read");
        assert_eq!(&answer, b"pong");
        drop(first);
    }
}
