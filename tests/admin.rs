//! The admin API through the real binary: keys, /conf, /jwt, /status, /metrics.

use crate::support;

use std::time::Duration;

use http::Method;
use support::*;

fn routes(set: &[&Backend]) -> String {
    Upstreams::new()
        .host("DEFAULT", Host::new().path("/", Path::servers(set)))
        .render()
}

/// The admin address the proxy logged.
fn admin_addr(proxy: &ProxyProcess) -> std::net::SocketAddr {
    proxy.logged_addr("admin API on http://")
}

async fn call(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut client = Client::connect(Proto::H1, addr).await;
    let resp = client
        .send(method, Some("admin"), path, headers, full(body.to_string()))
        .await;
    let status = resp.status().as_u16();
    (
        status,
        String::from_utf8_lossy(&body_bytes(resp).await).into_owned(),
    )
}

/// A GET of `path` with the master key.
async fn keyed_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    call(addr, Method::GET, path, &[("x-api-key", "s3cret")], "").await
}

async fn served_by(proxy: &ProxyProcess) -> String {
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("any", "/").await;
    let name = header(&resp, "x-backend");
    body_bytes(resp).await;
    name
}

/// `POST /jwt` with `body`; returns the status and the answer.
async fn ask_for_token(admin: std::net::SocketAddr, body: &str) -> (u16, String) {
    call(admin, Method::POST, "/jwt", &[], body).await
}

/// `RUST_LOG` showing aralez's debug lines (the proxy's own filter otherwise).
const DEBUG_LOG: &str = "info,aralez=debug,h2=warn,hyper=warn";

/// What the file watcher logs (at debug) when a change event leaves the files as they were.
const UNCHANGED: &str = "configuration files unchanged";

const ADMIN: &str =
    "config_address: \"127.0.0.1:0\"\nconfig_api_enabled: true\nmaster_key: \"s3cret\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_checks_the_key() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let admin = admin_addr(&proxy);
    let cases: [(Method, &str, &str, u16); 3] = [
        (Method::GET, "/status?all", "", 200),
        (Method::GET, "/metrics", "", 200),
        (Method::POST, "/conf", &routes(&[&a]), 200),
    ];
    for (method, path, body, ok) in cases {
        let (status, _) = call(admin, method.clone(), path, &[], body).await;
        assert_eq!(status, 403, "{method} {path} without a key");
        let (status, _) = call(admin, method.clone(), path, &[("x-api-key", "wrong")], body).await;
        assert_eq!(status, 403, "{method} {path} with a wrong key");
        for good in [("x-api-key", "s3cret"), ("authorization", "Bearer s3cret")] {
            let (status, text) = call(admin, method.clone(), path, &[good], body).await;
            assert_eq!(status, ok, "{method} {path} with {good:?}: {text}");
        }
        let with_query = if path.contains('?') {
            format!("{path}&key=s3cret")
        } else {
            format!("{path}?key=s3cret")
        };
        assert_eq!(
            call(admin, method.clone(), &with_query, &[], body).await.0,
            ok,
            "{method} {path}?key="
        );
    }
    let (_, status_json) = call(
        admin,
        Method::GET,
        "/status?all",
        &[("x-api-key", "s3cret")],
        "",
    )
    .await;
    let parsed: serde_json::Value = serde_json::from_str(&status_json).unwrap();
    assert_eq!(parsed["routes"][0]["host"], "DEFAULT");
    assert_eq!(
        parsed["routes"][0]["backends"][0]["address"],
        a.addr.to_string()
    );
    assert_eq!(parsed["routes"][0]["backends"][0]["up"], true);
    let (_, metrics) = keyed_get(admin, "/metrics").await;
    assert!(metrics.contains("aralez_requests_total"), "{metrics}");
    // A HEAD says the length its GET would (it said none).
    let mut lengths = Vec::new();
    for method in [Method::HEAD, Method::GET] {
        let mut client = Client::connect(Proto::H1, admin).await;
        let key = [("x-api-key", "s3cret")];
        let resp = client
            .send(method, Some("admin"), "/status", &key, full(""))
            .await;
        lengths.push(header(&resp, "content-length"));
        body_bytes(resp).await;
    }
    assert!(
        !lengths[0].is_empty() && lengths[0] == lengths[1],
        "{lengths:?}"
    );
    // The three accepted POST /conf calls above count as applied reloads from the API.
    let api_applied = metrics
        .lines()
        .find(|l| l.starts_with("aralez_config_reloads_total{source=\"api\",result=\"applied\"}"));
    assert_eq!(
        api_applied.and_then(|l| l.rsplit(' ').next()),
        Some("3"),
        "{metrics}"
    );
    // The refusals above are said, with who asked (key guessing went unseen); the log is read
    // as the process writes it, so it is waited for. At most one line a second with a count of
    // the rest: the refusals module's paused-clock test.
    proxy.wait_log("admin API: ", Duration::from_secs(5)).await;
    let log = proxy.log_text();
    let said: Vec<&str> = log.lines().filter(|l| l.contains("admin API: ")).collect();
    assert!(
        said.first()
            .is_some_and(|l| l.contains("GET \"/status\" from 127.0.0.1:")
                && l.contains("refused (403 Forbidden)")),
        "{log}"
    );
    // Every refusal is told, the burst's last ones a second on though no request follows
    // (they had waited for the next refusal, and a burst of guesses showed as one).
    let told_all = eventually(Duration::from_secs(5), || {
        refusals_told(&proxy.log_text()) == 6
    });
    assert!(told_all.await, "{}", proxy.log_text());
}

/// How many refusals the admin API's lines tell: one for each line of a refusal, and the
/// counts of the rest.
fn refusals_told(log: &str) -> u64 {
    let number_before = |line: &str, words: &str, opener: char| -> Option<u64> {
        let before = &line[..line.find(words)?];
        before.rsplit(opener).next()?.parse().ok()
    };
    log.lines()
        .filter(|l| l.contains("admin API: "))
        .map(|l| match l.contains("refused (") {
            true => 1 + number_before(l, " more since the last report", '(').unwrap_or(0),
            false => number_before(l, " more requests refused", ' ').unwrap_or(0),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_validates_fully_and_save_writes_the_file_once() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    // Debug logs for aralez: the file watcher says when it finds the file unchanged.
    let proxy = ProxyProcess::start_env(&routes(&[&a]), ADMIN, &[("RUST_LOG", DEBUG_LOG)]);
    let admin = admin_addr(&proxy);
    let key = [("x-api-key", "s3cret")];
    let broken = "upstreams:\n  DEFAULT:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:0\"]}\n      \"/x\": {servers: [\"nohost\"]}\n";
    let (status, text) = call(admin, Method::POST, "/conf", &key, broken).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("POST /conf:4:") && text.contains("POST /conf:5:"),
        "every error with its line: {text}"
    );
    assert_eq!(
        served_by(&proxy).await,
        "a",
        "a rejected body changes nothing"
    );
    // An empty body, or comments only (a template that rendered nothing), is no "no routes".
    for empty in ["", "# rendered from nothing\n\n"] {
        let (status, text) = call(admin, Method::POST, "/conf", &key, empty).await;
        assert_eq!(status, 400, "{empty:?}: {text}");
        assert!(text.contains("the body is empty"), "{text}");
    }
    // The refusals are logged too (the broken body's two errors, each empty body's line).
    let logged = proxy.wait_log_count(
        "configuration rejected, nothing changed",
        4,
        Duration::from_secs(5),
    );
    assert!(logged.await, "{}", proxy.log_text());
    assert_eq!(
        proxy.log_count("configuration rejected, nothing changed: the body is empty"),
        2
    );
    let file = proxy.path("upstreams.yaml");
    let before_file = std::fs::read_to_string(&file).unwrap();

    // Applied without ?save: live at once, the file untouched.
    let (status, text) = call(admin, Method::POST, "/conf", &key, &routes(&[&b])).await;
    assert_eq!((status, text.trim()), (200, "applied"));
    assert_eq!(served_by(&proxy).await, "b");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before_file);
    // Applied with warnings: they are answered and logged (they went nowhere).
    let pathless = format!("{}  extra.test:\n    paths: {{}}\n", routes(&[&b]));
    let (status, text) = call(admin, Method::POST, "/conf", &key, &pathless).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("applied, with warnings:"), "{text}");
    assert!(text.contains("extra.test"), "{text}");
    proxy
        .wait_log("source=\"POST /conf\"", Duration::from_secs(5))
        .await;
    let (status, _) = call(admin, Method::POST, "/conf", &key, &routes(&[&b])).await;
    assert_eq!(status, 200);

    // With ?save: the file holds exactly the body, and the watcher does not apply it a second time.
    // The watcher's check at start-up has run (it found the file unchanged), so the next
    // "unchanged" line is its answer to the save's rename.
    proxy.wait_log(UNCHANGED, Duration::from_secs(5)).await;
    // The answer to the POST above can come before its "configuration applied" line is read
    // from the proxy's output: wait for that line (the one that takes extra.test away), or the
    // count below may miss it.
    proxy
        .wait_log("hosts removed: extra.test", Duration::from_secs(5))
        .await;
    let (applied_before, unchanged_before) = (
        proxy.log_count("configuration applied"),
        proxy.log_count(UNCHANGED),
    );
    let (status, _) = call(admin, Method::POST, "/conf?save", &key, &routes(&[&a])).await;
    assert_eq!(status, 200);
    assert_eq!(served_by(&proxy).await, "a");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), routes(&[&a]));
    let watcher_done = eventually(Duration::from_secs(5), || {
        proxy.log_count(UNCHANGED) > unchanged_before
            || proxy.log_count("configuration applied") > applied_before + 1
    });
    assert!(
        watcher_done.await,
        "the watcher never looked at the saved file"
    );
    assert_eq!(
        proxy.log_text().matches("configuration applied").count(),
        applied_before + 1,
        "{}",
        proxy.log_text()
    );
    let leftovers: Vec<_> = std::fs::read_dir(proxy.dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // A body that routes nothing but does not say so (a bare `{}`) changes nothing.
    let (status, text) = call(admin, Method::POST, "/conf", &key, "{}\n").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("routes nothing"), "{text}");
    // A body as large as a file may be (here 5 MiB) is taken: a file the watch applies can be
    // posted and pushed too (4 MiB were refused).
    let padded = format!(
        "{}{}",
        routes(&[&b]),
        "# padding\n".repeat(5 * 1024 * 1024 / 10)
    );
    let (status, text) = call(admin, Method::POST, "/conf", &key, &padded).await;
    assert_eq!((status, text.trim()), (200, "applied"));
    // A body announced past 8 MiB is refused before a byte of it is read (the answer comes
    // while the client would still be sending, so the head alone is sent here).
    let mut raw = tokio::net::TcpStream::connect(admin).await.unwrap();
    let head =
        "POST /conf HTTP/1.1\r\nHost: a\r\nx-api-key: s3cret\r\nContent-Length: 8388609\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut raw, head.as_bytes())
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tokio::io::AsyncReadExt::read_exact(&mut raw, &mut answer)
        .await
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413");
}

/// A key written unquoted as a number is the text written: `master_key: 0123` was YAML's number
/// (and the key the operator wrote was refused); so is a route's `apikey` data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_written_as_a_number_is_the_text_written() {
    let a = Backend::start("a").await;
    let routes = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::servers(&[&a]).healthcheck(false)),
        )
        .render()
        .replace(
            "healthcheck: false",
            "healthcheck: false\n        authorization: {type: apikey, data: 0777}",
        );
    assert!(routes.contains("data: 0777"), "{routes}");
    let proxy = ProxyProcess::start(
        &routes,
        "config_address: \"127.0.0.1:0\"\nmaster_key: 0123 # unquoted",
    );
    let admin = admin_addr(&proxy);
    let status = |key: &'static str| async move {
        call(admin, Method::GET, "/status", &[("x-api-key", key)], "")
            .await
            .0
    };
    assert_eq!(
        (
            status("0123").await,
            status("83").await,
            status("123").await
        ),
        (200, 403, 403)
    );
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for (key, want) in [("0777", 200), ("777", 403)] {
        let resp = client
            .send(
                Method::GET,
                Some("any"),
                "/",
                &[("x-api-key", key)],
                full(""),
            )
            .await;
        assert_eq!(resp.status(), want, "{key}");
        body_bytes(resp).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_issues_hs256_tokens_for_the_master_key_only() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let admin = admin_addr(&proxy);
    let (status, _) = ask_for_token(admin, r#"{"master_key":"nope","owner":"ci","valid":5}"#).await;
    assert_eq!(status, 403);
    let (status, _) = ask_for_token(admin, "not json").await;
    assert_eq!(status, 400);
    let (status, body) =
        ask_for_token(admin, r#"{"master_key":"s3cret","owner":"ci","valid":5}"#).await;
    assert_eq!(status, 201, "{body}");
    let token = serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_required_spec_claims(&["exp"]);
    let decoded = jsonwebtoken::decode::<serde_json::Value>(
        &token,
        &jsonwebtoken::DecodingKey::from_secret(b"s3cret"),
        &validation,
    )
    .unwrap();
    assert_eq!(decoded.claims["owner"], "ci");
    let ttl = decoded.claims["exp"].as_u64().unwrap() - decoded.claims["iat"].as_u64().unwrap();
    assert_eq!(ttl, 300);
    // `exp` is accepted in place of `valid`.
    let (status, _) = ask_for_token(admin, r#"{"master_key":"s3cret","owner":"ci","exp":1}"#).await;
    assert_eq!(status, 201);
    // A validity out of 1 minute to a year is refused with the range, not quietly changed.
    for valid in [0, 525_601, 100_000_000] {
        let body = format!(r#"{{"master_key":"s3cret","owner":"ci","valid":{valid}}}"#);
        let (status, text) = ask_for_token(admin, &body).await;
        assert_eq!(status, 400, "{valid}: {text}");
        assert!(text.contains("from 1 to 525600"), "{text}");
    }
    let body = r#"{"master_key":"s3cret","owner":"ci","valid":525600}"#;
    assert_eq!(ask_for_token(admin, body).await.0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_master_key_or_with_the_api_disabled_the_answer_is_403_and_why() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(
        &routes(&[&a]),
        "config_address: \"127.0.0.1:0\"\nconfig_api_enabled: true",
    );
    let admin = admin_addr(&proxy);
    for path in ["/status", "/conf"] {
        let method = if path == "/conf" {
            Method::POST
        } else {
            Method::GET
        };
        let (status, text) = call(admin, method, path, &[("x-api-key", "anything")], "").await;
        assert_eq!(status, 403);
        assert!(text.contains("no master_key is configured"), "{text}");
    }
    let proxy = ProxyProcess::start(
        &routes(&[&a]),
        "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"",
    );
    let admin = admin_addr(&proxy);
    let (status, text) = call(
        admin,
        Method::POST,
        "/conf",
        &[("x-api-key", "k")],
        &routes(&[&a]),
    )
    .await;
    assert_eq!(status, 403);
    assert!(text.contains("config_api_enabled"), "{text}");
    assert_eq!(
        call(admin, Method::GET, "/status", &[("x-api-key", "k")], "")
            .await
            .0,
        200
    );
}

/// Over HTTP/2 a refusal waits for the request's body (as nginx reads and discards it), so the
/// stream ends as the client ends it: answered first, it was reset (`RST_STREAM(NO_ERROR)`)
/// under a body still going up, and Debian 12's curl reported a framing error, not the 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_refusal_waits_for_the_body_still_coming() {
    let a = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "admin", &["admin.local"]);
    let (_proxy, addr) = start_admin_over_tls(&a, certs.path());
    let config = tls_client_config(&[root], &[b"h2"]);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("admin.local").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let (send, connection) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post("https://admin.local/conf")
        .header("x-api-key", "wrong")
        .body(())
        .unwrap();
    let (answer, mut body) = send.send_request(req, false).expect("request head");
    body.send_data(
        bytes::Bytes::from_static(
            b"upstreams: {}
",
        ),
        false,
    )
    .expect("first part");
    tokio::time::sleep(Duration::from_millis(300)).await;
    body.send_data(
        bytes::Bytes::from_static(
            b"# the end
",
        ),
        true,
    )
    .expect("the rest of the body: the stream was not reset under it");
    let resp = answer.await.expect("the answer");
    assert_eq!(resp.status(), 403);
    let mut got = Vec::new();
    let mut answer_body = resp.into_body();
    while let Some(chunk) = answer_body.data().await {
        got.extend_from_slice(&chunk.expect("the answer's body, whole"));
    }
    assert!(String::from_utf8_lossy(&got).contains("wrong key"));

    // A body of megabytes is read to its end too (it was reset past 64 KiB).
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post("https://admin.local/conf")
        .header("x-api-key", "wrong")
        .body(())
        .unwrap();
    let (answer, mut body) = send.send_request(req, false).expect("request head");
    // Sent as the window opens: a stream reset under it has no room to give.
    let mut left = 3usize << 20;
    while left > 0 {
        body.reserve_capacity(left.min(64 * 1024));
        let room = std::future::poll_fn(|cx| body.poll_capacity(cx)).await;
        let room = room.expect("the stream ended under the body");
        let room = room.expect("the stream was reset under the body");
        let piece = room.min(left);
        left -= piece;
        body.send_data(bytes::Bytes::from(vec![b'#'; piece]), left == 0)
            .expect("the stream was reset under the body");
    }
    let resp = answer.await.expect("the answer");
    assert_eq!(resp.status(), 403);
}

/// The proxy with the admin API over TLS, on `certs`' `admin.crt` and `admin.key`; its address.
fn start_admin_over_tls(
    backend: &Backend,
    certs: &std::path::Path,
) -> (ProxyProcess, std::net::SocketAddr) {
    let main = format!(
        "{ADMIN}\nconfig_tls_address: \"127.0.0.1:0\"\nconfig_tls_certificate: \"{0}/admin.crt\"\nconfig_tls_key_file: \"{0}/admin.key\"",
        certs.display()
    );
    let proxy = ProxyProcess::start(&routes(&[backend]), &main);
    let addr = proxy.logged_addr("admin API on https://");
    (proxy, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_tls_checks_keys_the_same_way() {
    let a = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "admin", &["admin.local"]);
    let (proxy, addr) = start_admin_over_tls(&a, certs.path());
    let config = tls_client_config(&[root], &[b"http/1.1"]);
    let cases: [(&[(&str, &str)], u16); 3] = [
        (&[], 403),
        (&[("x-api-key", "wrong")], 403),
        (&[("authorization", "Bearer s3cret")], 200),
    ];
    for (headers, want) in cases {
        let mut client = Client::connect_tls(addr, "admin.local", config.clone()).await;
        let resp = client
            .send(
                Method::GET,
                Some("admin.local"),
                "/status?live",
                headers,
                full(""),
            )
            .await;
        assert_eq!(resp.status().as_u16(), want, "{headers:?}");
        body_bytes(resp).await;
    }
    let mut client = Client::connect_tls(addr, "admin.local", config).await;
    let resp = client
        .send(
            Method::POST,
            Some("admin.local"),
            "/conf",
            &[("x-api-key", "s3cret")],
            full("upstreams: [broken"),
        )
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(served_by(&proxy).await, "a");
}

/// The certificate the admin API's TLS listener at `addr` serves to a new handshake.
async fn admin_certificate(
    addr: std::net::SocketAddr,
    roots: &[rustls_pki_types::CertificateDer<'static>],
) -> rustls_pki_types::CertificateDer<'static> {
    let mut config = (*tls_client_config(roots, &[b"http/1.1"])).clone();
    config.resumption = rustls::client::Resumption::disabled();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("admin.local").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, stream)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().expect("certificate")[0].clone()
}

/// The admin API's certificate is read again on SIGHUP (certbot's deploy hook after a
/// renewal); a pair that does not load then leaves the one serving in place, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_admin_certificate_and_keeps_it_when_the_new_one_is_broken() {
    let a = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let first = write_self_signed(certs.path(), "admin", &["admin.local"]);
    let (proxy, addr) = start_admin_over_tls(&a, certs.path());
    let renewed = write_self_signed(certs.path(), "admin", &["admin.local"]);
    let roots = [first.clone(), renewed.clone()];
    assert_eq!(admin_certificate(addr, &roots).await, first);
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy
        .wait_log(
            "the admin API's certificate reloaded",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(admin_certificate(addr, &roots).await, renewed);
    // A key that is not the certificate's: refused, the renewed pair serves on.
    let other = tempfile::tempdir().unwrap();
    write_self_signed(other.path(), "other", &["admin.local"]);
    std::fs::copy(
        other.path().join("other.key"),
        certs.path().join("admin.key"),
    )
    .unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy
        .wait_log("the one loaded keeps serving", Duration::from_secs(10))
        .await;
    assert_eq!(admin_certificate(addr, &roots).await, renewed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_jwt_opens_a_jwt_route() {
    let a = Backend::start("a").await;
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::servers(&[&a]).authorization("jwt")),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, ADMIN);
    let admin = admin_addr(&proxy);
    let (status, body) =
        ask_for_token(admin, r#"{"master_key":"s3cret","owner":"ci","valid":5}"#).await;
    assert_eq!(status, 201);
    let token = serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("any", "/").await;
    assert_eq!(resp.status(), 401, "no token");
    body_bytes(resp).await;
    let bearer = format!("Bearer {token}");
    let resp = client
        .send(
            Method::GET,
            Some("any"),
            "/",
            &[("authorization", &bearer)],
            full(""),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-backend"), "a");
}

/// Several `POST /conf?save` at once: each is saved and installed in turn, so the file on disk
/// is what serves. They raced: one request's temporary file was renamed by another (its answer a
/// 500 "not applied" though another's text was on disk), and the text saved first could be
/// installed last, the file and the routes apart for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_at_once_leave_the_file_and_the_routes_alike() {
    let backends = [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    ];
    let proxy = ProxyProcess::start(&routes(&[&backends[0]]), ADMIN);
    let admin = admin_addr(&proxy);
    let file = proxy.path("upstreams.yaml");
    for round in 0..8 {
        let posts = backends.iter().map(|backend| {
            let body = routes(&[backend]);
            async move {
                let key = [("x-api-key", "s3cret")];
                call(admin, Method::POST, "/conf?save", &key, &body).await
            }
        });
        for (status, text) in futures_util::future::join_all(posts).await {
            assert_eq!(status, 200, "round {round}: {text}");
        }
        let on_disk = std::fs::read_to_string(&file).unwrap();
        let saved = backends
            .iter()
            .find(|b| routes(&[b]) == on_disk)
            .map(|b| b.name)
            .expect("one of the texts on disk");
        assert_eq!(served_by(&proxy).await, saved, "round {round}");
    }
}

/// A connection to the admin API from `ip` (a loopback address of the test's choosing).
async fn connect_from(ip: [u8; 4], admin: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::from(ip), 0).into())
        .unwrap();
    socket.connect(admin).await.unwrap()
}

/// One address that holds its admin connections open (each sends a byte of a head, as a
/// slowloris does) gets at most 16 of the admin API's 64 places; another address is served
/// meanwhile. One address could take all 64 and shut out the monitoring and cluster pushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_admin_connection() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let admin = admin_addr(&proxy);
    let mut held = half_sent_heads([127, 0, 0, 2], admin, 64, b"G").await;
    // Those past the address's 16 are closed; the 16 wait for the rest of their head.
    let closed = closed_by_the_server(&mut held, Duration::from_secs(1)).await;
    assert_eq!(closed.iter().filter(|c| **c).count(), 48);
    let other = connect_from([127, 0, 0, 3], admin).await;
    let (status, _) = status_over(other).await;
    assert_eq!(status, 200);
}

/// `n` connections from `ip`, each having sent `start` of a head (as a slowloris does); a
/// connection the server closed at once is kept too.
async fn half_sent_heads(
    ip: [u8; 4],
    admin: std::net::SocketAddr,
    n: usize,
    start: &[u8],
) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = connect_from(ip, admin).await;
        let _ = stream.write_all(start).await;
        held.push(stream);
    }
    held
}

/// Which of `streams` the server closed (or reset) within `within`.
async fn closed_by_the_server(
    streams: &mut [tokio::net::TcpStream],
    within: Duration,
) -> Vec<bool> {
    use tokio::io::AsyncReadExt;
    let closed = streams.iter_mut().map(|stream| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(within, stream.read(&mut byte)).await;
        matches!(read, Ok(Ok(0) | Err(_)))
    });
    futures_util::future::join_all(closed).await
}

/// `GET /status` with the master key over `stream`: its status, and the client, still open.
async fn status_over(stream: tokio::net::TcpStream) -> (u16, Client) {
    let mut client = Client::handshake(Proto::H1, stream).await;
    let resp = client
        .send(
            Method::GET,
            Some("admin"),
            "/status",
            &[("x-api-key", "s3cret")],
            full(""),
        )
        .await;
    let status = resp.status().as_u16();
    body_bytes(resp).await;
    (status, client)
}

/// An address whose connections all idle (sixteen half-sent heads from loopback) does not
/// keep a new one out: its oldest idle connection is closed for it, and the operator's or the
/// monitoring's request from the same address is served. It was refused, for as long as the
/// heads were held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_from_an_address_at_its_cap_closes_its_oldest_idle_one() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let admin = admin_addr(&proxy);
    let head = b"GET /metrics HTTP/1.1\r\n";
    let mut held = half_sent_heads([127, 0, 0, 2], admin, 16, head).await;
    // Each kept open: the next one needs a place of its own.
    let mut served = Vec::new();
    for round in 0..3 {
        let stream = connect_from([127, 0, 0, 2], admin).await;
        let (status, client) = status_over(stream).await;
        assert_eq!(status, 200, "round {round}");
        served.push(client);
    }
    // The three oldest half-sent heads were closed for them, the others wait on.
    let closed = closed_by_the_server(&mut held, Duration::from_millis(500)).await;
    assert_eq!(closed[..3], [true; 3], "{closed:?}");
    assert!(closed[3..].iter().all(|c| !c), "{closed:?}");
}

/// Which backend answers a request for `host`.
async fn served_for(proxy: &ProxyProcess, host: &str) -> String {
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get(host, "/").await;
    let name = header(&resp, "x-backend");
    body_bytes(resp).await;
    name
}

/// `POST /conf` serves its body with conf.d merged, as a load of the file would (conf.d's
/// hosts fell to DEFAULT); a SIGHUP afterwards makes the files serve again, as nginx's HUP
/// does (it said "unchanged"); `?save` keeps the file's mode (600 became 644) and follows a
/// link to it (the link was replaced by a file); `?save=false` writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_merges_conf_d_sighup_brings_the_files_back_and_save_keeps_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let (admin, key) = (admin_addr(&proxy), [("x-api-key", "s3cret")]);
    let conf_d = proxy.path("conf.d");
    std::fs::create_dir(&conf_d).unwrap();
    let c_host = format!(
        "c.test:\n  paths:\n    \"/\":\n      servers: [\"{}\"]\n",
        c.addr
    );
    write_atomically(&conf_d.join("10-c.yaml"), &c_host);
    let c_served = || async { (served_for(&proxy, "c.test").await == "c").then_some(()) };
    assert!(eventually_async(Duration::from_secs(10), c_served)
        .await
        .is_some());

    let (status, text) = call(admin, Method::POST, "/conf", &key, &routes(&[&b])).await;
    assert_eq!((status, text.trim()), (200, "applied"));
    assert_eq!(served_by(&proxy).await, "b");
    assert_eq!(served_for(&proxy, "c.test").await, "c", "conf.d merged");
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    let files_back = || async { (served_by(&proxy).await == "a").then_some(()) };
    let back = eventually_async(Duration::from_secs(10), files_back).await;
    assert!(back.is_some(), "{}", proxy.log_text());

    let (file, real) = (proxy.path("upstreams.yaml"), proxy.path("real.yaml"));
    std::fs::rename(&file, &real).unwrap();
    std::os::unix::fs::symlink(&real, &file).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    // An operator's file (nobody's here, when the tests run as root) stays the operator's: a
    // save by root made it root's.
    let root = nix::unistd::geteuid().is_root();
    if root {
        let nobody = Some(65534);
        std::os::unix::fs::chown(&real, nobody, nobody).unwrap();
    }
    let unsaved = call(
        admin,
        Method::POST,
        "/conf?save=false",
        &key,
        &routes(&[&b]),
    )
    .await;
    assert_eq!(unsaved.0, 200, "{}", unsaved.1);
    assert_eq!(std::fs::read_to_string(&real).unwrap(), routes(&[&a]));
    let saved = call(admin, Method::POST, "/conf?save", &key, &routes(&[&c])).await;
    assert_eq!(saved.0, 200, "{}", saved.1);
    assert_eq!(std::fs::read_to_string(&real).unwrap(), routes(&[&c]));
    assert!(std::fs::symlink_metadata(&file).unwrap().is_symlink());
    let saved_file = std::fs::metadata(&real).unwrap();
    assert_eq!(saved_file.permissions().mode() & 0o777, 0o600);
    if root {
        use std::os::unix::fs::MetadataExt;
        assert_eq!((saved_file.uid(), saved_file.gid()), (65534, 65534));
    }
    assert_eq!(served_by(&proxy).await, "c");
}

/// A 405 names the methods the endpoint takes (RFC 9110 §15.5.6), and a backend listed twice
/// on a path is one `aralez_backend_up` series (two were invalid exposition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_405_says_what_is_allowed_and_metrics_have_no_duplicate_series() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a, &a]), ADMIN);
    let admin = admin_addr(&proxy);
    for (method, path, allowed) in [
        (Method::DELETE, "/status", "GET, HEAD"),
        (Method::POST, "/metrics", "GET, HEAD"),
        (Method::GET, "/conf", "POST"),
    ] {
        let mut client = Client::connect(Proto::H1, admin).await;
        let key = [("x-api-key", "s3cret")];
        let resp = client
            .send(method.clone(), Some("admin"), path, &key, full(""))
            .await;
        assert_eq!(resp.status(), 405, "{method} {path}");
        assert_eq!(header(&resp, "allow"), allowed, "{method} {path}");
    }
    let (status, text) = keyed_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let series = text
        .lines()
        .filter(|l| l.starts_with("aralez_backend_up{"))
        .collect::<Vec<_>>();
    assert_eq!(series.len(), 1, "{series:?}");
}

/// A refused key ends an HTTP/1.1 connection (it is kept for the next request with the right
/// key): keep-alive connections that only collect 403s held the API's 64 places, 16 an
/// address, so a client with no key could keep the one with it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_ends_its_connection_a_granted_one_keeps_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), ADMIN);
    let addr = admin_addr(&proxy);
    let ask = |key: &str| format!("GET /status HTTP/1.1\r\nHost: a\r\nx-api-key: {key}\r\n\r\n");
    let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
    refused.write_all(ask("wrong").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), refused.read_to_end(&mut got));
    read.await.expect("the 403, then the close").unwrap();
    let got = String::from_utf8_lossy(&got).to_lowercase();
    assert!(
        got.starts_with("http/1.1 403") && got.contains("connection: close"),
        "{got}"
    );
    // The right key, twice on one connection (a closed one fails the second send).
    let mut granted = Client::connect(Proto::H1, addr).await;
    for round in 0..2 {
        let resp = granted
            .send(
                Method::GET,
                Some("a"),
                "/status",
                &[("x-api-key", "s3cret")],
                full(""),
            )
            .await;
        assert_eq!(resp.status(), 200, "round {round}");
        assert!(resp.headers().get("connection").is_none(), "round {round}");
        body_bytes(resp).await;
    }
}
