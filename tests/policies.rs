//! Tests of the traffic policies (SPEC §5, §8): auth of every type and sticky sessions, through
//! the real binary where the process matters (keys from the environment, cookies across a
//! restart) and in process on tokio's paused clock where time does (forward auth's timeout).
//! Rate and 4xx limits are in `limits.rs`. Each case runs over HTTP/1.1 and h2c where the
//! protocol could matter.

use crate::inproc;
use crate::policies_support;
use crate::support;

use std::time::Duration;

use base64::Engine as _;
use http::Method;
use policies_support::{forged, hs256, now, AuthService};
use support::{
    body_bytes, full, header, Backend, Client, Host, Path, Proto, ProxyProcess, Upstreams,
    PROTOCOLS,
};

const MASTER: &str = "master-secret-for-tests";

async fn get(
    c: &mut Client,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, String) {
    let resp = c
        .send(
            Method::GET,
            Some(host),
            path,
            headers,
            full(bytes::Bytes::new()),
        )
        .await;
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let body = String::from_utf8_lossy(&body_bytes(resp).await).into_owned();
    (status, headers, body)
}

fn auth_config(backend: &Backend, auth: &AuthService) -> String {
    let to = || Path::servers(&[backend]);
    let forward = format!("http://{}/check", auth.addr);
    Upstreams::new()
        .host(
            "basic.test",
            Host::new().path("/", to().authorization_data("basic", "ann:pa:ss")),
        )
        .host(
            "key.test",
            Host::new().path("/", to().authorization_data("apikey", "k-123")),
        )
        .host(
            "jwt.test",
            Host::new()
                .authorization_data("jwt", "route-secret")
                .path("/", to())
                .path("/open", to().authorization_data("apikey", "other")),
        )
        .host(
            "master.test",
            Host::new().path("/", to().authorization("jwt")),
        )
        .host(
            "fwd.test",
            Host::new().path("/", to().authorization_data("forward", &forward)),
        )
        .render()
}

/// `master.test`'s jwt rule without data needs a master secret to load.
const MASTER_KEY: &str = "master_key: \"m-secret\"";

#[tokio::test]
async fn basic_and_apikey_right_wrong_missing() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let proxy = ProxyProcess::start(&auth_config(&backend, &auth), MASTER_KEY);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let good = format!("Basic {}", b64("ann:pa:ss"));
    let wrong = format!("Basic {}", b64("ann:pa:sx"));
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let before = backend.requests();
        let (st, h, _) = get(&mut c, "basic.test", "/", &[]).await;
        assert_eq!(st, 401, "{proto:?}");
        assert_eq!(h["www-authenticate"], "Basic realm=\"aralez\"");
        assert_eq!(
            get(&mut c, "basic.test", "/", &[("authorization", &wrong)])
                .await
                .0,
            401
        );
        assert_eq!(get(&mut c, "key.test", "/", &[]).await.0, 403);
        assert_eq!(
            get(&mut c, "key.test", "/", &[("x-api-key", "k-12")])
                .await
                .0,
            403
        );
        assert_eq!(
            backend.requests(),
            before,
            "refused requests never reach the backend"
        );
        assert_eq!(
            get(&mut c, "basic.test", "/", &[("authorization", &good)])
                .await
                .0,
            200
        );
        assert_eq!(
            get(&mut c, "key.test", "/", &[("x-api-key", "k-123")])
                .await
                .0,
            200
        );
        assert_eq!(backend.requests(), before + 2);
    }
    // An upload waiting for `100 Continue` that is refused is told the connection closes: its
    // body was never asked for, and will not be read.
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head =
        "POST / HTTP/1.1\r\nHost: basic.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    let read = tokio::io::AsyncReadExt::read_to_string(&mut s, &mut answer);
    assert!(
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .is_ok(),
        "{answer}"
    );
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{answer}"
    );
}

#[tokio::test]
async fn jwt_tokens_from_header_and_query() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let proxy = ProxyProcess::start(
        &auth_config(&backend, &auth),
        &format!("master_key: \"{MASTER}\""),
    );
    let exp = now() + 600;
    let claims = format!("{{\"sub\":\"ann\",\"exp\":{exp}}}");
    let good = hs256("route-secret", &claims);
    let signature = good.rsplit('.').next().unwrap().to_string();
    let refused = [
        ("wrong secret", hs256("other-secret", &claims)),
        (
            "expired",
            hs256("route-secret", &format!("{{\"exp\":{}}}", now() - 120)),
        ),
        ("no exp", hs256("route-secret", "{\"sub\":\"ann\"}")),
        ("alg none", forged("none", &claims, "")),
        ("RS256", forged("RS256", &claims, &signature)),
        ("garbage", "a.b.c".to_string()),
    ];
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let before = backend.requests();
        let (st, h, _) = get(&mut c, "jwt.test", "/", &[]).await;
        assert_eq!(st, 401, "{proto:?}");
        assert_eq!(h["www-authenticate"], "Bearer realm=\"aralez\"");
        for (name, token) in &refused {
            let bearer = format!("Bearer {token}");
            assert_eq!(
                get(&mut c, "jwt.test", "/", &[("authorization", &bearer)])
                    .await
                    .0,
                401,
                "{name}"
            );
            assert_eq!(
                get(&mut c, "jwt.test", &format!("/?araleztoken={token}"), &[])
                    .await
                    .0,
                401,
                "{name} (query)"
            );
        }
        assert_eq!(
            backend.requests(),
            before,
            "no refused token reached the backend"
        );

        let bearer = format!("Bearer {good}");
        let (st, h, _) = get(&mut c, "jwt.test", "/x?a=1", &[("authorization", &bearer)]).await;
        assert_eq!((st, h["x-seen-uri"].to_str().unwrap()), (200, "/x?a=1"));
        let (st, h, _) = get(
            &mut c,
            "jwt.test",
            &format!("/x?a=1&araleztoken={good}&b=2"),
            &[],
        )
        .await;
        assert_eq!(st, 200);
        let seen = h["x-seen-uri"].to_str().unwrap().to_string();
        assert!(
            seen.ends_with("/x?a=1&b=2") && !seen.contains("araleztoken"),
            "backend saw {seen}"
        );
        // A path's own rule overrides the host's.
        assert_eq!(
            get(&mut c, "jwt.test", "/open", &[("authorization", &bearer)])
                .await
                .0,
            403
        );
        assert_eq!(
            get(&mut c, "jwt.test", "/open", &[("x-api-key", "other")])
                .await
                .0,
            200
        );
        // No data: the master key signs.
        let by_master = format!("Bearer {}", hs256(MASTER, &claims));
        assert_eq!(
            get(&mut c, "master.test", "/", &[("authorization", &by_master)])
                .await
                .0,
            200
        );
        assert_eq!(
            get(&mut c, "master.test", "/", &[("authorization", &bearer)])
                .await
                .0,
            401
        );
    }
}

#[tokio::test]
async fn jwt_key_env_overrides_master_key() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let proxy = ProxyProcess::start_env(
        &auth_config(&backend, &auth),
        &format!("master_key: \"{MASTER}\""),
        &[("JWT_KEY", "from-env")],
    );
    let claims = format!("{{\"exp\":{}}}", now() + 60);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let env_token = format!("Bearer {}", hs256("from-env", &claims));
    let master_token = format!("Bearer {}", hs256(MASTER, &claims));
    assert_eq!(
        get(&mut c, "master.test", "/", &[("authorization", &env_token)])
            .await
            .0,
        200
    );
    assert_eq!(
        get(
            &mut c,
            "master.test",
            "/",
            &[("authorization", &master_token)]
        )
        .await
        .0,
        401
    );
}

/// A jwt rule without data, with neither master_key nor JWT_KEY, is a configuration error at
/// its line: a reload bringing one in is refused and the running routes stay (the start is
/// refused too: the check-config corpus). It loaded, and every request of the route got a 503.
#[tokio::test]
async fn jwt_without_any_secret_is_a_config_error() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let before = Upstreams::new()
        .host(
            "basic.test",
            Host::new().path("/", Path::servers(&[&backend])),
        )
        .render();
    let proxy = ProxyProcess::start(&before, "");
    std::fs::write(proxy.path("upstreams.yaml"), auth_config(&backend, &auth)).unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy
        .wait_log("reload rejected", Duration::from_secs(10))
        .await;
    let log = proxy.log_text();
    assert!(
        log.contains(":38:17:") && log.contains("neither is set"),
        "{log}"
    );
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(get(&mut c, "basic.test", "/", &[]).await.0, 200);
}

#[tokio::test(start_paused = true)]
async fn forward_auth_allows_relays_and_times_out() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let proxy = inproc::Proxy::start(&auth_config(&backend, &auth), "").await;
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        // 200: allowed; the service's identity headers replace the client's own.
        let (st, h, _) = get(
            &mut c,
            "fwd.test",
            "/ok/page?q=1",
            &[
                ("authorization", "Bearer t"),
                ("cookie", "s=1"),
                ("remote-user", "mallory"),
                ("x-auth-groups", "admin"),
            ],
        )
        .await;
        assert_eq!(st, 200, "{proto:?}");
        assert_eq!(h["x-seen-remote-user"], "alice");
        assert_eq!(h["x-seen-auth-groups"], "staff");
        // The auth service and the backend see one request id, the one the client gets back.
        assert_eq!(
            auth.last_header("x-request-id").as_deref(),
            h["x-request-id"].to_str().ok()
        );
        assert_eq!(h["x-seen-request-id"], h["x-request-id"]);
        assert_eq!(
            auth.last_header("authorization").as_deref(),
            Some("Bearer t")
        );
        assert_eq!(auth.last_header("cookie").as_deref(), Some("s=1"));
        assert_eq!(
            auth.last_header("x-forwarded-method").as_deref(),
            Some("GET")
        );
        assert_eq!(
            auth.last_header("x-forwarded-host").as_deref(),
            Some("fwd.test")
        );
        assert_eq!(
            auth.last_header("x-forwarded-uri").as_deref(),
            Some("/ok/page?q=1")
        );
        assert_eq!(
            auth.last_header("x-forwarded-proto").as_deref(),
            Some("http")
        );
        assert_eq!(
            auth.last_header("x-forwarded-for").as_deref(),
            Some("127.0.0.1")
        );

        let before = backend.requests();
        let (st, h, body) = get(&mut c, "fwd.test", "/redirect", &[]).await;
        assert_eq!((st, body.as_str()), (302, "go log in"));
        assert_eq!(h["location"], "https://login.example/");
        assert_eq!(h["set-cookie"], "auth_state=xyz");
        let (st, h, body) = get(
            &mut c,
            "fwd.test",
            "/private",
            &[("remote-user", "mallory")],
        )
        .await;
        assert_eq!((st, body.as_str()), (401, "who are you?"));
        assert_eq!(h["www-authenticate"], "Bearer realm=\"sso\"");
        assert_eq!(
            backend.requests(),
            before,
            "refused requests never reach the backend"
        );
    }
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let started = tokio::time::Instant::now();
    let (st, h, _) = get(&mut c, "fwd.test", "/hang", &[]).await;
    let took = started.elapsed();
    assert_eq!(st, 503);
    assert_eq!(header_value(&h, "retry-after"), "2");
    // Exactly the auth service's 5 s, in paused time.
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_millis(5100),
        "took {took:?}"
    );
}

fn header_value(h: &http::HeaderMap, name: &str) -> String {
    h.get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

fn sticky_cookie(h: &http::HeaderMap) -> Option<String> {
    h.get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("backend_id="))
        .map(|v| v.split(';').next().unwrap().to_string())
}

#[tokio::test]
async fn sticky_sessions_pin_and_move_when_the_backend_goes() {
    let a = Backend::builder("a").cookies().start().await;
    let b = Backend::builder("b").cookies().start().await;
    let c3 = Backend::builder("c").cookies().start().await;
    let yaml = Upstreams::new()
        .host(
            "s.test",
            Host::new()
                .sticky_sessions(600)
                .path("/", Path::servers(&[&a, &b, &c3]).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let (st, h, _) = get(&mut c, "s.test", "/", &[]).await;
        assert_eq!(st, 200);
        let cookies: Vec<&str> = h
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            cookies.len(),
            3,
            "backend cookies kept, ours appended: {cookies:?}"
        );
        assert!(
            cookies.iter().any(|c| c.starts_with("app="))
                && cookies.contains(&"theme=dark; Path=/")
        );
        let sticky = cookies
            .iter()
            .find(|c| c.starts_with("backend_id="))
            .unwrap();
        assert!(
            sticky.ends_with("; Path=/; Max-Age=600; HttpOnly; SameSite=Lax"),
            "{sticky}"
        );
        let cookie = sticky_cookie(&h).unwrap();
        let first = header_value(&h, "x-backend");
        for _ in 0..100 {
            let (st, h, _) = get(&mut c, "s.test", "/", &[("cookie", &cookie)]).await;
            assert_eq!((st, header_value(&h, "x-backend")), (200, first.clone()));
            assert_eq!(
                sticky_cookie(&h),
                None,
                "a pinned answer needs no new cookie"
            );
        }
        // Without the cookie, round robin spreads the load.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..6 {
            seen.insert(header_value(
                &get(&mut c, "s.test", "/", &[]).await.1,
                "x-backend",
            ));
        }
        assert_eq!(seen.len(), 3);
        // A forged cookie pins nothing and is replaced.
        let forged = format!("backend_id={}", "ab".repeat(16));
        let (_, h, _) = get(&mut c, "s.test", "/", &[("cookie", &forged)]).await;
        assert!(sticky_cookie(&h).is_some());
    }
    // The pinned backend goes away: another answers, with a new cookie that then pins it.
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (_, h, _) = get(&mut c, "s.test", "/", &[]).await;
    let (cookie, pinned) = (sticky_cookie(&h).unwrap(), header_value(&h, "x-backend"));
    let gone = [&a, &b, &c3]
        .into_iter()
        .find(|x| x.name == pinned)
        .unwrap();
    gone.stop();
    let (st, h, _) = get(&mut c, "s.test", "/", &[("cookie", &cookie)]).await;
    let now_on = header_value(&h, "x-backend");
    assert_eq!(st, 200);
    assert_ne!(now_on, pinned);
    let new_cookie = sticky_cookie(&h).expect("a new cookie for the new backend");
    assert_ne!(new_cookie, cookie);
    for _ in 0..20 {
        let (_, h, _) = get(&mut c, "s.test", "/", &[("cookie", &new_cookie)]).await;
        assert_eq!(header_value(&h, "x-backend"), now_on);
    }
}

#[tokio::test]
async fn policies_answer_grpc_clients_with_a_grpc_status() {
    let backend = Backend::builder("b").cookies().start().await;
    let auth = AuthService::start().await;
    let proxy = ProxyProcess::start(&auth_config(&backend, &auth), MASTER_KEY);
    let mut c = Client::connect(Proto::H2c, proxy.addr).await;
    let resp = c
        .send(
            Method::POST,
            Some("key.test"),
            "/svc/Method",
            &[("content-type", "application/grpc")],
            full(bytes::Bytes::new()),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "grpc-status"), "7");
}

/// The cookie a fresh proxy process issues for its only backend.
async fn cookie_from_new_process(backend: std::net::SocketAddr, main_extra: &str) -> String {
    let yaml = Upstreams::new()
        .host(
            "s.test",
            Host::new()
                .sticky_sessions(600)
                .path("/", Path::addrs(&[backend]).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, main_extra);
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("s.test", "/").await;
    sticky_cookie(resp.headers()).expect("a sticky cookie")
}

#[tokio::test]
async fn with_a_master_key_sticky_cookies_survive_a_restart() {
    let a = Backend::builder("a").cookies().start().await;
    let keyed = "master_key: \"shared-secret\"";
    let first = cookie_from_new_process(a.addr, keyed).await;
    let second = cookie_from_new_process(a.addr, keyed).await;
    assert_eq!(
        first, second,
        "same master key, same cookie across processes"
    );
    let other = cookie_from_new_process(a.addr, "master_key: \"another\"").await;
    assert_ne!(first, other);
    let unkeyed = cookie_from_new_process(a.addr, "").await;
    assert_ne!(
        unkeyed,
        cookie_from_new_process(a.addr, "").await,
        "without a key: per process"
    );
}

/// A protected prefix meets its policy however a client writes the path: encoded as browsers
/// send `/café`, in another case, or one slash short (`/secret` for `/secret/`: a 301 there,
/// as nginx answers, not the open route of `/`). Before, all three reached the backend of `/`.
#[tokio::test]
async fn a_protected_prefix_meets_its_policy_however_the_path_is_written() {
    let backend = Backend::start("b").await;
    let to = || Path::servers(&[&backend]);
    let key = |p: Path| p.authorization_data("apikey", "k-1");
    let yaml = Upstreams::new()
        .host(
            "p.test",
            Host::new()
                .path("/", to())
                .path("/caf\u{e9}", key(to()))
                .path("/a b", key(to()))
                .path("/secret/", key(to())),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let before = backend.requests();
        for path in [
            "/caf%C3%A9",
            "/caf%c3%a9/x",
            "/CAF%C3%A9",
            "/a%20b",
            "/secret/x",
        ] {
            assert_eq!(
                get(&mut c, "p.test", path, &[]).await.0,
                403,
                "{proto:?} {path}"
            );
        }
        // A path written with leading slashes gets one: `//secret/` would be another host's.
        let one_slash_short = [
            ("/secret", "/secret/"),
            ("/secret?q=1", "/secret/?q=1"),
            ("//secret?next=1", "/secret/?next=1"),
            ("///secret", "/secret/"),
        ];
        for (path, location) in one_slash_short {
            let (status, headers, _) = get(&mut c, "p.test", path, &[]).await;
            assert_eq!(status, 301, "{proto:?} {path}");
            assert_eq!(headers["location"], location, "{proto:?} {path}");
        }
        assert_eq!(
            backend.requests(),
            before,
            "{proto:?}: nothing reached the backend"
        );
        let key = [("x-api-key", "k-1")];
        assert_eq!(get(&mut c, "p.test", "/caf%C3%A9", &key).await.0, 200);
        assert_eq!(get(&mut c, "p.test", "/secretx", &[]).await.0, 200);
    }
}
