//! How the proxy speaks to backends (SPEC §6.3), through the binary with real backends:
//! detection for backends given without a scheme (TLS by handshake with ALPN, h2c by the HTTP/2
//! preface, else HTTP/1.1), detection redone when a backend changes, pinned schemes,
//! certificate verification with `upstream_tls_verify`, and a second HTTP/2 connection when
//! the first is full.

use crate::support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use support::*;

/// A host whose "/" goes to `server`, health-checked every second (which is what makes the
/// proxy detect a bare address's protocol).
fn probed(server: impl std::fmt::Display) -> Host {
    Host::new().path("/", Path::addrs(&[server]).hc_interval(1))
}

/// A host whose "/" goes to `server`, without health checks.
fn unprobed(server: impl std::fmt::Display) -> Host {
    Host::new().path("/", Path::addrs(&[server]).healthcheck(false))
}

/// GET / on `host`: (status, backend name, HTTP version the backend saw).
async fn seen(client: &mut Client, host: &str) -> (u16, String, String) {
    let resp = client.get(host, "/").await;
    let status = resp.status().as_u16();
    (
        status,
        header(&resp, "x-backend"),
        header(&resp, "x-seen-version"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_without_a_scheme_are_detected() {
    let h1 = Backend::builder("h1").h1_only().start().await;
    let h2c = Backend::start("h2c").await;
    let tls_h2 = start_tls_backend("tls-h2", &[b"h2", b"http/1.1"]).await;
    let tls_h1 = start_tls_backend("tls-h1", &[b"http/1.1"]).await;
    // A backend is one object however many routes use it, so the unprobed one stands alone.
    let lone = Backend::start("unprobed").await;
    let yaml = Upstreams::new()
        .host("h1.local", probed(h1.addr))
        .host("h2c.local", probed(h2c.addr))
        .host("tlsh2.local", probed(&tls_h2))
        .host("tlsh1.local", probed(&tls_h1))
        // Pinned by its scheme: HTTP/1.1 although the backend would speak h2c.
        .host("pinned.local", probed(format!("http://{}", h2c.addr)))
        // Detected on first use whether or not health checks run (issue 12).
        .host("unprobed.local", unprobed(lone.addr))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let expected = [
        ("h1.local", "h1", "HTTP/1.1"),
        ("h2c.local", "h2c", "HTTP/2.0"),
        ("tlsh2.local", "tls-h2", "HTTP/2.0"),
        ("tlsh1.local", "tls-h1", "HTTP/1.1"),
        ("pinned.local", "h2c", "HTTP/1.1"),
        ("unprobed.local", "unprobed", "HTTP/2.0"),
    ];
    for (host, backend, version) in expected {
        for _ in 0..3 {
            let got = seen(&mut client, host).await;
            assert_eq!(got, (200, backend.into(), version.into()), "{host}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_is_redone_when_a_backend_changes_protocol() {
    let plain = Backend::builder("plain").h1_only().start().await;
    let addr = plain.addr;
    let yaml = Upstreams::new().host("swap.local", probed(addr)).render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let first = seen(&mut client, "swap.local").await;
    assert_eq!(first, (200, "plain".into(), "HTTP/1.1".into()));

    // The same port now serves TLS with h2: the cached "plain" answer stops working.
    plain.stop();
    drop(plain);
    let acceptor = tls_backend_acceptor(&[b"h2", b"http/1.1"]);
    serve_tls_backend("tls", acceptor, addr).await;
    let start = Instant::now();
    // The same client connection throughout (shared with the polling closure).
    let shared = tokio::sync::Mutex::new(client);
    let last = eventually_async(Duration::from_secs(10), || async {
        let got = seen(&mut *shared.lock().await, "swap.local").await;
        (got.0 == 200).then_some(got)
    })
    .await;
    let mut client = shared.into_inner();
    assert_eq!(last, Some((200, "tls".into(), "HTTP/2.0".into())));
    eprintln!("re-detected as TLS after {:?}", start.elapsed());
    for _ in 0..5 {
        assert_eq!(seen(&mut client, "swap.local").await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_health_checks_off_by_reload_keeps_detection() {
    let backend = Backend::start("h2c").await;
    let checked = Upstreams::new()
        .host("flip.local", probed(backend.addr))
        .render();
    let unchecked = Upstreams::new()
        .host("flip.local", unprobed(backend.addr))
        .render();
    let proxy = ProxyProcess::start(&checked, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(
        seen(&mut client, "flip.local").await,
        (200, "h2c".into(), "HTTP/2.0".into()),
        "detected while health-checked"
    );
    // Without health checks the backend is still spoken to in the protocol it was found to
    // speak: detection does not depend on health checks (an h2-only gRPC backend on a route with
    // `healthcheck: false` must not get HTTP/1.1).
    write_atomically(&proxy.path("upstreams.yaml"), &unchecked);
    let applied = eventually(Duration::from_secs(5), || {
        proxy.log_text().contains("configuration applied")
    })
    .await;
    assert!(applied, "no reload: {}", proxy.log_text());
    for _ in 0..3 {
        let got = seen(&mut client, "flip.local").await;
        assert_eq!(got, (200, "h2c".into(), "HTTP/2.0".into()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_verify_checks_chain_and_name() {
    let pki = test_pki(&["backend.local"]);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let chain = vec![pki.leaf.clone(), pki.ca.clone()];
    let acceptor = tls_acceptor_for(chain, pki.leaf_key.clone_key(), &[b"h2", b"http/1.1"]);
    let trusted = serve_tls_backend("trusted", acceptor.clone(), any_local()).await;
    // The same server again, for a route whose host its certificate does not name (one backend
    // object per address: connections are shared by every route that uses it).
    let misnamed = serve_tls_backend("trusted", acceptor.clone(), any_local()).await;
    // And once more for a route with health checks: its probes ask for the name its requests
    // do (they asked for the backend's address, failed verification, and held it down).
    let checked = serve_tls_backend("checked", acceptor, any_local()).await;
    let stranger = start_tls_backend("stranger", &[b"h2", b"http/1.1"]).await;
    let to = |server: &TlsBackend, verify: bool| {
        Path::addrs(&[format!("https://{server}")])
            .healthcheck(false)
            .upstream_tls_verify(verify)
    };
    let yaml = Upstreams::new()
        .host(
            "backend.local",
            Host::new()
                .path("/trusted", to(&trusted, true))
                .path("/stranger", to(&stranger, true))
                .path("/unverified", to(&stranger, false))
                .path(
                    "/checked",
                    Path::addrs(&[format!("https://{checked}")]).upstream_tls_verify(true),
                ),
        )
        // The name checked is the SNI, the request's host: the certificate does not cover it.
        .host("other.local", Host::new().path("/", to(&misnamed, true)))
        // The checked backend on the same path for a host its certificate does not name: its
        // probes ask for that host, and fail, and must not take the backend out of the route
        // of the host they pass for (one probe asking one of the names decided for both).
        .host(
            "aaa.local",
            Host::new().path(
                "/checked",
                Path::addrs(&[format!("https://{checked}")]).upstream_tls_verify(true),
            ),
        )
        .render();
    let ca = ca_file.to_str().unwrap();
    let proxy = ProxyProcess::start_env(&yaml, "hc_interval: 1", &[("SSL_CERT_FILE", ca)]);
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    // Three health rounds: the checked route stays in rotation.
    let rounds = std::time::Instant::now();
    while rounds.elapsed() < std::time::Duration::from_millis(3_000) {
        let resp = client.get("backend.local", "/checked").await;
        assert_eq!(resp.status(), 200, "{}", proxy.log_text());
        body_bytes(resp).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let cases = [
        ("backend.local", "/trusted", 200, "trusted"),
        ("backend.local", "/stranger", 502, ""),
        ("backend.local", "/unverified", 200, "stranger"),
        ("other.local", "/", 502, ""),
        ("aaa.local", "/checked", 503, ""),
    ];
    for (host, path, status, backend) in cases {
        let resp = client.get(host, path).await;
        assert_eq!(resp.status().as_u16(), status, "{host}{path}");
        assert_eq!(header(&resp, "x-backend"), backend, "{host}{path}");
    }
}

/// Sends `count` requests for `path` at once on one h2 connection; returns their statuses.
async fn burst(
    sender: &hyper::client::conn::http2::SendRequest<ClientBody>,
    count: usize,
    path: &str,
) -> Vec<u16> {
    let requests = (0..count).map(|_| {
        let mut sender = sender.clone();
        let req = http::Request::get(format!("http://h2.local{path}"))
            .body(full(bytes::Bytes::new()))
            .unwrap();
        async move {
            sender.ready().await.unwrap();
            sender.send_request(req).await.unwrap().status().as_u16()
        }
    });
    join_all(requests).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_h2_connection_gets_another_at_the_backends_stream_limit() {
    // The backend allows 10 streams per connection (its SETTINGS say so).
    let backend = Backend::builder("h2").h2c_limited(10).start().await;
    let server = format!("h2c://{}", backend.addr);
    let yaml = Upstreams::new().host("h2.local", unprobed(server)).render();
    let proxy = ProxyProcess::start(&yaml, "");
    let Client::H2(sender) = Client::connect(Proto::H2c, proxy.addr).await else {
        unreachable!("h2 client")
    };
    let accepts = || backend.accepts.load(std::sync::atomic::Ordering::SeqCst);
    // 25 slow requests at once: three connections (10 + 10 + 5), not one and not 25.
    let statuses = burst(&sender, 25, "/slow/400").await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(accepts(), 3);
    // Later requests reuse those connections.
    let statuses = burst(&sender, 20, "/").await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(accepts(), 3);
}

/// An HTTP/1.1 client's `TE: trailers`, spelled in capitals or repeated, reaches an HTTP/2
/// backend as one lowercase `trailers` (an HTTP/2 client refuses any other spelling, and the
/// request would fail), also when it lists other codings beside it; a `TE` without it is
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn te_reaches_an_h2_backend_as_one_lowercase_trailers() {
    let backend = Backend::start("h2c").await;
    let server = format!("h2c://{}", backend.addr);
    let yaml = Upstreams::new().host("h2.local", unprobed(server)).render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[("te", "trailers")], "trailers"),
        (&[("te", "trailers"), ("te", "Trailers")], "trailers"),
        (&[("te", "TRAILERS")], "trailers"),
        (&[("te", "trailers, gzip")], "trailers"),
        (&[("te", "gzip")], "-"),
    ];
    for (te, seen) in cases {
        let resp = client
            .send(http::Method::GET, Some("h2.local"), "/", te, full(""))
            .await;
        assert_eq!(resp.status(), 200, "{te:?}");
        assert_eq!(header(&resp, "x-seen-version"), "HTTP/2.0", "{te:?}");
        assert_eq!(header(&resp, "x-seen-te"), seen, "{te:?}");
        body_bytes(resp).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_backend_connection_is_reused_streams_both_ways_and_is_dropped_when_closed() {
    let backend = Backend::builder("h1").h1_only().start().await;
    let yaml = Upstreams::new()
        .host("h1.local", unprobed(format!("http://{}", backend.addr)))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let accepts = || backend.accepts.load(std::sync::atomic::Ordering::SeqCst);
    for proto in [Proto::H1, Proto::H2c] {
        let mut client = Client::connect(proto, proxy.addr).await;
        for _ in 0..50 {
            assert_eq!(seen(&mut client, "h1.local").await.0, 200, "{proto:?}");
        }
        // 1 MiB up and echoed back down on the pooled connection.
        let total = 1024 * 1024;
        let resp = client
            .send(
                http::Method::POST,
                Some("h1.local"),
                "/echo",
                &[],
                generated_body(total),
            )
            .await;
        assert_eq!(resp.status(), 200, "{proto:?}");
        assert_eq!(body_bytes(resp).await.len(), total, "{proto:?}");
    }
    // One worker serves both clients in turn: one connection was enough for all of it.
    assert!(accepts() <= 2, "{} backend connections", accepts());
    // The backend closes every connection (its pooled one included) and comes back on the same
    // address: the next request finds the closed one, drops it, and is answered on a new one.
    let addr = backend.addr;
    backend.stop();
    drop(backend);
    let again = Backend::builder("h1-again").h1_only().start_on(addr).await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let got = seen(&mut client, "h1.local").await;
    assert_eq!((got.0, got.1.as_str()), (200, "h1-again"));
    assert_eq!(again.accepts.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A TLS backend that closes without TLS's `close_notify` after an answer whose body ends with
/// the connection (HTTP/1.0, no `Content-Length`): the whole body reaches the client and the
/// answer ends cleanly, as nginx and curl take it. It was cut with an error after its last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_backend_that_closes_without_close_notify_ends_its_answer() {
    let acceptor = tls_backend_acceptor(&[b"http/1.1"]);
    use tokio::io::AsyncWriteExt;
    let addr = serve_tls(acceptor, any_local(), |mut tls| async move {
        support::scripted::read_head(&mut tls).await;
        let answer = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nall of the body";
        let _ = tls.write_all(answer).await;
        let _ = tls.flush().await;
        // The TCP connection ends here, with no TLS close_notify before it.
        let (tcp, _) = tls.into_inner();
        drop(tcp);
    })
    .await;
    let routes = Upstreams::new()
        .host("t.test", unprobed(format!("https://{addr}")))
        .render();
    let proxy = ProxyProcess::start(&routes, "");
    for proto in [Proto::H1, Proto::H2c] {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client.get("t.test", "/").await;
        assert_eq!(resp.status(), 200, "{proto:?}");
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| b.to_bytes());
        let body = body.unwrap_or_else(|e| panic!("{proto:?}: the answer was cut: {e}"));
        assert_eq!(&body[..], b"all of the body", "{proto:?}");
    }
    assert!(
        !proxy.log_text().contains("was cut"),
        "{}",
        proxy.log_text()
    );
}

/// A backend that refuses the handshake with a TLS alert (a TLS 1.1-only server refuses 1.2
/// and 1.3 with `protocol_version`) speaks TLS: detected as TLS, not as plain HTTP/1.1 (whose
/// requests such a server answers with its "plain HTTP sent to an HTTPS port" 400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_refusing_the_handshake_with_an_alert_is_detected_as_tls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = serve_tcp(any_local(), |mut tcp| async move {
        let mut buf = [0u8; 2048];
        if matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {
            // A fatal protocol_version alert, as a TLS 1.1-only server sends.
            let _ = tcp
                .write_all(&[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46])
                .await;
        }
    })
    .await;
    let routes = Upstreams::new().host("t.test", unprobed(addr)).render();
    let proxy = ProxyProcess::start(&routes, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("t.test", "/").await;
    assert_eq!(resp.status(), 502);
    body_bytes(resp).await;
    proxy
        .wait_log("backend protocol detected", Duration::from_secs(5))
        .await;
    let log = proxy.log_text();
    assert!(log.contains("protocol=\"tls\""), "{log}");
}

/// A backend given without a scheme whose certificate `upstream_tls_verify` refuses is known
/// to speak TLS: its protocol is not detected again every few health rounds (a probe found it
/// 167 times in 16 minutes, each said in the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_certificate_does_not_send_the_backend_back_to_detection() {
    let stranger = start_tls_backend("stranger", &[b"http/1.1"]).await;
    let path = Path::addrs(&[stranger.addr])
        .hc_interval(1)
        .upstream_tls_verify(true);
    let yaml = Upstreams::new()
        .host("s.test", Host::new().path("/", path))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    proxy
        .wait_log("backend protocol detected", Duration::from_secs(5))
        .await;
    // Five health rounds: three refusals in a row sent it back to detection.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = proxy.log_text();
    assert_eq!(proxy.log_count("backend protocol detected"), 1, "{log}");
    assert_eq!(proxy.log_count("will be detected again"), 0, "{log}");
}

/// An h2c backend that answers with a head h2 refuses (a field name in capitals) sent no valid
/// HTTP: the client's 502 and the log say so. It was "the backend closed the connection before
/// answering", and the log line said only "http2 error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_http2_answer_is_said_to_be_no_valid_http() {
    use support::frame::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = serve_tcp(any_local(), |mut tcp| async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let mut answered = false;
        let _ = tcp.write_all(&h2_frame(SETTINGS, 0, 0, &[])).await;
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            let after = seen.strip_prefix(PREFACE).unwrap_or(&[]);
            for f in frames(after) {
                if f.kind == SETTINGS && f.flags & ACK == 0 && !answered {
                    let _ = tcp.write_all(&h2_frame(SETTINGS, ACK, 0, &[])).await;
                }
                if f.kind == HEADERS && !answered {
                    answered = true;
                    // `:status: 200`, then `X-Up: 1`, a name in capitals.
                    let mut block = vec![0x88, 0x00, 0x04];
                    block.extend_from_slice(b"X-Up");
                    block.extend_from_slice(&[0x01, b'1']);
                    let flags = END_HEADERS | END_STREAM;
                    let _ = tcp
                        .write_all(&h2_frame(HEADERS, flags, f.stream, &block))
                        .await;
                }
            }
        }
    })
    .await;
    let routes = Upstreams::new()
        .host("h2.test", unprobed(format!("h2c://{addr}")))
        .render();
    let proxy = ProxyProcess::start(&routes, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("h2.test", "/").await;
    assert_eq!(resp.status(), 502);
    let body = String::from_utf8_lossy(&body_bytes(resp).await).into_owned();
    assert!(
        body.contains("not valid HTTP"),
        "{body}\n{}",
        proxy.log_text()
    );
    let log = proxy.log_text();
    assert!(!log.contains("backend reset: http2 error\n"), "{log}");
}
