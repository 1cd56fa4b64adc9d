//! HPACK over h2c against the in-process proxy, both ways (vendor/h2/PATCHED.md). Requests as a
//! client library codes them: every request of a connection reaches the backend with its own
//! header values, which guards the vendored h2's memo of the last Huffman-coded values sent
//! without indexing. Answers as the proxy codes them, read byte by byte: literals without
//! indexing and without Huffman coding, never indexed where the value is sensitive.

use crate::inproc;
use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request};
use inproc::Proxy;
use support::{default_route, full, h2_frame, header, Backend, Client, Proto};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `GET {path}` with `Authorization: {value}`, never indexed when `sensitive` (as h2 and
/// nghttp2 send credentials; h2 never indexes `:path` or `Authorization` either way), and returns
/// the path and `Authorization` the backend saw.
async fn seen(client: &mut Client, path: &str, value: &str, sensitive: bool) -> (String, String) {
    let Client::H2(sender) = client else {
        panic!("an h2c client");
    };
    let mut value = HeaderValue::from_str(value).expect("header value");
    value.set_sensitive(sensitive);
    let request = Request::get(format!("http://x.test{path}"))
        .header("authorization", value)
        .body(full(Bytes::new()))
        .expect("request");
    sender.ready().await.expect("connection ready");
    let resp = sender.send_request(request).await.expect("answer");
    assert_eq!(resp.status(), 200);
    (
        header(&resp, "x-seen-uri"),
        header(&resp, "x-seen-authorization"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_sent_without_indexing_reach_the_backend_as_sent_on_every_request() {
    let backend = Backend::start("a").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let mut client = Client::connect(Proto::H2c, proxy.addr).await;
    let token = |last: char| format!("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.sig{last}");
    let long = format!(
        "Bearer {}",
        "abcdefghijklmnopqrstuvwxyz0123456789".repeat(30)
    );
    let path = |n: u32| format!("/api/v1/accounts/{n}/orders?page=1");
    // The same values again; a token and a path that differ from the first only in their last
    // character ('a' and 'e', '1' and '2' have codes of the same length, so they are coded to
    // the same length); more distinct values than the memo has entries; a value too long to be
    // kept; one sent without the never-indexed flag; and the first values once more.
    let mut sequence = vec![
        (path(1), token('a'), true),
        (path(1), token('a'), true),
        (path(2), token('e'), true),
        (path(1), token('a'), true),
        ("/".to_string(), "Bearer x".to_string(), true),
    ];
    sequence.extend((10..16).map(|n| (path(n), token('a'), true)));
    sequence.extend([
        (path(1), long.clone(), true),
        (path(1), long.clone(), true),
        (path(2), token('c'), false),
        (path(1), token('a'), true),
    ]);
    for (i, (path, value, sensitive)) in sequence.iter().enumerate() {
        let (seen_path, seen_value) = seen(&mut client, path, value, *sensitive).await;
        assert_eq!(&seen_path, path, "request {i}: path");
        assert_eq!(&seen_value, value, "request {i}: authorization");
    }
}

/// The names of HPACK's static table (RFC 7541 Appendix A), index 1 first.
const STATIC_NAMES: [&str; 61] = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
];

/// The value of a static-table entry that has one (the others are empty).
fn static_value(index: usize) -> &'static str {
    match index {
        2 => "GET",
        3 => "POST",
        4 => "/",
        5 => "/index.html",
        6 => "http",
        7 => "https",
        8 => "200",
        9 => "204",
        10 => "206",
        11 => "304",
        12 => "400",
        13 => "404",
        14 => "500",
        16 => "gzip, deflate",
        _ => "",
    }
}

/// How a field was coded (RFC 7541 §6).
#[derive(Debug, PartialEq)]
enum Coded {
    StaticIndex,
    WithoutIndexing,
    NeverIndexed,
}

/// An HPACK integer with an `n`-bit prefix at `at` (RFC 7541 §5.1).
fn hpack_int(block: &[u8], at: &mut usize, n: u32) -> usize {
    let mask = (1usize << n) - 1;
    let mut value = usize::from(block[*at]) & mask;
    *at += 1;
    if value == mask {
        let mut shift = 0;
        loop {
            let b = block[*at];
            *at += 1;
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
    }
    value
}

/// An HPACK string at `at`, which must not be Huffman-coded.
fn raw_string(block: &[u8], at: &mut usize) -> String {
    assert_eq!(block[*at] & 0x80, 0, "a Huffman-coded string at byte {at}");
    let len = hpack_int(block, at, 7);
    let s = String::from_utf8(block[*at..*at + len].to_vec()).expect("UTF-8");
    *at += len;
    s
}

/// The fields of a header block, each with how it was coded. Panics on anything that refers to
/// or fills the dynamic table.
fn fields(block: &[u8]) -> Vec<(String, String, Coded)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < block.len() {
        let first = block[at];
        assert_ne!(first & 0xc0, 0x40, "a field indexed into the dynamic table");
        assert_ne!(first & 0xe0, 0x20, "a dynamic table size update");
        if first & 0x80 != 0 {
            let index = hpack_int(block, &mut at, 7);
            assert!((1..=61).contains(&index), "index {index} is not static");
            let (name, value) = (STATIC_NAMES[index - 1], static_value(index));
            out.push((name.to_string(), value.to_string(), Coded::StaticIndex));
            continue;
        }
        let coded = if first & 0x10 != 0 {
            Coded::NeverIndexed
        } else {
            Coded::WithoutIndexing
        };
        let index = hpack_int(block, &mut at, 4);
        assert!(index <= 61, "name index {index} is not static");
        let name = match index {
            0 => raw_string(block, &mut at),
            i => STATIC_NAMES[i - 1].to_string(),
        };
        let value = raw_string(block, &mut at);
        out.push((name, value, coded));
    }
    out
}

/// `GET http://x.test/` with `Authorization: {auth}`, the authorization never indexed, every
/// string raw.
fn request_block(auth: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x84, 0x01, 6];
    block.extend_from_slice(b"x.test");
    // authorization is static index 23: 15 in the 4-bit prefix, 8 after it.
    block.extend_from_slice(&[0x1f, 0x08]);
    let len = auth.len();
    assert!((127..127 + 16_384).contains(&len));
    let rest = len - 127;
    block.extend_from_slice(&[0x7f, 0x80 | (rest & 0x7f) as u8, (rest >> 7) as u8]);
    block.extend_from_slice(auth.as_bytes());
    block
}

/// Sends two requests on one h2c connection and returns each answer's header block.
async fn answer_blocks(addr: std::net::SocketAddr, auth: &str) -> [Vec<u8>; 2] {
    const HEADERS: u8 = 0x1;
    const SETTINGS: u8 = 0x4;
    const CONTINUATION: u8 = 0x9;
    const END_STREAM_HEADERS: u8 = 0x5;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(SETTINGS, 0, 0, &[]));
    for stream in [1, 3] {
        hello.extend(h2_frame(
            HEADERS,
            END_STREAM_HEADERS,
            stream,
            &request_block(auth),
        ));
    }
    s.write_all(&hello).await.expect("write");
    let (mut got, mut blocks) = (Vec::new(), [Vec::new(), Vec::new()]);
    let mut done = [false, false];
    let mut buf = vec![0u8; 64 * 1024];
    while !done.iter().all(|d| *d) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("answers within 10 s")
            .expect("read");
        assert_ne!(n, 0, "the proxy closed before answering both requests");
        got.extend_from_slice(&buf[..n]);
        while got.len() >= 9 {
            let len = usize::from(got[0]) << 16 | usize::from(got[1]) << 8 | usize::from(got[2]);
            if got.len() < 9 + len {
                break;
            }
            let (kind, flags) = (got[3], got[4]);
            let stream = u32::from_be_bytes([got[5], got[6], got[7], got[8]]) & 0x7fff_ffff;
            let payload: Vec<u8> = got.drain(..9 + len).skip(9).collect();
            if kind == SETTINGS && flags & 0x1 == 0 {
                s.write_all(&h2_frame(SETTINGS, 0x1, 0, &[]))
                    .await
                    .expect("ack");
            }
            if (kind == HEADERS || kind == CONTINUATION) && (stream == 1 || stream == 3) {
                let i = (stream / 2) as usize;
                assert_eq!(kind == HEADERS, blocks[i].is_empty(), "frame order");
                assert_eq!(flags & 0x28, 0, "no padding or priority in an answer");
                blocks[i].extend_from_slice(&payload);
                done[i] |= flags & 0x4 != 0;
            }
        }
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_literals_without_indexing_or_huffman_coding() {
    let backend = Backend::builder("a").cookies().start().await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let auth = format!("Bearer {}", "t".repeat(293));
    for block in answer_blocks(proxy.addr, &auth).await {
        let fields = fields(&block);
        let first = fields.first().expect("a field");
        assert_eq!(
            (first.0.as_str(), first.1.as_str(), &first.2),
            (":status", "200", &Coded::StaticIndex)
        );
        let find = |name: &str| -> Vec<&(String, String, Coded)> {
            fields.iter().filter(|f| f.0 == name).collect()
        };
        let cookies: Vec<&str> = find("set-cookie").iter().map(|f| f.1.as_str()).collect();
        assert_eq!(cookies, ["app=a; Path=/", "theme=dark; Path=/"]);
        assert!(find("set-cookie")
            .iter()
            .all(|f| f.2 == Coded::WithoutIndexing));
        let backend_name = find("x-backend");
        assert_eq!(backend_name.len(), 1);
        assert_eq!(
            (backend_name[0].1.as_str(), &backend_name[0].2),
            ("a", &Coded::WithoutIndexing)
        );
        // A value over 127 bytes long, whose length takes more than its first byte.
        let echoed = find("x-seen-authorization");
        assert_eq!(echoed.len(), 1);
        assert_eq!(echoed[0].1, auth);
        // The proxy's own request id is sent never indexed.
        let id = find("x-request-id");
        assert_eq!(id.len(), 1);
        assert_eq!(id[0].2, Coded::NeverIndexed, "x-request-id: {:?}", id[0]);
        assert!(!id[0].1.is_empty());
    }
}
