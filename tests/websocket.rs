//! WebSocket through the proxy with no config: HTTP/1.1 Upgrade -> 101 -> frames both ways;
//! HTTP/2 clients by extended CONNECT (RFC 8441) bridged to an HTTP/1.1 upgrade; TLS backends;
//! a half-close passed through an upgraded connection.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket echo server (real handshake and framing); returns its address.
async fn echo_server() -> std::net::SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(echo(stream));
        }
    });
    addr
}

/// The same echo server behind TLS (self-signed; ALPN offers h2 too, so the proxy must ask for
/// HTTP/1.1 to upgrade).
async fn tls_echo_server() -> std::net::SocketAddr {
    let acceptor = tls_backend_acceptor(&[b"h2", b"http/1.1"]);
    serve_tls(acceptor, any_local(), echo).await
}

/// One WebSocket connection: text and binary echoed, pings answered, close returned.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(stream: S) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    while let Some(Ok(msg)) = ws.next().await {
        if let Message::Close(frame) = msg {
            let _ = ws.send(Message::Close(frame)).await;
            return;
        }
        // Text and binary are echoed; pings are answered by the library as it reads.
        if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
            return;
        }
    }
}

fn ws_route(backend: std::net::SocketAddr) -> String {
    Upstreams::new()
        .host(
            "chat.local",
            Host::new().path("/", Path::addrs(&[backend]).healthcheck(false)),
        )
        .render()
}

/// The proxy with plain and TLS listeners (`client_header_timeout: 1`, `client_idle_timeout: 3`) in front of an echo
/// server, for `chat.local`.
struct ChatProxy {
    proxy: ProxyProcess,
    root: rustls_pki_types::CertificateDer<'static>,
    _certs: tempfile::TempDir,
}

impl ChatProxy {
    async fn start() -> ChatProxy {
        let backend = echo_server().await;
        let certs = tempfile::tempdir().unwrap();
        let root = write_self_signed(certs.path(), "chat", &["chat.local"]);
        let main = format!(
            "client_header_timeout: 1\nclient_idle_timeout: 3\nproxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
            certs.path().display()
        );
        let proxy = ProxyProcess::start(&ws_route(backend), &main);
        ChatProxy {
            proxy,
            root,
            _certs: certs,
        }
    }

    /// A TLS connection to the proxy for `chat.local`, offering `alpn`.
    async fn tls_client(&self, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tls_addr = self.proxy.logged_addr("listening on https://");
        let config = tls_client_config(std::slice::from_ref(&self.root), &[alpn]);
        let tcp = TcpStream::connect(tls_addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("chat.local").unwrap();
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .unwrap()
    }
}

async fn exercise<S>(stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (ws, resp) = tokio_tungstenite::client_async("ws://chat.local/socket", stream)
        .await
        .expect("WebSocket handshake through the proxy");
    assert_eq!(resp.status(), 101);
    echo_frames(ws).await;
}

/// Text, 1 MiB binary, ping, a pause longer than the header timeout, then the close handshake.
async fn echo_frames<S>(mut ws: WebSocketStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 253) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap().into_data().as_ref(),
        big.as_slice()
    );
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(b"are you there".to_vec().into())
    );
    // Idle longer than the header timeout: an upgraded connection is not an HTTP one (kept: the
    // point is that the timeout's time really passes). Its own idle timeout (3 s here) is tested
    // in tests/tunnels.rs on the paused clock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ws.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("still here")
    );
    ws.close(None).await.unwrap();
    let mut closed = false;
    while let Some(msg) = ws.next().await {
        if matches!(msg, Ok(Message::Close(_)) | Err(_)) {
            closed = true;
            break;
        }
    }
    assert!(
        closed || ws.next().await.is_none(),
        "close handshake completes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_over_plain_and_tls_listeners() {
    let chat = ChatProxy::start().await;
    let proxy = &chat.proxy;
    exercise(TcpStream::connect(proxy.addr).await.unwrap()).await;

    exercise(chat.tls_client(b"http/1.1").await).await;
}

/// Opens a WebSocket over HTTP/2 by extended CONNECT (RFC 8441) on `io`, an h2 connection to
/// the proxy; `scheme` is the one the client uses.
async fn extended_connect<IO>(
    io: IO,
    scheme: &str,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let resp = ask_extended_connect(io, scheme, "/socket").await;
    assert_eq!(resp.status(), 200, "RFC 8441: the stream opens with 200");
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let upgraded = hyper::upgrade::on(resp).await.expect("upgraded stream");
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await
}

/// The proxy's answer to a WebSocket extended CONNECT for `path` on `io`, an h2 connection.
async fn ask_extended_connect<IO>(
    io: IO,
    scheme: &str,
    path: &str,
) -> http::Response<hyper::body::Incoming>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake with the proxy");
    tokio::spawn(conn);
    // A first exchange makes sure the proxy's SETTINGS (ENABLE_CONNECT_PROTOCOL) have arrived.
    let warm = http::Request::get(format!("{scheme}://chat.local/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(warm).await.expect("first request");
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("{scheme}://chat.local{path}"))
        .header("sec-websocket-version", "13")
        .body(Empty::<Bytes>::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    sender
        .send_request(req)
        .await
        .expect("extended CONNECT through the proxy")
}

/// A backend that answers the upgrade with a 2xx of its own and switches nothing: the HTTP/2
/// client gets a 502, not a 200 that would say its tunnel is open (h2 reset the stream, the
/// answer having a body). Over plain and TLS backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_connect_the_backend_does_not_switch_is_a_502() {
    use support::scripted::{scripted_routes, Then};
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno";
    let routes = scripted_routes(ANSWER, Then::AnswerTheNext).await;
    let proxy = ProxyProcess::start(&routes, "access_log: all");
    for path in ["/plain", "/tls"] {
        let plain = TcpStream::connect(proxy.addr).await.unwrap();
        let resp = ask_extended_connect(plain, "http", path).await;
        assert_eq!(resp.status(), 502, "{path}");
        let body = body_bytes(resp).await;
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("did not accept the protocol upgrade"),
            "{path}: {text}"
        );
    }
    // The access log names the backend that refused (it said `backend=-`).
    assert!(
        proxy
            .wait_log_count("status=502", 2, Duration::from_secs(5))
            .await
    );
    let log = proxy.log_text();
    let refusals = log.lines().filter(|l| l.contains("status=502"));
    for line in refusals {
        assert!(!line.contains(" backend=- "), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_from_http2_clients_by_extended_connect() {
    let chat = ChatProxy::start().await;
    let proxy = &chat.proxy;
    // h2c with prior knowledge on the plain port.
    let plain = TcpStream::connect(proxy.addr).await.unwrap();
    echo_frames(extended_connect(plain, "http").await).await;
    // h2 by ALPN on the TLS port.
    let tls = chat.tls_client(b"h2").await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    echo_frames(extended_connect(tls, "https").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_to_tls_backends_pinned_and_detected() {
    let backend = tls_echo_server().await;
    // `https://` pins TLS; the bare address is detected as TLS. No health checks: this backend
    // speaks only WebSocket, so a probe (a plain HEAD) fails and would take it out of rotation
    // as soon as the first round ends (the test raced that round before).
    for server in [format!("https://{backend}"), backend.to_string()] {
        let yaml = Upstreams::new()
            .host(
                "chat.local",
                Host::new().path("/", Path::addrs(&[server]).healthcheck(false)),
            )
            .render();
        let proxy = ProxyProcess::start(&yaml, "client_header_timeout: 1\nclient_idle_timeout: 3");
        exercise(TcpStream::connect(proxy.addr).await.unwrap()).await;
    }
}

/// A backend that switches to a raw protocol, reads until the client's half-close, then answers
/// with the byte count and closes.
async fn counting_backend() -> std::net::SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read_exact(&mut byte).await.is_ok() {
                    head.push(byte[0]);
                }
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: count\r\n\r\n";
                if stream.write_all(switch).await.is_err() {
                    return;
                }
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
                let _ = stream
                    .write_all(format!("got {}", rest.len()).as_bytes())
                    .await;
            });
        }
    });
    addr
}

/// ... and the tunnel's access log line is written when it ends, with the bytes each way (it
/// was written at the 101, with none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_passes_through_an_upgraded_connection() {
    let backend = counting_backend().await;
    let proxy = ProxyProcess::start(&ws_route(backend), "access_log: all");
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let ask = "GET / HTTP/1.1\r\nHost: chat.local\r\nConnection: upgrade\r\nUpgrade: count\r\n\r\n";
    client.write_all(ask.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        client
            .read_exact(&mut byte)
            .await
            .expect("101 from the proxy");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    client.write_all(&[7u8; 100_000]).await.unwrap();
    // Half-close: the backend sees EOF, yet its answer still comes back.
    client.shutdown().await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_string(&mut answer))
        .await
        .expect("answer after half-close")
        .unwrap();
    assert_eq!(answer, "got 100000");
    proxy.wait_log("status=101", Duration::from_secs(5)).await;
    let log = proxy.log_text();
    let line = log.lines().find(|l| l.contains("status=101")).unwrap();
    assert!(
        line.contains(" bytes=10 ") && line.contains(" bytes_in=100000 "),
        "{line}"
    );
}

/// A WebSocket open when the proxy is told to stop keeps working through the drain, and the
/// proxy exits once it closes, well within the grace period (nginx keeps an old worker for its
/// upgraded connections until `worker_shutdown_timeout`). It used to be cut at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_open_at_sigterm_lives_through_the_drain() {
    let backend = echo_server().await;
    let mut proxy = ProxyProcess::start(&ws_route(backend), "grace_period_seconds: 20");
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async("ws://chat.local/socket", stream)
        .await
        .expect("WebSocket handshake through the proxy");
    proxy.signal(nix::sys::signal::Signal::SIGTERM);
    let stopped = std::time::Instant::now();
    // Messages for longer than the drain takes without tunnels (it lingers for a second).
    for i in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let text = format!("message {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text(text));
    }
    ws.close(None).await.unwrap();
    drop(ws);
    proxy.expect_clean_exit(Duration::from_secs(10), "after the WebSocket closed");
    assert!(
        stopped.elapsed() < Duration::from_secs(15),
        "waited for the grace period"
    );
}

/// A WebSocket over an HTTP/2 stream is the connection's business as long as it lives: its
/// response ended as the tunnel opened, and the connection looked idle, was asked to close
/// (`client_idle_timeout`, 3 s here) and was cut a header timeout (1 s) later, traffic or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_websocket_over_http2_outlives_the_connections_idle_timeout() {
    let chat = ChatProxy::start().await;
    let plain = TcpStream::connect(chat.proxy.addr).await.unwrap();
    let mut ws = extended_connect(plain, "http").await;
    let started = std::time::Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(6) {
        n += 1;
        let text = format!("message {n}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(2), ws.next()).await;
        let echoed =
            echoed.unwrap_or_else(|_| panic!("no echo of {text} after {:?}", started.elapsed()));
        match echoed {
            Some(Ok(msg)) => assert_eq!(msg, Message::text(text)),
            other => panic!("the tunnel ended after {:?}: {other:?}", started.elapsed()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The proxy made the `Sec-WebSocket-Key` the backend saw (the HTTP/2 client sends none), so it
/// alone can tell a wrong `Sec-WebSocket-Accept`: a 502, not a tunnel to something that did not
/// understand the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_connect_answered_with_a_wrong_accept_is_a_502() {
    use support::scripted::{scripted_routes, Then};
    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n";
    let proxy = ProxyProcess::start(&scripted_routes(ANSWER, Then::Stall).await, "");
    for path in ["/plain", "/tls"] {
        let plain = TcpStream::connect(proxy.addr).await.unwrap();
        let resp = ask_extended_connect(plain, "http", path).await;
        assert_eq!(resp.status(), 502, "{path}");
        let body = body_bytes(resp).await;
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("did not accept the protocol upgrade"),
            "{path}: {text}"
        );
    }
}

/// A backend's `101` that names no protocol (no `Upgrade` field, RFC 9110 §15.2.2 requires one)
/// is a 502: the client was told `Upgrade: websocket`, made up, and the tunnel opened to
/// whatever the backend had switched to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_without_an_upgrade_field_is_a_502() {
    use support::scripted::{read_head, scripted_routes, Then};
    use tokio::io::AsyncWriteExt;
    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\n\r\nhello";
    let proxy = ProxyProcess::start(&scripted_routes(ANSWER, Then::Stall).await, "");
    for path in ["/plain", "/tls"] {
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        let ask = format!("GET {path} HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
        client.write_all(ask.as_bytes()).await.unwrap();
        let head = String::from_utf8_lossy(&read_head(&mut client).await).into_owned();
        assert!(head.starts_with("HTTP/1.1 502"), "{path}: {head}");
    }
}
