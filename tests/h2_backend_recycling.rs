//! HTTP/2 backends that recycle their connections (RFC 9113 §8.7): a stream the backend never
//! processed, refused with REFUSED_STREAM or left above a GOAWAY's last stream id, is sent
//! again, whatever its method, with its body; a request that reached the backend is never sent
//! twice. Through the binary, with backends that refuse and recycle on purpose and record every
//! request they answered: one on the h2 crate's server, and one writing frames itself, which
//! sends a GOAWAY as soon as a connection had its share of streams, with later ones in flight.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::join_all;
use h2::Reason;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the recycling backend does.
#[derive(Clone, Copy)]
struct Recycling {
    /// Shut a connection down gracefully (GOAWAY) after this many requests on it; 0: never.
    per_connection: usize,
    /// Refuse the first stream of every request path with REFUSED_STREAM.
    refuse_each_once: bool,
    /// Reset every stream with INTERNAL_ERROR once its request is in (processed, then failed).
    fail_each: bool,
    /// Refuse every stream with REFUSED_STREAM (a backend shedding load).
    refuse_all: bool,
}

impl Recycling {
    fn refusing_each_once() -> Recycling {
        Recycling {
            per_connection: 0,
            refuse_each_once: true,
            fail_each: false,
            refuse_all: false,
        }
    }

    fn shutting_down_after(per_connection: usize) -> Recycling {
        Recycling {
            per_connection,
            refuse_each_once: false,
            fail_each: false,
            refuse_all: false,
        }
    }
}

/// The backend's record: each answered request as "METHOD path body", connections accepted,
/// streams refused.
#[derive(Default)]
struct Record {
    answered: Mutex<Vec<String>>,
    refused_paths: Mutex<HashSet<String>>,
    connections: AtomicUsize,
    refused: AtomicUsize,
}

async fn start_recycling_backend(how: Recycling) -> (std::net::SocketAddr, Arc<Record>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let record = Arc::new(Record::default());
    let shared = record.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            shared.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_connection(socket, how, shared.clone()));
        }
    });
    (addr, record)
}

async fn serve_connection(socket: TcpStream, how: Recycling, record: Arc<Record>) {
    let Ok(mut conn) = h2::server::handshake(socket).await else {
        return;
    };
    let mut streams = 0;
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        streams += 1;
        let path = req.uri().path().to_owned();
        let first_time = lock(&record.refused_paths).insert(path);
        if how.fail_each {
            record.refused.fetch_add(1, Ordering::SeqCst);
            respond.send_reset(Reason::INTERNAL_ERROR);
        } else if how.refuse_all || (how.refuse_each_once && first_time) {
            record.refused.fetch_add(1, Ordering::SeqCst);
            respond.send_reset(Reason::REFUSED_STREAM);
        } else {
            tokio::spawn(answer(req, respond, record.clone()));
        }
        if streams == how.per_connection {
            conn.graceful_shutdown();
        }
    }
}

async fn answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    record: Arc<Record>,
) {
    let seen = format!("{} {}", req.method(), req.uri().path());
    let mut body = req.into_body();
    let mut got = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    lock(&record.answered).push(format!("{seen} {}", String::from_utf8_lossy(&got)));
    let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
        return;
    };
    let _ = send.send_data(Bytes::from_static(b"ok"), true);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `clients` HTTP/1.1 clients each send `each` requests, GETs and POSTs by turns, every one on
/// its own path (a POST's body names it too). Returns what each request was and its status.
async fn mixed_load(proxy: &ProxyProcess, clients: usize, each: usize) -> Vec<(String, u16)> {
    let runs = (0..clients).map(|c| async move {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let mut out = Vec::new();
        for i in 0..each {
            let path = format!("/c{c}/r{i}");
            let (method, body) = if i % 2 == 0 {
                (http::Method::GET, String::new())
            } else {
                (http::Method::POST, format!("body of {path}"))
            };
            let resp = client
                .send(
                    method.clone(),
                    Some("h2.local"),
                    &path,
                    &[],
                    full(body.clone()),
                )
                .await;
            let status = resp.status().as_u16();
            body_bytes(resp).await;
            out.push((format!("{method} {path} {body}"), status));
        }
        out
    });
    join_all(runs).await.into_iter().flatten().collect()
}

fn proxy_for(backend: std::net::SocketAddr) -> ProxyProcess {
    let server = format!("h2c://{backend}");
    let route = Path::addrs(&[server]).healthcheck(false);
    let yaml = Upstreams::new()
        .host("h2.local", Host::new().path("/", route))
        .render();
    ProxyProcess::start(&yaml, "")
}

/// Every request answered 200, and the backend answered each exactly once.
fn assert_each_answered_once(sent: &[(String, u16)], record: &Record) {
    let failed: Vec<_> = sent.iter().filter(|(_, s)| *s != 200).collect();
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    let mut times: HashMap<&str, usize> = HashMap::new();
    let answered = lock(&record.answered);
    for seen in answered.iter() {
        *times.entry(seen.as_str()).or_default() += 1;
    }
    for (request, _) in sent {
        assert_eq!(times.get(request.as_str()), Some(&1), "{request}");
    }
    assert_eq!(answered.len(), sent.len());
}

/// `clients` x `each` requests of [`mixed_load`] through the proxy to a backend that recycles
/// as `how` says; each must be answered 200, and by the backend once.
async fn recycled_run(how: Recycling, clients: usize, each: usize) -> (usize, Arc<Record>) {
    let (backend, record) = start_recycling_backend(how).await;
    let proxy = proxy_for(backend);
    let sent = mixed_load(&proxy, clients, each).await;
    assert_each_answered_once(&sent, &record);
    (sent.len(), record)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_are_sent_again_with_their_bodies() {
    let (sent, record) = recycled_run(Recycling::refusing_each_once(), 4, 10).await;
    assert_eq!(record.refused.load(Ordering::SeqCst), sent);
}

/// A stream the backend reset with INTERNAL_ERROR on a connection that lives on reached it:
/// a 502, not the same request sent to the same backend again as if the connection had been
/// stale (SPEC §5: at most one try a backend). It was sent twice when the connection was reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_backend_resets_is_not_sent_to_it_again() {
    let how = Recycling {
        per_connection: 0,
        refuse_each_once: false,
        fail_each: true,
        refuse_all: false,
    };
    let (backend, record) = start_recycling_backend(how).await;
    let proxy = proxy_for(backend);
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for round in 1..=3 {
        let resp = client.get("h2.local", "/reset").await;
        assert_eq!(resp.status(), 502, "round {round}");
        body_bytes(resp).await;
        assert_eq!(
            record.refused.load(Ordering::SeqCst),
            round,
            "tries by round {round}"
        );
    }
    assert_eq!(
        record.connections.load(Ordering::SeqCst),
        1,
        "the connection lived on"
    );
}

/// A backend that refuses every stream (shedding load) gets a request 1 + 3 resends times, not
/// twice that as if its connection had been stale (a bodyless request went through the resends
/// twice); the request then goes to the next backend (a POST with its body too, in HTTP/1.1 form
/// to an HTTP/1.1 backend), or gets the 502 when there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_refusing_every_stream_gets_a_request_four_times_then_the_next_backend_does() {
    let how = Recycling {
        refuse_all: true,
        ..Recycling::shutting_down_after(0)
    };
    let (shedding, refused) = start_recycling_backend(how).await;
    let proxy = proxy_for(shedding);
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("h2.local", "/get").await;
    assert_eq!(resp.status(), 502);
    body_bytes(resp).await;
    assert_eq!(refused.refused.load(Ordering::SeqCst), 4, "sends of a GET");
    let resp = client
        .send(
            http::Method::POST,
            Some("h2.local"),
            "/post",
            &[],
            full("up"),
        )
        .await;
    assert_eq!(resp.status(), 502);
    body_bytes(resp).await;
    assert_eq!(refused.refused.load(Ordering::SeqCst), 8, "and of a POST");
    drop(proxy);

    let (answering, answered) = start_recycling_backend(Recycling::shutting_down_after(0)).await;
    let servers = [format!("h2c://{shedding}"), format!("h2c://{answering}")];
    let yaml = Upstreams::new()
        .host(
            "h2.local",
            Host::new().path("/", Path::addrs(&servers).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for i in 0..4 {
        let resp = client.get("h2.local", &format!("/next/{i}")).await;
        assert_eq!(resp.status(), 200, "request {i}");
        body_bytes(resp).await;
    }
    assert_eq!(lock(&answered.answered).len(), 4);
    let sends = refused.refused.load(Ordering::SeqCst) - 8;
    assert!(
        sends > 0 && sends % 4 == 0,
        "{sends} sends to the shedding backend"
    );
    drop(proxy);

    // Round robin: one of two POSTs in a row is sent to the shedding backend first.
    let plain = Backend::builder("plain").h1_only().start().await;
    let servers = [format!("h2c://{shedding}"), plain.addr.to_string()];
    let yaml = Upstreams::new()
        .host(
            "h2.local",
            Host::new().path("/", Path::addrs(&servers).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let before = refused.refused.load(Ordering::SeqCst);
    for i in 0..2 {
        let target = format!("/echo/{i}?q=1");
        let resp = client
            .send(
                http::Method::POST,
                Some("h2.local"),
                &target,
                &[],
                full("up"),
            )
            .await;
        assert_eq!(resp.status(), 200, "POST {i}");
        assert_eq!(resp.headers()["x-backend"], "plain");
        assert_eq!(resp.headers()["x-seen-host"], "h2.local");
        assert_eq!(resp.headers()["x-seen-target"], target.as_str());
        assert_eq!(resp.headers()["x-seen-version"], "HTTP/1.1");
        assert_eq!(body_bytes(resp).await, "up");
    }
    let sends = refused.refused.load(Ordering::SeqCst) - before;
    assert_eq!(
        sends, 4,
        "sends of the POST that went to the shedding backend first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_backend_shuts_down_lose_no_request() {
    let (sent, record) = recycled_run(Recycling::shutting_down_after(5), 8, 30).await;
    // 240 requests, 5 a connection: the proxy did move on to new connections.
    assert!(record.connections.load(Ordering::SeqCst) >= sent / 5 / 2);
}

/// A backend of raw HTTP/2 frames: on each of its first `recycled` connections, once a stream
/// beyond the first `per_connection` has begun (or the client has gone quiet for 100 ms), it
/// sends a GOAWAY naming the last of those, answers the streams up to it and ignores those
/// above (it answers none before); then it closes the connection. Later connections answer every stream (so a request is refused
/// `recycled` times at most, within the proxy's resends). It records the body of each stream
/// it answered, and counts the streams it ignored.
async fn start_goaway_backend(
    per_connection: usize,
    recycled: usize,
) -> (std::net::SocketAddr, Arc<Record>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let record = Arc::new(Record::default());
    let shared = record.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let n = shared.connections.fetch_add(1, Ordering::SeqCst);
            let limit = (n < recycled).then_some(per_connection);
            tokio::spawn(serve_raw(socket, limit, shared.clone()));
        }
    });
    (addr, record)
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 1;
const ACK: u8 = 1;
const END_HEADERS: u8 = 4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

async fn read_frame(socket: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    socket.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    socket.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], stream, payload))
}

/// One connection of [`start_goaway_backend`]; `per_connection`: `None` never recycles.
async fn serve_raw(mut socket: TcpStream, per_connection: Option<usize>, record: Arc<Record>) {
    let mut preface = [0u8; 24];
    if socket.read_exact(&mut preface).await.is_err() {
        return;
    }
    let _ = socket.write_all(&frame(SETTINGS, 0, 0, &[])).await;
    let mut begun: Vec<u32> = Vec::new();
    let mut last: Option<u32> = None;
    // Streams whose request has ended, with their bodies; and those still coming in.
    let mut bodies: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut ended: Vec<u32> = Vec::new();
    let mut ignored: HashSet<u32> = HashSet::new();
    let mut goaway_sent = false;
    loop {
        let quiet = std::time::Duration::from_millis(100);
        let next = tokio::time::timeout(quiet, read_frame(&mut socket)).await;
        let mut out = Vec::new();
        match next {
            Ok(None) => return,
            Err(_) if last.is_none() && !begun.is_empty() && per_connection.is_some() => {
                last = bodies.keys().chain(&ended).max().copied();
            }
            Err(_) => {}
            Ok(Some((kind, flags, stream, payload))) => match kind {
                SETTINGS if flags & ACK == 0 => out.extend(frame(SETTINGS, ACK, 0, &[])),
                PING if flags & ACK == 0 => out.extend(frame(PING, ACK, 0, &payload)),
                HEADERS | DATA if last.is_some_and(|l| stream > l) => {
                    ignored.insert(stream);
                }
                HEADERS => {
                    begun.push(stream);
                    bodies.insert(stream, Vec::new());
                    if flags & END_STREAM != 0 {
                        ended.push(stream);
                    }
                    if let Some(n) = per_connection.filter(|n| begun.len() == n + 1) {
                        last = Some(begun[n - 1]);
                        for above in &begun[n..] {
                            bodies.remove(above);
                            ended.retain(|e| e != above);
                            ignored.insert(*above);
                        }
                    }
                }
                DATA => {
                    bodies.entry(stream).or_default().extend(&payload);
                    if flags & END_STREAM != 0 {
                        ended.push(stream);
                    }
                }
                _ => {}
            },
        }
        let Some(last) = last.or(per_connection.is_none().then_some(u32::MAX)) else {
            continue;
        };
        if !goaway_sent && last != u32::MAX {
            goaway_sent = true;
            let mut goaway = last.to_be_bytes().to_vec();
            goaway.extend(0u32.to_be_bytes());
            out.extend(frame(GOAWAY, 0, 0, &goaway));
        }
        for stream in ended.drain(..) {
            let body = bodies.remove(&stream).unwrap_or_default();
            lock(&record.answered).push(String::from_utf8_lossy(&body).into_owned());
            // `:status: 200` is entry 8 of HPACK's static table.
            out.extend(frame(HEADERS, END_HEADERS, stream, &[0x88]));
            out.extend(frame(DATA, END_STREAM, stream, b"ok"));
        }
        if socket.write_all(&out).await.is_err() {
            return;
        }
        if last != u32::MAX && bodies.keys().all(|s| *s > last) {
            record.refused.fetch_add(ignored.len(), Ordering::SeqCst);
            // A lingering close, as servers do: closed with unread bytes, the connection would
            // be reset, and the answers just written lost with it.
            let _ = socket.shutdown().await;
            let mut rest = [0u8; 4096];
            let linger = std::time::Duration::from_secs(2);
            let _ = tokio::time::timeout(linger, async {
                while socket.read(&mut rest).await.is_ok_and(|n| n > 0) {}
            })
            .await;
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_above_a_goaways_last_stream_are_sent_again() {
    let (backend, record) = start_goaway_backend(2, 2).await;
    let proxy = proxy_for(backend);
    let runs = (0..16).map(|c| {
        let proxy = &proxy;
        async move {
            let mut client = Client::connect(Proto::H1, proxy.addr).await;
            let mut out = Vec::new();
            for i in 0..12 {
                let body = format!("c{c} r{i}");
                let resp = client
                    .send(
                        http::Method::POST,
                        Some("h2.local"),
                        "/",
                        &[],
                        full(body.clone()),
                    )
                    .await;
                out.push((body, resp.status().as_u16()));
                body_bytes(resp).await;
            }
            out
        }
    });
    let sent: Vec<(String, u16)> = join_all(runs).await.into_iter().flatten().collect();
    assert_each_answered_once(&sent, &record);
    // Streams did go above a GOAWAY's last stream id, and were sent again.
    assert!(record.refused.load(Ordering::SeqCst) > 0);
}
