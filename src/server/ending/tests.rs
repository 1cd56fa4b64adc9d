//! The end of a connection after a `Connection: close` answer, over real sockets on
//! 127.0.0.1: over TLS the answer and the `close_notify` leave in one write and nothing calls
//! `shutdown(2)`; over plain TCP the client reads the whole answer and then a clean end. (That
//! aralez's TLS config holds the session tickets for the answer's write is `tls`'s test.)

use std::convert::Infallible;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::server::client_tcp::ClientListener;
use crate::server::h1::Connection;
use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;

type TestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";

type Answer = Pin<Box<dyn Future<Output = Result<Response<TestBody>, Infallible>> + Send>>;

fn hello(_: Request<ClientBody>) -> Answer {
    let body = Full::new(Bytes::from("hello")).map_err(|e| match e {});
    Box::pin(std::future::ready(Ok(Response::new(body.boxed_unsync()))))
}

/// Longer than any of these exchanges takes: a test that would hang fails instead.
const PATIENCE: Duration = Duration::from_secs(10);

/// Counts the writes that moved bytes and the shutdowns of the socket under it.
#[derive(Clone, Default)]
struct Counts {
    writes: Arc<AtomicUsize>,
    shutdowns: Arc<AtomicUsize>,
}

impl Counts {
    fn writes(&self) -> usize {
        self.writes.load(Ordering::Relaxed)
    }
}

struct Counted {
    socket: TcpStream,
    counts: Counts,
}

impl Counted {
    fn count_write(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.counts.writes.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.socket).poll_write(cx, buf);
        this.count_write(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.socket).poll_write_vectored(cx, bufs);
        this.count_write(polled)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.counts.shutdowns.fetch_add(1, Ordering::Relaxed);
        Pin::new(&mut this.socket).poll_shutdown(cx)
    }
}

/// A server config over a fresh self-signed certificate and a client config trusting it.
fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// One TLS connection from the client side: the request, then the answer read to a clean end
/// (an error unless the server's close_notify came before the end of the stream).
async fn tls_exchange(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> io::Result<Vec<u8>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = TlsConnector::from(config).connect(name, tcp).await.unwrap();
    tls.write_all(REQUEST).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut answer)).await;
    read.expect("the server closes").map(|_| answer)
}

fn assert_hello(answer: &[u8]) {
    let answer = String::from_utf8_lossy(answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
}

#[tokio::test]
async fn over_tls_a_closing_answer_and_its_close_notify_leave_in_one_write() {
    let (server_config, client_config) = tls_configs();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::spawn(tls_exchange(listener.local_addr().unwrap(), client_config));
    let (socket, _) = listener.accept().await.unwrap();
    let counts = Counts::default();
    let counted = Counted {
        socket,
        counts: counts.clone(),
    };
    let tls = TlsAcceptor::from(server_config)
        .accept(counted)
        .await
        .unwrap();
    let after_handshake = counts.writes();

    let served = Connection::new(tls, service_fn(hello), BytesMut::new()).await;

    assert!(matches!(served, Ok(None)), "{served:?}");
    assert_eq!(
        counts.writes() - after_handshake,
        1,
        "answer and close_notify"
    );
    assert_eq!(counts.shutdowns.load(Ordering::Relaxed), 0);
    assert_hello(&client.await.unwrap().expect("a clean TLS end"));
}

#[tokio::test]
async fn over_tcp_a_closing_answer_is_read_whole_then_the_end() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = ClientListener::new(listener).unwrap();
    let client = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(REQUEST).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut answer)).await;
        read.expect("the server closes").map(|_| answer)
    });
    let (socket, _) = listener.accept().await.unwrap();

    let served = Connection::new(socket, service_fn(hello), BytesMut::new()).await;

    assert!(matches!(served, Ok(None)), "{served:?}");
    assert_hello(&client.await.unwrap().unwrap());
}
