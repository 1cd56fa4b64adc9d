//! When a request takes a connection coming back rather than opening one, against a real
//! backend on 127.0.0.1 that counts its connections.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Empty};

use super::*;
use crate::config::values::parse_server;
use crate::upstream::backend::Registry;

/// How the backend's first exchange is paced: it says when it has read the first request, waits
/// for the test's go, answers, and says when the answer is written.
struct FirstExchange {
    got: tokio::sync::mpsc::UnboundedSender<()>,
    go: mpsc::Receiver<()>,
    answered: mpsc::Sender<()>,
}

/// A keep-alive backend answering `ok` to every request, counting the connections it accepts.
fn backend(first: Option<FirstExchange>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let mut first = first;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let first = first.take();
            std::thread::spawn(move || serve(stream, first));
        }
    });
    (addr, accepted)
}

fn serve(stream: TcpStream, mut first: Option<FirstExchange>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let mut line = String::new();
        // A request without a body: its head ends with an empty line.
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        if let Some(first) = &first {
            let _ = first.got.send(());
            let _ = first.go.recv();
        }
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
        if let Some(first) = first.take() {
            let _ = first.answered.send(());
        }
    }
}

/// One GET through the pool, its answer read to the end (which gives the connection back).
/// With `Expect` it goes through hyper's client instead of the inline one.
async fn get(x: Exchange<'_>, client: Client) -> Bytes {
    let mut req = Request::builder().uri("/").header(header::HOST, "backend");
    if client == Client::Hyper {
        req = req.header(header::EXPECT, "100-continue");
    }
    let req = req
        .body(Either::Right(Empty::<Bytes>::new()))
        .expect("request");
    let resp = send(x, req, false).await.expect("answer");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// Which of the pool's two HTTP/1.1 clients a request takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Client {
    Inline,
    Hyper,
}

#[tokio::test]
async fn a_request_finding_no_idle_connection_first_lets_an_answer_already_in_bring_one_back() {
    assert_eq!(connections_for_two_requests(Client::Inline).await, 1);
}

#[tokio::test]
async fn so_does_one_through_hyper_s_client() {
    assert_eq!(connections_for_two_requests(Client::Hyper).await, 1);
}

/// Two GETs, the second sent while the first one's answer is already in but not yet read: the
/// connections the backend accepted.
async fn connections_for_two_requests(client: Client) -> usize {
    let (got, mut got_first) = tokio::sync::mpsc::unbounded_channel();
    let (go, go_rx) = mpsc::channel();
    let (answered, answered_first) = mpsc::channel();
    let (addr, accepted) = backend(Some(FirstExchange {
        got,
        go: go_rx,
        answered,
    }));
    let registry = Registry::for_tests(1, Duration::from_secs(60));
    let backend = registry.backend(&parse_server(&addr.to_string()).expect("spec"), false);
    backend.set_detected(Wire::Http1);
    let x = Exchange {
        backend: &backend,
        worker: WorkerId(0),
        timeouts: Timeouts {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(5),
        },
        sni_from_request: false,
        deferred: None,
    };

    // The first request goes out on a new connection and waits for its answer.
    let mut first = pin!(get(x, client));
    tokio::select! {
        got = got_first.recv() => assert!(got.is_some(), "the backend stopped"),
        _ = &mut first => unreachable!("answered before the backend's go"),
    }
    // The answer arrives while this thread blocks, so the worker has not polled for it: a
    // second request now finds no idle connection while the first one's is about to come back.
    go.send(()).expect("go");
    answered_first.recv().expect("the backend answered");
    // In this order at every poll (tokio's `join!` takes turns).
    let (a, b) = futures_util::future::join(first, get(x, client)).await;

    assert_eq!((&a[..], &b[..]), (&b"ok"[..], &b"ok"[..]), "{client:?}");
    accepted.load(Ordering::SeqCst)
}

/// At the connection limit, another worker's idle plain connection is closed to make room:
/// each worker keeps its own idle ones, and another's made requests get 503 (`Capacity`)
/// while the backend idled.
#[tokio::test]
async fn another_workers_idle_connection_makes_room_under_the_limit() {
    let (addr, accepted) = backend(None);
    let registry = Registry::for_tests(2, Duration::from_secs(60)).with_max_connections(1);
    let backend = registry.backend(&parse_server(&addr.to_string()).expect("spec"), false);
    backend.set_detected(Wire::Http1);
    let on = |worker| Exchange {
        backend: &backend,
        worker: WorkerId(worker),
        timeouts: Timeouts {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(5),
        },
        sni_from_request: false,
        deferred: None,
    };
    assert_eq!(&get(on(0), Client::Inline).await[..], b"ok");
    assert_eq!(&get(on(1), Client::Inline).await[..], b"ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
