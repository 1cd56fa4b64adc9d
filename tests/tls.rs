//! The TLS listener: SNI certificates from the watched directory, hot replacement, broken pairs,
//! grades, HSTS, and proxying over TLS (HTTP/1.1 and h2 by ALPN).

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::{Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::crypto::CryptoProvider;
use rustls::CipherSuite;
use rustls_pki_types::{CertificateDer, ServerName};
use support::*;
use tokio::net::TcpStream;

struct TlsProxy {
    proxy: ProxyProcess,
    tls: SocketAddr,
    certs: tempfile::TempDir,
    roots: Vec<CertificateDer<'static>>,
    _backend: Backend,
}

async fn start(grade: &str) -> TlsProxy {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let roots = vec![
        write_self_signed(certs.path(), "default", &["default.local", "127.0.0.1"]),
        write_self_signed(certs.path(), "alpha", &["alpha.local"]),
        write_self_signed(certs.path(), "wild", &["*.beta.local"]),
    ];
    let (proxy, tls) = start_tls_proxy(&backend, certs.path(), grade);
    TlsProxy {
        proxy,
        tls,
        certs,
        roots,
        _backend: backend,
    }
}

/// Handshakes with `name` as SNI (an IP sends none) and returns the certificate served. Never
/// resumed: a resumed session reports the certificate of the session it resumes, so a check
/// that ran once before a renewal was picked up would see the old certificate for good.
async fn served_cert(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<CertificateDer<'static>> {
    let mut config = (*config).clone();
    config.resumption = rustls::client::Resumption::disabled();
    let config = Arc::new(config);
    let stream = TcpStream::connect(addr).await?;
    let server_name = ServerName::try_from(name.to_string()).expect("name");
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, stream)
        .await?;
    Ok(tls.get_ref().1.peer_certificates().expect("certificate")[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_certificate_and_no_sni_gets_the_default() {
    let t = start("medium").await;
    let config = tls_client_config(&t.roots, &[b"http/1.1"]);
    let cases = [
        ("alpha.local", 1),
        ("x.beta.local", 2),
        ("default.local", 0),
        ("127.0.0.1", 0),
    ];
    for (name, want) in cases {
        let cert = served_cert(t.tls, name, config.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cert, t.roots[want], "{name}");
    }
    // And requests go through, over HTTP/1.1 and h2 (ALPN), and for a client offering only
    // `http/1.0` (refused the handshake, as nginx does not).
    for alpn in [&b"http/1.1"[..], b"h2", b"http/1.0"] {
        let mut client =
            Client::connect_tls(t.tls, "alpha.local", tls_client_config(&t.roots, &[alpn])).await;
        let resp = client.get("alpha.local", "/").await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-backend"), "a");
        assert_eq!(header(&resp, "x-seen-proto"), "https");
        body_bytes(resp).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_pairs_serve_new_handshakes_and_broken_ones_are_skipped() {
    let mut t = start("medium").await;
    let config = tls_client_config(&t.roots, &[b"http/1.1"]);
    // An open connection, made before the change.
    let mut open = Client::connect_tls(t.tls, "alpha.local", config.clone()).await;
    assert_eq!(open.get("alpha.local", "/").await.status(), 200);

    // A FIFO named like a certificate, with no key: reading it waited for a writer for good,
    // and no change was ever picked up again.
    let fifo = t.certs.path().join("pipe.crt");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let new_alpha = write_self_signed(t.certs.path(), "alpha", &["alpha.local"]);
    t.roots.push(new_alpha.clone());
    let config = tls_client_config(&t.roots, &[b"http/1.1"]);
    let started = Instant::now();
    let picked_up = eventually_async(Duration::from_secs(3), || async {
        let served = served_cert(t.tls, "alpha.local", config.clone()).await;
        (served.unwrap() == new_alpha).then_some(())
    })
    .await;
    assert!(
        picked_up.is_some(),
        "the new pair was not picked up; the proxy's log:\n{}",
        t.proxy.log_text()
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        open.get("alpha.local", "/again").await.status(),
        200,
        "the open connection keeps working"
    );

    // A corrupt replacement: the last good copy keeps serving, and the problem is logged.
    std::fs::write(
        t.certs.path().join("alpha.key"),
        "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let logged = eventually(Duration::from_secs(3), || {
        t.proxy.log_text().contains("last good copy keeps serving")
    })
    .await;
    assert!(logged, "{}", t.proxy.log_text());
    assert_eq!(
        served_cert(t.tls, "alpha.local", config.clone())
            .await
            .unwrap(),
        new_alpha
    );
    // A deleted pair goes: its name falls back to the default certificate, which the client
    // rejects as not valid for that name.
    std::fs::remove_file(t.certs.path().join("wild.crt")).unwrap();
    std::fs::remove_file(t.certs.path().join("wild.key")).unwrap();
    let last = std::sync::Mutex::new(String::new());
    let gone = eventually_async(Duration::from_secs(3), || async {
        match served_cert(t.tls, "x.beta.local", config.clone()).await {
            Err(e) if format!("{e:?}").contains("default.local") => Some(()),
            other => {
                *last.lock().unwrap() = format!("{other:?}");
                None
            }
        }
    })
    .await;
    assert!(
        gone.is_some(),
        "the deleted pair still serves: {}",
        last.lock().unwrap()
    );
    let said = t.proxy.log_text();
    assert!(
        said.contains("certificates: pair wild removed (*.beta.local"),
        "{said}"
    );
}

/// A self-signed RSA pair `dir/stem.crt` + `.key` for `names`; returns the certificate.
fn write_self_signed_rsa(
    dir: &std::path::Path,
    stem: &str,
    names: &[&str],
) -> CertificateDer<'static> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("RSA key");
    let cert = rcgen::CertificateParams::new(names)
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    cert.der().clone()
}

/// A self-signed ECDSA pair `dir/stem.crt` + `.key` for `name`, valid from `from` to `to`
/// seconds from now; returns the certificate.
fn write_valid_between(
    dir: &std::path::Path,
    stem: &str,
    name: &str,
    (from, to): (i64, i64),
) -> CertificateDer<'static> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let at = |secs: i64| time::OffsetDateTime::from_unix_timestamp(now + secs).expect("time");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
    (params.not_before, params.not_after) = (at(from), at(to));
    let cert = params.self_signed(&key).expect("certificate");
    std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    cert.der().clone()
}

/// What a pair's validity decides is decided again when it changes, with no file touched: a
/// renewal valid from a few seconds on takes over then. It was decided at the last reload
/// only, so a pair that expired kept serving beside a valid one until something changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_that_becomes_valid_takes_over_when_it_does() {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let day = 86_400;
    let current = write_valid_between(certs.path(), "a-current", "v.local", (-60, day));
    let renewal = write_valid_between(certs.path(), "b-renewal", "v.local", (3, 2 * day));
    let (proxy, tls) = start_tls_proxy(&backend, certs.path(), "medium");
    let config = tls_client_config(&[current.clone(), renewal.clone()], &[b"http/1.1"]);
    let served = served_cert(tls, "v.local", config.clone())
        .await
        .expect("handshake");
    assert_eq!(served, current);
    // Looked at again until it changes, for up to 15 s: the change comes 3 s after the start.
    let taken_over = eventually_async(Duration::from_secs(15), || async {
        let served = served_cert(tls, "v.local", config.clone()).await;
        served.is_ok_and(|cert| cert == renewal).then_some(())
    });
    assert!(taken_over.await.is_some(), "{}", proxy.log_text());
}

/// A client of TLS 1.2 with the given suites only (of aws-lc-rs's).
fn tls12_with_suites(
    roots: &[CertificateDer<'static>],
    suites: &[CipherSuite],
) -> Arc<rustls::ClientConfig> {
    let mut provider: CryptoProvider = rustls::crypto::aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .retain(|s| suites.contains(&s.suite()));
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A name with an ECDSA and an RSA pair (nginx's two `ssl_certificate` lines): a client that
/// can verify ECDSA gets that one, a TLS 1.2 client with RSA suites only gets the RSA one, and
/// both are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_ecdsa_and_rsa_pairs_serves_each_client_one_it_can_use() {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    // Also for 127.0.0.1, which a client sends no SNI for: the fallback (the first pair by
    // file name) then offers its name's two as well.
    let names = ["dual.local", "127.0.0.1"];
    let rsa = write_self_signed_rsa(certs.path(), "dual-rsa", &names);
    let ecdsa = write_self_signed(certs.path(), "dual-ecdsa", &names);
    let (proxy, tls) = start_tls_proxy(&backend, certs.path(), "medium");
    let roots = [rsa.clone(), ecdsa.clone()];
    let rsa_suites = [CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256];
    let ecdsa_suites = [CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256];
    let cases = [
        ("TLS 1.3", tls_client_config(&roots, &[b"http/1.1"]), &ecdsa),
        (
            "TLS 1.2, RSA suites",
            tls12_with_suites(&roots, &rsa_suites),
            &rsa,
        ),
        (
            "TLS 1.2, ECDSA suites",
            tls12_with_suites(&roots, &ecdsa_suites),
            &ecdsa,
        ),
    ];
    for (client, config, want) in cases {
        for name in names {
            let served = served_cert(tls, name, config.clone()).await;
            let served =
                served.unwrap_or_else(|e| panic!("{client} {name}: {e}\n{}", proxy.log_text()));
            assert_eq!(&served, want, "{client} {name}");
        }
        let mut client = Client::connect_tls(tls, "dual.local", config).await;
        assert_eq!(client.get("dual.local", "/").await.status(), 200);
    }
}

/// A client that speaks only TLS 1.2 with AES-128-GCM suites.
fn tls12_aes128_only(roots: &[CertificateDer<'static>]) -> Arc<rustls::ClientConfig> {
    let mut provider: CryptoProvider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites.retain(|s| {
        matches!(
            s.suite(),
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    Arc::new(config)
}

/// `high` (Aralez also spells it `A+`, any case) refuses a TLS 1.2 AES-128 client and adds HSTS.
async fn assert_grade_high(grade: &str) {
    let high = start(grade).await;
    assert!(
        served_cert(high.tls, "alpha.local", tls12_aes128_only(&high.roots))
            .await
            .is_err(),
        "{grade} accepted TLS 1.2 AES-128"
    );
    let mut client = Client::connect_tls(
        high.tls,
        "alpha.local",
        tls_client_config(&high.roots, &[b"http/1.1"]),
    )
    .await;
    let resp = client.get("alpha.local", "/").await;
    assert_eq!(
        header(&resp, "strict-transport-security"),
        "max-age=31536000",
        "{grade}"
    );
}

/// `medium` (Aralez's `a`) accepts that client and adds no HSTS.
async fn assert_grade_medium(grade: &str) {
    let medium = start(grade).await;
    assert!(
        served_cert(medium.tls, "alpha.local", tls12_aes128_only(&medium.roots))
            .await
            .is_ok(),
        "{grade} refused TLS 1.2 AES-128"
    );
    let mut client = Client::connect_tls(
        medium.tls,
        "alpha.local",
        tls_client_config(&medium.roots, &[b"http/1.1"]),
    )
    .await;
    let resp = client.get("alpha.local", "/").await;
    assert!(
        resp.headers().get("strict-transport-security").is_none(),
        "{grade}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grade_high_refuses_weak_clients_and_sends_hsts() {
    assert_grade_high("high").await;
    assert_grade_medium("medium").await;
}

/// The Rust-proxy comparison's Aralez main.yaml says `proxy_tls_grade: a+`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aralez_letter_grades_are_the_grades_they_mean() {
    assert_grade_high("a+").await;
    assert_grade_high("A+").await;
    assert_grade_medium("a").await;
    assert_grade_medium("B").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_https_and_redirect_to() {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "default", &["shop.local"]);
    let yaml = Upstreams::new()
        .host(
            "shop.local",
            Host::new()
                .to_https(true)
                .path("/", Path::servers(&[&backend]).healthcheck(false))
                .path("/old", Path::redirect("https://new.example/")),
        )
        .render();
    let main = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&yaml, &main);
    let tls = proxy.logged_addr("listening on https://");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client.get("shop.local:8080", "/cart?id=7").await;
        assert_eq!(resp.status(), 301, "{proto:?}");
        assert_eq!(
            header(&resp, "location"),
            format!("https://shop.local:{}/cart?id=7", tls.port())
        );
        let resp = client
            .send(
                http::Method::POST,
                Some("shop.local"),
                "/cart",
                &[],
                full("x"),
            )
            .await;
        assert_eq!(resp.status(), 308, "{proto:?}: non-GET keeps its method");
        let resp = client.get("shop.local", "/old/page?q=1").await;
        assert_eq!(
            (resp.status().as_u16(), header(&resp, "location")),
            (301, "https://new.example/old/page?q=1".to_string())
        );
    }
    assert_eq!(
        backend.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "redirects never reach the backend"
    );
    let mut client = Client::connect_tls(
        tls,
        "shop.local",
        tls_client_config(&[root], &[b"http/1.1"]),
    )
    .await;
    let resp = client.get("shop.local", "/cart").await;
    assert_eq!(
        (resp.status().as_u16(), header(&resp, "x-backend")),
        (200, "a".to_string()),
        "over TLS: served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_speak_what_alpn_picks() {
    let h2_backend = start_tls_backend("tls-h2", &[b"h2", b"http/1.1"]).await;
    let h1_backend = start_tls_backend("tls-h1", &[b"http/1.1"]).await;
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new()
                .path("/two", Path::addrs(&[format!("https://{h2_backend}")]))
                .path("/one", Path::addrs(&[format!("https://{h1_backend}")])),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "hc_interval: 1");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for (path, backend, version) in [
            ("/two/x?q=1", "tls-h2", "HTTP/2.0"),
            ("/one/y", "tls-h1", "HTTP/1.1"),
        ] {
            for _ in 0..3 {
                let resp = client.get("app.local", path).await;
                assert_eq!(resp.status(), 200, "{proto:?} {path}");
                assert_eq!(header(&resp, "x-backend"), backend);
                assert_eq!(header(&resp, "x-seen-version"), version, "{proto:?} {path}");
                assert!(
                    header(&resp, "x-seen-uri").ends_with(path),
                    "{}",
                    header(&resp, "x-seen-uri")
                );
                body_bytes(resp).await;
            }
        }
    }
    // Active health checks reach TLS backends too: both stay up. A second probe means the
    // first one's verdict is in.
    let probed_twice = eventually(Duration::from_secs(10), || {
        h2_backend.probes() >= 2 && h1_backend.probes() >= 2
    });
    assert!(probed_twice.await, "the TLS backends were not probed");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(client.get("app.local", "/one").await.status(), 200);
    assert_eq!(client.get("app.local", "/two").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_to_an_https_service() {
    let backend = Backend::start("app").await;
    let auth = start_tls_backend("auth", &[b"http/1.1"]).await;
    let route = Path::servers(&[&backend])
        .healthcheck(false)
        .authorization_data("forward", &format!("https://{auth}/check"));
    let yaml = Upstreams::new()
        .host("DEFAULT", Host::new().path("/", route))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("app.local", "/private").await;
    assert_eq!(resp.status(), 200, "{}", proxy.log_text());
    assert_eq!(header(&resp, "x-backend"), "app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_downloads_bursts_and_flow_control_over_tls_h2() {
    let t = start("medium").await;
    let h2 = tls_client_config(&t.roots, &[b"h2"]);
    // 100 MiB through TLS over h1 and h2, with the proxy's memory flat.
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let mut client =
            Client::connect_tls(t.tls, "alpha.local", tls_client_config(&t.roots, &[alpn])).await;
        body_bytes(client.get("alpha.local", "/big/1048576").await).await;
        let baseline = t.proxy.rss_kib();
        let resp = client
            .get("alpha.local", &format!("/big/{}", 100 * 1024 * 1024))
            .await;
        let mut body = resp.into_body();
        let (mut received, mut peak) = (0usize, baseline);
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            if let Ok(data) = frame.unwrap().into_data() {
                received += data.len();
                if received % (8 << 20) < data.len() {
                    peak = peak.max(t.proxy.rss_kib());
                }
            }
        }
        assert_eq!(received, 100 * 1024 * 1024);
        assert!(
            (peak - baseline) / 1024 < 24,
            "RSS grew {} MiB",
            (peak - baseline) / 1024
        );
    }
    // 1,000 concurrent streams on one h2 connection.
    let client = Client::connect_tls(t.tls, "alpha.local", h2.clone()).await;
    let Client::H2(sender) = client else {
        panic!("ALPN did not pick h2")
    };
    let mut burst = Vec::new();
    for i in 0..1000 {
        let mut s = sender.clone();
        burst.push(tokio::spawn(async move {
            let req = http::Request::get(format!("https://alpha.local/n/{i}"))
                .body(full(""))
                .unwrap();
            s.ready().await.unwrap();
            let resp = s.send_request(req).await.unwrap();
            let status = resp.status();
            body_bytes(resp).await;
            status
        }));
    }
    for task in burst {
        assert_eq!(task.await.unwrap(), 200);
    }
    // A stream whose body is never read does not stall the other streams on the connection.
    let mut client = Client::connect_tls(t.tls, "alpha.local", h2).await;
    let stalled = client
        .get("alpha.local", &format!("/big/{}", 50 * 1024 * 1024))
        .await;
    for i in 0..20 {
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            client.get("alpha.local", &format!("/other/{i}")),
        )
        .await
        .expect("another stream stalled behind an unread one");
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
    }
    drop(stalled);
}

/// Keeps a client's TLS 1.3 tickets in rustls's own store and counts those the server gives.
#[derive(Debug)]
struct CountedTickets {
    store: rustls::client::ClientSessionMemoryCache,
    given: AtomicUsize,
}

impl rustls::client::ClientSessionStore for CountedTickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.store.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.store.kx_hint(name)
    }
    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.store.set_tls12_session(name, value)
    }
    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.store.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.store.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.given.fetch_add(1, Ordering::SeqCst);
        self.store.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.store.take_tls13_ticket(name)
    }
}

/// Two tickets after a full handshake (the client can resume two connections at once), one
/// after each resumption (replacing the ticket it used), as nginx and HAProxy give through
/// OpenSSL; rustls alone would give two every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tickets_after_a_full_handshake_one_after_a_resumption() {
    let t = start("medium").await;
    let tickets = Arc::new(CountedTickets {
        store: rustls::client::ClientSessionMemoryCache::new(8),
        given: AtomicUsize::new(0),
    });
    let mut config = (*tls_client_config(&t.roots, &[b"http/1.1"])).clone();
    config.resumption = rustls::client::Resumption::store(tickets.clone());
    let config = Arc::new(config);
    let mut seen = Vec::new();
    for _ in 0..3 {
        // The tickets come before the answer on the connection, so they are counted by now.
        let kind = alpha_answered(t.tls, config.clone()).await;
        seen.push((kind, tickets.given.load(Ordering::SeqCst)));
    }
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(
        seen,
        [(Some(Full), 2), (Some(Resumed), 3), (Some(Resumed), 4)]
    );
}

/// A handshake for `alpha.local` and one request answered on it: whether the handshake was
/// full or resumed.
async fn alpha_answered(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Option<rustls::HandshakeKind> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("alpha.local").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .unwrap();
    let kind = tls.get_ref().1.handshake_kind();
    let mut client = Client::handshake(Proto::H1, tls).await;
    assert_eq!(client.get("alpha.local", "/").await.status(), 200);
    kind
}

/// Points `link` at `target` by a new link renamed over it, as `ln -sfn` and certbot do.
fn relink(target: &str, link: &std::path::Path) {
    let fresh = link.with_extension("new-link");
    std::os::unix::fs::symlink(target, &fresh).unwrap();
    std::fs::rename(&fresh, link).unwrap();
}

/// The certificate directory as a link moved to where nothing is yet (the release directory
/// is made after the link): what then appears there serves within seconds, with no SIGHUP.
/// Only the link's parent was watched, for the link itself, and the directory's arrival was
/// never seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_link_to_where_nothing_is_yet_serves_what_comes_there() {
    let backend = Backend::start("a").await;
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("v1")).unwrap();
    let mut roots = vec![write_self_signed(&at("v1"), "default", &["default.local"])];
    relink("v1", &at("current"));
    let (proxy, tls) = start_tls_proxy(&backend, &at("current"), "medium");
    relink("v3", &at("current"));
    let seen_gone = || proxy.log_text().contains("pair(s) loaded keep serving");
    let gone = eventually(Duration::from_secs(10), seen_gone).await;
    assert!(gone, "{}", proxy.log_text());
    // The directory comes later, once the watcher has settled on the missing one (made while it
    // still read, it is seen by that read: not the case at fault).
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::create_dir(at("v3")).unwrap();
    let fresh = write_self_signed(&at("v3"), "new", &["new.local"]);
    roots.push(fresh.clone());
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    let picked_up = eventually_async(Duration::from_secs(15), || async {
        let served = served_cert(tls, "new.local", config.clone()).await;
        served.is_ok_and(|cert| cert == fresh).then_some(())
    });
    assert!(picked_up.await.is_some(), "{}", proxy.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_follow_their_links_a_replaced_directory_and_sighup() {
    let backend = Backend::start("a").await;
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    for dir in ["certs", "le/live/b", "le/archive/b"] {
        std::fs::create_dir_all(at(dir)).unwrap();
    }
    // certbot's layout: certs/b.crt -> le/live/b/fullchain.pem -> ../../archive/b/one.crt
    let mut roots = vec![write_self_signed(
        &at("certs"),
        "default",
        &["default.local"],
    )];
    roots.push(write_self_signed(&at("le/archive/b"), "one", &["b.local"]));
    relink("../../archive/b/one.crt", &at("le/live/b/fullchain.pem"));
    relink("../../archive/b/one.key", &at("le/live/b/privkey.pem"));
    relink(
        at("le/live/b/fullchain.pem").to_str().unwrap(),
        &at("certs/b.crt"),
    );
    relink(
        at("le/live/b/privkey.pem").to_str().unwrap(),
        &at("certs/b.key"),
    );
    let (proxy, tls) = start_tls_proxy(&backend, &at("certs"), "medium");
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    assert_eq!(served_cert(tls, "b.local", config).await.unwrap(), roots[1]);

    // A renewal: new files in archive/, the links in live/ moved to them.
    let renewed = write_self_signed(&at("le/archive/b"), "two", &["b.local"]);
    roots.push(renewed.clone());
    relink("../../archive/b/two.crt", &at("le/live/b/fullchain.pem"));
    relink("../../archive/b/two.key", &at("le/live/b/privkey.pem"));
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    let picked_up = eventually_async(Duration::from_secs(10), || async {
        let served = served_cert(tls, "b.local", config.clone()).await;
        (served.unwrap() == renewed).then_some(())
    });
    assert!(picked_up.await.is_some(), "{}", proxy.log_text());

    // SIGHUP reloads them (certbot's deploy hook).
    let reloads = || proxy.log_text().matches("certificates reloaded").count();
    let before = reloads();
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    let reloaded = eventually(Duration::from_secs(10), || reloads() > before);
    assert!(reloaded.await, "{}", proxy.log_text());

    // The directory removed and made again: what is copied into it serves.
    std::fs::remove_dir_all(at("certs")).unwrap();
    std::fs::create_dir(at("certs")).unwrap();
    roots.push(write_self_signed(
        &at("certs"),
        "default",
        &["default.local"],
    ));
    let fresh = write_self_signed(&at("certs"), "c", &["c.local"]);
    roots.push(fresh.clone());
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    let picked_up = eventually_async(Duration::from_secs(10), || async {
        let served = served_cert(tls, "c.local", config.clone()).await;
        served.is_ok_and(|cert| cert == fresh).then_some(())
    });
    assert!(picked_up.await.is_some(), "{}", proxy.log_text());

    // The directory gone for a while (moved away; its replacement moved in later): the pairs
    // loaded keep serving meanwhile, and the replacement's serve once it is there, no SIGHUP.
    std::fs::rename(at("certs"), at("certs.old")).unwrap();
    let seen_gone = || proxy.log_text().contains("pair(s) loaded keep serving");
    assert!(
        eventually(Duration::from_secs(10), seen_gone).await,
        "{}",
        proxy.log_text()
    );
    let still = served_cert(tls, "c.local", config.clone()).await;
    assert_eq!(still.ok(), Some(fresh.clone()), "{}", proxy.log_text());
    std::fs::create_dir(at("certs.new")).unwrap();
    let replacement = write_self_signed(&at("certs.new"), "d", &["d.local"]);
    std::fs::rename(at("certs.new"), at("certs")).unwrap();
    let config = tls_client_config(std::slice::from_ref(&replacement), &[b"http/1.1"]);
    let picked_up = eventually_async(Duration::from_secs(10), || async {
        let served = served_cert(tls, "d.local", config.clone()).await;
        served.is_ok_and(|cert| cert == replacement).then_some(())
    });
    assert!(picked_up.await.is_some(), "{}", proxy.log_text());
}

/// A change made after the certificates were read at start but before the directory was
/// watched (no event will ever tell of it) is read once the watch is set up.
#[tokio::test]
async fn a_change_before_the_watch_began_is_read_when_it_begins() {
    let dir = tempfile::tempdir().unwrap();
    write_self_signed(dir.path(), "a", &["a.local"]);
    let (store, problems) = aralez::tls::CertStore::open(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(store.len(), 1);
    write_self_signed(dir.path(), "b", &["b.local"]);
    let watching = tokio::spawn(aralez::tls::watch(
        store.clone(),
        aralez::tls::CertReload::new(),
    ));
    let read = eventually(Duration::from_secs(10), || store.len() == 2).await;
    watching.abort();
    assert!(read, "the pair added before the watch began was not read");
}

/// A ClientHello whose SNI is an IP address (wrk and h2load send one) is served without a word
/// in the log: rustls warned of each, a line per handshake that any client could send until the
/// disk was full. So is one whose SNI is no DNS name: the default certificate answers it (it
/// was a fatal alert, no certificate and nothing in the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_address_as_sni_fills_no_log() {
    let t = start("medium").await;
    for name in ["9.9.9.9", "a-.test", "a..test", "9.9.9.9"] {
        let out = tokio::task::block_in_place(|| {
            std::process::Command::new("openssl")
                .args([
                    "s_client",
                    "-connect",
                    &t.tls.to_string(),
                    "-servername",
                    name,
                ])
                .stdin(std::process::Stdio::null())
                .output()
                .expect("openssl s_client")
        });
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("BEGIN CERTIFICATE"),
            "{name}: no handshake: {said}"
        );
    }
    // A SIGHUP after them: its line marks that theirs, if any, were written.
    t.proxy.signal(nix::sys::signal::Signal::SIGHUP);
    t.proxy
        .wait_log("configuration files unchanged", Duration::from_secs(10))
        .await;
    assert!(
        !t.proxy.log_text().contains("SNI"),
        "{}",
        t.proxy.log_text()
    );
}

/// A failed handshake is counted by why in `/metrics` and said at `info` with the client and the
/// reason (at most once a second: a scanner makes thousands), as nginx logs each at `info`; it
/// had been said at debug only, and an operator whose chain clients refused saw nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_handshakes_are_counted_by_why_and_said() {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let roots = vec![write_self_signed(certs.path(), "alpha", &["alpha.local"])];
    let main = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nproxy_tls_grade: high\n\
         config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&default_route(&[&backend]), &main);
    let tls = proxy.logged_addr("listening on https://");
    let admin = proxy.logged_addr("admin API on http://");
    // A client that trusts nothing ends the handshake with an alert.
    let distrustful = tls_client_config(&[], &[b"http/1.1"]);
    assert!(served_cert(tls, "alpha.local", distrustful).await.is_err());
    let said = "TLS handshake failed (client_alert)";
    proxy.wait_log(said, Duration::from_secs(5)).await;
    // One that offers only what grade `high` refuses has nothing in common with it.
    assert!(served_cert(tls, "alpha.local", tls12_aes128_only(&roots))
        .await
        .is_err());
    let series = |why: &str| format!("aralez_tls_handshake_failures_total{{reason=\"{why}\"}}");
    let counted = eventually_async(Duration::from_secs(5), || async {
        (metric(admin, &series("incompatible")).await == Some(1.0)).then_some(())
    })
    .await;
    assert!(counted.is_some(), "{}", proxy.log_text());
    assert_eq!(metric(admin, &series("client_alert")).await, Some(1.0));
    assert_eq!(metric(admin, &series("timeout")).await, Some(0.0));
    // And when each pair's certificate expires (rcgen's lasts until 4096).
    let expires = metric(
        admin,
        "aralez_certificate_not_after_seconds{pair=\"alpha\"}",
    )
    .await;
    assert!(expires.is_some_and(|at| at > 4.0e10), "{expires:?}");
}

/// Sessions made under a certificate are not resumed once its pair is replaced (a key replaced
/// in a hurry would otherwise stay trusted by resumption for the tickets' 12 hours); a reload
/// that changes nothing keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_pair_ends_the_sessions_made_under_the_old_one() {
    let t = start("medium").await;
    // The replacement is made aside first, so the client trusts both from the start: only
    // resumption is in question.
    let staged = tempfile::tempdir().unwrap();
    let new_alpha = write_self_signed(staged.path(), "alpha", &["alpha.local"]);
    let mut roots = t.roots.clone();
    roots.push(new_alpha.clone());
    let mut config = (*tls_client_config(&roots, &[b"http/1.1"])).clone();
    let sessions = rustls::client::ClientSessionMemoryCache::new(8);
    config.resumption = rustls::client::Resumption::store(Arc::new(sessions));
    let config = Arc::new(config);
    // The tickets come with the first answer.
    let handshake = || alpha_answered(t.tls, config.clone());
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(handshake().await, Some(Full));
    assert_eq!(handshake().await, Some(Resumed));
    t.proxy.signal(nix::sys::signal::Signal::SIGHUP);
    t.proxy
        .wait_log("certificates reloaded", Duration::from_secs(5))
        .await;
    assert_eq!(handshake().await, Some(Resumed), "nothing changed");

    for file in ["alpha.key", "alpha.crt"] {
        let aside = t.certs.path().join(format!("{file}.new"));
        std::fs::copy(staged.path().join(file), &aside).unwrap();
        std::fs::rename(&aside, t.certs.path().join(file)).unwrap();
    }
    let picked_up = eventually_async(Duration::from_secs(5), || async {
        let served = served_cert(t.tls, "alpha.local", config.clone()).await;
        (served.ok() == Some(new_alpha.clone())).then_some(())
    })
    .await;
    assert!(picked_up.is_some(), "{}", t.proxy.log_text());
    assert_eq!(handshake().await, Some(Full), "{}", t.proxy.log_text());
}
