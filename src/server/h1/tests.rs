//! The own HTTP/1.1 side over an in-memory pipe: keep-alive and pipelining, the framing of
//! each kind of body, HEAD and 204, request bodies (read, dropped, cut), and what it hands to
//! hyper, byte for byte.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::{Connection, H1Error, Handoff, Refusal};
use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;

/// An in-memory stream ends as any: its shutdown is what the client side sees.
impl super::Socket for DuplexStream {}

type TestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
type Answer = Pin<Box<dyn Future<Output = Result<Response<TestBody>, Infallible>> + Send>>;

/// Answers `/` with `hello`, `/chunks` with two frames of unknown length, `/big` with one
/// 20,000-byte frame of unknown length, `/sized` with one 100,000-byte frame of known length,
/// `/empty` with 204; each says which path it served.
fn answer(req: Request<ClientBody>) -> Answer {
    Box::pin(async move {
        let path = req.uri().path().to_owned();
        let body: TestBody = match path.as_str() {
            "/chunks" => {
                let frames = ["hello", " world"].map(|s| Ok(Frame::data(Bytes::from(s))));
                StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
            }
            "/big" => {
                let frame = Ok(Frame::data(Bytes::from(vec![b'x'; 20_000])));
                StreamBody::new(futures_util::stream::iter([frame])).boxed_unsync()
            }
            "/sized" => Full::new(Bytes::from(vec![b'y'; 100_000]))
                .map_err(|e| match e {})
                .boxed_unsync(),
            _ => Full::new(Bytes::from("hello"))
                .map_err(|e| match e {})
                .boxed_unsync(),
        };
        let mut resp = Response::new(body);
        if path == "/empty" {
            *resp.status_mut() = StatusCode::NO_CONTENT;
        }
        resp.headers_mut().insert("x-path", path.parse().unwrap());
        Ok(resp)
    })
}

type Served = Result<Option<Handoff<DuplexStream>>, H1Error>;

/// Serves one end of a pipe in a task; the test talks through the other.
fn serve() -> (DuplexStream, tokio::task::JoinHandle<Served>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = Connection::new(server, service_fn(answer), BytesMut::new());
    (client, tokio::spawn(conn))
}

/// Sends `requests`, then reads everything until the server closes.
async fn exchange(requests: &str) -> (String, Served) {
    let (mut client, served) = serve();
    client.write_all(requests.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    let served = served.await.unwrap();
    (String::from_utf8_lossy(&got).into_owned(), served)
}

/// The response text without its `date` line, which changes every second.
fn without_date(text: &str) -> String {
    text.split("\r\n")
        .filter(|line| !line.starts_with("date: "))
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let requests =
        "GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let (text, served) = exchange(requests).await;
    assert!(matches!(served, Ok(None)), "{served:?}");
    let one = "HTTP/1.1 200 OK\r\nx-path: /a\r\ncontent-length: 5\r\n\r\nhello";
    // The last answer says the connection closes after it.
    let two =
        "HTTP/1.1 200 OK\r\nx-path: /b\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
    assert_eq!(without_date(&text), format!("{one}{two}"));
    assert_eq!(text.matches("\r\ndate: ").count(), 2, "{text}");
}

#[tokio::test]
async fn a_body_of_unknown_length_is_chunked() {
    let (text, _) = exchange("GET /chunks HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    let want = "HTTP/1.1 200 OK\r\nx-path: /chunks\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    assert_eq!(without_date(&text), want);
}

#[tokio::test]
async fn a_large_chunk_goes_out_whole_with_its_framing() {
    let (text, _) = exchange("GET /big HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(body, format!("4e20\r\n{}\r\n0\r\n\r\n", "x".repeat(20_000)));
}

#[tokio::test]
async fn a_large_last_piece_goes_out_whole_on_a_closing_connection() {
    // More than the pipe takes at once: the head and part of the piece go in the first write,
    // the rest of the piece alone in the next ones.
    let (text, served) = exchange("GET /sized HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    assert!(matches!(served, Ok(None)), "{served:?}");
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("content-length: 100000"), "{head}");
    assert_eq!(body.len(), 100_000);
}

#[tokio::test]
async fn head_and_no_content_answers_carry_no_body() {
    let requests = "HEAD / HTTP/1.1\r\n\r\nGET /empty HTTP/1.1\r\nconnection: close\r\n\r\n";
    let (text, _) = exchange(requests).await;
    // The length a GET would get, and no body.
    let head = "HTTP/1.1 200 OK\r\nx-path: /\r\ncontent-length: 5\r\n\r\n";
    let empty = "HTTP/1.1 204 No Content\r\nx-path: /empty\r\nconnection: close\r\n\r\n";
    assert_eq!(without_date(&text), format!("{head}{empty}"));
}

/// What is handed over, and when: everything from the first head hyper must read, unread.
#[tokio::test]
async fn unusual_requests_go_to_hyper_with_every_byte_unread() {
    let unusual = [
        "GET / HTTP/1.0\r\n\r\n",
        "CONNECT x:443 HTTP/1.1\r\nhost: x:443\r\n\r\n",
        "GET / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        "GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        "PUT / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\ncontent-length: +0\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET / HTTP/1.1\r\nbad header: x\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\n\r\n",
    ];
    for request in unusual {
        let (mut client, served) = serve();
        let first = "GET /first HTTP/1.1\r\n\r\n";
        client.write_all(first.as_bytes()).await.unwrap();
        client.write_all(request.as_bytes()).await.unwrap();
        let handoff = match served.await.unwrap() {
            Ok(Some(handoff)) => handoff,
            other => panic!("{request:?} was not handed over: {other:?}"),
        };
        assert_eq!(handoff.read, request.as_bytes(), "{request:?}");
        assert_eq!(handoff.served, 1, "{request:?}");
        let mut answered = vec![0; 4096];
        let n = client.read(&mut answered).await.unwrap();
        let answered = String::from_utf8_lossy(&answered[..n]).into_owned();
        assert!(answered.contains("x-path: /first"), "{answered}");
    }
}

#[tokio::test]
async fn a_head_larger_than_the_buffer_goes_to_hyper() {
    let (mut client, served) = serve();
    let request = format!("GET / HTTP/1.1\r\nx-long: {}\r\n\r\n", "a".repeat(5000));
    client.write_all(request.as_bytes()).await.unwrap();
    let Ok(Some(mut handoff)) = served.await.unwrap() else {
        panic!("a long head was not handed over");
    };
    let mut rest = vec![0; request.len() - handoff.read.len()];
    handoff.io.read_exact(&mut rest).await.unwrap();
    let whole = [&handoff.read[..], &rest[..]].concat();
    assert_eq!(whole, request.as_bytes());
    assert_eq!(handoff.served, 0);
}

#[tokio::test]
async fn a_client_closing_mid_head_is_an_error_and_between_requests_is_not() {
    let (mut client, served) = serve();
    client.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
    client.shutdown().await.unwrap();
    assert!(matches!(
        served.await.unwrap(),
        Err(H1Error::IncompleteHead)
    ));

    let (client, served) = serve();
    drop(client);
    assert!(matches!(served.await.unwrap(), Ok(None)));
}

#[tokio::test]
async fn shutting_down_closes_an_idle_connection() {
    use super::super::idle::Graceful;
    let (_client, server) = tokio::io::duplex(1024);
    let mut conn = Box::pin(Connection::new(server, service_fn(answer), BytesMut::new()));
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(conn.as_mut().poll(&mut cx).is_pending(), "waits for a head");
    conn.as_mut().shut_down();
    assert!(matches!(
        conn.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Ok(None))
    ));
}

/// Answers with how many body bytes it read (`/ignore`: none, at once).
fn count_body(req: Request<ClientBody>) -> Answer {
    Box::pin(async move {
        let path = req.uri().path().to_owned();
        let text = if path == "/ignore" {
            "ignored".to_owned()
        } else {
            match req.into_body().collect().await {
                Ok(body) => format!("read {}", body.to_bytes().len()),
                Err(e) => format!("failed: {e}"),
            }
        };
        let body = Full::new(Bytes::from(text)).map_err(|e| match e {});
        Ok(Response::new(body.boxed_unsync()))
    })
}

/// Sends `pieces` (then closes its sending side, with `half_close`) while reading everything
/// the connection answers until it closes.
async fn talk(pieces: Vec<Vec<u8>>, half_close: bool) -> String {
    let (client, server) = tokio::io::duplex(8 * 1024);
    tokio::spawn(Connection::new(
        server,
        service_fn(count_body),
        BytesMut::new(),
    ));
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let sending = tokio::spawn(async move {
        for piece in pieces {
            if to_server.write_all(&piece).await.is_err() {
                break;
            }
        }
        if half_close {
            let _ = to_server.shutdown().await;
        }
        to_server
    });
    let mut got = Vec::new();
    let read = from_server.read_to_end(&mut got);
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    assert!(
        read.is_ok(),
        "the connection did not close: {:?}",
        String::from_utf8_lossy(&got)
    );
    drop(sending);
    without_date(&String::from_utf8_lossy(&got))
}

fn post(path: &str, length: usize) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\ncontent-length: {length}\r\n\r\n").into_bytes()
}

const LAST_GET: &[u8] = b"GET /last HTTP/1.1\r\nconnection: close\r\n\r\n";

fn answer_text(text: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
        text.len()
    )
}

#[tokio::test]
async fn a_body_of_declared_length_reaches_the_service_and_the_next_request_follows() {
    let body = vec![b'b'; 100_000];
    let got = talk(vec![post("/", body.len()), body, LAST_GET.to_vec()], false).await;
    assert_eq!(
        got,
        answer_text("read 100000") + &last_answer_text("read 0")
    );
}

#[tokio::test]
async fn a_body_the_answer_did_not_wait_for_is_dropped_before_the_next_request() {
    // The body looks like requests: were it read as such, more answers would come.
    let body = b"GET /x HTTP/1.1\r\n\r\n".repeat(2000);
    let got = talk(
        vec![post("/ignore", body.len()), body, LAST_GET.to_vec()],
        false,
    )
    .await;
    assert_eq!(got, answer_text("ignored") + &last_answer_text("read 0"));
}

#[tokio::test]
async fn a_body_over_the_discard_limit_closes_the_connection_after_the_answer() {
    let length = 2 * super::body::MAX_DISCARD as usize;
    let got = talk(vec![post("/ignore", length), vec![b'b'; 100_000]], false).await;
    assert_eq!(got, last_answer_text("ignored"));
}

#[tokio::test]
async fn a_client_closing_in_the_middle_of_a_body_cuts_it() {
    let got = talk(vec![post("/", 1000), vec![b'b'; 10]], true).await;
    assert!(
        got.contains("failed: the client closed in the middle of the body"),
        "{got}"
    );
}

/// An answer that says the connection closes after it.
fn last_answer_text(text: &str) -> String {
    let len = text.len();
    format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n{text}")
}

/// Answers when `release` fires; says on `dropped` if it is dropped before.
fn held_answer(
    release: tokio::sync::oneshot::Receiver<()>,
    dropped: tokio::sync::oneshot::Sender<()>,
) -> Answer {
    struct Tell(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for Tell {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let tell = Tell(Some(dropped));
    Box::pin(async move {
        let mut tell = tell;
        let _ = release.await;
        drop(tell.0.take());
        let body = Full::new(Bytes::from("late")).map_err(|e| match e {});
        Ok(Response::new(body.boxed_unsync()))
    })
}

/// The client's end, the connection, what releases its first answer, and what hears that the
/// answer was dropped instead.
type Held<S> = (
    DuplexStream,
    Pin<Box<Connection<DuplexStream, S>>>,
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
);

/// A connection whose first request's answer waits for the returned sender; the receiver
/// hears if that answer is dropped instead.
fn serve_held() -> Held<impl super::Serve> {
    let (release_tx, release_rx) = tokio::sync::oneshot::channel();
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
    let held = std::sync::Mutex::new(Some((release_rx, dropped_tx)));
    let service = service_fn(
        move |req: Request<ClientBody>| match held.lock().unwrap().take() {
            Some((release, dropped)) => held_answer(release, dropped),
            None => answer(req),
        },
    );
    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = Box::pin(Connection::new(server, service, BytesMut::new()));
    (client, conn, release_tx, dropped_rx)
}

#[tokio::test]
async fn a_watched_request_ends_when_its_client_leaves_and_not_when_it_pipelines() {
    use super::super::idle::Graceful;
    let noop = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&noop);

    // The client leaves: the answer is dropped and the connection ends.
    let (mut client, mut conn, _release, mut dropped) = serve_held();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(conn.as_mut().poll(&mut cx).is_pending(), "the answer waits");
    conn.as_mut().watch_client();
    drop(client);
    assert!(matches!(
        conn.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Ok(None))
    ));
    assert!(dropped.try_recv().is_ok(), "the answer was not dropped");

    // Unwatched (the timer has not seen it wait), a client that leaves is found at the write.
    let (mut client, mut conn, release, mut dropped) = serve_held();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(conn.as_mut().poll(&mut cx).is_pending());
    let (_, to_server) = tokio::io::split(client);
    drop(to_server);
    assert!(
        conn.as_mut().poll(&mut cx).is_pending(),
        "not watched: still waits"
    );
    assert!(dropped.try_recv().is_err());
    drop(release);

    // The client pipelines its next request meanwhile: both are answered, in order.
    let (mut client, mut conn, release, _dropped) = serve_held();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(conn.as_mut().poll(&mut cx).is_pending());
    conn.as_mut().watch_client();
    client
        .write_all(b"GET /next HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(
        conn.as_mut().poll(&mut cx).is_pending(),
        "pipelining is not leaving"
    );
    release.send(()).unwrap();
    let mut text = String::new();
    let (served, read) = tokio::join!(conn, client.read_to_string(&mut text));
    read.unwrap();
    assert!(matches!(served, Ok(None)));
    let bodies: Vec<&str> = text.split("\r\n\r\n").skip(1).collect();
    assert!(text.matches("HTTP/1.1 200 OK").count() == 2, "{text}");
    assert!(
        bodies[0].starts_with("late") && text.contains("x-path: /next"),
        "{text}"
    );
}

#[tokio::test]
async fn quotes_and_angle_brackets_in_a_target_are_encoded_not_refused() {
    // Not URI characters, but sent raw by clients and taken by nginx: they were a 400.
    let (text, served) =
        exchange("GET /q<1>?a=\"b\" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("x-path: /q%3C1%3E\r\n"), "{text}");
    assert!(
        matches!(served, Ok(None)),
        "served here, not handed to hyper"
    );
}

/// A request line longer than the head may be is answered 414 here (hyper answered it 431, as
/// a head of too many fields), and what the client still sends is read before the end; a head
/// whose request line ended goes to hyper as before, however long.
#[tokio::test]
async fn a_request_line_longer_than_the_head_limit_is_a_414() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let conn = Connection::new(server, service_fn(answer), BytesMut::new()).with_head_limit(8192);
    let served = tokio::spawn(conn);
    let line = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(20_000));
    client.write_all(line.as_bytes()).await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{text}");
    let served = served.await.unwrap();
    assert!(
        matches!(served, Err(H1Error::Refused(Refusal::TargetTooLong))),
        "{served:?}"
    );

    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = Connection::new(server, service_fn(answer), BytesMut::new()).with_head_limit(8192);
    let served = tokio::spawn(conn);
    let mut client = client;
    let head = format!(
        "GET /{} HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(100),
        "b".repeat(6_000)
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let served = served.await.unwrap();
    assert!(
        matches!(served, Ok(Some(_))),
        "a long head whose line ended goes to hyper: {served:?}"
    );
}

/// A `Content-Length` above 2^63 − 1 is answered 400 here and ends the connection, in a head
/// served here or one that would go to hyper (which answered 2^64 − 2 and 2^64 − 1 with 431 and
/// took the rest); the largest length a file can have is still taken.
#[tokio::test]
async fn a_content_length_above_2_63_is_a_400() {
    for (version, extra, length) in [
        ("1.1", "", "18446744073709551615"),
        ("1.1", "", "18446744073709551614"),
        ("1.1", "", "9223372036854775808"),
        ("1.1", "", "123456789012345678901234567890"),
        ("1.0", "", "18446744073709551615"),
        ("1.1", "expect: 100-continue\r\n", "18446744073709551615"),
    ] {
        let (mut client, served) = serve();
        let head = format!("POST / HTTP/{version}\r\n{extra}content-length: {length}\r\n\r\n");
        client.write_all(head.as_bytes()).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{head}: {text}"
        );
        let served = served.await.unwrap();
        assert!(
            matches!(
                served,
                Err(H1Error::Refused(Refusal::ContentLengthTooLarge))
            ),
            "{head}: {served:?}"
        );
    }
    let (mut client, _served) = serve();
    let head = "POST /len HTTP/1.1\r\ncontent-length: 9223372036854775807\r\n\r\nabc";
    client.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"hello") {
        let mut piece = [0u8; 1024];
        let n = client.read(&mut piece).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&piece[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("x-path: /len\r\n"), "{text}");
}

/// A request line of HTTP/1.2 (or 1.9) is read as HTTP/1.1 and served, as nginx and HAProxy
/// serve it (RFC 9110 §2.5); HTTP/2.0 or later in an HTTP/1 request line is nginx's 505. Both
/// were hyper's 400.
#[tokio::test]
async fn later_versions_are_served_as_http_1_1_or_refused_505() {
    let (text, served) = exchange("GET /v HTTP/1.2\r\nhost: x\r\nconnection: close\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("x-path: /v\r\n"), "{text}");
    assert!(matches!(served, Ok(None)), "served here: {served:?}");
    for line in ["GET / HTTP/2.0", "GET / HTTP/3.0"] {
        let (mut client, served) = serve();
        client
            .write_all(format!("{line}\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 505 "), "{line}: {text}");
        let served = served.await.unwrap();
        assert!(
            matches!(served, Err(H1Error::Refused(Refusal::VersionNotSupported))),
            "{served:?}"
        );
    }
    // HTTP/2's preface is not a later version: it goes to hyper.
    let (mut client, served) = serve();
    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let served = served.await.unwrap();
    assert!(matches!(served, Ok(Some(_))), "{served:?}");
}
