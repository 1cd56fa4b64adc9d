//! Kubernetes discovery against a test API server that speaks the EndpointSlice list + chunked
//! watch protocol (shapes from tests/fixtures/kubernetes/), with a bearer token check.
//!
//! The proxy runs in process (`tests/inproc`) with its real watcher, on tokio's paused clock:
//! backoffs and query timeouts are virtual time.

use crate::inproc;
use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use inproc::Proxy;
use support::*;
use tokio::sync::mpsc;

const LIST: &str = include_str!("fixtures/kubernetes/endpointslice-list-web.json");
const EXPIRED: &str = include_str!("fixtures/kubernetes/endpointslice-watch-expired.jsonl");
const UNAUTHORIZED: &str = include_str!("fixtures/kubernetes/unauthorized.json");
const TOKEN: &str = "good-token";

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// The API server's state: the slices a list returns, and the open watch streams.
struct ApiState {
    slices: Vec<serde_json::Value>,
    resource_version: u64,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    lists: usize,
    /// Requests of any kind, refused ones too.
    requests: usize,
    /// Watches asked for.
    watches: usize,
    /// How watches are answered.
    watch_mode: WatchMode,
}

#[derive(Clone, Copy, PartialEq)]
enum WatchMode {
    /// Events as they come.
    Events,
    /// A clean end at once.
    EndAtOnce,
    /// One line that never ends.
    Endless,
    /// The watch request itself refused: 410 Gone (its version was compacted away).
    Gone,
    /// Half an event, then the connection closed (its length said more).
    CutMidLine,
}

/// A slice named `name` from the fixture, with `(ip, ready)` endpoints on `port`.
fn slice(name: &str, port: u16, endpoints: &[(&str, Option<bool>)]) -> serde_json::Value {
    let mut s: serde_json::Value =
        serde_json::from_str::<serde_json::Value>(LIST).unwrap()["items"][0].clone();
    s["metadata"]["name"] = name.into();
    s["ports"][0]["port"] = port.into();
    let template = s["endpoints"][0].clone();
    s["endpoints"] = endpoints
        .iter()
        .map(|(ip, ready)| {
            let mut e = template.clone();
            e["addresses"] = serde_json::json!([ip]);
            match ready {
                Some(r) => e["conditions"]["ready"] = (*r).into(),
                None => {
                    e["conditions"].as_object_mut().unwrap().remove("ready");
                }
            }
            e
        })
        .collect();
    s
}

struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
}

impl FakeApi {
    async fn start(slices: Vec<serde_json::Value>) -> FakeApi {
        let listener = bind_local().await;
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ApiState {
            slices,
            resource_version: 100,
            watchers: Vec::new(),
            lists: 0,
            requests: 0,
            watches: 0,
            watch_mode: WatchMode::Events,
        }));
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, st.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeApi { addr, state }
    }

    /// An API server whose one slice lists `backend` (on 127.0.0.1), ready.
    async fn serving(backend: &Backend) -> FakeApi {
        let ready = [("127.0.0.1", Some(true))];
        FakeApi::start(vec![slice("web-1", backend.addr.port(), &ready)]).await
    }

    /// Sends a watch event (`type` + object) to every open watch, keeping the list in step.
    fn event(&self, kind: &str, object: serde_json::Value) {
        let mut st = self.state.lock().unwrap();
        st.resource_version += 1;
        let mut object = object;
        if object["metadata"].is_object() {
            object["metadata"]["resourceVersion"] = st.resource_version.to_string().into();
        }
        let name = object["metadata"]["name"].clone();
        match kind {
            "ADDED" | "MODIFIED" => {
                st.slices.retain(|s| s["metadata"]["name"] != name);
                st.slices.push(object.clone());
            }
            "DELETED" => st.slices.retain(|s| s["metadata"]["name"] != name),
            _ => {}
        }
        let line = format!(
            "{}\n",
            serde_json::json!({ "type": kind, "object": object })
        );
        st.watchers
            .retain(|w| w.send(Bytes::from(line.clone())).is_ok());
    }

    /// Ends every watch with the fixture's 410 Expired error, after replacing the slices.
    fn expire(&self, slices: Vec<serde_json::Value>) {
        let mut st = self.state.lock().unwrap();
        st.slices = slices;
        st.resource_version += 10;
        for w in st.watchers.drain(..) {
            let _ = w.send(Bytes::from(format!("{}\n", EXPIRED.trim())));
        }
    }
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<Mutex<ApiState>>,
) -> Result<Response<Body>, Infallible> {
    let full = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(
                Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()
    };
    state.lock().unwrap().requests += 1;
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {TOKEN}") {
        return Ok(full(StatusCode::UNAUTHORIZED, UNAUTHORIZED.to_string()));
    }
    let path_ok = req.uri().path() == "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";
    let query = req.uri().query().unwrap_or("").to_string();
    if !path_ok || !query.contains("labelSelector=kubernetes.io%2Fservice-name%3Dweb") {
        return Ok(full(
            StatusCode::NOT_FOUND,
            format!(
                "{{\"kind\":\"Status\",\"code\":404,\"message\":\"{}\"}}",
                req.uri()
            ),
        ));
    }
    if query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        let mode = {
            let mut st = state.lock().unwrap();
            st.watches += 1;
            st.watch_mode
        };
        if mode == WatchMode::EndAtOnce {
            return Ok(full(StatusCode::OK, String::new()));
        }
        if mode == WatchMode::Gone {
            let gone = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version\",\"reason\":\"Expired\",\"code\":410}";
            return Ok(full(StatusCode::GONE, gone.to_string()));
        }
        if mode == WatchMode::CutMidLine {
            let half = Bytes::from_static(b"{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Endpoi");
            // Sent in a chunk of its own; then the body fails and hyper breaks the connection
            // off without the last chunk.
            let cut = futures_util::stream::unfold(Some(half), |half| async move {
                match half {
                    Some(half) => Some((Ok(Frame::data(half)), None)),
                    None => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        let reset = std::io::ErrorKind::ConnectionReset;
                        Some((Err(std::io::Error::from(reset)), None))
                    }
                }
            });
            return Ok(Response::new(BodyExt::boxed(StreamBody::new(cut))));
        }
        if mode == WatchMode::Endless {
            let chunk = Bytes::from(vec![b'x'; 1 << 20]);
            let line = futures_util::stream::repeat_with(move || Ok(Frame::data(chunk.clone())));
            return Ok(Response::new(BodyExt::boxed(StreamBody::new(line))));
        }
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        state.lock().unwrap().watchers.push(tx);
        let stream = tokio_stream_from(rx).map(|b| Ok::<_, std::io::Error>(Frame::data(b)));
        return Ok(Response::builder()
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap());
    }
    let mut st = state.lock().unwrap();
    st.lists += 1;
    let mut list: serde_json::Value = serde_json::from_str(LIST).unwrap();
    list["metadata"]["resourceVersion"] = st.resource_version.to_string().into();
    list["items"] = serde_json::Value::Array(st.slices.clone());
    Ok(full(StatusCode::OK, list.to_string()))
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn k8s_routes(api: SocketAddr, tokenpath: &std::path::Path) -> String {
    let discovery = Discovery::kubernetes(&[&format!("http://{api}")])
        .tokenpath(&tokenpath.display().to_string())
        .service(Service::new("web.local", "web", "/"));
    Upstreams::new().discovery(discovery).render()
}

async fn answering(proxy: &Proxy) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..9 {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("web.local", "/").await;
        if resp.status() == 200 {
            seen.insert(header(&resp, "x-backend"));
        }
        body_bytes(resp).await;
    }
    seen
}

/// Waits up to 10 s until the backends answering for web.local are exactly `want`.
async fn wait_for(proxy: &Proxy, want: &[&str]) {
    let last = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let found = eventually_async(Duration::from_secs(10), || {
        let last = &last;
        async move {
            let seen = answering(proxy).await;
            let done = seen.iter().map(String::as_str).eq(want.iter().copied());
            *last.borrow_mut() = seen;
            done.then_some(())
        }
    })
    .await;
    assert!(
        found.is_some(),
        "wanted {want:?}, saw {:?}; log:\n{}",
        last.borrow(),
        proxy.log_text()
    );
}

/// A service-account directory with a token and a namespace file.
fn account(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let sa = dir.join("sa");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), token).unwrap();
    std::fs::write(sa.join("namespace"), "default").unwrap();
    sa.join("token")
}

#[tokio::test(start_paused = true)]
async fn endpoint_slices_are_listed_watched_and_relisted() {
    let a = Backend::start("a").await;
    let port = a.addr.port();
    let b = Backend::builder("b")
        .start_on(format!("127.0.0.2:{port}").parse().unwrap())
        .await;
    let c = Backend::builder("c")
        .start_on(format!("127.0.0.3:{port}").parse().unwrap())
        .await;
    // a is ready (condition absent counts as ready), b is not.
    let api = FakeApi::start(vec![slice(
        "web-1",
        port,
        &[("127.0.0.1", None), ("127.0.0.2", Some(false))],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &account(dir.path(), TOKEN)), "").await;
    wait_for(&proxy, &["a"]).await;

    api.event(
        "MODIFIED",
        slice(
            "web-1",
            port,
            &[("127.0.0.1", Some(true)), ("127.0.0.2", Some(true))],
        ),
    );
    wait_for(&proxy, &["a", "b"]).await;
    api.event("BOOKMARK", serde_json::json!({ "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "metadata": {} }));
    api.event("ADDED", slice("web-2", port, &[("127.0.0.3", Some(true))]));
    wait_for(&proxy, &["a", "b", "c"]).await;
    api.event("DELETED", slice("web-1", port, &[]));
    wait_for(&proxy, &["c"]).await;
    // A slice with no port number: its endpoints leave, and the log says why.
    let mut portless = slice("web-2", port, &[("127.0.0.3", Some(true))]);
    portless["ports"] = serde_json::json!([{ "name": "http", "protocol": "TCP" }]);
    api.event("MODIFIED", portless);
    let said =
        "EndpointSlice `web-2` lists no TCP port with a number; its 1 endpoint(s) are left out";
    let logged = eventually(Duration::from_secs(5), || proxy.log_text().contains(said)).await;
    assert!(logged, "{}", proxy.log_text());

    // 410 Gone: the watcher lists again and follows the new state.
    let lists_before = api.state.lock().unwrap().lists;
    api.expire(vec![slice("web-3", port, &[("127.0.0.2", Some(true))])]);
    wait_for(&proxy, &["b"]).await;
    assert!(
        api.state.lock().unwrap().lists > lists_before,
        "relisted after 410"
    );
    // Routine, not a failure: said at info, listed again at once, not counted.
    assert_eq!(proxy.discovery_failures("kubernetes"), 0);
    assert!(proxy
        .log_text()
        .contains("the watch's version is gone (410); listing again"));
    drop((a, b, c));
}

#[tokio::test(start_paused = true)]
async fn a_bad_token_is_reported_clearly() {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(
        &k8s_routes(api.addr, &account(dir.path(), "stale-token")),
        "",
    )
    .await;
    let reported = eventually(Duration::from_secs(10), || {
        proxy
            .log_text()
            .contains("401 Unauthorized from the API server: check the token")
    })
    .await;
    assert!(reported, "{}", proxy.log_text());
    assert!(answering(&proxy).await.is_empty());
}

/// Serves backend `a` from an API server that answers watches as `mode` says, and checks
/// that five watches take 3.5 s at least while `a` keeps serving; the proxy, to read its log.
async fn watched_again_once_a_second_at_most(mode: WatchMode) -> Proxy {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    api.state.lock().unwrap().watch_mode = mode;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &account(dir.path(), TOKEN)), "").await;
    wait_for(&proxy, &["a"]).await;
    let (before, started) = (
        api.state.lock().unwrap().watches,
        tokio::time::Instant::now(),
    );
    let asked = eventually(Duration::from_secs(60), || {
        api.state.lock().unwrap().watches >= before + 5
    })
    .await;
    assert!(asked, "the watcher stopped:\n{}", proxy.log_text());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(3500), "5 watches in {took:?}");
    assert_eq!(answering(&proxy).await, ["a".to_string()].into());
    proxy
}

/// An API server that ends each watch at once, cleanly: kube starts the next at once, and it
/// was asked thousands of times a second. A watch now lasts a second at least.
#[tokio::test(start_paused = true)]
async fn a_watch_that_ends_at_once_is_started_again_once_a_second_at_most() {
    watched_again_once_a_second_at_most(WatchMode::EndAtOnce).await;
}

/// An API server (or a balancer before it) that cuts each watch mid-event: kube takes the cut
/// for an end, says nothing and watches again at once (1,400 times a second). A cut watch now
/// lasts a second at least too, and is said.
#[tokio::test(start_paused = true)]
async fn a_watch_cut_mid_event_is_started_again_once_a_second_at_most_and_said() {
    let proxy = watched_again_once_a_second_at_most(WatchMode::CutMidLine).await;
    let said = proxy.log_text();
    assert!(said.contains("a watch was cut before its end"), "{said}");
}

/// A watch that sends one line without end is cut at 64 MiB (it grew to 15 GB); the last
/// known backends keep serving.
#[tokio::test(start_paused = true)]
async fn a_watch_line_without_end_is_cut_and_the_backends_kept() {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    api.state.lock().unwrap().watch_mode = WatchMode::Endless;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &account(dir.path(), TOKEN)), "").await;
    wait_for(&proxy, &["a"]).await;
    let cut = eventually(Duration::from_secs(60), || {
        proxy.log_text().contains("larger than 64 MiB")
    })
    .await;
    assert!(cut, "{}", proxy.log_text());
    assert_eq!(answering(&proxy).await, ["a".to_string()].into());
}

/// A token file written late, and ending in a newline (as `echo` writes it): the client was
/// never built without the file (discovery stayed off for good), and kube put the newline in
/// the header (every request failed). Now the API's 401 is logged until the file comes, and the
/// token is read trimmed.
#[tokio::test(start_paused = true)]
async fn a_token_file_written_late_with_a_newline_is_read() {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    let dir = tempfile::tempdir().unwrap();
    let token = account(dir.path(), TOKEN);
    std::fs::remove_file(&token).unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &token), "").await;
    let refused = eventually(Duration::from_secs(30), || {
        proxy.log_text().contains("401 Unauthorized")
    })
    .await;
    assert!(refused, "{}", proxy.log_text());
    let said = format!("`{}`, which cannot be read: No such file", token.display());
    assert!(proxy.log_text().contains(&said), "{}", proxy.log_text());
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    wait_for(&proxy, &["a"]).await;
    // The end of the refusals is said too.
    let log = proxy.log_text();
    assert!(log.contains("kubernetes: watching again after"), "{log}");
}

/// Backends `a` (127.0.0.1) and `b` (127.0.0.2) on one port, an API server whose one slice
/// lists `a`, and the proxy following it, answering from `a`.
async fn two_on_one_port() -> (Backend, Backend, FakeApi, tempfile::TempDir, Proxy) {
    let a = Backend::start("a").await;
    let port = a.addr.port();
    let b = Backend::builder("b")
        .start_on(format!("127.0.0.2:{port}").parse().unwrap())
        .await;
    let api = FakeApi::serving(&a).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &account(dir.path(), TOKEN)), "").await;
    wait_for(&proxy, &["a"]).await;
    (a, b, api, dir, proxy)
}

/// A watch request answered with HTTP 410 itself (not an ERROR event in the stream): kube's
/// watcher asks again from the same compacted version for good; aralez lists again.
#[tokio::test(start_paused = true)]
async fn a_watch_refused_with_410_gone_lists_again() {
    let (a, b, api, _dir, proxy) = two_on_one_port().await;
    let port = a.addr.port();
    {
        let mut st = api.state.lock().unwrap();
        st.watch_mode = WatchMode::Gone;
        st.slices = vec![slice("web-2", port, &[("127.0.0.2", Some(true))])];
        st.resource_version += 10;
        // The open watch ends; the next one is refused.
        st.watchers.clear();
    }
    wait_for(&proxy, &["b"]).await;
    drop((a, b));
}

/// A list refused every time (a stale token): kube's watcher starts its back-off again at each
/// list it begins, so the API server was asked once a second for good, and each failure was
/// followed by "watching again". The tries now come further and further apart (to 30 s), and
/// nothing says the watch is back until a list succeeds.
#[tokio::test(start_paused = true)]
async fn a_list_that_keeps_failing_is_tried_less_and_less_often() {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    let dir = tempfile::tempdir().unwrap();
    let token = account(dir.path(), "stale-token");
    let proxy = Proxy::start(&k8s_routes(api.addr, &token), "").await;
    proxy.pass(Duration::from_secs(120)).await;
    let asked = api.state.lock().unwrap().requests;
    assert!((3..=14).contains(&asked), "{asked} tries in 120 s");
    let log = proxy.log_text();
    assert!(!log.contains("watching again after"), "{log}");
    // Each failed try is counted where an alert can see it.
    let failures = proxy.discovery_failures("kubernetes");
    assert!(
        (3..=asked as u64).contains(&failures),
        "{failures} of {asked}"
    );
    // The failures name the API server, as Consul's lines name theirs.
    assert!(
        log.contains(&format!("server=http://{}", api.addr)),
        "{log}"
    );
    std::fs::write(&token, TOKEN).unwrap();
    let back = eventually(Duration::from_secs(60), || {
        proxy.log_text().contains("watching again after")
    });
    assert!(back.await, "{}", proxy.log_text());
    wait_for(&proxy, &["a"]).await;
}

/// A burst of slice changes (a rolling deploy, or a flapping endpoint) is published at most
/// every 250 ms: each event rebuilt every route and logged a line (23,000 a second).
#[tokio::test(start_paused = true)]
async fn a_burst_of_slice_changes_is_one_rebuild() {
    let (a, b, api, _dir, proxy) = two_on_one_port().await;
    let port = a.addr.port();
    let applied = || proxy.log_count("configuration applied");
    let before = applied();
    for round in 0..201 {
        let ip = if round % 2 == 0 {
            "127.0.0.2"
        } else {
            "127.0.0.1"
        };
        api.event("MODIFIED", slice("web-1", port, &[(ip, Some(true))]));
    }
    wait_for(&proxy, &["b"]).await;
    let rebuilds = applied() - before;
    assert!(
        (1..=4).contains(&rebuilds),
        "{rebuilds} rebuilds for 201 changes"
    );
    drop((a, b));
}

/// A list past 10,000 backends is dropped and the last known backends kept: an API server that
/// paged on without end had it all held in memory.
#[tokio::test(start_paused = true)]
async fn a_list_of_too_many_backends_keeps_the_last_known_ones() {
    let a = Backend::start("a").await;
    let api = FakeApi::serving(&a).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&k8s_routes(api.addr, &account(dir.path(), TOKEN)), "").await;
    wait_for(&proxy, &["a"]).await;
    let many = vec![("127.0.0.3", Some(true)); 10_001];
    let lists = api.state.lock().unwrap().lists;
    api.expire(vec![slice("web-big", a.addr.port(), &many)]);
    // The back-offs before the list (aralez's after the 410, kube's) pass in paused time, with
    // room: the clock jumps ahead whenever the runtime waits on a socket, which under load is
    // often. The list itself (a megabyte) is then waited for in real time.
    let relisting = eventually(Duration::from_secs(600), || {
        api.state.lock().unwrap().lists > lists
    });
    assert!(relisting.await, "{}", proxy.log_text());
    let said = inproc::in_real_time(Duration::from_secs(60), async {
        while !proxy.log_text().contains("lists more than 10000 backends") {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        }
    });
    assert!(said.await.is_some(), "{}", proxy.log_text());
    assert_eq!(answering(&proxy).await, ["a".to_string()].into());
}
