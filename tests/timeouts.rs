//! Whose each timeout is, through the in-process proxy on tokio's paused clock: the client's
//! send timeout cuts a client that stops reading, never a slow backend; the backend's response
//! timeout bounds its answer, never an upload that keeps moving.

use crate::inproc;
use crate::support;

use std::time::Duration;

use http_body_util::BodyExt;
use inproc::Proxy;
use support::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_is_cut_off_after_the_send_timeout() {
    // An HTTP/2 client with a zero flow-control window: its streams can never move, and each
    // holds a backend connection. Before, nothing ever timed them out.
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(
        &support::default_route(&[&backend]),
        "client_send_timeout: 5",
    )
    .await;
    let s = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(s))
            .await
            .unwrap();
    let mut conn = tokio::spawn(conn);
    send.ready().await.unwrap();
    let started = tokio::time::Instant::now();
    for _ in 0..8 {
        let req = http::Request::builder()
            .uri(format!("http://{}/big/1048576", proxy.addr))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let mut send = send.clone();
        // The response is held, never read: dropping it would cancel the stream.
        tokio::spawn(async move {
            let _held = send.send_request(req).await;
            std::future::pending::<()>().await
        });
    }
    let ended = tokio::time::timeout(Duration::from_secs(30), &mut conn).await;
    assert!(ended.is_ok(), "the stuck connection was never closed");
    let after = started.elapsed();
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(11),
        "closed after {after:?}"
    );
    // Said, with the client's address.
    let said = "(client_send_timeout: the client stopped reading); closed";
    assert_eq!(proxy.log_count(said), 1, "{}", proxy.log_text());
    // A client that reads is served all along.
    let mut ok = support::Client::connect(support::Proto::H2c, proxy.addr).await;
    assert_eq!(ok.get("any", "/").await.status(), 200);
}

/// The send timeout is the client's: a backend slower than it to answer, or quiet longer than
/// it in the middle of its answer, is bounded by `upstream_response_timeout` alone. Both used
/// to be cut at the send timeout, with no answer, over HTTP/1.1 and h2c alike.
#[tokio::test(start_paused = true)]
async fn a_slow_backend_is_not_cut_by_the_clients_send_timeout() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(
        &support::default_route(&[&backend]),
        "client_send_timeout: 5\nupstream_response_timeout: 30",
    )
    .await;
    for proto in [support::Proto::H1, support::Proto::H2c] {
        let mut client = support::Client::connect(proto, proxy.addr).await;
        let resp = client.get("any", "/slow/12000").await;
        assert_eq!(resp.status(), 200, "{proto:?}");
        assert_eq!(support::body_bytes(resp).await, "b", "{proto:?}");
        let resp = client.get("any", "/pause/12000").await;
        assert_eq!(resp.status(), 200, "{proto:?}");
        let body = resp.into_body().collect().await;
        let body = body.unwrap_or_else(|e| panic!("{proto:?}: the paused answer was cut: {e}"));
        assert_eq!(body.to_bytes(), "first,rest", "{proto:?}");
    }
}

/// `upstream_response_timeout` is the wait for the backend's answer once the request is sent:
/// an upload that keeps moving, slower than the timeout in all, is not cut (it got a 504 at
/// the timeout, the backend a body cut short), nginx's `proxy_send_timeout` bounding the time
/// between writes instead. Over aralez's HTTP/1.1 client.
#[tokio::test(start_paused = true)]
async fn a_slow_upload_that_keeps_moving_is_not_cut_by_the_response_timeout() {
    let head =
        "POST /collect HTTP/1.1\r\nHost: any\r\nContent-Length: 10000\r\nConnection: close\r\n\r\n";
    let (_backend, _proxy, mut stream) = upload_started(head).await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stream.write_all(&[b'x'; 1000]).await.unwrap();
    }
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("10000"), "{answer}");
}

/// A request body that stops coming is the client's stall: a 408 and the connection closed
/// (nginx's `client_body_timeout`), not the 504 that blamed the backend for it. A body of up to
/// 64 KiB is read whole first, and never reaches the backend; a larger one stalls with the
/// backend waiting for the rest (over aralez's HTTP/1.1 client).
#[tokio::test(start_paused = true)]
async fn a_request_body_that_stops_coming_is_a_408_not_the_backends_504() {
    // An `Expect: 100-continue` upload got a 504 (hyper's client waited for the backend).
    let cases = [
        (100, "", false),
        (100, "Expect: 100-continue\r\n", false),
        (100_000, "", true),
    ];
    for (length, expect, reaches_backend) in cases {
        let head = format!(
            "POST /collect HTTP/1.1\r\nHost: any\r\n{expect}Content-Length: {length}\r\n\r\n0123456789"
        );
        let (backend, _proxy, mut stream) = upload_started(&head).await;
        let mut answer = String::new();
        let read =
            tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut answer));
        assert!(read.await.is_ok(), "the connection stayed open: {answer}");
        let answer = answer.trim_start_matches("HTTP/1.1 100 Continue\r\n\r\n");
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "{length} {expect}: {answer}"
        );
        // Closed with the answer, and saying so (it stayed open for the idle timeout, and served
        // what came late as a request).
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{answer}"
        );
        assert_eq!(backend.requests() > 0, reaches_backend, "{length} {expect}");
    }
}

/// A proxy with `upstream_response_timeout: 3` in front of an HTTP/1.1 backend, and a
/// connection to it that has sent `head` (and what of the body follows it).
async fn upload_started(head: &str) -> (Backend, Proxy, TcpStream) {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(
        &support::http1_route(&backend),
        "upstream_response_timeout: 3",
    )
    .await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    (backend, proxy, stream)
}

/// A small upload still on its way holds no backend connection: the proxy reads a body of
/// declared length up to 64 KiB whole before it picks a backend (nginx's request buffering).
/// With one connection allowed to the backend, a client that stalled its upload held it, and
/// every other request got a 503 until the upload's timeout. Over HTTP/1.1 and h2c.
#[tokio::test(start_paused = true)]
async fn a_small_upload_on_its_way_holds_no_backend_connection() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(
        &support::http1_route(&backend),
        "upstream_max_connections: 1\nupstream_response_timeout: 30",
    )
    .await;
    // Over HTTP/1.1: the head and a tenth of the body.
    let mut upload = TcpStream::connect(proxy.addr).await.unwrap();
    let head =
        "POST /collect HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\nConnection: close\r\n\r\n";
    upload.write_all(head.as_bytes()).await.unwrap();
    upload.write_all(&[b'x'; 10]).await.unwrap();
    another_request_is_served_meanwhile(&proxy, &backend, 1).await;
    upload.write_all(&[b'x'; 90]).await.unwrap();
    let mut answer = String::new();
    upload.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n100"), "{answer}");

    // Over h2c: a stream whose DATA stops after a tenth of its declared length.
    let mut client = support::Client::connect(support::Proto::H2c, proxy.addr).await;
    let (more, rx) = tokio::sync::mpsc::channel(2);
    let piece = |n| {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(vec![b'x'; n])))
    };
    more.send(piece(10)).await.unwrap();
    let mut rx = rx;
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(stream));
    let uploading = tokio::spawn(async move {
        let length = [("content-length", "100")];
        client
            .send(http::Method::POST, Some("a"), "/collect", &length, body)
            .await
    });
    another_request_is_served_meanwhile(&proxy, &backend, 3).await;
    more.send(piece(90)).await.unwrap();
    drop(more);
    let resp = uploading.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(support::body_bytes(resp).await, "100");
}

/// Once the proxy has taken the `started`th request (an upload still on its way), a GET is
/// answered by the backend, and the upload has not reached it.
async fn another_request_is_served_meanwhile(proxy: &Proxy, backend: &Backend, started: u64) {
    let metrics = &proxy.ctx.metrics;
    let taken = inproc::in_real_time(Duration::from_secs(10), async {
        while metrics.requests() < started {
            tokio::task::yield_now().await;
        }
    });
    assert!(taken.await.is_some(), "the upload never reached the proxy");
    // Time for the proxy to pass the upload on, if it did that.
    proxy.pass(Duration::from_millis(200)).await;
    let before = backend.requests();
    let mut other = support::Client::connect(support::Proto::H1, proxy.addr).await;
    let resp = other.get("a", "/").await;
    assert_eq!(
        resp.status(),
        200,
        "the upload held the backend's one connection"
    );
    assert_eq!(
        backend.requests(),
        before + 1,
        "the upload reached the backend"
    );
}

/// With no backend in rotation, an upload on its way is answered 503 at once: the proxy read
/// the whole body first (an `Expect: 100-continue` client was even asked for it), then refused.
#[tokio::test(start_paused = true)]
async fn with_no_backend_in_rotation_an_upload_is_refused_without_its_body() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&support::http1_route(&backend), "hc_interval: 60").await;
    backend.stop();
    // Three failed connects take it out of rotation (passive health).
    for _ in 0..3 {
        let mut client = support::Client::connect(support::Proto::H1, proxy.addr).await;
        assert_eq!(client.get("a", "/").await.status(), 502);
    }
    let mut upload = TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\nConnection: close\r\n\r\n";
    upload.write_all(head.as_bytes()).await.unwrap();
    upload.write_all(b"0123456789").await.unwrap();
    let mut answer = String::new();
    let read = tokio::time::timeout(Duration::from_secs(5), upload.read_to_string(&mut answer));
    assert!(read.await.is_ok(), "no answer before the rest of the body");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
}

/// A proxy with `client_header_timeout: 3` and its access log in a file (the file's directory
/// kept with the access log's path).
async fn with_a_3s_head_timeout_and_access_log() -> (Proxy, Backend, AccessLogAt) {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let main = format!(
        "client_header_timeout: 3\naccess_log: all\nlog_file: \"{}\"",
        access.display()
    );
    let proxy = Proxy::start(&support::default_route(&[&backend]), &main).await;
    (
        proxy,
        backend,
        AccessLogAt {
            path: access,
            _dir: dir,
        },
    )
}

/// Where a test's access log is written, and the directory that holds it (kept for as long).
struct AccessLogAt {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl AccessLogAt {
    /// Its lines with `status=<status>`, once `proxy` has flushed it.
    fn lines_with_status(&self, proxy: &Proxy, status: u16) -> (usize, String) {
        proxy.ctx.access_log.flush();
        let lines = std::fs::read_to_string(&self.path).unwrap_or_default();
        let needle = format!(" status={status} ");
        (lines.lines().filter(|l| l.contains(&needle)).count(), lines)
    }
}

/// A connection closed at `client_header_timeout` with part of a request head sent (slowloris)
/// is said at info with the client's address, and gets the access log's 408 line, as nginx
/// logs it; one that sent nothing, or a keep-alive one left waiting after its request, closes
/// as quietly as before. Both closed with no trace at all.
#[tokio::test(start_paused = true)]
async fn a_request_head_cut_short_is_logged_as_a_408() {
    let (proxy, _backend, access) = with_a_3s_head_timeout_and_access_log().await;
    let mut partial = TcpStream::connect(proxy.addr).await.unwrap();
    partial.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    let _silent = TcpStream::connect(proxy.addr).await.unwrap();
    let mut served = support::Client::connect(support::Proto::H1, proxy.addr).await;
    assert_eq!(served.get("any", "/").await.status(), 200);
    proxy.pass(Duration::from_secs(5)).await;
    let mut byte = [0u8; 1];
    let closed = inproc::in_real_time(Duration::from_secs(5), partial.read(&mut byte)).await;
    assert!(matches!(closed, Some(Ok(0))), "{closed:?}");
    let (timed_out, lines) = access.lines_with_status(&proxy, 408);
    assert_eq!(timed_out, 1, "{lines}");
    let said = "no whole request head within 3s (client_header_timeout)";
    assert_eq!(proxy.log_count(said), 1, "{}", proxy.log_text());
}

/// A slowloris of many connections is said once a second, with how many went unsaid, not a
/// line a connection; the access log keeps a 408 for each.
#[tokio::test(start_paused = true)]
async fn many_request_heads_cut_short_are_said_once_a_second() {
    let (proxy, _backend, access) = with_a_3s_head_timeout_and_access_log().await;
    let partial = || async {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        s
    };
    let mut burst = Vec::new();
    for _ in 0..5 {
        burst.push(partial().await);
    }
    proxy.pass(Duration::from_secs(4)).await;
    let mut late = partial().await;
    proxy.pass(Duration::from_secs(4)).await;
    let mut byte = [0u8; 1];
    let closed = inproc::in_real_time(Duration::from_secs(5), late.read(&mut byte)).await;
    assert!(matches!(closed, Some(Ok(0))), "{closed:?}");
    let (timed_out, lines) = access.lines_with_status(&proxy, 408);
    assert_eq!(timed_out, 6, "{lines}");
    let said = "no whole request head within 3s (client_header_timeout); closed";
    assert_eq!(proxy.log_count(said), 2, "{}", proxy.log_text());
    let told = "closed (4 more since the last report)";
    assert_eq!(proxy.log_count(told), 1, "{}", proxy.log_text());
    drop(burst);
}
