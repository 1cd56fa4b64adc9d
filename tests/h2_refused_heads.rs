//! HTTP/2 request heads that h2 refuses itself, before they become requests (vendor/h2's
//! `refusals`): one over the header list limit gets a 431, a malformed one (no `:path`, a
//! connection-specific field) a `RST_STREAM` with `PROTOCOL_ERROR`. They are logged and counted
//! as hyper's HTTP/1 refusals are (`method=- target=-`, method and version `OTHER`), over h2c and
//! over TLS. Before, they left no line and no count: a client whose every request was refused
//! looked like no client at all.

use crate::support;

use std::time::Duration;

use support::frame::*;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), the prefix's other bits `first`.
fn hpack_int(first: u8, n: u32, mut value: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

/// A literal field without indexing, its name literal too.
fn literal(name: &str, value: &str, out: &mut Vec<u8>) {
    coded_literal(0x00, name, value, out);
}

/// A literal field of the representation `first` says (RFC 7541 §6.2), its name literal too.
fn coded_literal(first: u8, name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(first);
    hpack_int(0, 7, name.len(), out);
    out.extend_from_slice(name.as_bytes());
    hpack_int(0, 7, value.len(), out);
    out.extend_from_slice(value.as_bytes());
}

/// `GET http://x.test/` (`:method GET`, `:scheme http`, `:path /` from the static table, a
/// literal `:authority`), then `extra`; without `:path` when `path` is false.
fn block(path: bool, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = vec![0x82, 0x86];
    if path {
        out.push(0x84);
    }
    out.extend_from_slice(&[0x41, 0x06]);
    out.extend_from_slice(b"x.test");
    for (name, value) in extra {
        literal(name, value, &mut out);
    }
    out
}

/// A whole request on `stream`: HEADERS, then CONTINUATIONs of at most 16 KiB each.
fn request(stream: u32, block: &[u8]) -> Vec<u8> {
    let mut pieces = block.chunks(16_384).peekable();
    let mut out = Vec::new();
    let mut kind = HEADERS;
    let mut flags = END_STREAM;
    while let Some(piece) = pieces.next() {
        let last = pieces.peek().is_none();
        let end = if last { END_HEADERS } else { 0 };
        out.extend(h2_frame(kind, flags | end, stream, piece));
        (kind, flags) = (CONTINUATION, 0);
    }
    out
}

/// Whether `fs` hold a `RST_STREAM` with PROTOCOL_ERROR on stream `id`.
fn reset_for_protocol_error(fs: &[Frame], id: u32) -> bool {
    fs.iter()
        .any(|f| f.kind == RST_STREAM && f.stream == id && f.payload == [0, 0, 0, 1])
}

/// Reads from `s` until the frames come that `done` waits for (10 s at most): the bytes read,
/// or which frames came before the connection ended or the time ran out.
async fn read_until<S: AsyncRead + Unpin>(
    s: &mut S,
    done: impl Fn(&[Frame]) -> bool,
) -> Result<Vec<u8>, String> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let came =
        |got: &[u8]| -> Vec<(u8, u32)> { frames(got).iter().map(|f| (f.kind, f.stream)).collect() };
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while !done(&frames(&got)) {
            let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("closed after {:?}", came(&got)));
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok(())
    });
    match read.await {
        Ok(Ok(())) => Ok(got),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(format!("no more within 10 s after {:?}", came(&got))),
    }
}

/// Sends the three refused requests (streams 1, 3, 5) and a good one (7) on one connection;
/// waits until each is answered: 431 on 1 (`:status` is a literal: not in the static table),
/// resets with PROTOCOL_ERROR on 3 and 5, a head on 7.
async fn refused_three<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let big = "y".repeat(70_000);
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&h2_frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s.write_all(&request(1, &block(true, &[("x-big", &big)])))
        .await
        .unwrap();
    s.write_all(&request(3, &block(false, &[]))).await.unwrap();
    s.write_all(&request(5, &block(true, &[("connection", "close")])))
        .await
        .unwrap();
    s.write_all(&request(7, &block(true, &[]))).await.unwrap();
    let head = |fs: &[Frame], id| fs.iter().any(|f| f.kind == HEADERS && f.stream == id);
    let done = |fs: &[Frame]| {
        let reset = |id| reset_for_protocol_error(fs, id);
        head(fs, 1) && reset(3) && reset(5) && head(fs, 7)
    };
    let got = read_until(&mut s, done)
        .await
        .expect("every stream answered");
    let fs = frames(&got);
    let head = fs
        .iter()
        .find(|f| f.kind == HEADERS && f.stream == 1)
        .unwrap();
    assert!(
        head.payload.windows(3).any(|w| w == b"431"),
        "a 431 on stream 1: {:?}",
        head.payload
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_h2_refuses_itself_are_logged_and_counted() {
    let backend = Backend::start("b").await;
    let certs = tempfile::tempdir().unwrap();
    let roots = [write_self_signed(certs.path(), "x", &["x.test"])];
    let main = format!(
        "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\naccess_log: all\n\
         proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&default_route(&[&backend]), &main);
    let admin = proxy.logged_addr("admin API on http://");
    let tls = proxy.logged_addr("listening on https://");
    refused_three(TcpStream::connect(proxy.addr).await.unwrap()).await;
    let name = rustls_pki_types::ServerName::try_from("x.test").unwrap();
    let config = tls_client_config(&roots, &[b"h2"]);
    let stream = TcpStream::connect(tls).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .expect("TLS handshake");
    refused_three(stream).await;
    let refused = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with("access ") && l.contains(" method=- target=- "))
            .map(|l| (l.contains(" tls=TLSv1.3 "), l.contains(" status=431 ")))
            .collect::<Vec<_>>()
    };
    let logged = eventually(Duration::from_secs(5), || {
        refused(&proxy.log_text()).len() >= 6
    });
    assert!(logged.await, "{}", proxy.log_text());
    let mut lines = refused(&proxy.log_text());
    lines.sort();
    let want = [(false, false), (false, false), (false, true)];
    let want: Vec<_> = want
        .iter()
        .chain(&want.map(|(_, big)| (true, big)))
        .copied()
        .collect();
    assert_eq!(
        lines,
        want,
        "(over TLS, 431) for each: {}",
        proxy.log_text()
    );
    for (status, count) in [("400", 4.0), ("431", 2.0), ("200", 2.0)] {
        let series = format!("aralez_responses_total{{status=\"{status}\"}}");
        assert_eq!(metric(admin, &series).await, Some(count), "{series}");
    }
    let other = "aralez_requests_total{method=\"OTHER\",version=\"OTHER\"}";
    assert_eq!(metric(admin, other).await, Some(6.0));
}

/// A literal field with incremental indexing (RFC 7541 §6.2.1), its name literal too.
fn indexed_literal(name: &str, value: &str, out: &mut Vec<u8>) {
    coded_literal(0x40, name, value, out);
}

/// `GET http://x.test{path}`, then the coded `fields`.
fn head_with(path: &str, fields: &[u8]) -> Vec<u8> {
    let mut out = vec![0x82, 0x86];
    literal(":path", path, &mut out);
    out.extend_from_slice(&[0x41, 0x06]);
    out.extend_from_slice(b"x.test");
    out.extend_from_slice(fields);
    out
}

/// A request with a field that is none (an upper-case name, a NUL in a value) is malformed:
/// its stream is reset (RFC 9113 §8.1.1), as nginx does, and the connection's other streams go
/// on. The connection was ended with a GOAWAY, and a request in flight on it was lost (and
/// logged 499). The dynamic table keeps a stand-in of the invalid field's size, so the indexes
/// the client uses afterwards still name what it inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_that_is_none_resets_its_stream_and_spares_the_others() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "access_log: all");
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&h2_frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let mut first = Vec::new();
    indexed_literal("x-first", "1", &mut first);
    let mut upper = Vec::new();
    indexed_literal("X-Upper", "1", &mut upper);
    let mut nul = Vec::new();
    literal("x-nul", "a\0b", &mut nul);
    // Each head inserts its `:authority` too. At stream 7's field, dynamic index 66 names
    // `x-first` only if the table kept a stand-in for `X-Upper` (without it, 66 is stream 1's
    // `:authority`, a second one in stream 7's head).
    let sent = [
        (1, head_with("/slow/300", &first)),
        (3, head_with("/", &upper)),
        (5, head_with("/", &nul)),
        (7, head_with("/", &[0x80 | 66])),
        // Index 65 is the stand-in by now (stream 9's `:authority` came first): a request that
        // refers to it is as malformed as stream 3 (it went out with a field `xxxxxxx: x`).
        (9, head_with("/", &[0x80 | 65])),
    ];
    for (stream, block) in &sent {
        s.write_all(&request(*stream, block)).await.unwrap();
    }
    let done = |fs: &[Frame]| {
        let reset = |id| reset_for_protocol_error(fs, id);
        let ended = |id| {
            fs.iter()
                .any(|f| f.kind == DATA && f.stream == id && f.flags & END_STREAM != 0)
        };
        ended(1) && reset(3) && reset(5) && ended(7) && reset(9)
    };
    let got = match read_until(&mut s, done).await {
        Ok(got) => got,
        Err(why) => panic!("not every stream answered: {why}\n{}", proxy.log_text()),
    };
    assert!(!frames(&got).iter().any(|f| f.kind == GOAWAY));
    let lost = eventually(Duration::from_millis(300), || {
        proxy.log_text().contains("status=499")
    });
    assert!(!lost.await, "{}", proxy.log_text());
}
