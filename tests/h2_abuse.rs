//! HTTP/2 abuse, written frame by frame (no client library would send these), against the
//! in-process proxy: the abusive connection is refused (GOAWAY or closed) and a normal client is
//! served meanwhile. Part of issue 13's judges: rapid reset (CVE-2023-44487) and CONTINUATION
//! flood (CVE-2024-27316 family), PING flood and SETTINGS flood (CVE-2019-9512, -9515). The
//! zero-window case is in `hardening.rs`. And what an upload may hold in the proxy: the flow-control
//! windows it is granted.

use crate::inproc;
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use inproc::Proxy;
use support::frame::*;
use support::{default_route, h2_frame, Backend, Client, Proto};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET http://a/` in HPACK from the static table (`:method GET`, `:scheme http`, `:path /`)
/// and a literal `:authority a`.
fn get_block() -> Vec<u8> {
    vec![0x82, 0x86, 0x84, 0x41, 0x01, b'a']
}

/// `POST http://a/echo`: `:method POST` and `:scheme http` from the static table, literal
/// `:path /echo` and `:authority a`.
fn post_echo_block() -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x44, 0x05];
    block.extend_from_slice(b"/echo");
    block.extend_from_slice(&[0x41, 0x01, b'a']);
    block
}

/// Writes `bytes` and reads everything the proxy sends back until it closes or `limit` passes;
/// whether a GOAWAY came, and whether the connection was closed.
async fn outcome(mut s: TcpStream, limit: Duration) -> (bool, bool) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let closed = loop {
        match tokio::time::timeout(limit, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (has_frame(&got, GOAWAY), closed)
}

/// Whether a frame of `kind` is among the frames in `bytes` (which follow no preface).
fn has_frame(bytes: &[u8], kind: u8) -> bool {
    frames(bytes).iter().any(|f| f.kind == kind)
}

/// The value of setting `id` in a SETTINGS frame's payload.
fn setting(payload: &[u8], id: u16) -> Option<u32> {
    payload.chunks_exact(6).find_map(|entry| {
        (u16::from_be_bytes([entry[0], entry[1]]) == id)
            .then(|| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
    })
}

async fn opened(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&h2_frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s
}

async fn a_normal_client_is_served(addr: SocketAddr) {
    let mut c = Client::connect(Proto::H2c, addr).await;
    assert_eq!(c.get("a", "/").await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn rapid_reset_is_refused() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let mut s = opened(proxy.addr).await;
    let mut burst = Vec::new();
    for i in 0..5_000u32 {
        let stream = 2 * i + 1;
        burst.extend(h2_frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            stream,
            &get_block(),
        ));
        burst.extend(h2_frame(RST_STREAM, 0, stream, &8u32.to_be_bytes()));
    }
    // The proxy may close before taking it all.
    let _ = s.write_all(&burst).await;
    let (goaway, closed) = outcome(s, Duration::from_secs(10)).await;
    assert!(
        goaway || closed,
        "5,000 opened-and-reset streams were taken quietly"
    );
    a_normal_client_is_served(proxy.addr).await;
    assert!(
        backend.requests() < 5_000,
        "{} reset requests reached the backend",
        backend.requests()
    );
}

#[tokio::test(start_paused = true)]
async fn continuation_flood_is_refused() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let mut s = opened(proxy.addr).await;
    // A header block that never ends: HEADERS without END_HEADERS, then CONTINUATION frames of
    // literal headers, far past max_request_header_bytes (64 KiB).
    let _ = s
        .write_all(&h2_frame(HEADERS, END_STREAM, 1, &get_block()))
        .await;
    let mut literal = vec![0x40, 0x04, b'x', b'-', b'a', b'b', 0x7f, 0x81, 0x07];
    literal.extend(std::iter::repeat_n(b'v', 1024 - 9));
    let mut flood = Vec::new();
    for _ in 0..1_000 {
        flood.extend(h2_frame(CONTINUATION, 0, 1, &literal));
    }
    let _ = s.write_all(&flood).await;
    let (goaway, closed) = outcome(s, Duration::from_secs(10)).await;
    assert!(
        goaway || closed,
        "1 MiB of CONTINUATION frames was taken quietly"
    );
    assert_eq!(
        backend.requests(),
        0,
        "the endless header block reached the backend"
    );
    a_normal_client_is_served(proxy.addr).await;
}

/// Sends `count` copies of one frame while reading what comes back (a flooder that reads its
/// answers, so the proxy is never slowed by a full socket); whether the proxy closed or
/// GOAWAYed the connection before it was all sent and answered.
async fn flood_is_refused(addr: SocketAddr, one: Vec<u8>, count: usize) -> bool {
    let s = opened(addr).await;
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let batch: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * 1_000)
            .collect();
        for _ in 0..count / 1_000 {
            if wr.write_all(&batch).await.is_err() {
                return;
            }
        }
        // Keep the connection open: only the proxy may end it.
        std::future::pending::<()>().await;
        drop(wr);
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let refused = loop {
        match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break has_frame(&got, GOAWAY),
        }
    };
    writer.abort();
    refused
}

#[tokio::test(start_paused = true)]
async fn ping_flood_is_refused() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let ping = h2_frame(PING, 0, 0, b"12345678");
    assert!(
        flood_is_refused(proxy.addr, ping, 100_000).await,
        "100,000 PINGs were all answered"
    );
    a_normal_client_is_served(proxy.addr).await;
}

#[tokio::test(start_paused = true)]
async fn settings_flood_is_refused() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    // SETTINGS_INITIAL_WINDOW_SIZE = 65535, over and over.
    let settings = h2_frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
    assert!(
        flood_is_refused(proxy.addr, settings, 100_000).await,
        "100,000 SETTINGS frames were all acknowledged"
    );
    a_normal_client_is_served(proxy.addr).await;
}

/// Reads what the proxy sends (into `got`) until its frames satisfy `enough`, and returns them.
/// Fails if the proxy closes, refuses a stream or the connection, or stops for 30 s.
async fn read_until(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    got: &mut Vec<u8>,
    enough: impl Fn(&[Frame]) -> bool,
) -> Vec<Frame> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await;
        let n = read.expect("the proxy stopped sending").unwrap();
        let kinds = |bytes: &[u8]| frames(bytes).iter().map(|f| f.kind).collect::<Vec<_>>();
        assert!(
            n > 0,
            "the proxy closed the connection after frames {:?}",
            kinds(got)
        );
        got.extend_from_slice(&buf[..n]);
        let sent = frames(got);
        let refused = sent
            .iter()
            .any(|f| f.kind == GOAWAY || f.kind == RST_STREAM);
        assert!(
            !refused,
            "the proxy refused the upload (a flow-control error?)"
        );
        if enough(&sent) {
            return sent;
        }
    }
}

/// What one HTTP/2 stream, and one connection, may send ahead of the backend's reading.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

#[tokio::test(start_paused = true)]
async fn an_upload_is_granted_fixed_flow_control_windows() {
    // What a client sends ahead of the backend's reading is what the proxy holds for it: 1 MiB a
    // stream and 16 MiB a connection, announced at once and never grown. (hyper's adaptive
    // windows started at 64 KiB, then grew to 16 MiB a stream, measured with PINGs as data came.)
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let (mut rd, mut wr) = TcpStream::connect(proxy.addr).await.unwrap().into_split();
    let mut hello = PREFACE.to_vec();
    // Room for the echo to come back whole: 16 MiB for the stream and for the connection.
    hello.extend(h2_frame(SETTINGS, 0, 0, &[0, 4, 0x01, 0, 0, 0]));
    hello.extend(h2_frame(
        WINDOW_UPDATE,
        0,
        0,
        &CONNECTION_WINDOW.to_be_bytes(),
    ));
    wr.write_all(&hello).await.unwrap();
    let mut got = Vec::new();
    let is_settings = |f: &Frame| f.kind == SETTINGS && f.flags & ACK == 0;
    let is_connection_update = |f: &Frame| f.kind == WINDOW_UPDATE && f.stream == 0;
    let opening = read_until(&mut rd, &mut got, |sent| {
        sent.iter().any(is_settings) && sent.iter().any(is_connection_update)
    })
    .await;
    let settings = opening.iter().find(|f| is_settings(f)).unwrap();
    assert_eq!(setting(&settings.payload, 0x4), Some(STREAM_WINDOW));
    let update = opening.iter().find(|f| is_connection_update(f)).unwrap();
    let increment = u32::from_be_bytes(update.payload[..4].try_into().unwrap());
    assert_eq!(
        65_535 + increment,
        CONNECTION_WINDOW,
        "the connection's window"
    );

    let writer = tokio::spawn(async move {
        let mut out = h2_frame(SETTINGS, ACK, 0, &[]);
        out.extend(h2_frame(HEADERS, END_HEADERS, 1, &post_echo_block()));
        // A whole stream window at once.
        let chunk = vec![b'x'; 16_384];
        let chunks = STREAM_WINDOW as usize / chunk.len();
        for i in 1..=chunks {
            let flags = if i == chunks { END_STREAM } else { 0 };
            out.extend(h2_frame(DATA, flags, 1, &chunk));
        }
        wr.write_all(&out).await.unwrap();
        // Keep the connection open: only the proxy may end it.
        std::future::pending::<()>().await;
        drop(wr);
    });
    let sent = read_until(&mut rd, &mut got, |sent| {
        sent.iter()
            .any(|f| f.kind == DATA && f.stream == 1 && f.flags & END_STREAM != 0)
    })
    .await;
    writer.abort();
    assert!(
        !sent.iter().any(|f| f.kind == PING),
        "the proxy measured the upload with PINGs"
    );
    let echoed: usize = sent
        .iter()
        .filter(|f| f.kind == DATA && f.stream == 1)
        .map(|f| f.payload.len())
        .sum();
    assert_eq!(echoed, STREAM_WINDOW as usize, "the backend's echo");
}

/// An idle HTTP/2 connection asked to close (GOAWAY and a PING) is closed even when its client
/// never answers the PING: such a connection was held for good, so a client could take every
/// place up to `max_connections` and keep it.
#[tokio::test(start_paused = true)]
async fn an_idle_connection_that_never_answers_the_goaway_ping_is_closed() {
    let backend = Backend::start("b").await;
    let main = "client_idle_timeout: 10\nclient_header_timeout: 5";
    let proxy = Proxy::start(&default_route(&[&backend]), main).await;
    let mut s = opened(proxy.addr).await;
    s.write_all(&h2_frame(SETTINGS, ACK, 0, &[])).await.unwrap();
    let get = h2_frame(HEADERS, END_HEADERS | END_STREAM, 1, &get_block());
    s.write_all(&get).await.unwrap();
    // Everything the proxy sends is read (the answer, GOAWAY, its PING); nothing is answered.
    let (goaway, closed) = outcome(s, Duration::from_secs(30)).await;
    assert!(goaway);
    assert!(closed, "still open 30 s after the GOAWAY");
    a_normal_client_is_served(proxy.addr).await;
}

/// RFC 9113 §8.3.1: `:path` starts with `/`, or is `*` for OPTIONS. A GET for `*` or `?x`
/// reached HTTP/1.1 backends as `GET * HTTP/1.1` and `GET ?x HTTP/1.1`, request lines an
/// HTTP/1.1 client cannot send through (they are 400s there). A 400 now.
#[tokio::test(start_paused = true)]
async fn a_path_that_is_not_one_is_a_400() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    // `:method` GET (2) or OPTIONS (literal), `:scheme` http, `:path` literal, `:authority` a;
    // answers `:status` 400 and 200 are static-table entries 12 and 8.
    let options = [0x02, 0x07, b'O', b'P', b'T', b'I', b'O', b'N', b'S'];
    for (method, path, status) in [
        (&[0x82][..], "*", 0x8c),
        (&[0x82][..], "?x", 0x8c),
        (&[0x82][..], "/x", 0x88),
        (&options[..], "*", 0x88),
    ] {
        let s = opened(proxy.addr).await;
        let (mut rd, mut wr) = s.into_split();
        let mut block = method.to_vec();
        block.extend([0x86, 0x04, path.len() as u8]);
        block.extend(path.as_bytes());
        block.extend([0x01, 0x01, b'a']);
        let request = h2_frame(HEADERS, END_HEADERS | END_STREAM, 1, &block);
        wr.write_all(&request).await.unwrap();
        let answer = |f: &Frame| f.kind == HEADERS && f.stream == 1;
        let sent = read_until(&mut rd, &mut Vec::new(), |fs| fs.iter().any(answer)).await;
        let head = sent.iter().find(|f| answer(f)).unwrap();
        assert_eq!(
            head.payload.first(),
            Some(&status),
            "{path}: {:?}",
            head.payload
        );
    }
}

/// RFC 9113 §8.1: trailers carry no pseudo-header field. One (`:path /admin` among the
/// request's trailers) was dropped without a word and the rest passed on; the stream is reset
/// with PROTOCOL_ERROR now, and the connection serves on.
#[tokio::test(start_paused = true)]
async fn request_trailers_with_a_pseudo_header_field_reset_the_stream() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let s = opened(proxy.addr).await;
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(&h2_frame(HEADERS, END_HEADERS, 1, &post_echo_block()))
        .await
        .unwrap();
    wr.write_all(&h2_frame(DATA, 0, 1, b"abc")).await.unwrap();
    // `:path /admin` (its name from the static table), then `x-t: 1`, both literals.
    let mut trailers = vec![0x04, 0x06];
    trailers.extend_from_slice(b"/admin");
    trailers.extend_from_slice(&[0x00, 0x03, b'x', b'-', b't', 0x01, b'1']);
    let end = END_HEADERS | END_STREAM;
    wr.write_all(&h2_frame(HEADERS, end, 1, &trailers))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let reset = loop {
        let read = tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await;
        let n = read.expect("the proxy stopped sending").unwrap();
        assert!(n > 0, "the proxy closed the connection");
        got.extend_from_slice(&buf[..n]);
        let sent = frames(&got);
        if let Some(f) = sent.iter().find(|f| f.kind == RST_STREAM && f.stream == 1) {
            break f.payload.clone();
        }
        assert!(!has_frame(&got, GOAWAY), "a GOAWAY, not a stream reset");
    };
    assert_eq!(reset, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
    a_normal_client_is_served(proxy.addr).await;
}
