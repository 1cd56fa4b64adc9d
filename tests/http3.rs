//! HTTP/3 (`http3: true`) through the real binary: quinn + h3 as a client here, and aioquic (a
//! Python HTTP/3 stack from PyPI, `tests/h3/h3_client.py`) as an independent one. Routes,
//! policies and backends are the ones HTTP/1.1 and HTTP/2 use; the TLS listener's certificates
//! (replaced while running); `Alt-Svc` on the TCP TLS listener; metrics and the access log say
//! HTTP/3; SIGTERM lets a request in flight finish.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Method, Request};
use support::tools::{self, Tool};
use support::*;

const AIOQUIC: Tool = Tool {
    env: "ARALEZ_H3_PYTHON",
    installed: "target/judges/h3venv/bin/python",
    on_path: &["aioquic-python"],
};

/// A proxy with HTTP/3 on, certificates for `h3.test` from a test CA, routes to `backend`
/// (`/private` behind an API key).
struct H3Proxy {
    proxy: ProxyProcess,
    pki: TestPki,
    certs: tempfile::TempDir,
    quic: SocketAddr,
    tls: SocketAddr,
}

impl H3Proxy {
    fn start(backend: &Backend) -> H3Proxy {
        H3Proxy::start_with(backend, "")
    }

    /// [`start`](Self::start) with more main.yaml lines.
    fn start_with(backend: &Backend, extra: &str) -> H3Proxy {
        let pki = test_pki(&["h3.test", "other.test"]);
        let certs = tempfile::tempdir().expect("certificate dir");
        std::fs::write(certs.path().join("h3.test.crt"), &pki.leaf_pem).expect("write cert");
        std::fs::write(certs.path().join("h3.test.key"), &pki.leaf_key_pem).expect("write key");
        let yaml = Upstreams::new()
            .host(
                "h3.test",
                Host::new()
                    .path("/", Path::servers(&[backend]).healthcheck(false))
                    .path(
                        "/private",
                        Path::servers(&[backend])
                            .healthcheck(false)
                            .authorization_data("apikey", "s3cret"),
                    )
                    .path(
                        "/limited",
                        Path::servers(&[backend]).healthcheck(false).rate_limit(2),
                    )
                    .path("/moved-away", Path::redirect("https://elsewhere.test/"))
                    .path(
                        "/own-alt-svc",
                        Path::servers(&[backend])
                            .healthcheck(false)
                            .client_headers(&["Alt-Svc:clear"]),
                    ),
            )
            .render();
        let main = format!(
            "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nhttp3: true\nconfig_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\naccess_log: all\n{extra}",
            certs.path().display()
        );
        let proxy = ProxyProcess::start(&yaml, &main);
        let quic = proxy.logged_addr("listening on h3://");
        let tls = proxy.logged_addr("listening on https://");
        H3Proxy {
            proxy,
            pki,
            certs,
            quic,
            tls,
        }
    }

    /// A QUIC connection and its h3 client, trusting `roots`.
    async fn connect(&self, roots: &[rustls_pki_types::CertificateDer<'static>]) -> H3Client {
        self.try_connect(roots).await.expect("an HTTP/3 connection")
    }

    /// [`connect`](Self::connect), `None` when the handshake fails.
    async fn try_connect(
        &self,
        roots: &[rustls_pki_types::CertificateDer<'static>],
    ) -> Option<H3Client> {
        connect_to(self.quic, roots).await
    }
}

/// An HTTP/3 connection to `quic` for `h3.test`, trusting `roots`; `None` when it fails.
async fn connect_to(
    quic: SocketAddr,
    roots: &[rustls_pki_types::CertificateDer<'static>],
) -> Option<H3Client> {
    connect_with(quic, roots, None).await
}

/// [`connect_to`] with the client's own QUIC transport settings.
async fn connect_with(
    quic: SocketAddr,
    roots: &[rustls_pki_types::CertificateDer<'static>],
    transport: Option<quinn::TransportConfig>,
) -> Option<H3Client> {
    {
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add(root.clone()).expect("root");
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_root_certificates(store)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
        let mut endpoint = quinn::Endpoint::client(([127, 0, 0, 1], 0).into()).expect("endpoint");
        let mut client = quinn::ClientConfig::new(Arc::new(crypto));
        if let Some(transport) = transport {
            client.transport_config(Arc::new(transport));
        }
        endpoint.set_default_client_config(client);
        let conn = endpoint.connect(quic, "h3.test").ok()?.await.ok()?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
            .await
            .ok()?;
        let driving = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Some((endpoint, send, driving, conn))
    }
}

/// A client endpoint, its h3 requests, the task driving the connection, the connection.
type H3Client = (
    quinn::Endpoint,
    h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    tokio::task::JoinHandle<()>,
    quinn::Connection,
);

/// One request; the status, headers and whole body.
async fn exchange(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (u16, http::HeaderMap, Bytes) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("https://h3.test{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if !body.is_empty() {
        req = req.header("content-length", body.len());
    }
    let stream = send
        .send_request(req.body(()).expect("request"))
        .await
        .expect("send request");
    // The body goes up while the answer comes down (an echo answers as it reads).
    let (mut up, mut stream) = stream.split();
    let bodiless = body.is_empty();
    let sending = tokio::spawn(async move {
        if !bodiless {
            up.send_data(body).await.expect("send body");
        }
        let finished = up.finish().await;
        // A server may stop reading a bodiless request once its answer is complete (RFC 9114
        // §4.1, with H3_NO_ERROR); a request with a body must go up whole.
        if !bodiless {
            finished.expect("finish");
        }
    });
    let resp = stream.recv_response().await.expect("response");
    let mut got = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.expect("body") {
        got.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    sending.await.expect("the body went up");
    (
        resp.status().as_u16(),
        resp.headers().clone(),
        Bytes::from(got),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_http3_take_the_same_routes_policies_and_backends() {
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start(&backend);
    let (endpoint, mut send, _driving, _conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;

    let (status, headers, body) =
        exchange(&mut send, Method::GET, "/hello", &[], Bytes::new()).await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"h3-backend");
    assert_eq!(headers["x-seen-fwd-host"], "h3.test");
    assert_eq!(headers["x-seen-proto"], "https");
    // The id the backend saw comes back, once.
    let ids: Vec<_> = headers.get_all("x-request-id").iter().collect();
    assert_eq!(ids.len(), 1, "{headers:?}");
    assert_eq!(ids[0].len(), 32);
    assert_eq!(headers["x-seen-request-id"], ids[0]);

    // A 10 MiB body both ways, streamed.
    let big = Bytes::from(vec![7u8; 10 << 20]);
    let (status, _, echoed) = exchange(&mut send, Method::POST, "/echo", &[], big.clone()).await;
    assert_eq!((status, echoed.len()), (200, big.len()));
    assert!(echoed == big);

    // The client moves to another UDP port (a connection migration): the connection goes on.
    let moved = std::net::UdpSocket::bind("127.0.0.1:0").expect("a new UDP socket");
    endpoint.rebind(moved).expect("rebind");
    let (status, _, body) = exchange(&mut send, Method::GET, "/moved", &[], Bytes::new()).await;
    assert_eq!((status, &body[..]), (200, &b"h3-backend"[..]));

    // The route's policy refuses without the key, lets the key through.
    let (status, _, _) = exchange(&mut send, Method::GET, "/private/x", &[], Bytes::new()).await;
    assert_eq!(status, 403);
    let key = [("x-api-key", "s3cret")];
    let (status, _, _) = exchange(&mut send, Method::GET, "/private/x", &key, Bytes::new()).await;
    assert_eq!(status, 200);

    // Connection-specific fields make a request malformed (RFC 9114 §4.2), as over HTTP/2.
    for field in [("connection", "keep-alive"), ("te", "gzip")] {
        let (status, _, _) = exchange(&mut send, Method::GET, "/x", &[field], Bytes::new()).await;
        assert_eq!(status, 400, "{field:?}");
    }
    let trailers = [("te", "trailers")];
    let (status, _, _) = exchange(&mut send, Method::GET, "/x", &trailers, Bytes::new()).await;
    assert_eq!(status, 200);

    // The route's rate limit and redirect, as on every listener.
    let mut limited = Vec::new();
    for _ in 0..24 {
        limited.push(
            exchange(&mut send, Method::GET, "/limited", &[], Bytes::new())
                .await
                .0,
        );
    }
    assert!(
        limited.contains(&200) && limited.contains(&429),
        "{limited:?}"
    );
    let (status, headers, _) =
        exchange(&mut send, Method::GET, "/moved-away", &[], Bytes::new()).await;
    assert_eq!(
        (status, headers["location"].to_str().ok()),
        (301, Some("https://elsewhere.test/moved-away"))
    );

    // 100 requests at once on the one connection.
    let streams = (0..100).map(|i| {
        let mut send = send.clone();
        async move {
            exchange(
                &mut send,
                Method::GET,
                &format!("/n/{i}"),
                &[],
                Bytes::new(),
            )
            .await
            .0
        }
    });
    let statuses = futures_util::future::join_all(streams).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    // An unknown host is the router's 404, as on every listener.
    let (status, _, _) = {
        let req = Request::get("https://nobody.test/")
            .body(())
            .expect("request");
        let mut stream = send.send_request(req).await.expect("send");
        stream.finish().await.expect("finish");
        let resp = stream.recv_response().await.expect("response");
        (resp.status().as_u16(), (), ())
    };
    assert_eq!(status, 404);

    // Metrics and the access log say HTTP/3.
    let admin = h3.proxy.logged_addr("admin API on http://");
    let served = metric(
        admin,
        "aralez_requests_total{method=\"GET\",version=\"HTTP/3\"}",
    )
    .await;
    assert!(served.is_some_and(|n| n >= 104.0), "{served:?}");
    assert!(
        h3.proxy
            .wait_log_count("version=HTTP/3.0", 104, Duration::from_secs(5))
            .await,
        "{}",
        h3.proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_advertises_http3_and_new_connections_get_a_replaced_certificate() {
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start(&backend);
    // Alt-Svc on HTTP/1.1 and HTTP/2 over TLS.
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let config = tls_client_config(std::slice::from_ref(&h3.pki.ca), &[alpn]);
        let mut client = Client::connect_tls(h3.tls, "h3.test", config).await;
        let resp = client.get("h3.test", "/").await;
        let want = format!("h3=\":{}\"; ma=86400", h3.quic.port());
        assert_eq!(resp.headers()["alt-svc"], want.as_str());
        body_bytes(resp).await;
        // Beside an answer's own: in its place, clients were sent where nothing serves HTTP/3.
        let resp = client.get("h3.test", "/own-alt-svc").await;
        let all: Vec<_> = resp.headers().get_all("alt-svc").iter().collect();
        assert_eq!(all, ["clear", want.as_str()], "{alpn:?}");
    }
    // A new pair from another CA replaces the served one: new QUIC connections get it.
    let fresh = test_pki(&["h3.test"]);
    std::fs::write(h3.certs.path().join("h3.test.key"), &fresh.leaf_key_pem).expect("key");
    std::fs::write(h3.certs.path().join("h3.test.crt"), &fresh.leaf_pem).expect("cert");
    let switched = eventually_async(Duration::from_secs(10), || async {
        let roots = std::slice::from_ref(&fresh.ca);
        let attempt = tokio::time::timeout(Duration::from_secs(2), h3.try_connect(roots)).await;
        attempt.ok().flatten()
    })
    .await;
    let (_endpoint, mut send, _driving, _conn) = switched.expect("the new certificate is served");
    let (status, _, _) = exchange(&mut send, Method::GET, "/", &[], Bytes::new()).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_http3_request_in_flight_finish() {
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start(&backend);
    let (_endpoint, mut send, _driving, _conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    let slow = tokio::spawn(async move {
        exchange(&mut send, Method::GET, "/slow/1500", &[], Bytes::new()).await
    });
    assert!(eventually_async(Duration::from_secs(5), || async {
        (backend.requests() >= 1).then_some(())
    })
    .await
    .is_some());
    h3.proxy.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, _, body) = slow.await.expect("the slow request");
    assert_eq!((status, &body[..]), (200, &b"h3-backend"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_an_idle_http3_connection_to_time_out() {
    // An idle connection (its one request done) ends once told to close: the stop waited for
    // the client's idle timeout (here 60 s, past the grace period's 30) before.
    let backend = Backend::start("h3-backend").await;
    let mut h3 = H3Proxy::start_with(&backend, "client_idle_timeout: 60");
    let (_endpoint, mut send, _driving, _conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    let (status, _, _) = exchange(&mut send, Method::GET, "/", &[], Bytes::new()).await;
    assert_eq!(status, 200);
    h3.proxy.signal(nix::sys::signal::Signal::SIGTERM);
    let exited = h3.proxy.wait_exit(Duration::from_secs(15));
    assert!(exited.is_some(), "still running: {}", h3.proxy.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_open_at_exit_are_told_the_connection_closed() {
    // Each client hears the CONNECTION_CLOSE before the process exits: the last connections'
    // close frames were sometimes still queued when the endpoint went, and their clients then
    // waited out their idle timeout (30 s here) to learn it.
    let backend = Backend::start("h3-backend").await;
    let mut h3 = H3Proxy::start(&backend);
    let mut clients = Vec::new();
    for _ in 0..24 {
        let (endpoint, mut send, driving, conn) =
            h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
        let (status, _, _) = exchange(&mut send, Method::GET, "/", &[], Bytes::new()).await;
        assert_eq!(status, 200);
        clients.push((endpoint, send, driving, conn));
    }
    h3.proxy.signal(nix::sys::signal::Signal::SIGTERM);
    let exited = h3.proxy.wait_exit(Duration::from_secs(15));
    assert!(exited.is_some(), "still running: {}", h3.proxy.log_text());
    for (_, _, _, conn) in &clients {
        let ended = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        match ended {
            Ok(quinn::ConnectionError::ApplicationClosed(_)) => {}
            other => panic!("not closed by the proxy: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_client_that_stops_reading_gives_its_backend_connection_back() {
    // A client that never opens its flow-control window again holds its stream only for
    // `client_send_timeout`: it held the stream, and with it the backend's one connection
    // (`upstream_max_connections: 1`), for good, and everyone else got 503.
    let backend = Backend::builder("h3-backend").h1_only().start().await;
    let main = "client_send_timeout: 2\nupstream_max_connections: 1";
    let h3 = H3Proxy::start_with(&backend, main);
    let mut stingy = quinn::TransportConfig::default();
    stingy.stream_receive_window(16_384u32.into());
    stingy.receive_window(65_536u32.into());
    let client = connect_with(h3.quic, std::slice::from_ref(&h3.pki.ca), Some(stingy)).await;
    let (_endpoint, mut send, _driving, _conn) = client.expect("an HTTP/3 connection");
    let req = Request::get("https://h3.test/big/50000000")
        .body(())
        .unwrap();
    let mut stream = send.send_request(req).await.expect("send request");
    stream.finish().await.expect("finish");
    let resp = stream.recv_response().await.expect("response");
    assert_eq!(resp.status(), 200);
    // Nothing more is read: the proxy's writes find no room.
    let mut other = Client::connect_tls(
        h3.tls,
        "h3.test",
        tls_client_config(std::slice::from_ref(&h3.pki.ca), &[b"http/1.1"]),
    )
    .await;
    let until = std::time::Instant::now() + Duration::from_secs(15);
    let mut statuses = Vec::new();
    while std::time::Instant::now() < until {
        let resp = other.get("h3.test", "/").await;
        statuses.push(resp.status().as_u16());
        body_bytes(resp).await;
        if statuses.last() == Some(&200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        statuses.last(),
        Some(&200),
        "{statuses:?}: {}",
        h3.proxy.log_text()
    );
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_request_waiting_for_its_backend_is_not_idle() {
    // QUIC's idle timer was `client_idle_timeout` itself: a request whose backend took longer
    // to answer (within `upstream_response_timeout`) lost its connection, no packet having
    // crossed meanwhile. The connection idles out once it carries no request instead.
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start_with(
        &backend,
        "client_idle_timeout: 1\nupstream_response_timeout: 10",
    );
    let (_endpoint, mut send, _driving, conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    let (status, _, body) = exchange(&mut send, Method::GET, "/slow/2500", &[], Bytes::new()).await;
    assert_eq!((status, &body[..]), (200, &b"h3-backend"[..]));
    let closed = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await;
    assert!(closed.is_ok(), "the idle connection was never closed");
}

#[tokio::test]
async fn an_independent_client_aioquic_gets_the_same_answers() {
    let Some(python) = tools::find(&AIOQUIC) else {
        return;
    };
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start(&backend);
    let ca = h3.certs.path().join("ca.pem");
    std::fs::write(&ca, &h3.pki.ca_pem).expect("write CA");
    let mut requests = vec![
        serde_json::json!({"method": "GET", "path": "/", "authority": "h3.test"}),
        serde_json::json!({"method": "POST", "path": "/echo", "authority": "h3.test", "body_size": 10 << 20}),
        serde_json::json!({"method": "GET", "path": "/private", "authority": "h3.test"}),
        serde_json::json!({"method": "GET", "path": "/", "authority": "nobody.test"}),
    ];
    for i in 0..100 {
        requests.push(
            serde_json::json!({"method": "GET", "path": format!("/n/{i}"), "authority": "h3.test"}),
        );
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/h3_client.py");
    let port = h3.quic.port().to_string();
    let requests = serde_json::Value::Array(requests).to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(["127.0.0.1", &port, "h3.test"])
            .arg(&ca)
            .arg(requests)
            .output()
            .expect("run the aioquic client")
    })
    .await
    .expect("client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(result["alpn"], "h3");
    let answers = result["answers"].as_array().expect("answers");
    assert_eq!(answers[0]["status"], 200, "{}", answers[0]);
    assert_eq!(answers[0]["body_head"], "h3-backend");
    assert_eq!(answers[1]["status"], 200, "{}", answers[1]);
    assert_eq!(answers[1]["body_len"], 10 << 20);
    assert_eq!(answers[1]["body_sha256"], answers[1]["sent_sha256"]);
    assert_eq!(answers[2]["status"], 403, "{}", answers[2]);
    assert_eq!(answers[3]["status"], 404, "{}", answers[3]);
    assert!(answers[4..].iter().all(|a| a["status"] == 200), "{text}");
}

/// [`H3Proxy`] with an upgrade socket in the returned directory, for a live upgrade, and a
/// grace period of 10 s.
fn upgradable(backend: &Backend) -> (H3Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("upgrade.sock");
    let extra = format!(
        "upgrade_sock: \"{}\"\ngrace_period_seconds: 10\n",
        sock.display()
    );
    (H3Proxy::start_with(backend, &extra), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_upgrade_hands_the_quic_socket_over_and_no_request_is_lost() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let backend = Backend::start("h3-backend").await;
    let (mut h3, _dir) = upgradable(&backend);
    let (stop, ok, failed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    // A client that opens a fresh connection for every request.
    let client = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let (quic, ca) = (h3.quic, h3.pki.ca.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let attempt = tokio::time::timeout(Duration::from_secs(15), async {
                    let (_endpoint, mut send, _driving, conn) =
                        connect_to(quic, std::slice::from_ref(&ca)).await?;
                    let req = Request::get("https://h3.test/").body(()).ok()?;
                    let mut stream = send.send_request(req).await.ok()?;
                    stream.finish().await.ok()?;
                    let status = stream.recv_response().await.ok()?.status();
                    while stream.recv_data().await.ok()?.is_some() {}
                    conn.close(0u32.into(), b"done");
                    Some(status)
                })
                .await;
                match attempt {
                    Ok(Some(status)) if status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    let served = |n: usize| {
        let ok = ok.clone();
        async move {
            eventually_async(Duration::from_secs(20), || async {
                (ok.load(Ordering::Relaxed) >= n).then_some(())
            })
            .await
            .is_some()
        }
    };
    assert!(served(20).await, "{}", h3.proxy.log_text());
    let conf = h3.proxy.path("main.yaml");
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    assert!(new.log_text().contains("received"), "{}", new.log_text());
    let before = ok.load(Ordering::Relaxed);
    h3.proxy.signal(nix::sys::signal::Signal::SIGQUIT);
    h3.proxy
        .expect_clean_exit(Duration::from_secs(15), "the old process after SIGQUIT");
    // The new instance answers HTTP/3 on the same port now.
    assert!(served(before + 20).await, "{}", new.log_text());
    stop.store(true, Ordering::Relaxed);
    client.await.expect("client");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "{}\n---\n{}",
        h3.proxy.log_text(),
        new.log_text()
    );
    assert!(new
        .log_text()
        .contains("the previous instance exited; serving HTTP/3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_that_never_completes_is_dropped_and_the_connection_serves_on() {
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start_with(&backend, "client_header_timeout: 1\n");
    let (_endpoint, mut send, _driving, conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    // A request stream with the start of a HEADERS frame (type 0x01, 100 bytes announced) and
    // then nothing more.
    let (mut up, mut down) = conn.open_bi().await.expect("a stream");
    up.write_all(&[0x01, 0x40, 0x64, 0x00, 0x00])
        .await
        .expect("partial head");
    let started = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), down.read_to_end(1024)).await;
    assert!(ended.is_ok(), "the stream is still held after 10 s");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // The connection itself goes on.
    let (status, _, body) = exchange(&mut send, Method::GET, "/", &[], Bytes::new()).await;
    assert_eq!((status, &body[..]), (200, &b"h3-backend"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_live_upgrade_alt_svc_waits_until_http3_is_served() {
    let backend = Backend::start("h3-backend").await;
    let (mut h3, _dir) = upgradable(&backend);
    let alt_svc = || async {
        let config = tls_client_config(std::slice::from_ref(&h3.pki.ca), &[b"http/1.1"]);
        let mut client = Client::connect_tls(h3.tls, "h3.test", config).await;
        let resp = client.get("h3.test", "/").await;
        assert_eq!(resp.status(), 200);
        resp.headers()
            .get("alt-svc")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert!(alt_svc().await.is_some());
    // An HTTP/3 request in flight keeps the old instance draining for a while.
    let (_endpoint, mut send, _driving, _conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    let slow = tokio::spawn(async move {
        let req = Request::get("https://h3.test/slow/2500")
            .body(())
            .expect("request");
        let mut stream = send.send_request(req).await.expect("send");
        stream.finish().await.expect("finish");
        stream.recv_response().await.expect("response").status()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let conf = h3.proxy.path("main.yaml");
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    h3.proxy.signal(nix::sys::signal::Signal::SIGQUIT);
    // The old instance no longer accepts: the new one answers, without offering HTTP/3 yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(alt_svc().await, None, "{}", new.log_text());
    assert_eq!(
        slow.await.expect("the slow request"),
        200,
        "{}",
        h3.proxy.log_text()
    );
    h3.proxy
        .expect_clean_exit(Duration::from_secs(15), "the old process after SIGQUIT");
    let offered = eventually_async(Duration::from_secs(5), || async { alt_svc().await });
    assert!(offered.await.is_some(), "{}", new.log_text());
}

/// An HTTP/3 request body of declared length is read whole before a backend is chosen, as over
/// HTTP/1.1 and HTTP/2 (its size was unknown, so a slow uploader held a backend connection):
/// one that stops coming is a 408 that no backend saw; DATA past its content-length is refused
/// (it was cut silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_bodies_are_read_ahead_and_held_to_their_length() {
    let backend = Backend::start("h3-backend").await;
    let h3 = H3Proxy::start_with(&backend, "upstream_response_timeout: 1\n");
    let (_endpoint, mut send, _driving, _conn) = h3.connect(std::slice::from_ref(&h3.pki.ca)).await;
    let before = backend.requests();
    let req = Request::post("https://h3.test/collect")
        .header("content-length", "10")
        .body(())
        .expect("request");
    let mut stream = send.send_request(req).await.expect("send request");
    stream
        .send_data(Bytes::from_static(b"01234"))
        .await
        .expect("half the body");
    let resp = tokio::time::timeout(Duration::from_secs(10), stream.recv_response()).await;
    let resp = resp.expect("an answer").expect("a response");
    assert_eq!(resp.status(), 408);
    assert_eq!(
        backend.requests(),
        before,
        "the backend saw the stalled upload"
    );
    // More DATA than the declared length: refused, not cut to it.
    let req = Request::post("https://h3.test/collect")
        .header("content-length", "4")
        .body(())
        .expect("request");
    let mut stream = send.send_request(req).await.expect("send request");
    stream
        .send_data(Bytes::from_static(b"0123456789"))
        .await
        .expect("the body");
    stream.finish().await.expect("finish");
    let resp = stream.recv_response().await.expect("a response");
    assert_eq!(resp.status(), 400);
}

/// A client that leaves (closes its connection, or resets a request's stream) while its
/// request waits for a slow backend, or while the backend is slow with the body, gives the
/// backend's connection back at once, as over HTTP/1.1 and HTTP/2: with
/// `upstream_max_connections: 1` every other client got 503 until the backend answered (up to
/// `upstream_response_timeout`), and the request was logged 200. It is logged 499 now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_client_that_leaves_gives_its_backend_connection_back() {
    let backend = Backend::builder("h3-backend").h1_only().start().await;
    let h3 = H3Proxy::start_with(&backend, "upstream_max_connections: 1");
    let ca = std::slice::from_ref(&h3.pki.ca);
    let mut other =
        Client::connect_tls(h3.tls, "h3.test", tls_client_config(ca, &[b"http/1.1"])).await;
    for (path, leave) in [
        ("/slow/30000", "close"),
        ("/slow/30000", "reset"),
        ("/pause/30000", "close"),
    ] {
        let (_endpoint, mut send, _driving, conn) = h3.connect(ca).await;
        let reached_before = backend.requests();
        let req = Request::get(format!("https://h3.test{path}"))
            .body(())
            .unwrap();
        let mut stream = send.send_request(req).await.expect("send request");
        if path.starts_with("/pause") {
            let resp = stream.recv_response().await.expect("response");
            assert_eq!(resp.status(), 200);
            let first = stream
                .recv_data()
                .await
                .expect("body")
                .expect("a first piece");
            assert_eq!(first.chunk(), b"first,");
        } else {
            // The request reaches the backend and holds its one connection.
            let held = eventually(Duration::from_secs(5), || {
                backend.requests() > reached_before
            });
            assert!(held.await, "{path}: never reached the backend");
        }
        let before = backend.requests();
        match leave {
            "close" => conn.close(0u32.into(), b"bye"),
            _ => stream.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED),
        }
        let started = std::time::Instant::now();
        let mut statuses = Vec::new();
        while started.elapsed() < Duration::from_secs(5) {
            let resp = other.get("h3.test", "/").await;
            statuses.push(resp.status().as_u16());
            body_bytes(resp).await;
            if statuses.last() == Some(&200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            statuses.last(),
            Some(&200),
            "{path} ({leave}): {statuses:?}: {}",
            h3.proxy.log_text()
        );
        assert!(backend.requests() > before);
        drop(stream);
    }
    let left = || {
        let log = h3.proxy.log_text();
        let lines = log.lines();
        lines
            .filter(|l| l.contains("target=\"/slow/30000\"") && l.contains(" status=499 "))
            .count()
    };
    let logged = eventually(Duration::from_secs(5), || left() == 2);
    assert!(logged.await, "{}", h3.proxy.log_text());
}
