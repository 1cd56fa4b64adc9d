//! Response compression (`compress` in upstreams.yaml) through the real binary, over HTTP/1.1
//! and h2c: gzip, br and zstd bodies decoded by Debian's `gzip`, `brotli` and `zstd` (judges
//! installed by scripts/install-judges.sh), the choice by `Accept-Encoding`, the responses that
//! must pass untouched, the headers, a 5 MiB body that streams, server-sent events that arrive
//! one by one, and check-config's file:line errors.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::tools::{self, Tool};
use support::upstreams::Yaml;
use support::*;
use tokio::sync::Semaphore;

const GZIP: Tool = Tool {
    env: "ARALEZ_GZIP",
    installed: "/usr/bin/gzip", // Debian's package
    on_path: &["gzip"],
};
const BROTLI: Tool = Tool {
    env: "ARALEZ_BROTLI",
    installed: "/usr/bin/brotli",
    on_path: &["brotli"],
};
const ZSTD: Tool = Tool {
    env: "ARALEZ_ZSTD",
    installed: "/usr/bin/zstd",
    on_path: &["zstd"],
};

const CODINGS: [&str; 3] = ["gzip", "br", "zstd"];

/// The three decoders, or `None` (reported as skipped) when one is missing.
struct Decoders {
    gzip: PathBuf,
    brotli: PathBuf,
    zstd: PathBuf,
}

impl Decoders {
    fn find() -> Option<Decoders> {
        Some(Decoders {
            gzip: tools::find(&GZIP)?,
            brotli: tools::find(&BROTLI)?,
            zstd: tools::find(&ZSTD)?,
        })
    }

    /// `data`, a whole stream, decoded by the command-line tool for `coding`.
    async fn decode(&self, coding: &str, data: &[u8]) -> String {
        let tool = match coding {
            "gzip" => &self.gzip,
            "br" => &self.brotli,
            "zstd" => &self.zstd,
            other => panic!("no decoder for {other}"),
        };
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("body"), data).expect("write body");
        let args = vec!["-dc".to_string(), "body".to_string()];
        let run = tools::run(
            tool.clone(),
            args,
            dir.path().to_path_buf(),
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(run.code, Some(0), "{coding} -dc failed: {}", run.stderr);
        run.stdout
    }
}

/// `n` bytes of text that compresses as a page would (words drawn by a fixed generator).
fn text(n: usize) -> String {
    const WORDS: [&str; 16] = [
        "proxy", "upstream", "<div>", "</div>", "compress", "header", "the", "a", "request",
        "response", "stream", "body", "{\"id\":", "42}", "<p>", "aralez",
    ];
    let mut out = String::with_capacity(n + 16);
    let mut x: u32 = 12345;
    while out.len() < n {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        out.push_str(WORDS[(x >> 16) as usize % WORDS.len()]);
        out.push(if x & 0x300 == 0 { '\n' } else { ' ' });
    }
    out.truncate(n);
    out
}

type OriginBody = UnsyncBoxBody<Bytes, Infallible>;

/// A backend whose answer the query string describes: `status`, `type` (Content-Type), `len`
/// (body bytes of [`text`]), `enc` (a Content-Encoding it claims), `cc` (Cache-Control), `etag`,
/// `vary`, and `kind`: `stream` (no Content-Length), `gated` (the body, then a wait for the
/// gate before it ends), `sse` (three events, the gate opening between them). A `Range:
/// bytes=a-b` request gets a 206. Every 200 says `Accept-Ranges: bytes`.
struct Origin {
    addr: SocketAddr,
    gate: Arc<Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    async fn start() -> Origin {
        let listener = bind_local().await;
        let addr = listener.local_addr().expect("origin address");
        let gate = Arc::new(Semaphore::new(0));
        let g = gate.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let g = g.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| origin_answer(g.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Origin { addr, gate, task }
    }

    /// Lets a gated body end, or the next event out.
    fn open(&self) {
        self.gate.add_permits(1);
    }
}

async fn origin_answer(
    gate: Arc<Semaphore>,
    req: Request<Incoming>,
) -> Result<Response<OriginBody>, Infallible> {
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let status: u16 = get("status").and_then(|s| s.parse().ok()).unwrap_or(200);
    let len: usize = get("len").and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut resp = Response::builder().status(status);
    for (param, header) in [
        ("type", "content-type"),
        ("enc", "content-encoding"),
        ("cc", "cache-control"),
        ("vary", "vary"),
    ] {
        if let Some(value) = get(param) {
            resp = resp.header(header, value);
        }
    }
    if let Some(tag) = get("etag") {
        resp = resp.header("etag", format!("\"{tag}\""));
    }
    let ok = |r: http::response::Builder, body: OriginBody| Ok(r.body(body).expect("response"));
    if status == 204 || status == 304 {
        return ok(resp, Empty::new().boxed_unsync());
    }
    let body = Bytes::from(text(len));
    if let Some(range) = req.headers().get("range").and_then(|v| v.to_str().ok()) {
        let (from, to) = range
            .strip_prefix("bytes=")
            .and_then(|r| r.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
            .expect("a bytes=a-b range");
        let resp = resp
            .status(206)
            .header("content-range", format!("bytes {from}-{to}/{len}"));
        return ok(resp, Full::new(body.slice(from..=to)).boxed_unsync());
    }
    let resp = resp.header("accept-ranges", "bytes");
    let chunks: Vec<Bytes> = (0..len)
        .step_by(64 * 1024)
        .map(|at| body.slice(at..len.min(at + 64 * 1024)))
        .collect();
    let body = match get("kind") {
        Some("stream") => stream_of(chunks, None),
        Some("gated") => stream_of(chunks, Some((gate, Bytes::new()))),
        Some("sse") => sse(gate),
        _ => Full::new(body).boxed_unsync(),
    };
    ok(resp, body)
}

/// `chunks` as a body without a length; with a gate, a last (empty) chunk waits for it.
fn stream_of(chunks: Vec<Bytes>, gated_end: Option<(Arc<Semaphore>, Bytes)>) -> OriginBody {
    let tail = futures_util::stream::iter(gated_end).then(|(gate, last)| async move {
        gate.acquire().await.expect("gate").forget();
        last
    });
    let frames = futures_util::stream::iter(chunks)
        .chain(tail)
        .map(|c| Ok::<_, Infallible>(Frame::data(c)));
    StreamBody::new(frames).boxed_unsync()
}

/// Three server-sent events; the second and third wait for the gate.
fn sse(gate: Arc<Semaphore>) -> OriginBody {
    let events = futures_util::stream::iter(1..=3).then(move |i| {
        let gate = gate.clone();
        async move {
            if i > 1 {
                gate.acquire().await.expect("gate").forget();
            }
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("data: event {i}\n\n"))))
        }
    });
    StreamBody::new(events).boxed_unsync()
}

/// A proxy with `c.test` (`compress: true` on the host; `/off` turns it off; `/custom` takes
/// every type from 10 bytes) and `localhost` (no `compress`), all to `origin`.
fn proxy_for(origin: &Origin) -> ProxyProcess {
    let custom = Yaml::Map(vec![
        ("min_size".into(), 10u64.into()),
        ("types".into(), Yaml::List(vec!["*/*".into()])),
    ]);
    let yaml = Upstreams::new()
        .host(
            "c.test",
            Host::new()
                .set("compress", true)
                .path("/", Path::addrs(&[origin.addr]))
                .path("/off", Path::addrs(&[origin.addr]).set("compress", false))
                .path(
                    "/custom",
                    Path::addrs(&[origin.addr]).set("compress", custom),
                ),
        )
        .host(
            "localhost",
            Host::new().path("/", Path::addrs(&[origin.addr])),
        )
        .render();
    ProxyProcess::start(&yaml, "")
}

async fn get(
    client: &mut Client,
    method: Method,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (Response<()>, Bytes) {
    let resp = client
        .send(method, Some(host), path, headers, full(Bytes::new()))
        .await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("response body").to_bytes();
    (Response::from_parts(parts, ()), bytes)
}

fn hdr(resp: &Response<()>, name: &str) -> String {
    let all: Vec<&str> = resp
        .headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .collect();
    all.join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_coding_decodes_to_the_backend_body() {
    let Some(decoders) = Decoders::find() else {
        return;
    };
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let want = text(200_000);
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for coding in CODINGS {
            for kind in ["", "&kind=stream"] {
                let path = format!("/page?type=text/html;charset=utf-8&len=200000{kind}");
                let ae = [("accept-encoding", coding)];
                let (resp, body) = get(&mut client, Method::GET, "c.test", &path, &ae).await;
                let case = format!("{proto:?} {coding} {path}");
                assert_eq!(resp.status(), 200, "{case}");
                assert_eq!(hdr(&resp, "content-encoding"), coding, "{case}");
                assert_eq!(hdr(&resp, "content-length"), "", "{case}");
                assert_eq!(hdr(&resp, "accept-ranges"), "", "{case}");
                assert_eq!(hdr(&resp, "vary"), "Accept-Encoding", "{case}");
                assert!(body.len() < want.len() / 2, "{case}: {} bytes", body.len());
                let decoded = decoders.decode(coding, &body).await;
                assert!(decoded == want, "{case}: decoded body differs");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_encoding_q_values_choose_the_coding() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let want = text(5_000);
    // (Accept-Encoding, the coding chosen; "" = identity)
    let table: [(Option<&str>, &str); 12] = [
        (None, ""),
        (Some(""), ""),
        (Some("identity"), ""),
        (Some("deflate"), ""),
        (Some("gzip;q=0"), ""),
        (Some("gzip, deflate, br, zstd"), "zstd"),
        (Some("gzip;q=0.5, br;q=0.9"), "br"),
        (Some("br;q=0, zstd;q=0, gzip"), "gzip"),
        (Some("zstd;q=0.2, br;q=0.1"), "zstd"),
        (Some("*;q=0.1, gzip;q=0.2"), "gzip"),
        (Some("*"), "zstd"),
        (Some("gzip;q=0.5, identity"), ""),
    ];
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for (accept, chosen) in table {
            let headers: Vec<(&str, &str)> =
                accept.map(|a| ("accept-encoding", a)).into_iter().collect();
            let path = "/q?type=application/json&len=5000";
            let (resp, body) = get(&mut client, Method::GET, "c.test", path, &headers).await;
            let case = format!("{proto:?} Accept-Encoding {accept:?}");
            assert_eq!(hdr(&resp, "content-encoding"), chosen, "{case}");
            assert_eq!(
                hdr(&resp, "vary"),
                "Accept-Encoding",
                "{case}: identity varies too"
            );
            if chosen.is_empty() {
                assert_eq!(hdr(&resp, "content-length"), "5000", "{case}");
                assert_eq!(body, want.as_bytes(), "{case}");
            } else {
                assert_ne!(body, want.as_bytes(), "{case}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_that_pass_untouched() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let html = "type=text/html&len=5000";
    // (why, host, path, status, body length); every request accepts all three codings, and
    // the `Range` case asks for bytes 0-99.
    let table: [(&str, &str, String, u16, usize); 11] = [
        ("no compress", "localhost", format!("/a?{html}"), 200, 5000),
        (
            "compress: false",
            "c.test",
            format!("/off/a?{html}"),
            200,
            5000,
        ),
        (
            "below min_size",
            "c.test",
            "/a?type=text/html&len=1000".into(),
            200,
            1000,
        ),
        (
            "type not listed",
            "c.test",
            "/a?type=image/png&len=5000".into(),
            200,
            5000,
        ),
        ("no Content-Type", "c.test", "/a?len=5000".into(), 200, 5000),
        (
            "already gzip",
            "c.test",
            format!("/a?{html}&enc=gzip"),
            200,
            5000,
        ),
        (
            "no-transform",
            "c.test",
            format!("/a?{html}&cc=no-transform"),
            200,
            5000,
        ),
        ("Range", "c.test", format!("/a?{html}"), 206, 100),
        ("204", "c.test", format!("/a?{html}&status=204"), 204, 0),
        (
            "304",
            "c.test",
            format!("/a?{html}&status=304&etag=v1"),
            304,
            0,
        ),
        // `/custom` takes every type, but never gRPC's.
        (
            "gRPC",
            "c.test",
            "/custom/a?type=application/grpc&len=5000".into(),
            200,
            5000,
        ),
    ];
    let want = text(5000);
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for (why, host, path, status, len) in &table {
            let method = Method::GET;
            let mut headers = vec![("accept-encoding", "gzip, br, zstd")];
            if *why == "Range" {
                headers.push(("range", "bytes=0-99"));
            }
            let (resp, body) = get(&mut client, method.clone(), host, path, &headers).await;
            let case = format!("{proto:?} {why}");
            assert_eq!(resp.status(), *status, "{case}");
            let expected_encoding = if *why == "already gzip" { "gzip" } else { "" };
            assert_eq!(hdr(&resp, "content-encoding"), expected_encoding, "{case}");
            assert_eq!(body.len(), *len, "{case}");
            assert_eq!(body, want.as_bytes()[..*len], "{case}: the backend's bytes");
            if *status == 200 {
                assert_eq!(hdr(&resp, "content-length"), len.to_string(), "{case}");
                assert_eq!(hdr(&resp, "accept-ranges"), "bytes", "{case}");
            }
            if *why == "304" {
                assert_eq!(hdr(&resp, "etag"), "\"v1\"", "{case}: strong ETag kept");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_is_appended_and_a_strong_etag_weakened() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let path = "/v?type=text/css&len=4000&etag=abc&vary=Origin";
        let ae = [("accept-encoding", "br")];
        let (resp, _) = get(&mut client, Method::GET, "c.test", path, &ae).await;
        assert_eq!(hdr(&resp, "content-encoding"), "br", "{proto:?}");
        assert_eq!(hdr(&resp, "vary"), "Origin, Accept-Encoding", "{proto:?}");
        assert_eq!(hdr(&resp, "etag"), "W/\"abc\"", "{proto:?}");
        // The same answer uncompressed keeps its strong ETag.
        let (resp, _) = get(&mut client, Method::GET, "c.test", path, &[]).await;
        assert_eq!(hdr(&resp, "content-encoding"), "", "{proto:?}");
        assert_eq!(hdr(&resp, "etag"), "\"abc\"", "{proto:?}");
        assert_eq!(hdr(&resp, "vary"), "Origin, Accept-Encoding", "{proto:?}");
        // HEAD gets the headers its GET gets (RFC 9110 §9.3.2; nginx's gzip does the same),
        // without a body: it kept the uncompressed ones, a strong ETag and no `Vary`.
        let (resp, body) = get(&mut client, Method::HEAD, "c.test", path, &ae).await;
        let head = (hdr(&resp, "content-encoding"), hdr(&resp, "etag"));
        assert_eq!(head, ("br".into(), "W/\"abc\"".into()), "{proto:?}");
        assert_eq!(hdr(&resp, "vary"), "Origin, Accept-Encoding", "{proto:?}");
        assert_eq!(
            (hdr(&resp, "content-length"), body.len()),
            (String::new(), 0)
        );
        let (resp, _) = get(&mut client, Method::HEAD, "c.test", path, &[]).await;
        assert_eq!(hdr(&resp, "content-encoding"), "", "{proto:?}");
        assert_eq!(hdr(&resp, "vary"), "Origin, Accept-Encoding", "{proto:?}");
        assert_eq!(
            hdr(&resp, "content-length"),
            "4000",
            "{proto:?}: GET's length"
        );
    }
}

/// A HEAD answer that gives no length (its GET would stream) gets the headers its GET would:
/// its own empty body was taken for a body under `min_size`, and it kept the plain headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_answer_without_a_length_gets_the_gets_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = serve_tcp(any_local(), |mut tcp| async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let answer = "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\netag: \"e1\"\r\n\r\n";
            if tcp.write_all(answer.as_bytes()).await.is_err() {
                break;
            }
        }
    })
    .await;
    let yaml = Upstreams::new()
        .host(
            "c.test",
            Host::new()
                .set("compress", true)
                .path("/", Path::addrs(&[addr]).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let ae = [("accept-encoding", "gzip")];
        let (resp, body) = get(&mut client, Method::HEAD, "c.test", "/h", &ae).await;
        let head = (hdr(&resp, "content-encoding"), hdr(&resp, "etag"));
        assert_eq!(head, ("gzip".into(), "W/\"e1\"".into()), "{proto:?}");
        assert_eq!(hdr(&resp, "vary"), "Accept-Encoding", "{proto:?}");
        assert!(body.is_empty(), "{proto:?}");
    }
}

/// Reads frames of `body` until `enough` holds for what came so far; panics after 10 s.
async fn read_until(body: &mut Incoming, got: &mut Vec<u8>, mut enough: impl FnMut(&[u8]) -> bool) {
    let limit = tokio::time::Instant::now() + Duration::from_secs(10);
    while !enough(got) {
        let frame = tokio::time::timeout_at(limit, body.frame())
            .await
            .unwrap_or_else(|_| panic!("only {} bytes within 10 s", got.len()))
            .expect("the body goes on")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_streams_while_it_is_compressed() {
    let Some(decoders) = Decoders::find() else {
        return;
    };
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let size = 5 * 1024 * 1024;
    let want = text(size);
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for coding in CODINGS {
            let path = format!("/big?type=text/plain&len={size}&kind=gated");
            let ae = [("accept-encoding", coding)];
            let resp = client
                .send(Method::GET, Some("c.test"), &path, &ae, full(Bytes::new()))
                .await;
            let case = format!("{proto:?} {coding}");
            assert_eq!(header(&resp, "content-encoding"), coding, "{case}");
            let mut body = resp.into_body();
            // The backend has not finished (it waits for the gate), yet most of the compressed
            // body is here: nothing waits for the whole.
            let mut got = Vec::new();
            read_until(&mut body, &mut got, |g| g.len() >= 256 * 1024).await;
            origin.open();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.expect("frame").into_data() {
                    got.extend_from_slice(&data);
                }
            }
            assert!(got.len() < size / 2, "{case}: {} bytes", got.len());
            let decoded = decoders.decode(coding, &got).await;
            assert!(
                decoded == want,
                "{case}: decoded {} bytes differ",
                decoded.len()
            );
        }
    }
}

/// What the start of a compressed stream decodes to. The command-line tools are no help here
/// (`brotli -d` prints nothing of a stream that has not ended), so the streaming decoders of the
/// crates the proxy encodes with do it; the whole stream is still checked by the tools.
fn decode_prefix(coding: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            let mut d = flate2::write::GzDecoder::new(&mut out);
            d.write_all(data).expect("gzip prefix");
            d.flush().expect("gzip flush");
        }
        "br" => {
            let mut d = brotli::DecompressorWriter::new(&mut out, 4096);
            d.write_all(data).expect("brotli prefix");
            d.flush().expect("brotli flush");
        }
        "zstd" => {
            let mut d = zstd::stream::write::Decoder::new(&mut out).expect("zstd decoder");
            d.write_all(data).expect("zstd prefix");
            d.flush().expect("zstd flush");
        }
        other => panic!("no decoder for {other}"),
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_arrive_one_at_a_time() {
    let Some(decoders) = Decoders::find() else {
        return;
    };
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for coding in CODINGS {
            let path = "/custom/events?type=text/event-stream&kind=sse";
            let ae = [("accept-encoding", coding)];
            let resp = client
                .send(Method::GET, Some("c.test"), path, &ae, full(Bytes::new()))
                .await;
            let case = format!("{proto:?} {coding}");
            assert_eq!(header(&resp, "content-encoding"), coding, "{case}");
            let mut body = resp.into_body();
            let mut got = Vec::new();
            for i in 1..=3 {
                if i > 1 {
                    origin.open();
                }
                // Each event must be decodable before the backend sends the next one.
                let event = format!("data: event {i}\n\n");
                let limit = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let decoded = decode_prefix(coding, &got);
                    if decoded.ends_with(event.as_bytes()) {
                        break;
                    }
                    let frame = tokio::time::timeout_at(limit, body.frame())
                        .await
                        .unwrap_or_else(|_| {
                            let so_far = String::from_utf8_lossy(&decoded);
                            panic!("{case}: event {i} not decodable; so far {so_far:?}")
                        })
                        .expect("the stream goes on")
                        .expect("a frame");
                    if let Ok(data) = frame.into_data() {
                        got.extend_from_slice(&data);
                    }
                }
            }
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.expect("frame").into_data() {
                    got.extend_from_slice(&data);
                }
            }
            let all = decoders.decode(coding, &got).await;
            assert_eq!(
                all, "data: event 1\n\ndata: event 2\n\ndata: event 3\n\n",
                "{case}"
            );
        }
    }
}

#[test]
fn check_config_names_the_line_of_a_bad_compress_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let main = dir.path().join("main.yaml");
    std::fs::write(
        &main,
        "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n",
    )
    .unwrap();
    let ups = dir.path().join("upstreams.yaml");
    std::fs::write(
        &ups,
        "upstreams:\n  a.com:\n    compress: yes please\n    paths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n        compress:\n          min_size: 512\n          types: [text/html, \"text html\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(binary())
        .args(["check-config", "-c"])
        .arg(&main)
        .output()
        .expect("run check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let host_line = format!(
        "{}:3:15: error: `upstreams.a.com.compress`: expected true, false or a mapping of min_size and types",
        ups.display()
    );
    assert!(stdout.contains(&host_line), "{stdout}");
    let type_line = format!(
        "{}:9:30: error: `upstreams.a.com.paths./.compress.types[1]`: `text html` is not a media type",
        ups.display()
    );
    assert!(stdout.contains(&type_line), "{stdout}");
}
