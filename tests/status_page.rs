//! The status page (`GET /` on the admin listener) through the real binary: the key, the
//! security headers, a document with no external asset, and in Debian's headless chromium a
//! page that fills itself from `/status?history` with the numbers the proxy counted (backend
//! states and protocols, request totals, the sampled history), plus a screenshot of it in
//! `target/status-page.png`.

use crate::support;

use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use support::*;

const MASTER: &str = "k";
const METRICS: &str = "m";
const ADMIN: &str =
    "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\nmetrics_key: \"m\"\nhc_interval: 1";
/// Longest one chromium run may take.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(90);

/// `/` to `ok` (200), `/gone` to `gone` (404), `/down` to an address nobody listens on.
fn routes(ok: &Backend, gone: &Backend, dead: std::net::SocketAddr) -> String {
    let host = Host::new()
        .path("/", Path::servers(&[ok]))
        .path("/gone", Path::servers(&[gone]))
        .path("/down", Path::addrs(&[dead]));
    Upstreams::new().host("DEFAULT", host).render()
}

/// An address of 127.0.0.1 that refuses connections (nothing listens there, and the port is out
/// of the range the kernel hands out by itself).
fn dead_address() -> std::net::SocketAddr {
    ([127, 0, 0, 1], support::ports::free_port()).into()
}

async fn status_json(admin: std::net::SocketAddr, query: &str) -> Value {
    let (status, _, body) =
        http_get(admin, &format!("/status{query}"), &[("x-api-key", MASTER)]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("JSON from /status")
}

/// Every (route, backend) of `/status`: (host, path, address, up, protocol).
fn backends_of(status: &Value) -> Vec<(String, String, String, bool, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for route in status["routes"].as_array().expect("routes") {
        for b in route["backends"].as_array().expect("backends") {
            out.push((
                text(&route["host"]),
                text(&route["path"]),
                text(&b["address"]),
                b["up"].as_bool().expect("up"),
                text(&b["protocol"]),
            ));
        }
    }
    out
}

/// The proxy with the three routes, once health checks have found `dead` down and detected the
/// others' protocol.
async fn start() -> (ProxyProcess, std::net::SocketAddr, Backend, Backend) {
    let ok = Backend::start("ok").await;
    let gone = Backend::builder("gone").status(404).start().await;
    let dead = dead_address();
    let proxy = ProxyProcess::start(&routes(&ok, &gone, dead), ADMIN);
    let admin = proxy.logged_addr("admin API on http://");
    let settled = eventually_async(Duration::from_secs(20), || async {
        let status = status_json(admin, "").await;
        let backends = backends_of(&status);
        let ready = backends.len() == 3
            && backends.iter().all(|(_, _, address, up, protocol)| {
                let is_dead = *address == dead.to_string();
                *up != is_dead && (is_dead || protocol != "detecting")
            });
        ready.then_some(())
    })
    .await;
    let last = status_json(admin, "").await;
    assert!(settled.is_some(), "health checks did not settle: {last}");
    (proxy, admin, ok, gone)
}

/// Sends `ok` requests that answer 200 and `missing` that answer 404 through the proxy.
async fn send(proxy: &ProxyProcess, ok: usize, missing: usize) {
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for (path, n, want) in [("/", ok, 200), ("/gone", missing, 404)] {
        for _ in 0..n {
            let resp = client.get("any", path).await;
            assert_eq!(resp.status().as_u16(), want, "GET {path}");
            body_bytes(resp).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_needs_a_read_key_and_loads_nothing_from_elsewhere() {
    let (_proxy, admin, _ok, _gone) = start().await;
    for headers in [vec![], vec![("x-api-key", "wrong")]] {
        let (status, _, _) = http_get(admin, "/", &headers).await;
        assert_eq!(status, 403, "GET / with {headers:?}");
    }
    let (status, _, _) = http_get(admin, "/?key=wrong", &[]).await;
    assert_eq!(status, 403);
    for (path, headers) in [
        ("/?key=k", vec![]),
        ("/?key=m", vec![]),
        ("/", vec![("x-api-key", METRICS)]),
        ("/", vec![("authorization", "Bearer k")]),
    ] {
        let (status, _, _) = http_get(admin, path, &headers).await;
        assert_eq!(status, 200, "GET {path} with {headers:?}");
    }
    let (status, headers, body) = http_get(admin, "/", &[("x-api-key", MASTER)]).await;
    assert_eq!(status, 200);
    let html = String::from_utf8(body.to_vec()).expect("UTF-8 page");
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("content-type"), "text/html; charset=utf-8");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("cache-control"), "no-store");
    assert_eq!(header("referrer-policy"), "no-referrer");
    let csp = header("content-security-policy");
    for part in [
        "default-src 'none'",
        "connect-src 'self'",
        "img-src data:",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{part} missing from {csp}");
    }
    // The policy's hashes are those of the page's one inline script and one inline style.
    for (directive, open, close) in [
        ("script-src", "<script>", "</script>"),
        ("style-src", "<style>", "</style>"),
    ] {
        let block = html
            .split_once(open)
            .and_then(|(_, rest)| rest.split_once(close))
            .map(|(inside, _)| inside)
            .expect("inline block");
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, block.as_bytes());
        let hash = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
        assert!(
            csp.contains(&format!("{directive} 'sha256-{hash}'")),
            "{directive} of {csp}"
        );
    }
    assert_no_external_reference(&html);
    // The page is read-only; /status keeps its shape unless asked for the history.
    assert_eq!(post(admin, "/").await, 405);
    let plain = status_json(admin, "?all").await;
    let keys: Vec<&String> = plain.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["routes"]);
    let (status, _, body) = http_get(admin, "/status?history", &[("x-api-key", METRICS)]).await;
    assert_eq!(
        status, 200,
        "the metrics key reads the history the page polls"
    );
    let with_history: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(with_history["history"]["interval_seconds"], 5.0);
    assert!(
        with_history["totals"]["requests"].is_u64(),
        "{with_history}"
    );
}

/// `POST path` with the master key; the status.
async fn post(admin: std::net::SocketAddr, path: &str) -> u16 {
    let mut client = Client::connect(Proto::H1, admin).await;
    let resp = client
        .send(
            http::Method::POST,
            Some("admin"),
            path,
            &[("x-api-key", MASTER)],
            full(""),
        )
        .await;
    let status = resp.status().as_u16();
    body_bytes(resp).await;
    status
}

/// No `src`/`href` attribute, CSS `url(`/`@import`, and the only `http(s)://` text is the SVG
/// namespace name (an identifier, never fetched).
fn assert_no_external_reference(html: &str) {
    for needle in [" src=", " href=", "url(", "@import", "srcset"] {
        assert!(!html.contains(needle), "the page holds `{needle}`");
    }
    let scheme_free = html.replace("'http://www.w3.org/2000/svg'", "");
    for scheme in ["http://", "https://", "//cdn", "ws://", "wss://"] {
        assert!(!scheme_free.contains(scheme), "the page names `{scheme}`");
    }
}

/// Runs chromium on `url` with `extra` flags in a fresh profile; its stdout.
async fn chromium(program: &FsPath, url: &str, extra: &[String]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("profile");
    let mut args = support::tools::headless_chromium_args(&profile);
    args.extend(extra.iter().cloned());
    args.push(url.to_string());
    let run = support::tools::run(
        program.to_path_buf(),
        args,
        dir.path().to_path_buf(),
        CHROMIUM_LIMIT,
    )
    .await;
    assert_eq!(
        run.code,
        Some(0),
        "chromium failed; stderr:\n{}",
        run.stderr
    );
    run.stdout
}

/// The value of attribute `name` in the tag that holds `marker` (e.g. `id="x"`).
fn attribute(dom: &str, marker: &str, name: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let rest = tag.split(&format!(" {name}=\"")).nth(1)?;
    rest.split('"').next().map(|v| v.replace("&amp;", "&"))
}

fn number(dom: &str, id: &str) -> f64 {
    let value = attribute(dom, &format!("id=\"{id}\""), "data-value");
    value
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("#{id} holds no number ({value:?})"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_the_routes_backends_and_counts_that_status_reports() {
    let (proxy, admin, ok, gone) = start().await;
    send(&proxy, 7, 3).await;
    assert_eq!((ok.requests(), gone.requests()), (7, 3));
    // The sampler (every 5 s) has put all ten requests into the history.
    let sampled = eventually_async(Duration::from_secs(20), || async {
        let status = status_json(admin, "?history").await;
        let samples = status["history"]["samples"].as_array()?.clone();
        let total: u64 = samples.iter().filter_map(|s| s["requests"].as_u64()).sum();
        (total == 10).then_some(status)
    })
    .await;
    let status = sampled.expect("ten requests sampled into the history within 20 s");
    assert_eq!(status["totals"]["requests"], 10);
    assert_eq!(status["totals"]["responses"]["2xx"], 7);
    assert_eq!(status["totals"]["responses"]["4xx"], 3);
    let Some(program) = support::tools::chromium() else {
        return;
    };

    // The DOM once the script has fetched and drawn (chromium's virtual time runs the timers).
    let url = format!("http://{admin}/?key={MASTER}");
    let flags = [
        "--virtual-time-budget=8000".to_string(),
        "--dump-dom".into(),
    ];
    let dom = chromium(&program, &url, &flags).await;
    assert_eq!(
        attribute(&dom, "<body", "data-state").as_deref(),
        Some("ready"),
        "the page did not load its data:\n{dom}"
    );
    let status = status_json(admin, "?history").await;
    assert_eq!(number(&dom, "total-requests"), 10.0);
    assert_eq!(status["totals"]["requests"], 10);
    assert_eq!(number(&dom, "total-2xx"), 7.0);
    assert_eq!(number(&dom, "total-4xx"), 3.0);
    assert_eq!(number(&dom, "total-5xx"), 0.0);
    assert_eq!(number(&dom, "window-requests"), 10.0);
    for q in ["p50", "p99", "mean"] {
        let json = status["totals"]["latency_ms"][q].as_f64().expect("latency");
        assert_eq!(number(&dom, &format!("latency-{q}")), json, "latency {q}");
    }
    let backends = backends_of(&status);
    let up = backends.iter().filter(|b| b.3).count();
    assert_eq!((up, backends.len()), (2, 3));
    assert_eq!(number(&dom, "backends-up"), up as f64);
    assert_eq!(number(&dom, "backends-total"), backends.len() as f64);
    for (host, path, address, up, protocol) in &backends {
        let marker = format!("data-address=\"{address}\"");
        let shown = |name| attribute(&dom, &marker, name);
        assert_eq!(shown("data-host").as_ref(), Some(host), "{address}");
        assert_eq!(shown("data-path").as_ref(), Some(path), "{address}");
        assert_eq!(shown("data-up"), Some(up.to_string()), "{address}");
        assert_eq!(shown("data-protocol").as_ref(), Some(protocol), "{address}");
    }
    let status_bars = dom.matches("class=\"b-2xx\"").count();
    assert!(status_bars >= 1, "no 2xx bar in the status chart");
    assert!(dom.matches("class=\"b-4xx\"").count() >= 1, "no 4xx bar");
    assert!(dom.contains("class=\"line l-rate\""), "no rate line");
    assert_no_external_reference(&dom);

    // A screenshot, opened with the read-only key this time.
    let png = screenshot_path();
    let _ = std::fs::remove_file(&png);
    let url = format!("http://{admin}/?key={METRICS}");
    let flags = [
        "--virtual-time-budget=8000".to_string(),
        "--window-size=1280,900".into(),
        format!("--screenshot={}", png.display()),
    ];
    chromium(&program, &url, &flags).await;
    assert_png(&png, 1280, 900);
}

/// `target/status-page.png` (next to the tests' own scratch directory).
fn screenshot_path() -> PathBuf {
    let scratch = FsPath::new(env!("CARGO_TARGET_TMPDIR"));
    scratch.parent().unwrap_or(scratch).join("status-page.png")
}

/// A PNG of `width` x `height` with enough in it to be a drawn page, not a blank one.
fn assert_png(path: &FsPath, width: u32, height: u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let be =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!((be(16), be(20)), (width, height), "PNG size");
    assert!(
        bytes.len() > 30_000,
        "{} is only {} bytes: a blank page?",
        path.display(),
        bytes.len()
    );
}
