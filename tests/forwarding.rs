//! Routing and forwarding through the real binary, every case over HTTP/1.1 and h2c (one table).

use crate::inproc;
use crate::support;

use bytes::Bytes;
use futures_util::stream;
use http::Method;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use support::*;

struct Routes {
    proxy: ProxyProcess,
    _backends: Vec<Backend>,
}

async fn routing_setup() -> Routes {
    let (a, b, c, d) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
        Backend::start("d").await,
    );
    let yaml = Upstreams::new()
        .host(
            "example.com",
            Host::new()
                .path("/", Path::servers(&[&a]))
                .path("/api", Path::servers(&[&b]))
                .path("/api/v2", Path::servers(&[&c])),
        )
        // Written otherwise than its RFC 5952 form, as clients may write it too.
        .host("[0:0::5]", Host::new().path("/", Path::servers(&[&b])))
        .host("DEFAULT", Host::new().path("/", Path::servers(&[&d])))
        .render();
    Routes {
        proxy: ProxyProcess::start(&yaml, ""),
        _backends: vec![a, b, c, d],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_and_path_selection() {
    let setup = routing_setup().await;
    // (host, path, backend that must answer)
    let table = [
        ("example.com", "/", "a"),
        ("EXAMPLE.Com", "/", "a"),
        ("example.com:8080", "/", "a"),
        ("example.com.", "/index", "a"),
        ("other.org", "/", "d"),
        ("other.org", "/api", "d"),
        ("example.com", "/api", "b"),
        ("example.com", "/api/", "b"),
        ("example.com", "/api/x?q=1", "b"),
        ("example.com", "/apix", "a"),
        ("example.com", "/api/v2", "c"),
        ("example.com", "/api/v2/y", "c"),
        ("example.com", "/api/v2x", "b"),
        ("example.com", "/%61pi/v2", "c"),
        // Prefixes match whatever the case: many backends read `/API` as `/api`.
        ("example.com", "/API/V2/y", "c"),
        ("example.com", "/Api", "b"),
        // One IPv6 address, however written, is one host (it went to DEFAULT, past its
        // host's policies).
        ("[::5]", "/", "b"),
        ("[0:0:0:0:0:0:0:5]:8080", "/x", "b"),
        ("[::6]", "/", "d"),
    ];
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, setup.proxy.addr).await;
        for (host, path, want) in table {
            let resp = client.get(host, path).await;
            assert_eq!(resp.status(), 200, "{proto:?} {host}{path}");
            assert_eq!(header(&resp, "x-backend"), want, "{proto:?} {host}{path}");
            // The original request target goes to the backend unchanged.
            let seen_uri = header(&resp, "x-seen-uri");
            assert!(
                seen_uri.ends_with(path),
                "{proto:?} {host}{path}: backend saw {seen_uri}"
            );
            body_bytes(resp).await;
        }
    }
    // Targets a backend could read differently from routing are refused before routing (the
    // backend would otherwise get what was never judged): dot segments, `;` parameters,
    // encoded separators.
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, setup.proxy.addr).await;
        for path in [
            "/x/../api/z",
            "/api/v2/../z",
            "/public/..;/api",
            "/api%2Fv2",
            "/a;b",
        ] {
            let resp = client.get("example.com", path).await;
            assert_eq!(resp.status(), 400, "{proto:?} {path}");
            assert_eq!(header(&resp, "x-backend"), "", "{proto:?} {path}");
            body_bytes(resp).await;
        }
    }
    // HTTP/1.1 without any Host header is refused (RFC 9112 §3.2).
    let mut client = Client::connect(Proto::H1, setup.proxy.addr).await;
    let resp = client.send(Method::GET, None, "/api", &[], full("")).await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_default_unknown_hosts_and_paths_get_404() {
    let a = Backend::start("a").await;
    let yaml = Upstreams::new()
        .host(
            "example.com",
            Host::new().path("/api", Path::servers(&[&a]).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for (host, path) in [
            ("other.org", "/api"),
            ("example.com", "/"),
            ("example.com", "/apix"),
        ] {
            let resp = client.get(host, path).await;
            assert_eq!(resp.status(), 404, "{proto:?} {host}{path}");
            assert!(header(&resp, "content-type").starts_with("text/plain"));
            assert!(!body_bytes(resp).await.is_empty());
        }
        let resp = client.get("example.com", "/api").await;
        assert_eq!(resp.status(), 200);
    }
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.send(Method::GET, None, "/api", &[], full("")).await;
    assert_eq!(resp.status(), 400, "HTTP/1.1 with no Host");
    assert_eq!(a.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers() {
    let a = Backend::builder("a").cookies().start().await;
    // Pinned to HTTP/1.1 (the backend also speaks h2c, which detection would pick).
    let route = Path::addrs(&[format!("http://{}", a.addr)])
        .server_headers(&["X-To-Backend: yes"])
        .client_headers(&["X-Frame-Options:DENY", "Set-Cookie:a=1", "Set-Cookie:b=2"]);
    let yaml = Upstreams::new()
        .server_headers(&["X-Global:g"])
        .host("example.com", Host::new().path("/", route))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client
            .send(
                Method::GET,
                Some("example.com:8080"),
                "/h",
                &[("x-forwarded-for", "203.0.113.9")],
                full(""),
            )
            .await;
        assert_eq!(resp.status(), 200, "{proto:?}");
        assert_eq!(
            header(&resp, "x-seen-xff"),
            "203.0.113.9, 127.0.0.1",
            "{proto:?}: XFF appended, no port"
        );
        assert_eq!(
            header(&resp, "x-seen-host"),
            "example.com:8080",
            "{proto:?}: Host kept"
        );
        assert_eq!(header(&resp, "x-seen-proto"), "http", "{proto:?}");
        assert_eq!(
            header(&resp, "x-seen-fwd-host"),
            "example.com:8080",
            "{proto:?}"
        );
        assert_eq!(
            header(&resp, "x-seen-version"),
            "HTTP/1.1",
            "{proto:?}: backend spoken to in HTTP/1.1"
        );
        let seen = header(&resp, "x-seen-headers");
        assert!(
            seen.contains("x-global") && seen.contains("x-to-backend"),
            "{proto:?}: server headers add up: {seen}"
        );
        // The backend's hop-by-hop headers never reach the client; client headers do, a
        // name listed twice with both values. A `Set-Cookie` is added beside the backend's
        // own, as nginx's `add_header` adds it (they were replaced, and the application's
        // session cookies with them).
        assert!(resp.headers().get("x-hop").is_none(), "{proto:?}");
        let cookies: Vec<_> = resp.headers().get_all("set-cookie").iter().collect();
        let want = ["app=a; Path=/", "theme=dark; Path=/", "a=1", "b=2"];
        assert_eq!(cookies, want, "{proto:?}");
        assert!(resp.headers().get("keep-alive").is_none(), "{proto:?}");
        assert_eq!(header(&resp, "x-frame-options"), "DENY", "{proto:?}");
        body_bytes(resp).await;
        // The `araleztoken` query parameter never reaches a backend, on any route.
        let resp = client
            .get("example.com", "/t?a=1&araleztoken=secret&b=2")
            .await;
        assert_eq!(header(&resp, "x-seen-uri"), "/t?a=1&b=2", "{proto:?}");
        body_bytes(resp).await;
        // Without an incoming XFF the client IP alone is sent.
        let resp = client.get("example.com", "/").await;
        assert_eq!(header(&resp, "x-seen-xff"), "127.0.0.1");
        assert_eq!(header(&resp, "x-seen-forwarded-lines"), "3", "{proto:?}");
        body_bytes(resp).await;
    }
    // Hop-by-hop request headers (only HTTP/1.1 clients can send them).
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let hop = [
        ("connection", "keep-alive, x-custom"),
        ("x-custom", "1"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("te", "gzip"),
        ("x-end-to-end", "kept"),
    ];
    let resp = client
        .send(Method::GET, Some("example.com"), "/", &hop, full(""))
        .await;
    let seen = header(&resp, "x-seen-headers");
    for gone in [
        "connection",
        "x-custom",
        "keep-alive",
        "proxy-connection",
        "te",
    ] {
        assert!(
            !seen.split(',').any(|h| h == gone),
            "{gone} reached the backend: {seen}"
        );
    }
    assert!(seen.contains("x-end-to-end"), "{seen}");
    // `TE: trailers` goes on when `Connection` names `TE`, as RFC 9110 §10.1.4 has a client do.
    let te = [("connection", "keep-alive, TE"), ("te", "gzip, trailers")];
    let resp = client
        .send(Method::GET, Some("example.com"), "/", &te, full(""))
        .await;
    let seen = header(&resp, "x-seen-headers");
    assert!(seen.split(',').any(|h| h == "te"), "{seen}");
}

/// A request without `X-Forwarded-*` of its own gets the three fields once each, and one
/// `X-Request-Id` (the one the client gets back), whether the backend is spoken to by aralez's
/// own HTTP/1.1 client or by hyper's (h2c here), and through a route's layers; a client's own
/// list is appended to and its own id replaced; a route rule that sets one of them wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fields_reach_inline_and_hyper_client_backends_once() {
    let a = Backend::start("a").await;
    let pinned = format!("http://{}", a.addr);
    let yaml = Upstreams::new()
        .host("h1.test", Host::new().path("/", Path::addrs(&[&pinned])))
        .host("h2.test", Host::new().path("/", Path::servers(&[&a])))
        .host(
            "layers.test",
            Host::new().path("/", Path::addrs(&[&pinned]).rate_limit(1_000_000)),
        )
        .host(
            "rule.test",
            Host::new().path(
                "/",
                Path::addrs(&[&pinned])
                    .server_headers(&["X-Forwarded-Proto: https", "X-Request-Id: from-rule"]),
            ),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let hosts = [
        ("h1.test", "HTTP/1.1"),
        ("h2.test", "HTTP/2.0"),
        ("layers.test", "HTTP/1.1"),
    ];
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for (host, version) in hosts {
            let what = format!("{proto:?} {host}");
            let resp = client.get(host, "/").await;
            assert_eq!(resp.status(), 200, "{what}");
            assert_eq!(header(&resp, "x-seen-version"), version, "{what}");
            assert_eq!(header(&resp, "x-seen-xff"), "127.0.0.1", "{what}");
            assert_eq!(header(&resp, "x-seen-proto"), "http", "{what}");
            assert_eq!(header(&resp, "x-seen-fwd-host"), host, "{what}");
            assert_eq!(header(&resp, "x-seen-forwarded-lines"), "3", "{what}");
            assert_one_request_id(&resp, &what);
            body_bytes(resp).await;
            // The client's own X-Forwarded-For is appended to; its id (not from a trusted
            // peer) is replaced.
            let own = [
                ("x-forwarded-for", "203.0.113.9"),
                ("x-request-id", "forged"),
            ];
            let resp = client
                .send(Method::GET, Some(host), "/", &own, full(""))
                .await;
            assert_eq!(header(&resp, "x-seen-xff"), "203.0.113.9, 127.0.0.1");
            assert_eq!(header(&resp, "x-seen-forwarded-lines"), "3", "{what}");
            assert_one_request_id(&resp, &what);
            assert_ne!(header(&resp, "x-request-id"), "forged", "{what}");
            body_bytes(resp).await;
        }
        let resp = client.get("rule.test", "/").await;
        let what = format!("{proto:?}: the rule wins");
        assert_eq!(header(&resp, "x-seen-proto"), "https", "{what}");
        assert_eq!(header(&resp, "x-seen-forwarded-lines"), "3", "{what}");
        assert_eq!(header(&resp, "x-seen-request-id"), "from-rule", "{what}");
        assert_eq!(header(&resp, "x-seen-request-id-lines"), "1", "{what}");
        assert_eq!(header(&resp, "x-request-id").len(), 32, "{what}");
        body_bytes(resp).await;
    }
}

/// The backend saw one `X-Request-Id`, the one the client got back.
fn assert_one_request_id(resp: &http::Response<hyper::body::Incoming>, what: &str) {
    let id = header(resp, "x-request-id");
    assert_eq!(id.len(), 32, "{what}: {id}");
    assert_eq!(header(resp, "x-seen-request-id"), id, "{what}");
    assert_eq!(header(resp, "x-seen-request-id-lines"), "1", "{what}");
}

/// An HTTP/1.0 request without `Host` goes on as HTTP/1.1, which must carry one (RFC 9112
/// §3.2): the backend's own, as nginx sends `$proxy_host`. It went without any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_host_reaches_the_backend_with_its_own() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = Backend::start("b").await;
    // Over HTTP/1.1: over HTTP/2 the backend's authority was sent already.
    let proxy = ProxyProcess::start(&http1_route(&backend), "");
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(b"GET /x HTTP/1.0\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    let read = stream.read_to_string(&mut answer);
    tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .expect("an answer within 5 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    let seen = format!("x-seen-host: {}\r\n", backend.addr);
    assert!(answer.contains(&seen), "{answer}");
}

/// An HTTP/2 client's cookie crumbs (RFC 9113 §8.2.3) reach an HTTP/1.1 backend as one field
/// joined with `; `: as two fields, a server reading them as a list (`a=1, b=2`) lost `b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_crumbs_reach_an_http1_backend_as_one_field() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(&http1_route(&backend), "");
    let mut client = Client::connect(Proto::H2c, proxy.addr).await;
    let crumbs = [("cookie", "a=1"), ("cookie", "b=2")];
    let resp = client
        .send(Method::GET, Some("a"), "/", &crumbs, full(Bytes::new()))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-seen-cookie-fields"), "a=1; b=2");
}

/// The proxy with every path of every host going to `backend`.
fn proxy_to(backend: &Backend) -> ProxyProcess {
    let yaml = Upstreams::new()
        .host("DEFAULT", Host::new().path("/", Path::servers(&[backend])))
        .render();
    ProxyProcess::start(&yaml, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_reaches_a_client_that_asked_to_close_whole() {
    // The last piece of an answer of known length, over 16 KiB, written on a connection that
    // closes after it (`Connection: close`, as urllib sends, or the drain): it went out cut.
    // An HTTP/1.1 backend: its answer comes in pieces as large as the proxy reads.
    let backend = Backend::builder("a").h1_only().start().await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "test", &["x.test"]);
    let (proxy, tls) = start_tls_proxy(&backend, certs.path(), "medium");
    let tls_config = tls_client_config(&[root], &[b"http/1.1"]);
    for size in [60_000, 300_000, 2_000_000] {
        for over_tls in [false, true] {
            let mut client = match over_tls {
                false => Client::connect(Proto::H1, proxy.addr).await,
                true => Client::connect_tls(tls, "x.test", tls_config.clone()).await,
            };
            let path = format!("/sized/{size}");
            let close = [("connection", "close")];
            let resp = client
                .send(Method::GET, Some("x.test"), &path, &close, full(""))
                .await;
            assert_eq!(resp.status(), 200);
            assert_eq!(header(&resp, "content-length"), size.to_string());
            let got = resp.into_body().collect().await;
            let got = got.map(|body| body.to_bytes().len());
            assert!(
                matches!(got, Ok(n) if n == size),
                "{size} bytes, TLS {over_tls}: {got:?}"
            );
        }
    }
}

fn chunked_unknown_length(chunks: usize, size: usize) -> ClientBody {
    let parts =
        (0..chunks).map(move |i| Ok(Frame::data(Bytes::from(vec![b'a' + (i % 26) as u8; size]))));
    StreamBody::new(stream::iter(parts)).boxed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_bodies() {
    let a = Backend::start("a").await;
    let proxy = proxy_to(&a);
    let mib: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client
            .send(Method::POST, Some("x"), "/echo", &[], full(Bytes::new()))
            .await;
        assert_eq!(resp.status(), 200);
        assert!(body_bytes(resp).await.is_empty(), "{proto:?}: empty body");

        let resp = client
            .send(Method::POST, Some("x"), "/echo", &[], full(mib.clone()))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            body_bytes(resp).await.as_ref(),
            mib.as_slice(),
            "{proto:?}: 1 MiB echoed intact"
        );

        let resp = client
            .send(
                Method::POST,
                Some("x"),
                "/echo",
                &[],
                chunked_unknown_length(40, 5000),
            )
            .await;
        // Answered while the body is still read, and read to its end: the connection goes on.
        assert_eq!(header(&resp, "connection"), "", "{proto:?}");
        let echoed = body_bytes(resp).await;
        assert_eq!(
            echoed.len(),
            200_000,
            "{proto:?}: chunked body of unknown length"
        );
        assert_eq!(echoed[5000], b'b');
        let next = client.get("x", "/").await;
        assert_eq!(next.status(), 200, "{proto:?}: the same connection again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_response_streams_with_flat_memory() {
    let a = Backend::start("a").await;
    let proxy = proxy_to(&a);
    const TOTAL: usize = 100 * 1024 * 1024;
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        // Warm up so the baseline includes buffers every connection allocates anyway.
        body_bytes(client.get("x", "/big/1048576").await).await;
        let baseline = proxy.rss_kib();
        let resp = client.get("x", &format!("/big/{TOTAL}")).await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let (mut received, mut peak, mut next_sample) = (0usize, baseline, 0usize);
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("frame").into_data() {
                received += data.len();
            }
            if received >= next_sample {
                peak = peak.max(proxy.rss_kib());
                next_sample += 4 * 1024 * 1024;
                // Read slowly for a while so a buffering proxy would have to hold the rest (kept:
                // the point is that real time passes while the backend keeps sending).
                if received < 16 * 1024 * 1024 {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
        assert_eq!(received, TOTAL, "{proto:?}");
        let growth_mib = (peak.saturating_sub(baseline)) / 1024;
        assert!(
            growth_mib < 24,
            "{proto:?}: proxy RSS grew by {growth_mib} MiB while streaming 100 MiB"
        );
    }
}

/// An HTTP/2 client that asks for `streams` answers of `path` on one connection, grants them
/// every byte of window there is, and never reads: what it asked for piles up in the proxy.
async fn stalled_h2_reader(
    addr: std::net::SocketAddr,
    streams: u32,
    path: &str,
) -> tokio::net::TcpStream {
    use support::frame::*;
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let most = 0x7fff_ffffu32;
    let window = [&4u16.to_be_bytes()[..], &most.to_be_bytes()].concat();
    let mut out = PREFACE.to_vec();
    out.extend(h2_frame(SETTINGS, 0, 0, &window));
    out.extend(h2_frame(
        WINDOW_UPDATE,
        0,
        0,
        &(most - 65_535).to_be_bytes(),
    ));
    // `:method GET`, `:scheme http`, then `:path` and `:authority x` as literals.
    let mut block = vec![0x82, 0x86, 0x04, u8::try_from(path.len()).unwrap()];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'x']);
    for n in 0..streams {
        out.extend(h2_frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            2 * n + 1,
            &block,
        ));
    }
    s.write_all(&out).await.unwrap();
    s
}

/// What HTTP/2 answers that a client never reads hold in the proxy: each stream's send buffer
/// is bounded (64 KiB), not hyper's 400 KiB, so 200 such streams cannot take hundreds of MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_answers_never_read_hold_a_bounded_buffer_each() {
    let a = Backend::start("a").await;
    let proxy = proxy_to(&a);
    let mut client = Client::connect(Proto::H2c, proxy.addr).await;
    body_bytes(client.get("x", "/big/1048576").await).await;
    let baseline = proxy.rss_kib();
    let path = "/big/8388608";
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(stalled_h2_reader(proxy.addr, 100, path).await);
    }
    // Until the buffers stop filling: two half-seconds in a row that added under 1 MiB.
    let (mut peak, mut calm) = (baseline, 0);
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = proxy.rss_kib();
        calm = if now < peak + 1024 { calm + 1 } else { 0 };
        peak = peak.max(now);
        if calm == 2 {
            break;
        }
    }
    let per_stream_kib = peak.saturating_sub(baseline) / 200;
    assert!(
        per_stream_kib < 400,
        "each stalled stream holds {per_stream_kib} KiB (RSS {baseline} -> {peak} KiB)"
    );
    // Meanwhile an ordinary client is served.
    assert_eq!(client.get("x", "/").await.status(), 200);
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_named_by_host_name_are_resolved() {
    let a = Backend::start("a").await;
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(&[format!("localhost:{}", a.addr.port())])),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client.get("any", "/").await;
        assert_eq!(
            (resp.status().as_u16(), header(&resp, "x-backend")),
            (200, "a".to_string()),
            "{proto:?}"
        );
    }
}

/// The upstreams builder renders block YAML with quoted, escaped strings, in the order set.
#[test]
fn upstreams_builder_renders_quoted_block_yaml() {
    let yaml = Upstreams::new()
        .server_headers(&["X-G:g"])
        .host(
            "a.test",
            Host::new().sticky_sessions(600).path(
                "/",
                Path::addrs(&["127.0.0.1:1"])
                    .healthcheck(false)
                    .authorization_data("basic", "a\"b\\c"),
            ),
        )
        .render();
    assert_eq!(
        yaml,
        "server_headers:\n  - \"X-G:g\"\nupstreams:\n  \"a.test\":\n    sticky_sessions: 600\n    paths:\n      \"/\":\n        servers:\n          - \"127.0.0.1:1\"\n        healthcheck: false\n        authorization:\n          type: \"basic\"\n          data: \"a\\\"b\\\\c\"\n"
    );
}

#[tokio::test(start_paused = true)]
async fn bodiless_answers_pass_over_every_backend_protocol() {
    // HEAD, 204 and 304 carry no body whatever their Content-Length says; over an HTTP/2
    // backend connection the backend's Content-Length used to surface as a protocol error and
    // the client got RST_STREAM (h2spec generic/4/2 found it).
    let ok = Backend::start("ok").await;
    let empty = Backend::builder("empty").status(204).start().await;
    let unchanged = Backend::builder("unchanged").status(304).start().await;
    for (name, pin) in [("h2c (detected)", ""), ("HTTP/1.1 (pinned)", "http://")] {
        let route = |b: &Backend| Path::addrs(&[format!("{pin}{}", b.addr)]).healthcheck(false);
        let yaml = Upstreams::new()
            .host("ok.test", Host::new().path("/", route(&ok)))
            .host("empty.test", Host::new().path("/", route(&empty)))
            .host("unchanged.test", Host::new().path("/", route(&unchanged)))
            .render();
        let proxy = inproc::Proxy::start(&yaml, "").await;
        for proto in PROTOCOLS {
            let mut c = Client::connect(proto, proxy.addr).await;
            for (method, host, status) in [
                (Method::HEAD, "ok.test", 200),
                (Method::GET, "empty.test", 204),
                (Method::GET, "unchanged.test", 304),
            ] {
                let resp = c
                    .send(method.clone(), Some(host), "/", &[], full(Bytes::new()))
                    .await;
                assert_eq!(resp.status(), status, "{name}, {proto:?}, {method} {host}");
                let body = resp.into_body().collect().await;
                let body = body.unwrap_or_else(|e| panic!("{name}, {proto:?}, {host}: {e}"));
                assert!(body.to_bytes().is_empty());
            }
        }
    }
}

/// Reads from `stream` until `answers` response heads (and what follows them) have come, or the
/// connection closes; everything read, as text.
async fn read_answers(
    stream: &mut tokio::net::TcpStream,
    answers: usize,
    body_of_last: &str,
) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8192];
    let complete = |got: &[u8]| {
        let text = String::from_utf8_lossy(got);
        text.matches("HTTP/1.1 200 OK").count() >= answers && text.ends_with(body_of_last)
    };
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !complete(&got) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    assert!(
        read.await.is_ok(),
        "answers missing: {}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// aralez's own HTTP/1.1 side and hyper's share one keep-alive connection: pipelined GETs and a
/// POST whose body the backend echoes are answered in order, then an HTTP/1.0 request (which
/// aralez hands to hyper, with the bytes it read) and one more HTTP/1.1 request on the same
/// socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_pipelined_requests_bodies_and_a_handover_in_order() {
    use tokio::io::AsyncWriteExt;
    let backend = Backend::start("a").await;
    let proxy = proxy_to(&backend);
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let pipelined = "GET /one HTTP/1.1\r\nHost: a\r\n\r\n\
        POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world\
        GET /three HTTP/1.1\r\nHost: a\r\n\r\n";
    stream.write_all(pipelined.as_bytes()).await.unwrap();
    let text = read_answers(&mut stream, 3, "a").await;
    let uris: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("x-seen-uri: "))
        .collect();
    assert_eq!(uris, ["/one", "/echo", "/three"], "{text}");
    assert!(
        text.contains("hello world"),
        "the body was not echoed: {text}"
    );

    let later = "GET /four HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n\
        GET /five HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    stream.write_all(later.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut rest);
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    assert!(
        read.is_ok(),
        "the connection did not close after Connection: close"
    );
    let rest = String::from_utf8_lossy(&rest);
    let uris: Vec<&str> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("x-seen-uri: "))
        .collect();
    assert_eq!(uris, ["/four", "/five"], "{rest}");
    assert_eq!(rest.matches(" 200 OK\r\n").count(), 2, "{rest}");
}
