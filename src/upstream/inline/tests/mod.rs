//! Inline exchanges against real sockets: a backend on 127.0.0.1 that answers each request
//! head with scripted bytes, sometimes one byte per write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

mod uploads;

type Nothing = http_body_util::Empty<Bytes>;

/// The pool of the tests: connections that went home.
#[derive(Clone, Default)]
#[allow(clippy::vec_box)] // the pool's own shape: connections travel boxed
struct Kept(Arc<Mutex<Vec<Box<InlineConn>>>>);

impl Home for Kept {
    fn keep(self, conn: Box<InlineConn>) {
        self.0.lock().unwrap().push(conn);
    }
}

impl InlineConn {
    async fn send_bodiless(
        self: Box<Self>,
        head: &Parts,
        home: Kept,
    ) -> Result<Response<InlineBody<Kept, Nothing>>, SendFailure<Nothing>> {
        self.send((head, None), Nothing::new(), BodyLength::Known(0), home)
            .await
    }
}

impl Kept {
    fn take(&self) -> Option<Box<InlineConn>> {
        self.0.lock().unwrap().pop()
    }
}

/// How the backend writes each answer.
#[derive(Clone, Copy, PartialEq)]
enum Pace {
    Whole,
    ByteByByte,
    /// Answers as soon as it has the head, then reads (and drops) all until the close.
    EarlyThenLinger,
    /// Waits this long after each head, then writes the answer whole.
    After(Duration),
}

/// The `content-length` of a request head (0 without one).
fn declared_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// A backend that, for each request head it reads, writes the next answer; it closes the
/// connection after the last one. The request heads it read come back at the end.
async fn backend(
    answers: Vec<&'static [u8]>,
    pace: Pace,
) -> (TcpStream, tokio::task::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut heads = Vec::new();
        for answer in answers {
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                if sock.read(&mut byte).await.unwrap() == 0 {
                    return heads;
                }
                head.push(byte[0]);
            }
            let mut head = String::from_utf8(head).unwrap();
            if pace != Pace::EarlyThenLinger {
                let mut body = vec![0u8; declared_length(&head)];
                sock.read_exact(&mut body).await.unwrap();
                head.push_str(std::str::from_utf8(&body).unwrap());
            }
            heads.push(head);
            match pace {
                Pace::Whole => sock.write_all(answer).await.unwrap(),
                Pace::After(delay) => {
                    tokio::time::sleep(delay).await;
                    sock.write_all(answer).await.unwrap();
                }
                Pace::EarlyThenLinger => {
                    sock.write_all(answer).await.unwrap();
                    let mut rest = Vec::new();
                    let _ = sock.read_to_end(&mut rest).await;
                }
                Pace::ByteByByte => {
                    for b in answer {
                        sock.write_all(&[*b]).await.unwrap();
                        sock.flush().await.unwrap();
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
        heads
    });
    (TcpStream::connect(addr).await.unwrap(), served)
}

fn get(path: &str) -> Parts {
    request(Method::GET, path)
}

fn request(method: Method, path: &str) -> Parts {
    let (parts, ()) = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "backend.test")
        .body(())
        .unwrap()
        .into_parts();
    parts
}

/// Sends `head` on a new connection to a backend with `answers`; the body collected.
async fn exchange(
    head: Parts,
    answers: Vec<&'static [u8]>,
    pace: Pace,
) -> (
    Result<(http::response::Parts, http_body_util::Collected<Bytes>), InlineError>,
    Kept,
) {
    let (sock, _served) = backend(answers, pace).await;
    let kept = Kept::default();
    let conn = InlineConn::new(sock, None);
    let resp = match conn.send_bodiless(&head, kept.clone()).await {
        Ok(resp) => resp,
        Err(failure) => return (Err(failure.error), kept),
    };
    let (parts, body) = resp.into_parts();
    (body.collect().await.map(|c| (parts, c)), kept)
}

#[tokio::test]
async fn a_content_length_body_is_read_and_the_connection_reused() {
    let answers: Vec<&[u8]> = vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nno!",
    ];
    let (sock, served) = backend(answers, Pace::Whole).await;
    let kept = Kept::default();
    let resp = InlineConn::new(sock, None)
        .send_bodiless(&get("/a?b=c"), kept.clone())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let values: Vec<_> = resp.headers().get_all("x-a").iter().collect();
    assert_eq!(values, ["1", "2"]);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    let mut conn = kept.take().expect("the connection went home");
    assert!(conn.is_reusable_now());
    let resp = conn
        .send_bodiless(&request(Method::POST, "/up"), kept.clone())
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"no!");
    let heads = served.await.unwrap();
    assert_eq!(
        heads[0],
        "GET /a?b=c HTTP/1.1\r\nhost: backend.test\r\n\r\n"
    );
    assert_eq!(
        heads[1],
        "POST /up HTTP/1.1\r\nhost: backend.test\r\ncontent-length: 0\r\n\r\n"
    );
}

#[tokio::test]
async fn chunks_and_trailers_arrive_one_byte_at_a_time() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Sum: 12\r\n\r\n";
    let (got, kept) = exchange(get("/"), vec![answer], Pace::ByteByByte).await;
    let (parts, collected) = got.unwrap();
    assert_eq!(parts.status, 200);
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["x-sum"], "12");
    assert_eq!(&collected.to_bytes()[..], b"hello, world");
    assert!(
        kept.take().is_some(),
        "a complete chunked body leaves the connection reusable"
    );
}

#[tokio::test]
async fn chunked_without_trailers_and_a_split_head() {
    let answer: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (got, kept) = exchange(get("/"), vec![answer], Pace::ByteByByte).await;
    let (_, collected) = got.unwrap();
    assert!(collected.trailers().is_none());
    assert_eq!(&collected.to_bytes()[..], b"abc");
    assert!(kept.take().is_some());
}

#[tokio::test]
async fn a_body_without_length_runs_to_the_close_and_the_connection_is_not_kept() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nuntil the end";
    let (got, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
    assert_eq!(&got.unwrap().1.to_bytes()[..], b"until the end");
    assert!(kept.take().is_none());
}

#[tokio::test]
async fn bodiless_answers_end_at_once_and_go_home() {
    let cases: [(Method, &'static [u8]); 3] = [
        (
            Method::HEAD,
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        ),
        (Method::GET, b"HTTP/1.1 204 No Content\r\n\r\n"),
        (
            Method::GET,
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        ),
    ];
    for (method, answer) in cases {
        let (sock, _served) = backend(vec![answer], Pace::Whole).await;
        let kept = Kept::default();
        let resp = InlineConn::new(sock, None)
            .send_bodiless(&request(method.clone(), "/"), kept.clone())
            .await
            .unwrap();
        assert!(resp.body().is_end_stream(), "{method}: no body to read");
        assert!(
            kept.take().is_some(),
            "{method}: home before the body is polled"
        );
    }
}

#[tokio::test]
async fn informational_answers_are_skipped() {
    let answer: &[u8] =
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
        HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok";
    let (got, _) = exchange(get("/"), vec![answer], Pace::Whole).await;
    let (parts, body) = got.unwrap();
    assert_eq!(parts.status, 201);
    assert!(parts.headers.get("link").is_none());
    assert_eq!(&body.to_bytes()[..], b"ok");
}

#[tokio::test]
async fn both_lengths_decode_as_chunked_and_close_the_connection() {
    let answer: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
        2\r\nok\r\n0\r\n\r\n";
    let (got, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
    assert_eq!(&got.unwrap().1.to_bytes()[..], b"ok");
    assert!(kept.take().is_none());
}

#[tokio::test]
async fn connection_close_and_http_1_0_are_not_kept() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx"[..],
        &b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx"[..],
    ] {
        let (got, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
        assert_eq!(&got.unwrap().1.to_bytes()[..], b"x");
        assert!(kept.take().is_none());
    }
    let answer = &b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx"[..];
    let (_, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
    assert!(kept.take().is_some());
}

#[tokio::test]
async fn bytes_past_the_response_make_the_connection_unfit() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n\r\n";
    let (got, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
    assert_eq!(&got.unwrap().1.to_bytes()[..], b"x");
    assert!(kept.take().is_none());
}

#[tokio::test]
async fn invalid_heads_are_bad_responses() {
    let mut too_large = b"HTTP/1.1 200 OK\r\n".to_vec();
    while too_large.len() <= MAX_HEAD {
        too_large.extend_from_slice(b"X-Filler: 0123456789012345678901234567890123456789\r\n");
    }
    let too_large: &'static [u8] = too_large.leak();
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for _ in 0..=MAX_HEADERS {
        many.extend_from_slice(b"X-F: 1\r\n");
    }
    many.extend_from_slice(b"\r\n");
    let many: &'static [u8] = many.leak();
    let cases: [&'static [u8]; 9] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        // A transfer coding that is not decoded would reach the client unlabelled.
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        too_large,
        many,
    ];
    for answer in cases {
        let (got, _) = exchange(get("/"), vec![answer], Pace::Whole).await;
        match got {
            Err(e) => assert!(e.is_bad_response(), "{e}"),
            Ok((parts, _)) => panic!("accepted {:?}", parts.status),
        }
    }
}

#[tokio::test]
async fn broken_bodies_are_errors_and_the_connection_is_dropped() {
    let cases: [&'static [u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
    ];
    for answer in cases {
        let (got, kept) = exchange(get("/"), vec![answer], Pace::Whole).await;
        assert!(got.is_err(), "{}", String::from_utf8_lossy(answer));
        assert!(kept.take().is_none());
    }
}

#[tokio::test]
async fn a_backend_that_closes_without_answering() {
    let (got, _) = exchange(get("/"), vec![b""], Pace::Whole).await;
    assert!(matches!(got, Err(InlineError::ClosedEarly)), "{got:?}");
    let (got, _) = exchange(get("/"), vec![b"HTTP/1.1 200 OK\r\n"], Pace::Whole).await;
    assert!(matches!(got, Err(InlineError::ClosedMidway)), "{got:?}");
}

#[tokio::test]
async fn an_idle_connection_the_backend_closed_is_not_reused() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let (sock, served) = backend(vec![answer], Pace::Whole).await;
    let kept = Kept::default();
    let resp = InlineConn::new(sock, None)
        .send_bodiless(&get("/"), kept.clone())
        .await
        .unwrap();
    drop(resp);
    served.await.unwrap(); // the backend has closed its end
    let mut conn = kept.take().expect("home after a complete response");
    let noticed = tokio::time::timeout(Duration::from_secs(5), async {
        while conn.is_reusable_now() {
            tokio::task::yield_now().await;
        }
    });
    assert!(noticed.await.is_ok(), "the close was never noticed");
}

#[tokio::test]
async fn a_large_body_arrives_whole_and_the_reads_grow() {
    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n".to_vec();
    answer.extend((0..1_048_576u32).map(|i| (i % 251) as u8));
    let answer: &'static [u8] = answer.leak();
    let (sock, _served) = backend(vec![answer], Pace::Whole).await;
    let kept = Kept::default();
    let resp = InlineConn::new(sock, None)
        .send_bodiless(&get("/big"), kept.clone())
        .await
        .unwrap();
    let mut body = resp.into_body();
    let (mut total, mut largest) = (0usize, 0usize);
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        assert!(data
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((total + i) % 251) as u8));
        total += data.len();
        largest = largest.max(data.len());
    }
    assert_eq!(total, 1_048_576);
    assert!(largest > READ_ROOM, "reads stayed at {largest} bytes");
    let conn = kept.take().expect("home");
    assert!(conn.buf.capacity() <= MAX_IDLE_BUFFER);
}

#[tokio::test(start_paused = true)]
async fn each_exchange_has_its_own_response_deadline_on_a_kept_connection() {
    let (second, answer_after) = (Duration::from_secs(1), Duration::from_millis(600));
    let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (sock, _served) = backend(vec![ok, ok, ok], Pace::After(answer_after)).await;
    let kept = Kept::default();
    let mut conn = InlineConn::new(sock, None);
    conn.respond_within(second);
    let resp = conn.send_bodiless(&get("/1"), kept.clone()).await.unwrap();
    resp.into_body().collect().await.unwrap();
    // Idle well past the first exchange's deadline: the next one starts its own.
    tokio::time::sleep(5 * second).await;
    let conn = kept.take().expect("kept");
    let resp = conn.send_bodiless(&get("/2"), kept.clone()).await;
    let resp = resp
        .map_err(|f| f.error)
        .expect("answered within its second");
    resp.into_body().collect().await.unwrap();
    // A shorter limit for the next exchange is its deadline.
    let mut conn = kept.take().expect("kept");
    let limit = answer_after - Duration::from_millis(100);
    conn.respond_within(limit);
    let start = tokio::time::Instant::now();
    let failed = conn.send_bodiless(&get("/3"), kept.clone()).await;
    assert!(matches!(
        failed,
        Err(SendFailure {
            error: InlineError::TimedOut,
            ..
        })
    ));
    assert_eq!(
        start.elapsed(),
        limit,
        "the deadline is the limit after the start"
    );
}
