//! Parking, in process on tokio's paused clock: an HTTP/1 connection idle for a second gives
//! hyper's buffers back and waits as a bare socket (`aralez_parked_sessions` counts it); the
//! client's next request, on the same socket, is served by a new hyper connection, upgrades
//! included, plain and over TLS. A parked connection still closes at its idle deadline and on
//! drain; half a request head is never cut by parking; half a pipelined head is closed.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aralez::server::{AcceptLoop, ConnInfo, Limits};
use aralez::vocab::ClientBody;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: park\r\n\r\n";
const ANSWER: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n";
/// An answer larger than the sockets' buffers.
const BIG: usize = 16 << 20;

/// Answers `ok`; an `Upgrade` request gets 101 and its tunnel echoes; a request body is read
/// after the answer, in the background (as a proxy streaming it upstream may).
async fn answer(mut req: Request<ClientBody>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/big" {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; BIG]))));
    }
    if !req.body().is_end_stream() {
        let body = req.into_body();
        tokio::spawn(http_body_util::BodyExt::collect(body));
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    if req.headers().contains_key(http::header::UPGRADE) {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let (mut read, mut write) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut read, &mut write).await;
            }
        });
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = resp.headers_mut();
        headers.insert(http::header::UPGRADE, "echo".parse().unwrap());
        headers.insert(http::header::CONNECTION, "upgrade".parse().unwrap());
        return Ok(resp);
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

struct Served {
    addr: SocketAddr,
    parked: Arc<AtomicUsize>,
    shutdown: watch::Sender<bool>,
}

impl Served {
    fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }
}

fn limits() -> Limits {
    Limits {
        header_timeout: HEAD_TIMEOUT,
        max_header_bytes: 16 * 1024,
        max_connections: 100,
        keepalive: None,
        grace_period: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        send_timeout: Duration::from_secs(60),
        backend_wait: Duration::from_secs(60),
        max_streams: 100,
    }
}

/// An accept loop on 127.0.0.1, with TLS when `tls` is given.
fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Served {
    let listener = support::proxy_listener();
    let addr = listener.local_addr().expect("address");
    let parked = Arc::new(AtomicUsize::new(0));
    let accept = AcceptLoop {
        name: "test",
        listener,
        tls,
        limits: limits(),
        open: Arc::new(AtomicUsize::new(0)),
        parked: parked.clone(),
        proxy_protocol: false,
        per_client: None,
        refusals: None,
    };
    let (shutdown, stop) = watch::channel(false);
    // Boxed: a listener's answers are `Unpin`.
    let service = |_: ConnInfo| service_fn(|req| Box::pin(answer(req)));
    tokio::spawn(accept.run(service, stop));
    Served {
        addr,
        parked,
        shutdown,
    }
}

/// Reads one `ok` answer (or whatever came before the connection closed).
async fn read_answer<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

async fn ask<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> String {
    s.write_all(GET).await.expect("write");
    read_answer(s).await
}

/// Whether the server closed `s` (end of stream or reset).
async fn closed<S: AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf).await, Ok(0) | Err(_))
}

/// A client connection. Without Nagle: a short write held back for the peer's delayed ACK (40
/// ms of real time) would arrive long after the paused clock had run past every deadline.
async fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// A client connection that has asked one thing and had its answer.
async fn answered_once(served: &Served) -> TcpStream {
    let mut s = connect(served.addr).await;
    assert!(ask(&mut s).await.starts_with(ANSWER));
    s
}

async fn idle(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_parks_and_its_next_request_is_served_on_the_same_socket() {
    let served = serve(None);
    let mut s = answered_once(&served).await;
    idle(Duration::from_millis(500)).await;
    assert_eq!(served.parked(), 0, "parked after half a second");
    idle(Duration::from_millis(700)).await;
    assert_eq!(served.parked(), 1, "not parked after 1.2 s idle");
    for round in 0..3 {
        assert!(ask(&mut s).await.starts_with(ANSWER), "round {round}");
        assert_eq!(served.parked(), 0);
        idle(Duration::from_secs(2)).await;
        assert_eq!(served.parked(), 1, "round {round}: not parked again");
    }
}

#[tokio::test(start_paused = true)]
async fn a_parked_connection_upgrades() {
    let served = serve(None);
    let mut s = answered_once(&served).await;
    idle(Duration::from_secs(2)).await;
    assert_eq!(served.parked(), 1);
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: park\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
    s.write_all(b"through the tunnel").await.expect("write");
    let mut echoed = [0u8; 18];
    s.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(&echoed, b"through the tunnel");
}

#[tokio::test(start_paused = true)]
async fn a_parked_connection_closes_at_its_head_deadline_and_on_drain() {
    let served = serve(None);
    let mut late = answered_once(&served).await;
    let asked = tokio::time::Instant::now();
    idle(Duration::from_secs(3)).await;
    let mut drained = answered_once(&served).await;
    idle(Duration::from_secs(2)).await;
    assert_eq!(served.parked(), 2);
    // client_header_timeout (10 s) after the last request: closed.
    assert!(closed(&mut late).await, "the parked connection stayed open");
    let waited = asked.elapsed();
    assert!(
        waited >= HEAD_TIMEOUT && waited < HEAD_TIMEOUT + Duration::from_secs(1),
        "closed after {waited:?}"
    );
    assert_eq!(served.parked(), 1);
    // The drain closes the other one at once (it carries no request).
    served.shutdown.send_replace(true);
    let started = tokio::time::Instant::now();
    assert!(closed(&mut drained).await);
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "drain took {:?}",
        started.elapsed()
    );
    assert_eq!(served.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn half_a_head_is_never_cut_by_parking() {
    let served = serve(None);
    let mut s = answered_once(&served).await;
    s.write_all(&GET[..9]).await.expect("write");
    idle(Duration::from_secs(3)).await;
    assert_eq!(served.parked(), 0, "parked with half a head read");
    s.write_all(&GET[9..]).await.expect("write");
    let answer = read_answer(&mut s).await;
    assert!(answer.starts_with(ANSWER), "{answer:?}");
}

#[tokio::test(start_paused = true)]
async fn half_a_pipelined_head_closes_instead_of_parking() {
    let served = serve(None);
    let mut s = connect(served.addr).await;
    let mut pipelined = GET.to_vec();
    pipelined.extend_from_slice(&GET[..9]);
    s.write_all(&pipelined).await.expect("write");
    assert!(read_answer(&mut s).await.starts_with(ANSWER));
    idle(Duration::from_secs(2)).await;
    // Closed when it would have parked, not at the head deadline (10 s).
    let started = tokio::time::Instant::now();
    assert!(
        closed(&mut s).await,
        "half a pipelined head: expected a close"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "closed after {:?}",
        started.elapsed()
    );
    assert_eq!(served.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_tls_connection_parks_and_is_served_again() {
    let pki = support::test_pki(&["park.test"]);
    let served = serve(Some(support::tls_acceptor_for(
        vec![pki.leaf.clone()],
        pki.leaf_key.clone_key(),
        &[b"http/1.1"],
    )));
    let config = support::tls_client_config(std::slice::from_ref(&pki.ca), &[b"http/1.1"]);
    let tcp = connect(served.addr).await;
    let name = rustls_pki_types::ServerName::try_from("park.test").expect("name");
    let mut s = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("handshake");
    assert!(ask(&mut s).await.starts_with(ANSWER));
    idle(Duration::from_secs(2)).await;
    assert_eq!(served.parked(), 1);
    assert!(ask(&mut s).await.starts_with(ANSWER));
    assert_eq!(served.parked(), 0);
}

/// Reads whatever comes within `wait`; the number of answers in it.
async fn answers_within<S: AsyncRead + Unpin>(s: &mut S, wait: Duration) -> usize {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(wait, s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200 OK")
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_request_body_still_coming_is_never_taken_for_a_request() {
    // The service answers before the body has come; the client sends half of it, waits past the
    // park time, then sends the rest, which looks like a request. It must stay body bytes: a
    // connection parked there would read them as a request (a desync).
    let served = serve(None);
    let mut s = connect(served.addr).await;
    let hidden = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let head = format!(
        "POST / HTTP/1.1\r\nHost: park\r\nContent-Length: {}\r\n\r\n",
        5 + hidden.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(b"12345").await.expect("write");
    assert_eq!(answers_within(&mut s, Duration::from_millis(100)).await, 1);
    idle(Duration::from_secs(3)).await;
    assert_eq!(served.parked(), 0, "parked with a request body unread");
    s.write_all(hidden).await.expect("write");
    s.write_all(GET).await.expect("write");
    assert_eq!(
        answers_within(&mut s, Duration::from_secs(1)).await,
        1,
        "the unread body was answered as a request"
    );
    // A request without a body ended last: the connection parks again.
    idle(Duration::from_secs(2)).await;
    assert_eq!(served.parked(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_the_client_is_slow_to_read_is_never_cut_by_parking() {
    let served = serve(None);
    let mut s = connect(served.addr).await;
    s.write_all(b"GET /big HTTP/1.1\r\nHost: park\r\n\r\n")
        .await
        .expect("write");
    // Not reading: the answer's tail waits in the proxy's buffers.
    idle(Duration::from_secs(3)).await;
    assert_eq!(served.parked(), 0, "parked with an answer not yet sent");
    // Reading it takes the proxy's writes, each woken by the kernel once the client has made
    // room (at most 128 KiB waits unsent): on the paused clock, every such wait would jump a
    // second ahead and end the read. The clock runs from here.
    tokio::time::resume();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    // Read until the whole answer is in (the head's length is known once it is): stopping at
    // a guessed length cut the read short whenever the last read ended within the head's
    // guessed-wrong bytes, about once in 200 runs.
    let mut head_end = None;
    while head_end.is_none_or(|end| got.len() < end + BIG) {
        match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
        if head_end.is_none() {
            head_end = got
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|at| at + 4);
        }
    }
    let head_end = head_end.expect("a head");
    assert_eq!(got.len() - head_end, BIG, "the answer was cut");
}
