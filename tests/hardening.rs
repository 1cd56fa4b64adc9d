//! Probes from the adversarial review (issue 13), each sent the way it was reproduced against
//! the binary, through the in-process proxy on tokio's paused clock: raw request heads over TCP
//! where the client library would refuse to send them.

use crate::inproc;
use crate::policies_support;
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use inproc::Proxy;
use policies_support::AuthService;
use support::{Backend, Host, Path, Upstreams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends a raw request head (the connection is closed after it) and returns the whole answer.
async fn exchange(addr: SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "no answer to {head:?}");
    String::from_utf8_lossy(&got).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

/// The value of `name` in a raw answer ("" when absent).
fn header_of(answer: &str, name: &str) -> String {
    answer
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn host_headers_missing_or_twice_are_refused() {
    let backend = Backend::start("b").await;
    let open = Path::servers(&[&backend]).healthcheck(false);
    let yaml = Upstreams::new()
        .host("a.test", Host::new().path("/", open.clone()))
        .host("DEFAULT", Host::new().path("/", open))
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let twice = "GET / HTTP/1.1\r\nHost: a.test\r\nHost: evil.test\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, twice).await), 400);
    let none = "GET / HTTP/1.1\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, none).await), 400);
    assert_eq!(backend.requests(), 0, "neither reached a backend");
    // HTTP/1.0 may leave Host out: it is routed to DEFAULT...
    let old = "GET / HTTP/1.0\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, old).await), 200);
    // ...but a to_https route with no host to send it to fails closed instead of serving plain.
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::servers(&[&backend]).to_https(true)),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let served_before = backend.requests();
    assert_eq!(status(&exchange(proxy.addr, old).await), 400);
    assert_eq!(backend.requests(), served_before);
    let with_host = "GET /x HTTP/1.0\r\nHost: s.test\r\n\r\n";
    let answer = exchange(proxy.addr, with_host).await;
    assert_eq!(status(&answer), 301);
    assert_eq!(header_of(&answer, "location"), "https://s.test/x");
}

#[tokio::test(start_paused = true)]
async fn h2c_upgrades_are_refused() {
    let backend = Backend::start("b").await;
    let yaml = support::default_route(&[&backend]);
    let proxy = Proxy::start(&yaml, "").await;
    let smuggle =
        "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings, close\r\n\
                   Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let answer = exchange(proxy.addr, smuggle).await;
    assert_eq!(status(&answer), 200, "{answer}");
    let seen = header_of(&answer, "x-seen-headers");
    assert!(!seen.contains("upgrade"), "the backend saw {seen}");
    assert!(!seen.contains("http2-settings"), "the backend saw {seen}");
    // Without `Connection` listing it, HTTP2-Settings is still never forwarded.
    let bare =
        "GET / HTTP/1.1\r\nHost: a.test\r\nHTTP2-Settings: AAMA\r\nConnection: close\r\n\r\n";
    let seen = header_of(&exchange(proxy.addr, bare).await, "x-seen-headers");
    assert!(!seen.contains("http2-settings"), "the backend saw {seen}");
}

#[tokio::test(start_paused = true)]
async fn password_guessing_meets_the_4xx_limit() {
    let backend = Backend::start("b").await;
    let yaml = Upstreams::new()
        .host(
            "basic.test",
            Host::new().x4xx_limit(5).path(
                "/",
                Path::servers(&[&backend])
                    .healthcheck(false)
                    .authorization_data("basic", "ann:secret"),
            ),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let guess = "GET / HTTP/1.1\r\nHost: basic.test\r\nAuthorization: Basic YW5uOndyb25n\r\nConnection: close\r\n\r\n";
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(status(&exchange(proxy.addr, guess).await));
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
    // Even the right password waits for a quiet second.
    let right = "GET / HTTP/1.1\r\nHost: basic.test\r\nAuthorization: Basic YW5uOnNlY3JldA==\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, right).await), 429);
    proxy.pass(Duration::from_millis(1001)).await;
    assert_eq!(status(&exchange(proxy.addr, right).await), 200);
}

/// The rate limit counts requests auth refuses: it ran after auth, so guesses were never
/// limited (nor the calls to a forward-auth service). Credentials given twice are a 400.
#[tokio::test(start_paused = true)]
async fn password_guessing_meets_the_rate_limit() {
    let backend = Backend::start("b").await;
    let yaml = Upstreams::new()
        .host(
            "basic.test",
            Host::new().path(
                "/",
                Path::servers(&[&backend])
                    .healthcheck(false)
                    .rate_limit(2)
                    .authorization_data("basic", "ann:secret"),
            ),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let guess = "GET / HTTP/1.1\r\nHost: basic.test\r\nAuthorization: Basic YW5uOndyb25n\r\nConnection: close\r\n\r\n";
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(status(&exchange(proxy.addr, guess).await));
    }
    assert_eq!(statuses, [401, 401, 429, 429, 429]);
    proxy.pass(Duration::from_millis(1001)).await;
    let twice = "GET / HTTP/1.1\r\nHost: basic.test\r\nAuthorization: Basic YW5uOnNlY3JldA==\r\nAuthorization: Basic YW5uOndyb25n\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, twice).await), 400);
}

#[tokio::test(start_paused = true)]
async fn a_connection_header_cannot_strip_forward_auth_identity() {
    let backend = Backend::start("b").await;
    let auth = AuthService::start().await;
    let forward = format!("http://{}/check", auth.addr);
    let yaml = Upstreams::new()
        .host(
            "fwd.test",
            Host::new().path(
                "/",
                Path::servers(&[&backend])
                    .healthcheck(false)
                    .authorization_data("forward", &forward),
            ),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let head = "GET /ok HTTP/1.1\r\nHost: fwd.test\r\nConnection: Remote-User, X-Auth-Groups, close\r\n\r\n";
    let answer = exchange(proxy.addr, head).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert_eq!(header_of(&answer, "x-seen-remote-user"), "alice");
    assert_eq!(header_of(&answer, "x-seen-auth-groups"), "staff");
    // Spelled with `_`, the client's own reached the backend, which CGI-style servers read as
    // the auth service's (`REMOTE_USER`).
    let head = "GET /ok HTTP/1.1\r\nHost: fwd.test\r\nRemote_User: root\r\nX_Auth_Groups: admins\r\nConnection: close\r\n\r\n";
    let answer = exchange(proxy.addr, head).await;
    assert_eq!(status(&answer), 200, "{answer}");
    let names = header_of(&answer, "x-seen-headers");
    assert!(!names.contains('_'), "{names}");
    assert_eq!(header_of(&answer, "x-seen-remote-user"), "alice");
}

#[tokio::test(start_paused = true)]
async fn tokens_in_the_query_never_reach_the_access_log() {
    let backend = Backend::start("b").await;
    let logs = tempfile::tempdir().unwrap();
    let log_file = logs.path().join("access.log");
    let main = format!("access_log: all\nlog_file: \"{}\"", log_file.display());
    let proxy = Proxy::start(&support::default_route(&[&backend]), &main).await;
    let head = "GET /a?x=1&araleztoken=eyJhbGciOi.secret-claims.signature&y=2 HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, head).await), 200);
    proxy.ctx.access_log.flush();
    let text = std::fs::read_to_string(&log_file).unwrap();
    assert!(
        text.contains("target=\"/a?x=1&araleztoken=REDACTED&y=2\""),
        "{text}"
    );
    assert!(!text.contains("secret-claims"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn the_file_server_hides_dotfiles_however_encoded_and_stays_in_its_folder() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sub/.git")).unwrap();
    std::fs::write(root.path().join("sub/.env"), "SECRET=1").unwrap();
    std::fs::write(root.path().join("sub/.git/config"), "[core]").unwrap();
    std::fs::write(root.path().join("sub/page.txt"), "page").unwrap();
    std::fs::write(outside.path().join("hostname"), "elsewhere").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("outlink")).unwrap();
    std::os::unix::fs::symlink(root.path().join("sub"), root.path().join("inlink")).unwrap();
    // FIFOs: opening one blocks until a writer comes (each request held a blocking thread).
    let fifo = |path: std::path::PathBuf| {
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
    };
    fifo(root.path().join("sub/pipe"));
    std::fs::create_dir_all(root.path().join("piped")).unwrap();
    fifo(root.path().join("piped/index.html"));
    let listener = support::proxy_listener();
    let addr = listener.local_addr().unwrap();
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let limits = aralez::server::Limits {
        header_timeout: Duration::from_secs(5),
        max_header_bytes: 16 * 1024,
        max_connections: 16,
        keepalive: None,
        grace_period: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(60),
        backend_wait: Duration::from_secs(60),
        max_streams: 16,
    };
    let folder = root.path().to_path_buf();
    let logs = (limits, aralez::accesslog::AccessLog::default());
    tokio::spawn(aralez::fileserver::serve(listener, folder, logs, stop_rx));
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n");
    for hidden in [
        "/sub/.env",
        "/sub%2F.env",
        "/sub%2f.git%2Fconfig",
        "/sub/%2Eenv",
        "/sub%5C.env",
        "/outlink/hostname",
        "/sub/pipe",
        "/piped/",
    ] {
        let answer = exchange(addr, &get(hidden)).await;
        assert_eq!(status(&answer), 404, "{hidden}: {answer}");
        assert!(!answer.contains("SECRET") && !answer.contains("elsewhere"));
    }
    // A link that stays inside the folder still works, as does the plain file.
    assert_eq!(status(&exchange(addr, &get("/sub/page.txt")).await), 200);
    assert_eq!(status(&exchange(addr, &get("/inlink/page.txt")).await), 200);
}

#[tokio::test(start_paused = true)]
async fn paths_cannot_slip_past_a_protected_prefix() {
    // `/` is open, `/admin` needs a key; each probe reached the backend as `/admin` before.
    let backend = Backend::start("b").await;
    let to = || Path::servers(&[&backend]).healthcheck(false);
    let yaml = Upstreams::new()
        .host(
            "app.test",
            Host::new()
                .path("/", to())
                .path("/admin", to().authorization_data("apikey", "k")),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let get =
        |path: &str| format!("GET {path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n");
    for (path, want) in [
        ("/admin;x", 400),
        ("/public/..;/admin", 400),
        ("/public/../admin", 400),
        ("/admin%2Fsecret", 400),
        ("/admin%5Csecret", 400),
        ("/admin\\secret", 400),
        // Malformed escapes (found by fuzzing): `/%61dmin%4%34` is `/admin%44` decoded once and
        // `/adminD` decoded twice.
        ("/%61dmin%4%34", 400),
        ("/public%", 400),
        ("/ADMIN", 403),
        ("/Admin/secret", 403),
        ("/admin", 403),
        ("/public", 200),
    ] {
        assert_eq!(
            status(&exchange(proxy.addr, &get(path)).await),
            want,
            "{path}"
        );
    }
    assert_eq!(backend.requests(), 1, "only /public reached the backend");
}

/// The admin API in the test's runtime, with `master_key` (or none).
async fn admin_api(proxy: &Proxy, master_key: Option<&str>) -> SocketAddr {
    let listener = support::proxy_listener();
    let addr = listener.local_addr().unwrap();
    let admin = std::sync::Arc::new(aralez::admin::Admin {
        reloader: proxy.ctx.reloader.clone(),
        master_key: master_key.map(str::to_string),
        config_api_enabled: true,
        metrics: proxy.ctx.metrics.clone(),
        metrics_key: None,
        history: Default::default(),
        cache: None,
        shared_limits: None,
        cluster: None,
        acme: None,
        certificates: None,
        conf_turn: Default::default(),
    });
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    let limits = aralez::process::limits(&proxy.main);
    tokio::spawn(aralez::admin::serve(listener, admin, None, limits, stop_rx));
    addr
}

#[tokio::test(start_paused = true)]
async fn the_admin_api_never_buffers_much_for_strangers() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&support::default_route(&[&backend]), "").await;
    let keyed = admin_api(&proxy, Some("k")).await;
    let keyless = admin_api(&proxy, None).await;
    // Announcing a huge body gets an answer at once, before any byte of it is read.
    let huge = |addr| async move {
        let head =
            "POST /jwt HTTP/1.1\r\nHost: a\r\nContent-Length: 4000000\r\nConnection: close\r\n\r\n";
        status(&exchange(addr, head).await)
    };
    assert_eq!(huge(keyless).await, 403, "no master key: nothing to read");
    assert_eq!(huge(keyed).await, 413, "a /jwt body is at most 4 KiB");
    let wrong = "POST /jwt HTTP/1.1\r\nHost: a\r\nx-api-key: nope\r\nContent-Length: 100\r\nConnection: close\r\n\r\n";
    assert_eq!(
        status(&exchange(keyed, wrong).await),
        403,
        "a wrong header key"
    );
    let conf =
        "POST /conf HTTP/1.1\r\nHost: a\r\nContent-Length: 4000000\r\nConnection: close\r\n\r\n";
    assert_eq!(
        status(&exchange(keyed, conf).await),
        403,
        "/conf checks its key first"
    );
    // A body that stalls is given up after 10 s.
    let started = tokio::time::Instant::now();
    let stalled =
        "POST /jwt HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"mas";
    assert_eq!(status(&exchange(keyed, stalled).await), 408);
    assert!(started.elapsed() >= Duration::from_secs(10));
    // The real thing still works.
    let body = r#"{"master_key":"k","owner":"ops","valid":10}"#;
    let good = format!(
        "POST /jwt HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(status(&exchange(keyed, &good).await), 201);
}

/// `POST /conf` bodies are read and applied one at a time: parsing holds about 50 times a
/// body's size, and sixteen posted at once held 1.5 GB. A second body waits for the first (here
/// one that stalls until its 10 s are up); one that waits 30 s gets a 503.
#[tokio::test(start_paused = true)]
async fn conf_bodies_are_read_and_applied_one_at_a_time() {
    let backend = Backend::start("b").await;
    let proxy = Proxy::start(&support::default_route(&[&backend]), "").await;
    let admin = admin_api(&proxy, Some("k")).await;
    let started = tokio::time::Instant::now();
    let stalled = "POST /conf HTTP/1.1\r\nHost: a\r\nx-api-key: k\r\nContent-Length: 1000\r\nConnection: close\r\n\r\nupstreams:";
    let first = tokio::spawn(async move {
        let answer = exchange(admin, stalled).await;
        (status(&answer), started.elapsed())
    });
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let yaml = support::default_route(&[&backend]);
    let good = format!(
        "POST /conf HTTP/1.1\r\nHost: a\r\nx-api-key: k\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{yaml}",
        yaml.len()
    );
    let answer = exchange(admin, &good).await;
    let (second, second_at) = (status(&answer), started.elapsed());
    let (first, first_at) = first.await.unwrap();
    assert_eq!((first, second), (408, 200), "{answer}");
    assert!(second_at >= first_at, "the second body was applied at {second_at:?}, before the first's turn ended at {first_at:?}");
    // Four stalled bodies ahead, each given its 10 s in turn: the next waits 30 s for its turn,
    // then gets a 503.
    let mut holders = Vec::new();
    for _ in 0..4 {
        let mut holder = TcpStream::connect(admin).await.unwrap();
        holder.write_all(stalled.as_bytes()).await.unwrap();
        holders.push(holder);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut late = TcpStream::connect(admin).await.unwrap();
    late.write_all(good.as_bytes()).await.unwrap();
    let mut waited = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), late.read_to_end(&mut waited));
    assert!(read.await.is_ok(), "no answer");
    let waited = String::from_utf8_lossy(&waited);
    assert_eq!(status(&waited), 503, "{waited}");
    assert!(
        waited.to_ascii_lowercase().contains("retry-after: 5"),
        "{waited}"
    );
}

/// A TLS backend that answers `x-seen-sni` (the server name of its connection) and, with
/// `only`, fails every handshake for another name, as servers with name-based certificates do.
async fn sni_backend(only: Option<&str>) -> SocketAddr {
    use rustls::server::{ClientHello, ResolvesServerCert};
    use rustls::sign::CertifiedKey;
    #[derive(Debug)]
    struct Names {
        cert: std::sync::Arc<CertifiedKey>,
        only: Option<String>,
    }
    impl ResolvesServerCert for Names {
        fn resolve(&self, hello: ClientHello<'_>) -> Option<std::sync::Arc<CertifiedKey>> {
            let name = hello.server_name().unwrap_or("");
            match &self.only {
                Some(only) if only != name => None,
                _ => Some(self.cert.clone()),
            }
        }
    }
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key).unwrap();
    let certified = std::sync::Arc::new(CertifiedKey::new(vec![cert.der().clone()], signer));
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(std::sync::Arc::new(Names {
            cert: certified,
            only: only.map(str::to_string),
        }));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    support::serve_tls(acceptor, support::any_local(), |tls| async move {
        let sni = tls.get_ref().1.server_name().unwrap_or("-").to_string();
        let svc = hyper::service::service_fn(move |_req| {
            let sni = sni.clone();
            async move {
                let resp = http::Response::builder()
                    .header("x-seen-sni", sni)
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        let io = hyper_util::rt::TokioIo::new(tls);
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, svc)
            .await;
    })
    .await
}

fn get_host(host: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

#[tokio::test(start_paused = true)]
async fn client_chosen_names_cannot_take_a_tls_backend_down() {
    let strict = sni_backend(Some("localhost")).await;
    let server = format!("https://localhost:{}", strict.port());
    let to = || Path::addrs(&[server.as_str()]).healthcheck(false);
    let yaml = Upstreams::new()
        .host("app.test", Host::new().path("/", to()))
        .host("DEFAULT", Host::new().path("/", to()))
        .render();
    let proxy = Proxy::start(&yaml, "hc_interval: 30").await;
    // Made-up hosts land on DEFAULT, which asks for the backend by its own name.
    for n in 0..10 {
        let answer = exchange(proxy.addr, &get_host(&format!("made-up-{n}.example"))).await;
        assert_eq!(status(&answer), 200, "{answer}");
        assert_eq!(header_of(&answer, "x-seen-sni"), "localhost");
    }
    // A named route presents its host, which this backend refuses: 502 each time...
    for _ in 0..5 {
        assert_eq!(
            status(&exchange(proxy.addr, &get_host("app.test")).await),
            502
        );
    }
    // ...and those refusals did not mark the backend down for everyone else.
    let answer = exchange(proxy.addr, &get_host("someone.example")).await;
    assert_eq!(status(&answer), 200, "{answer}");
}

#[tokio::test(start_paused = true)]
async fn pooled_tls_connections_are_kept_per_server_name() {
    let any_name = sni_backend(None).await;
    let server = format!("https://localhost:{}", any_name.port());
    let to = || Path::addrs(&[server.as_str()]).healthcheck(false);
    let yaml = Upstreams::new()
        .host("a.test", Host::new().path("/", to()))
        .host("b.test", Host::new().path("/", to()))
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let mut client = support::Client::connect(support::Proto::H1, proxy.addr).await;
    for host in ["a.test", "b.test", "a.test", "b.test"] {
        let resp = client.get(host, "/").await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            support::header(&resp, "x-seen-sni"),
            host,
            "a session of another name"
        );
        support::body_bytes(resp).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_gets_no_more_connections_than_its_limit() {
    let backend = Backend::start("b").await;
    let pinned = format!("http://{}", backend.addr);
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(&[pinned]).healthcheck(false)),
        )
        .render();
    let proxy = Proxy::start(&yaml, "upstream_max_connections: 2").await;
    let mut calls = Vec::new();
    for _ in 0..3 {
        let addr = proxy.addr;
        calls.push(tokio::spawn(async move {
            let slow = "GET /slow/2000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
            status(&exchange(addr, slow).await)
        }));
        tokio::task::yield_now().await;
    }
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 200, 503],
        "the third found both connections busy"
    );
    assert!(
        backend.accepts() <= 2,
        "{} backend connections",
        backend.accepts()
    );
    // Once they are free again, requests flow.
    let again = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&exchange(proxy.addr, again).await), 200);
}
