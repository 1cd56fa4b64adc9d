//! Uploads against real sockets: bodies of declared length or chunked, fed piece by piece by
//! the test, early answers and full duplex.

use bytes::Bytes;
use http::request::Parts;
use http::Method;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{backend, request, Kept, Pace};
use crate::upstream::inline::{BodyLength, InlineConn, InlineError};

/// More than this much body data is written from its own buffer, not copied.
const COALESCE_LIMIT_FOR_TESTS: usize = 16 * 1024;

/// A request body the test feeds piece by piece.
fn fed_body() -> (Sender<Fed>, FedBody) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    (
        tx,
        http_body_util::StreamBody::new(tokio_stream_like::Receiver(rx)),
    )
}

type Fed = Result<http_body::Frame<Bytes>, std::convert::Infallible>;
type Sender<T> = tokio::sync::mpsc::Sender<T>;
type FedBody = http_body_util::StreamBody<tokio_stream_like::Receiver<Fed>>;

/// `futures` Stream over a tokio channel (the tests' only need for one).
mod tokio_stream_like {
    #[derive(Debug)]
    pub struct Receiver<T>(pub tokio::sync::mpsc::Receiver<T>);

    impl<T> futures_util::Stream for Receiver<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
}

fn post(path: &str, length: usize) -> Parts {
    let mut head = request(Method::POST, path);
    head.headers.insert("content-length", length.into());
    head
}

#[tokio::test]
async fn a_body_goes_out_with_its_head_and_the_connection_is_reused() {
    let answer: &[u8] = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
    let (sock, served) = backend(vec![answer, answer], Pace::Whole).await;
    let kept = Kept::default();
    let body = http_body_util::Full::new(Bytes::from_static(b"{\"a\":1}"));
    let resp = InlineConn::new(sock, None)
        .send(
            (&post("/p", 7), None),
            body,
            BodyLength::Known(7),
            kept.clone(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    drop(resp);
    // A body fed in two pieces, the second after the head went out.
    let (tx, body) = fed_body();
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"abc"))))
        .await
        .unwrap();
    let conn = kept.take().expect("home after the first exchange");
    let sending = tokio::spawn(async move {
        let resp = conn
            .send(
                (&post("/q", 6), None),
                body,
                BodyLength::Known(6),
                kept.clone(),
            )
            .await;
        (
            resp.map(|r| r.status()).map_err(|f| f.error.to_string()),
            kept,
        )
    });
    tokio::task::yield_now().await;
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"def"))))
        .await
        .unwrap();
    let (status, kept) = sending.await.unwrap();
    assert_eq!(status.unwrap(), 201);
    drop(kept.take());
    let heads = served.await.unwrap();
    assert!(
        heads[0].ends_with("content-length: 7\r\n\r\n{\"a\":1}"),
        "{}",
        heads[0]
    );
    assert!(heads[1].ends_with("\r\n\r\nabcdef"), "{}", heads[1]);
}

#[tokio::test]
async fn a_backend_that_answers_before_the_body_ends_is_heard() {
    let answer: &[u8] = b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\n\r\nbig!";
    let (sock, _served) = backend(vec![answer], Pace::EarlyThenLinger).await;
    let kept = Kept::default();
    let (tx, body) = fed_body();
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"start"))))
        .await
        .unwrap();
    let resp = InlineConn::new(sock, None)
        .send(
            (&post("/upload", 1_000_000), None),
            body,
            BodyLength::Known(1_000_000),
            kept.clone(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&got[..], b"big!");
    assert!(
        kept.take().is_none(),
        "a connection with half a request on it is not kept"
    );
    drop(tx);
}

#[tokio::test]
async fn a_body_that_does_not_match_its_length_fails() {
    for (declared, sent) in [(10u64, &b"short"[..]), (2, &b"longer"[..])] {
        let (sock, _served) = backend(vec![b""], Pace::EarlyThenLinger).await;
        let body = http_body_util::Full::new(Bytes::from_static(sent));
        let got = InlineConn::new(sock, None)
            .send(
                (&post("/p", declared as usize), None),
                body,
                BodyLength::Known(declared),
                Kept::default(),
            )
            .await;
        match got {
            Err(f) => assert!(
                matches!(f.error, InlineError::RequestBody(_)),
                "{}",
                f.error
            ),
            Ok(r) => panic!("{declared} declared, {} sent: {:?}", sent.len(), r.status()),
        }
    }
}

#[tokio::test]
async fn a_body_of_unknown_length_goes_chunked_with_its_trailers() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        // Up to the end of the trailer section.
        while !got.ends_with(b"x-sum: 9\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(sock.read(&mut byte).await.unwrap(), 1);
            got.push(byte[0]);
        }
        sock.write_all(answer).await.unwrap();
        String::from_utf8(got).unwrap()
    });
    let sock = TcpStream::connect(addr).await.unwrap();
    let (tx, body) = fed_body();
    let big = Bytes::from(vec![b'z'; COALESCE_LIMIT_FOR_TESTS + 1]);
    for piece in [Bytes::from_static(b"abc"), Bytes::new(), big.clone()] {
        tx.send(Ok(http_body::Frame::data(piece))).await.unwrap();
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-sum", "9".parse().unwrap());
    tx.send(Ok(http_body::Frame::trailers(trailers)))
        .await
        .unwrap();
    drop(tx);
    let resp = InlineConn::new(sock, None)
        .send(
            (&request(Method::PUT, "/c"), None),
            body,
            BodyLength::Chunked,
            Kept::default(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = served.await.unwrap();
    let expected = format!(
        "PUT /c HTTP/1.1\r\nhost: backend.test\r\ntransfer-encoding: chunked\r\n\r\n\
         3\r\nabc\r\n{:x}\r\n{}\r\n0\r\nx-sum: 9\r\n\r\n",
        big.len(),
        "z".repeat(big.len())
    );
    assert!(got == expected, "{}", &got[..200.min(got.len())]);
}

#[tokio::test]
async fn an_echo_streams_back_while_the_body_goes_up() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Echoes each piece of a 9-byte body as a chunk as soon as it has it.
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            sock.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        sock.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let mut left = 9;
        while left > 0 {
            let mut piece = [0u8; 64];
            let n = sock.read(&mut piece).await.unwrap();
            assert!(n > 0, "the body stopped");
            left -= n;
            let chunk = format!("{n:x}\r\n{}\r\n", std::str::from_utf8(&piece[..n]).unwrap());
            sock.write_all(chunk.as_bytes()).await.unwrap();
        }
        sock.write_all(b"0\r\n\r\n").await.unwrap();
        let mut rest = Vec::new();
        let _ = sock.read_to_end(&mut rest).await;
    });
    let sock = TcpStream::connect(addr).await.unwrap();
    let (tx, body) = fed_body();
    let kept = Kept::default();
    let home = kept.clone();
    let sending = tokio::spawn(async move {
        let head = post("/echo", 9);
        InlineConn::new(sock, None)
            .send((&head, None), body, BodyLength::Known(9), home)
            .await
    });
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"one"))))
        .await
        .unwrap();
    let resp = sending.await.unwrap().map_err(|f| f.error).unwrap();
    let mut echo = resp.into_body();
    for (piece, next) in [("one", Some("two")), ("two", Some("333")), ("333", None)] {
        let got = echo.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&got[..], piece.as_bytes(), "the echo of {piece}");
        if let Some(next) = next {
            tx.send(Ok(http_body::Frame::data(Bytes::from_static(
                next.as_bytes(),
            ))))
            .await
            .unwrap();
        }
    }
    assert!(echo.frame().await.is_none());
    assert!(
        kept.take().is_some(),
        "the whole request went up: the connection is kept"
    );
}
