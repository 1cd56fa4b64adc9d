//! Every listener of the process is served by the one accept helper, so the proxy, the admin API
//! and the file server all close a half-sent request head after `client_header_timeout`, close a
//! connection idle for `client_idle_timeout`, refuse connections past their cap, and drain on
//! shutdown. One table of listeners, the same checks for each, in process on tokio's paused
//! clock. The listeners do not defer accepts (`tcp_defer_accept: false`): the tests time silent
//! connections from their accept, and the kernel's deferral runs on real time (it is
//! `server::listener`'s and `tcp_block`'s test).

use crate::inproc;
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use aralez::server::Limits;
use inproc::Proxy;
use support::{Host, Path, Upstreams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
const IDLE_TIMEOUT: Duration = Duration::from_secs(7);

/// The limits every listener of a test gets (the proxy's come from `MAIN`).
fn limits(max_connections: usize) -> Limits {
    Limits {
        header_timeout: HEADER_TIMEOUT,
        max_header_bytes: 16 * 1024,
        max_connections,
        keepalive: None,
        grace_period: Duration::from_secs(5),
        idle_timeout: IDLE_TIMEOUT,
        send_timeout: Duration::from_secs(60),
        backend_wait: Duration::from_secs(60),
        max_streams: 16,
    }
}

const MAIN: &str = "client_header_timeout: 3\nclient_idle_timeout: 7\nmax_connections: 3\n\
                    grace_period_seconds: 5\ntcp:\n  tcp_defer_accept: false";

struct Listeners {
    /// (name, address, a request that gets a complete answer there)
    table: Vec<(&'static str, SocketAddr, &'static str)>,
    stop: watch::Sender<bool>,
    _proxy: Proxy,
    _files: tempfile::TempDir,
}

/// The proxy (no routes needed: a 404 is an answer), the admin API and the file server, each
/// capped at 3 connections.
async fn start() -> Listeners {
    let unreachable = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(&["127.0.0.1:1"]).healthcheck(false)),
        )
        .render();
    let proxy = Proxy::start(&unreachable, MAIN).await;
    let (stop, stop_rx) = watch::channel(false);
    let admin_listener = support::undeferred_listener();
    let admin_addr = admin_listener.local_addr().unwrap();
    let admin = std::sync::Arc::new(aralez::admin::Admin {
        reloader: proxy.ctx.reloader.clone(),
        master_key: Some("k".into()),
        config_api_enabled: false,
        metrics: proxy.ctx.metrics.clone(),
        metrics_key: None,
        history: Default::default(),
        cache: None,
        shared_limits: None,
        cluster: None,
        acme: None,
        certificates: None,
        conf_turn: Default::default(),
    });
    let served = aralez::admin::serve(admin_listener, admin, None, limits(3), stop_rx.clone());
    tokio::spawn(served);
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("index.html"), "hello").unwrap();
    let files_listener = support::undeferred_listener();
    let files_addr = files_listener.local_addr().unwrap();
    let folder = files.path().to_path_buf();
    tokio::spawn(aralez::fileserver::serve(
        files_listener,
        folder,
        (limits(3), aralez::accesslog::AccessLog::default()),
        stop_rx,
    ));
    let get = |path: &'static str| path;
    Listeners {
        table: vec![
            (
                "proxy",
                proxy.addr,
                get("GET / HTTP/1.1\r\nhost: x\r\n\r\n"),
            ),
            (
                "admin API",
                admin_addr,
                get("GET /status HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\n\r\n"),
            ),
            (
                "file server",
                files_addr,
                get("GET / HTTP/1.1\r\nhost: x\r\n\r\n"),
            ),
        ],
        stop,
        _proxy: proxy,
        _files: files,
    }
}

/// Reads until the peer closes; `None` if it stays open past `limit` (paused time).
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read).await.ok().map(|()| got)
}

/// Sends `request` and reads one response head (the connection stays open).
async fn answered(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn a_half_sent_head_is_closed_after_the_header_timeout() {
    let listeners = start().await;
    for (name, addr, _) in &listeners.table {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let started = tokio::time::Instant::now();
        let closed = closed_within(&mut s, HEADER_TIMEOUT * 2).await;
        assert!(closed.is_some(), "{name}: a half-sent head stayed open");
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_TIMEOUT && waited < HEADER_TIMEOUT + Duration::from_millis(100),
            "{name}: closed after {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn http1_waits_for_a_request_head_at_most_the_header_timeout() {
    let listeners = start().await;
    for (name, addr, request) in &listeners.table {
        // A connection that sends nothing, and a keep-alive one after its answer: both close
        // at the header timeout, well before the idle timeout.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut kept = TcpStream::connect(addr).await.unwrap();
        assert!(
            answered(&mut kept, request).await.starts_with("HTTP/1.1 "),
            "{name}"
        );
        let started = tokio::time::Instant::now();
        for (which, stream) in [("silent", &mut silent), ("keep-alive", &mut kept)] {
            let closed = closed_within(stream, HEADER_TIMEOUT * 2).await;
            assert!(closed.is_some(), "{name}: a {which} connection stayed open");
            let waited = started.elapsed();
            assert!(
                waited >= HEADER_TIMEOUT - Duration::from_millis(1)
                    && waited < HEADER_TIMEOUT + Duration::from_millis(100),
                "{name}: the {which} connection closed after {waited:?}"
            );
        }
    }
}

/// An HTTP/2 (prior knowledge) connection that has carried one request: its sender (the client
/// would close the connection without one) and its task, which ends when the server closes it.
async fn h2_after_one_request(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::builder()
        .uri(format!("http://{addr}/status"))
        .header("x-api-key", "k")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert!(resp.status().as_u16() < 600);
    (send, conn)
}

#[tokio::test(start_paused = true)]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let listeners = start().await;
    for (name, addr, _) in &listeners.table {
        // HTTP/2 has no header timer between requests: the idle timer closes it.
        let (_send, mut conn) = h2_after_one_request(*addr).await;
        let started = tokio::time::Instant::now();
        let ended = tokio::time::timeout(IDLE_TIMEOUT * 2, &mut conn).await;
        assert!(ended.is_ok(), "{name}: an idle h2 connection stayed open");
        let waited = started.elapsed();
        assert!(
            waited >= IDLE_TIMEOUT && waited < IDLE_TIMEOUT + Duration::from_secs(1),
            "{name}: closed after {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn connections_past_the_cap_are_refused_at_once() {
    let listeners = start().await;
    for (name, addr, request) in &listeners.table {
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            assert!(
                answered(&mut s, request).await.starts_with("HTTP/1.1 "),
                "{name}"
            );
            held.push(s);
        }
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        let refused = closed_within(&mut fourth, Duration::from_millis(50)).await;
        assert_eq!(
            refused,
            Some(Vec::new()),
            "{name}: the 4th connection was served"
        );
        // A place frees up when one closes (once the server has seen the close).
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut again = TcpStream::connect(addr).await.unwrap();
        assert!(
            answered(&mut again, request).await.starts_with("HTTP/1.1 "),
            "{name}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_every_listener() {
    let listeners = start().await;
    let mut open = Vec::new();
    for (name, addr, _) in &listeners.table {
        open.push((*name, *addr, h2_after_one_request(*addr).await));
    }
    let asked = tokio::time::Instant::now();
    listeners._proxy.shut_down();
    let _ = listeners.stop.send(true);
    for (name, addr, (_send, conn)) in open {
        // Idle HTTP/2 connections get GOAWAY after the drain's linger (2 s), long before their
        // idle timeout (7 s) would close them.
        let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
        assert!(
            ended.is_ok(),
            "{name}: an idle connection survived the drain"
        );
        assert!(asked.elapsed() < IDLE_TIMEOUT, "{name}");
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "{name}: still accepting after shutdown"
        );
    }
}
