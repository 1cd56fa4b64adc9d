//! The first read of a plain client connection, made once for two readers.
//!
//! hyper-util tells HTTP/2 prior knowledge from HTTP/1 by reading the first 24 bytes (the
//! length of the HTTP/2 preface) on their own, and hyper then reads the rest of the request
//! head: two `recv` calls where one would do, on every new plain connection. [`ReadAhead`]
//! answers a first read smaller than [`READ_AHEAD`] from one socket read of up to that size,
//! kept on the stack, and holds what the reader had no room for until its next read, which it
//! answers without the socket. After that it passes reads straight through.
//!
//! TLS connections do not need it: their first bytes come out of rustls's buffer, not a
//! system call.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::park::ClientSocket;

/// The most one first read takes from the socket: a typical request head, whole.
pub const READ_AHEAD: usize = 4096;

/// A plain socket whose first small read reads ahead (module doc).
pub struct ReadAhead<S> {
    socket: S,
    state: State,
}

enum State {
    /// Nothing read yet.
    First,
    /// Bytes read ahead that no reader has taken yet, from `taken` on.
    Held { bytes: Box<[u8]>, taken: usize },
    /// Reads pass through.
    Through,
}

impl<S> ReadAhead<S> {
    pub fn new(socket: S) -> ReadAhead<S> {
        ReadAhead {
            socket,
            state: State::First,
        }
    }

    /// Whether bytes read from the socket wait here for a reader.
    pub fn holds_bytes(&self) -> bool {
        matches!(self.state, State::Held { .. })
    }
}

impl<S: AsyncRead + Unpin> ReadAhead<S> {
    /// The first read, for a reader with room for fewer than [`READ_AHEAD`] bytes.
    fn read_ahead(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut ahead = [MaybeUninit::<u8>::uninit(); READ_AHEAD];
        let mut ahead = ReadBuf::uninit(&mut ahead);
        match Pin::new(&mut self.socket).poll_read(cx, &mut ahead) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let read = ahead.filled();
        let given = read.len().min(buf.remaining());
        buf.put_slice(&read[..given]);
        self.state = if given < read.len() {
            State::Held {
                bytes: read[given..].into(),
                taken: 0,
            }
        } else {
            State::Through
        };
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.state {
            State::Through => Pin::new(&mut this.socket).poll_read(cx, buf),
            State::First if buf.remaining() >= READ_AHEAD => {
                this.state = State::Through;
                Pin::new(&mut this.socket).poll_read(cx, buf)
            }
            State::First => this.read_ahead(cx, buf),
            State::Held { bytes, taken } => {
                let rest = &bytes[*taken..];
                let given = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..given]);
                *taken += given;
                if *taken == bytes.len() {
                    this.state = State::Through;
                }
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
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

impl ClientSocket for ReadAhead<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.socket
    }

    fn holds_bytes(&self) -> bool {
        ReadAhead::holds_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn pair() -> (ReadAhead<TcpStream>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (ReadAhead::new(server), client)
    }

    const HEAD: &[u8] = b"GET /a HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\n\r\n";

    /// The first 24 bytes, then the rest of what the first read took, without the socket: bytes
    /// the client sends in between come only with the read after.
    #[tokio::test]
    async fn a_small_first_read_is_answered_then_the_rest_without_the_socket() {
        let (mut server, mut client) = pair().await;
        client.write_all(HEAD).await.unwrap();
        // Wait until the whole head is readable, so that one recv takes all of it.
        server.socket.readable().await.unwrap();
        let mut preface = [0u8; 24];
        let n = server.read(&mut preface).await.unwrap();
        assert_eq!(&preface[..n], &HEAD[..24]);
        assert!(server.holds_bytes());

        client.write_all(b"later").await.unwrap();
        let mut rest = vec![0u8; 8192];
        let n = server.read(&mut rest).await.unwrap();
        assert_eq!(&rest[..n], &HEAD[24..], "only what was read ahead");
        assert!(!server.holds_bytes());
        let n = server.read(&mut rest).await.unwrap();
        assert_eq!(&rest[..n], b"later");
    }

    /// What was read ahead is handed out as the reader has room, in order.
    #[tokio::test]
    async fn held_bytes_go_out_piece_by_piece() {
        let (mut server, mut client) = pair().await;
        client.write_all(HEAD).await.unwrap();
        server.socket.readable().await.unwrap();
        let mut got = Vec::new();
        let mut piece = [0u8; 10];
        while got.len() < HEAD.len() {
            let n = server.read(&mut piece).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&piece[..n]);
        }
        assert_eq!(got, HEAD);
        assert!(!server.holds_bytes());
    }

    /// A reader with room for a whole read-ahead reads the socket directly, and so does every
    /// read after the first; the end of the stream comes through.
    #[tokio::test]
    async fn a_large_first_read_and_the_end_of_stream_pass_through() {
        let (mut server, mut client) = pair().await;
        client.write_all(HEAD).await.unwrap();
        client.shutdown().await.unwrap();
        let mut all = Vec::new();
        server.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, HEAD);
        assert!(!server.holds_bytes());
    }

    /// A first read that finds the stream ended gives nothing and holds nothing.
    #[tokio::test]
    async fn a_first_read_at_the_end_of_stream_gives_nothing() {
        let (mut server, client) = pair().await;
        drop(client);
        let mut preface = [0u8; 24];
        assert_eq!(server.read(&mut preface).await.unwrap(), 0);
        assert!(!server.holds_bytes());
    }
}
