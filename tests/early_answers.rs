//! Backends that answer before the request is whole, or answer one request badly: the client
//! gets what the backend said, and one bad answer costs the other requests nothing.

use crate::support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;
use tokio::io::AsyncWriteExt;

/// A raw HTTP/1.1 backend: for each request head it reads, `answer(path)` says what to write
/// back and whether to close right after (without reading any body). It reads nothing until a
/// blank line, as many small servers do: a TLS ClientHello gets no answer (it has none).
async fn raw_backend(answer: fn(&str) -> (&'static [u8], bool)) -> std::net::SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                        seen.drain(..end + 4);
                        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                        let (bytes, close) = answer(&path);
                        if stream.write_all(bytes).await.is_err() || close {
                            return;
                        }
                    }
                    if !support::scripted::read_more(&mut stream, &mut seen).await {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A backend that answers every request 413 at once and closes, its body unread.
async fn refusing_backend() -> std::net::SocketAddr {
    raw_backend(|_| {
        let refusal: &[u8] =
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large";
        (refusal, true)
    })
    .await
}

/// A chunked upload that is never finished: 256 KiB, then nothing more. Its answer always comes
/// before the proxy has read it whole (a 4 MiB body could be read whole first, into the
/// kernel's buffers, and then the connection need not close: the test failed 1 time in 4).
fn unfinished_body() -> ClientBody {
    let sent = futures_util::stream::iter((0..4).map(|_| {
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(bytes::Bytes::from(
            vec![b'x'; 64 * 1024],
        )))
    }));
    let body = futures_util::StreamExt::chain(sent, futures_util::stream::pending());
    http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(body))
}

/// POSTs `body` to `host`'s `/upload` over a new HTTP/1.1 connection: the answer, within 10 s.
async fn upload(
    proxy: &ProxyProcess,
    host: &str,
    body: ClientBody,
) -> hyper::Response<hyper::body::Incoming> {
    upload_on(Client::connect(Proto::H1, proxy.addr).await, host, body).await
}

/// [`upload`] on `client`'s connection.
async fn upload_on(
    mut client: Client,
    host: &str,
    body: ClientBody,
) -> hyper::Response<hyper::body::Incoming> {
    let sent = client.send(http::Method::POST, Some(host), "/upload", &[], body);
    tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .expect("an answer in time")
}

fn route_to(backend: String) -> String {
    Upstreams::new()
        .host(
            "x.test",
            Host::new().path("/", Path::addrs(&[backend]).healthcheck(false)),
        )
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_an_upload_early_is_heard_not_a_502() {
    // The answer, then the connection closed with the body unread: the proxy's next writes
    // meet a reset.
    let backend = refusing_backend().await;
    let proxy = ProxyProcess::start(&route_to(format!("http://{backend}")), "");
    let body = Bytes::from(vec![b'x'; 8 << 20]);
    for round in 0..5 {
        let resp = upload(&proxy, "x.test", full(body.clone())).await;
        assert_eq!(resp.status(), 413, "round {round}: {}", proxy.log_text());
        assert_eq!(&body_bytes(resp).await[..], b"too large");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_malformed_answer_does_not_hold_up_the_next_requests() {
    // Two Content-Lengths that disagree on /bad; a plain answer elsewhere. No scheme: the
    // backend's protocol is detected, and this one sits on a TLS ClientHello (2 s probe).
    let backend = raw_backend(|path| {
        let bad: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok!";
        let good: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        (if path == "/bad" { bad } else { good }, false)
    })
    .await;
    let proxy = ProxyProcess::start(&route_to(backend.to_string()), "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let first = client.get("x.test", "/").await;
    assert_eq!(first.status(), 200, "{}", proxy.log_text());
    body_bytes(first).await;
    for _ in 0..2 {
        let bad = client.get("x.test", "/bad").await;
        assert_eq!(bad.status(), 502);
        body_bytes(bad).await;
        let started = Instant::now();
        let next = client.get("x.test", "/").await;
        assert_eq!(next.status(), 200);
        body_bytes(next).await;
        assert!(
            started.elapsed() < Duration::from_millis(1000),
            "the next request took {:?}: {}",
            started.elapsed(),
            proxy.log_text()
        );
    }
    assert!(
        !proxy.log_text().contains("detected again"),
        "{}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_a_chunked_upload_is_read_reaches_the_client() {
    // A chunked upload (no Content-Length) is served by hyper's side: answered before its body
    // is in, by the backend (413) or by the proxy itself (401), the connection must end with a
    // lingering close, or the client, still sending, meets a reset that loses the answer.
    let backend = refusing_backend().await;
    let to_backend = || Path::addrs(&[format!("http://{backend}")]).healthcheck(false);
    let basic = to_backend().authorization_data("basic", "ann:pa:ss");
    let upstreams = Upstreams::new()
        .host("x.test", Host::new().path("/", to_backend()))
        .host("auth.test", Host::new().path("/", basic))
        .render();
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "test", &["x.test", "auth.test"]);
    let tls_listener = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&upstreams, &tls_listener);
    let tls = proxy.logged_addr("listening on https://");
    let tls_config = tls_client_config(&[root], &[b"http/1.1"]);
    for (host, status) in [("auth.test", 401), ("x.test", 413)] {
        for round in 0..8 {
            let client = match round % 2 {
                0 => Client::connect(Proto::H1, proxy.addr).await,
                _ => Client::connect_tls(tls, host, tls_config.clone()).await,
            };
            let resp = upload_on(client, host, unfinished_body()).await;
            assert_eq!(
                resp.status(),
                status,
                "{host} round {round}: {}",
                proxy.log_text()
            );
            // The connection ends after it, and says so.
            assert_eq!(header(&resp, "connection"), "close", "{host} round {round}");
            body_bytes(resp).await;
        }
    }
    // HTTP/1.0 asking to keep the connection, refused before its body is read: told to close.
    let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST /upload HTTP/1.0\r\nhost: auth.test\r\nconnection: keep-alive\r\ncontent-length: 65536\r\n\r\n";
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(&[b'x'; 1000]).await.unwrap();
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(support::scripted::read_more(&mut raw, &mut seen).await);
    }
    let answer = String::from_utf8_lossy(&seen).into_owned();
    assert!(answer.starts_with("HTTP/1.0 401"), "{answer}");
    let answer = answer.to_ascii_lowercase();
    assert!(
        answer.contains("connection: close") && !answer.contains("keep-alive"),
        "{answer}"
    );
}
