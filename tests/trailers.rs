//! Trailer sections crossing the proxy, both ways: a field that only a header section may carry
//! (framing, routing, authentication, what the proxy sets itself) or a hop-by-hop one never
//! crosses; the rest does. Request trailers reached the backend as the client wrote them, so a
//! backend merging trailers into the head took a client's `X-Forwarded-For` or `Host`; an answer's
//! `connection` trailer made h2 reset the whole answer to an HTTP/2 client.

use crate::support;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use support::scripted::{answers_to_every_client, read_more};
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Fields a client puts in its trailers to pass for the proxy's, or to reframe the request.
const UNFIT: [(&str, &str); 7] = [
    ("host", "evil.example"),
    ("x-forwarded-for", "6.6.6.6"),
    ("x-request-id", "forged"),
    ("authorization", "Basic Zm9v"),
    ("content-length", "99"),
    ("forwarded", "for=6.6.6.6"),
    ("x-forwarded-proto", "gopher"),
];

/// A backend that answers every chunked request with a 200 once its trailer section is in, and
/// sends that section (lowercased) to the test.
async fn trailer_recording_backend() -> (std::net::SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let (sections, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(record_trailers(stream, sections.clone()));
        }
    });
    (addr, received)
}

async fn record_trailers(mut stream: TcpStream, sections: mpsc::UnboundedSender<String>) {
    let mut seen = Vec::new();
    while read_more(&mut stream, &mut seen).await {
        let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
        let Some(last_chunk) = text.find("\r\n0\r\n").map(|at| at + 5) else {
            continue;
        };
        let Some(end) = text[last_chunk - 2..].find("\r\n\r\n") else {
            continue;
        };
        let _ = sections.send(text[last_chunk..last_chunk - 2 + end].to_string());
        seen.clear();
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

fn assert_only_fit(section: &str, what: &str) {
    assert!(section.contains("x-keep: yes"), "{what}: {section:?}");
    for (name, value) in UNFIT {
        assert!(
            !section.contains(name) && !section.contains(value),
            "{what}: {name} crossed: {section:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfit_request_trailers_never_reach_the_backend() {
    let (backend, mut sections) = trailer_recording_backend().await;
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path(
                "/",
                Path::addrs(&[format!("http://{backend}")]).healthcheck(false),
            ),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");

    let mut raw = String::from("POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n");
    raw.push_str("\r\n3\r\nabc\r\n0\r\nX-Keep: yes\r\nConnection: close\r\n");
    for (name, value) in UNFIT {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str("\r\n");
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    client.write_all(raw.as_bytes()).await.unwrap();
    let section = sections.recv().await.expect("a request at the backend");
    assert_only_fit(&section, "HTTP/1.1");

    let mut trailers = HeaderMap::new();
    trailers.insert("x-keep", "yes".parse().unwrap());
    for (name, value) in UNFIT {
        trailers.append(name, value.parse().unwrap());
    }
    let frames = [Frame::data(Bytes::from("abc")), Frame::trailers(trailers)];
    let body = StreamBody::new(stream::iter(frames.map(Ok))).boxed();
    let mut h2 = Client::connect(Proto::H2c, proxy.addr).await;
    let resp = h2.send(Method::POST, Some("a"), "/up", &[], body).await;
    assert_eq!(resp.status(), 200);
    let section = sections.recv().await.expect("a request at the backend");
    assert_only_fit(&section, "h2c");
}

/// An answer's trailers: `connection` and the rest of its kind go, `x-t` reaches HTTP/1.1 and
/// h2c clients, over aralez's HTTP/1.1 client (plain) and hyper's (TLS), whether the head
/// declared it in `Trailer` or not (an HTTP/2 backend's gRPC or checksum trailers come
/// undeclared, and only declared ones reached HTTP/1.1 clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfit_answer_trailers_go_and_the_answer_arrives_whole() {
    const DECLARED: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\
        Trailer: x-t, connection, content-length, set-cookie\r\n\r\n3\r\nabc\r\n0\r\n\
        connection: close\r\nkeep-alive: 5\r\ncontent-length: 99\r\nset-cookie: a=b\r\n\
        x-t: v\r\n\r\n";
    const UNDECLARED: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        3\r\nabc\r\n0\r\nconnection: close\r\nset-cookie: a=b\r\nx-t: v\r\n\r\n";
    let mut every = answers_to_every_client(DECLARED, &[("te", "trailers")]).await;
    every.extend(answers_to_every_client(UNDECLARED, &[("te", "trailers")]).await);
    for got in every {
        let what = &got.what;
        assert_eq!(got.head.status, 200, "{what}");
        let body = got
            .body
            .unwrap_or_else(|e| panic!("{what}: the answer broke: {e}"));
        let trailers = body.trailers().cloned().unwrap_or_default();
        assert_eq!(body.to_bytes(), "abc", "{what}");
        assert_eq!(
            trailers.get("x-t").map(|v| v.as_bytes()),
            Some(&b"v"[..]),
            "{what}"
        );
        for name in ["connection", "keep-alive", "content-length", "set-cookie"] {
            assert!(!trailers.contains_key(name), "{what}: {name} crossed");
        }
    }
}

/// A chunked request with trailers keeps its connection: the request pipelined behind it is
/// answered too. The trailers ended the body, but the body was not noted as read to its end,
/// so the answer said `connection: close` and the next request was dropped unanswered.
#[tokio::test]
async fn a_request_with_trailers_keeps_its_connection_for_the_next_one() {
    use tokio::io::AsyncReadExt;
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "");
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          3\r\nabc\r\n0\r\nX-Trailer: v\r\n\r\n\
          GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answers = Vec::new();
    let read = conn.read_to_end(&mut answers);
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("both answers, then the close the second asked for")
        .unwrap();
    let answers = String::from_utf8_lossy(&answers);
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    let first = answers.split("HTTP/1.1 200 OK").nth(1).unwrap_or_default();
    assert!(!first.contains("connection: close"), "{answers}");
}
