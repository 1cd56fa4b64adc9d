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

/// A request body that stops coming, the backend waiting for the rest, is the client's stall:
/// a 408 and the connection closed (nginx's `client_body_timeout`), not the 504 that blamed the
/// backend for it. Over aralez's HTTP/1.1 client.
#[tokio::test(start_paused = true)]
async fn a_request_body_that_stops_coming_is_a_408_not_the_backends_504() {
    let head = "POST /collect HTTP/1.1\r\nHost: any\r\nContent-Length: 100\r\n\r\n0123456789";
    let (_backend, _proxy, mut stream) = upload_started(head).await;
    let mut answer = String::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut answer));
    assert!(read.await.is_ok(), "the connection stayed open: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Closed with the answer, and saying so (it stayed open for the idle timeout, and served
    // what came late as a request).
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{answer}"
    );
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
