//! What the cache's tests share: an origin that counts its requests and answers as the query
//! says, proxies with a `cache:` block in front of it, and requests that read `X-Cache-Status`.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::*;

/// An origin whose answer the query describes: `cc` (Cache-Control), `vary`, `cookie`
/// (a Set-Cookie), `status`, `age` (an Age header on a 200), `slow` (ms before answering), `len`
/// (body bytes), `ct` (a Content-Type), `etag` (an ETag; a request whose If-None-Match names it gets a 304 with the
/// same Cache-Control; with `etag304`, a 304 naming that ETag to any If-None-Match). The body is `#<n>` (its request count) unless `len` is given. `X-Lang`
/// echoes the request's Accept-Language; a request's `X-Origin-Vary` is the answer's `Vary`. While `failing` is set every answer is a 503. `flip`
/// answers `no-store` until `flipped` is set, then `max-age=60`. `seen` keeps what it was
/// asked (method, requests in progress when it arrived, counting itself).
pub struct Origin {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    pub failing: Arc<AtomicBool>,
    pub flipped: Arc<AtomicBool>,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

/// What the origin was asked.
#[derive(Default)]
pub struct Seen {
    in_progress: AtomicUsize,
    pub log: std::sync::Mutex<Vec<(Method, usize)>>,
}

impl Seen {
    pub fn methods(&self) -> Vec<Method> {
        let log = self.log.lock().expect("origin log");
        log.iter().map(|(m, _)| m.clone()).collect()
    }

    /// The most requests the origin was answering at once.
    pub fn most_at_once(&self) -> usize {
        let log = self.log.lock().expect("origin log");
        log.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }
}

/// Counts a request in progress until dropped.
struct InProgress(Arc<Seen>);

impl InProgress {
    fn start(seen: &Arc<Seen>, method: &Method) -> InProgress {
        let now = seen.in_progress.fetch_add(1, Ordering::SeqCst) + 1;
        let mut log = seen.log.lock().expect("origin log");
        log.push((method.clone(), now));
        InProgress(seen.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub async fn start() -> Origin {
        let listener = bind_local().await;
        let addr = listener.local_addr().expect("origin address");
        let requests = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(AtomicBool::new(false));
        let flipped = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let state = OriginState {
            count: requests.clone(),
            failing: failing.clone(),
            flipped: flipped.clone(),
            seen: seen.clone(),
        };
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Origin {
            addr,
            requests,
            failing,
            flipped,
            seen,
            task,
        }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct OriginState {
    count: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    flipped: Arc<AtomicBool>,
    seen: Arc<Seen>,
}

async fn answer(
    state: OriginState,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let OriginState {
        count,
        failing,
        flipped,
        seen,
    } = state;
    // The proxy's health probes are not requests of the test.
    if req
        .headers()
        .get("user-agent")
        .is_some_and(|v| v == PROBE_AGENT)
    {
        return Ok(Response::new(Full::new(Bytes::new())));
    }
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_progress = InProgress::start(&seen, req.method());
    let query = req.uri().query().unwrap_or("").to_string();
    let get = |k: &str| {
        query
            .split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.replace('+', " "))
    };
    if let Some(ms) = get("slow").and_then(|s| s.parse().ok()) {
        // The point of `slow`: a fetch that is still running when the other requests arrive.
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if failing.load(Ordering::SeqCst) {
        let resp = Response::builder()
            .status(503)
            .body(Full::new(Bytes::from("down")));
        return Ok(resp.expect("response"));
    }
    let etag = get("etag").map(|t| format!("\"{t}\""));
    let asked = req
        .headers()
        .get("if-none-match")
        .and_then(|v| v.to_str().ok());
    if let (Some(other), Some(_)) = (get("etag304"), asked) {
        // A 304 that names another representation than the one asked about.
        let resp = Response::builder()
            .status(304)
            .header("etag", format!("\"{other}\""));
        return Ok(resp.body(Full::new(Bytes::new())).expect("response"));
    }
    if let (Some(etag), Some(asked)) = (&etag, asked) {
        if asked == etag {
            let mut resp = Response::builder().status(304).header("etag", etag);
            if let Some(cc) = get("cc") {
                resp = resp.header("cache-control", cc);
            }
            return Ok(resp.body(Full::new(Bytes::new())).expect("response"));
        }
    }
    if get("flip").is_some() {
        let cc = if flipped.load(Ordering::SeqCst) {
            "max-age=60"
        } else {
            "no-store"
        };
        let mut resp = Response::builder().header("cache-control", cc);
        if let Some(vary) = get("vary") {
            resp = resp.header("vary", vary);
        }
        return Ok(resp
            .body(Full::new(Bytes::from(format!("#{n}"))))
            .expect("response"));
    }
    let status: u16 = get("status").and_then(|s| s.parse().ok()).unwrap_or(200);
    let mut resp = Response::builder().status(status);
    if let Some(etag) = etag {
        resp = resp.header("etag", etag);
    }
    for (param, name) in [
        ("cc", "cache-control"),
        ("vary", "vary"),
        ("cookie", "set-cookie"),
        ("age", "age"),
        ("ct", "content-type"),
    ] {
        if let Some(value) = get(param) {
            resp = resp.header(name, value);
        }
    }
    if let Some(lang) = req.headers().get("accept-language") {
        resp = resp.header("x-lang", lang);
    }
    // A resource whose `Vary` changes from one answer to the next.
    if let Some(vary) = req.headers().get("x-origin-vary") {
        resp = resp.header("vary", vary);
    }
    let body = match get("len").and_then(|s| s.parse::<usize>().ok()) {
        Some(len) => Bytes::from(vec![b'c'; len]),
        None => Bytes::from(format!("#{n}")),
    };
    Ok(resp.body(Full::new(body)).expect("response"))
}

/// `c.test` cached (its `/short` path with `cache_ttl: 1`, `/off` with `cache: false`,
/// `/auth` behind basic auth); 16 MB of memory, items up to 1 MB, `ttl` 60 s.
pub fn proxy_for(origin: &Origin) -> ProxyProcess {
    proxy_with(origin, 16, "")
}

/// The same routes with `mem_size_mb` and extra main.yaml lines.
pub fn proxy_with(origin: &Origin, mem_size_mb: u64, extra: &str) -> ProxyProcess {
    let cache =
        format!("  storage: memory\n  mem_size_mb: {mem_size_mb}\n  item_max_size: 1\n  ttl: 60\n");
    proxy_cache(origin, &cache, extra)
}

/// The same routes with the `cache:` block's lines and extra main.yaml lines.
pub fn proxy_cache(origin: &Origin, cache: &str, extra: &str) -> ProxyProcess {
    let yaml = Upstreams::new()
        .host(
            "c.test",
            Host::new()
                .path("/", Path::addrs(&[origin.addr]))
                .path("/short", Path::addrs(&[origin.addr]).set("cache_ttl", 1u64))
                .path("/off", Path::addrs(&[origin.addr]).set("cache", false))
                .path(
                    "/auth",
                    Path::addrs(&[origin.addr]).authorization_data("basic", "user:pass"),
                ),
        )
        .render();
    ProxyProcess::start(&yaml, &format!("cache:\n{cache}{extra}"))
}

pub async fn send(
    client: &mut Client,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (Response<()>, String) {
    let resp = client
        .send(method, Some("c.test"), path, headers, full(Bytes::new()))
        .await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("response body").to_bytes();
    (
        Response::from_parts(parts, ()),
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

pub async fn get(client: &mut Client, path: &str) -> (String, String) {
    let (resp, body) = send(client, Method::GET, path, &[]).await;
    (hdr(&resp, "x-cache-status"), body)
}

pub fn hdr(resp: &Response<()>, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .unwrap_or_default()
}

/// `POST /cache/purge` on the admin API with `key`: the status and the body.
pub async fn purge(admin: SocketAddr, key: &str, json: &str) -> (u16, String) {
    let mut c = Client::connect(Proto::H1, admin).await;
    let resp = c
        .send(
            Method::POST,
            Some("localhost"),
            "/cache/purge",
            &[("x-api-key", key)],
            full(json.to_string()),
        )
        .await;
    let status = resp.status().as_u16();
    (
        status,
        String::from_utf8_lossy(&body_bytes(resp).await).into_owned(),
    )
}
