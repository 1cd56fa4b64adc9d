//! Consul discovery against a test server that speaks Consul's HTTP API (the shapes in
//! tests/fixtures/consul/) with real blocking queries: a request with `index` equal to the
//! current one is held until the index changes or `wait` passes.
//!
//! The proxy runs in process (`tests/inproc`) with its real watcher, on tokio's paused clock:
//! backoffs and query timeouts are virtual time.

use crate::inproc;
use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use inproc::Proxy;
use support::*;
use tokio::sync::Notify;
use tokio::task::JoinSet;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

const FIXTURE: &str = include_str!("fixtures/consul/health-service-web-passing.json");

struct ConsulState {
    index: u64,
    instances: Vec<SocketAddr>,
    tokens_seen: Vec<String>,
    /// How the agent misbehaves, if it does.
    mode: Misbehaving,
    /// Health queries answered.
    queries: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Misbehaving {
    Not,
    /// Answers at once, with no `X-Consul-Index`.
    NoIndex,
    /// Answers with a body that never ends.
    Endless,
    /// Answers with 10,001 instances.
    Crowded,
}

/// A fake Consul agent for the service `web`.
struct FakeConsul {
    addr: SocketAddr,
    state: Arc<Mutex<ConsulState>>,
    changed: Arc<Notify>,
    tasks: JoinSet<()>,
}

/// A fake agent on an OS-chosen port, at `index`, listing `instances`.
async fn fake_consul(
    index: u64,
    instances: Vec<SocketAddr>,
) -> (FakeConsul, Arc<Mutex<ConsulState>>) {
    let state = Arc::new(Mutex::new(ConsulState {
        index,
        instances,
        tokens_seen: Vec::new(),
        mode: Misbehaving::Not,
        queries: 0,
    }));
    let consul = FakeConsul::start(any_local(), state.clone(), Arc::new(Notify::new())).await;
    (consul, state)
}

impl FakeConsul {
    async fn start(
        addr: SocketAddr,
        state: Arc<Mutex<ConsulState>>,
        changed: Arc<Notify>,
    ) -> FakeConsul {
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        let (st, ch) = (state.clone(), changed.clone());
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (st, ch) = (st.clone(), ch.clone());
                conns.spawn(async move {
                    let svc = service_fn(move |req| answer(req, st.clone(), ch.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeConsul {
            addr,
            state,
            changed,
            tasks,
        }
    }

    fn set(&self, instances: &[SocketAddr]) {
        let mut st = self.state.lock().unwrap();
        st.index += 1;
        st.instances = instances.to_vec();
        drop(st);
        self.changed.notify_waiters();
    }

    fn stop(mut self) -> (SocketAddr, Arc<Mutex<ConsulState>>, Arc<Notify>) {
        self.tasks.abort_all();
        (self.addr, self.state.clone(), self.changed.clone())
    }
}

/// The fixture's first entry, once per instance, with the instance's address and port.
fn body_for(instances: &[SocketAddr]) -> String {
    let template: serde_json::Value = serde_json::from_str::<Vec<serde_json::Value>>(FIXTURE)
        .unwrap()
        .remove(0);
    let entries: Vec<serde_json::Value> = instances
        .iter()
        .map(|addr| {
            let mut e = template.clone();
            e["Service"]["Address"] = serde_json::Value::String(addr.ip().to_string());
            e["Service"]["Port"] = serde_json::Value::from(addr.port());
            e
        })
        .collect();
    serde_json::to_string(&entries).unwrap()
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<Mutex<ConsulState>>,
    changed: Arc<Notify>,
) -> Result<Response<Body>, Infallible> {
    let full = |body: Full<Bytes>| Response::new(body.boxed());
    let token = req
        .headers()
        .get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    state.lock().unwrap().tokens_seen.push(token.clone());
    if token != "tok" {
        return Ok(Response::builder()
            .status(StatusCode::FORBIDDEN)
            .body(Full::new(Bytes::from("ACL not found")).boxed())
            .unwrap());
    }
    if req.uri().path() != "/v1/health/service/web" {
        return Ok(full(Full::new(Bytes::from("[]"))));
    }
    let query = req.uri().query().unwrap_or("").to_string();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
    };
    let asked: u64 = param("index").and_then(|i| i.parse().ok()).unwrap_or(0);
    let wait = param("wait")
        .and_then(|w| w.trim_end_matches('s').parse().ok())
        .unwrap_or(0u64);
    let mode = {
        let mut st = state.lock().unwrap();
        st.queries += 1;
        st.mode
    };
    match mode {
        Misbehaving::Not => {}
        Misbehaving::NoIndex => {
            let body = body_for(&state.lock().unwrap().instances);
            return Ok(full(Full::new(Bytes::from(body))));
        }
        Misbehaving::Crowded => {
            let entry = |port| {
                format!(
                    r#"{{"Node":{{"Address":""}},"Service":{{"Address":"127.0.0.9","Port":{port}}}}}"#
                )
            };
            let entries: Vec<String> = (1..=10_001).map(entry).collect();
            let body = format!("[{}]", entries.join(","));
            return Ok(Response::builder()
                .header("x-consul-index", "90")
                .body(Full::new(Bytes::from(body)).boxed())
                .unwrap());
        }
        Misbehaving::Endless => {
            let chunk = Bytes::from(vec![b' '; 1 << 20]);
            let spaces = futures_util::stream::repeat_with(move || Ok(Frame::data(chunk.clone())));
            let body = futures_util::stream::once(async { Ok(Frame::data(Bytes::from("["))) })
                .chain(spaces);
            return Ok(Response::builder()
                .header("x-consul-index", "70")
                .body(BodyExt::boxed(StreamBody::new(body)))
                .unwrap());
        }
    }
    let notified = changed.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if asked != 0 && asked == state.lock().unwrap().index {
        let _ = tokio::time::timeout(Duration::from_secs(wait), notified).await;
    }
    let st = state.lock().unwrap();
    Ok(Response::builder()
        .header("content-type", "application/json")
        .header("x-consul-index", st.index.to_string())
        .body(Full::new(Bytes::from(body_for(&st.instances))).boxed())
        .unwrap())
}

async fn backend_for_web(proxy: &Proxy) -> (u16, String) {
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("web.local", "/").await;
    let out = (resp.status().as_u16(), header(&resp, "x-backend"));
    body_bytes(resp).await;
    out
}

/// Waits until the set of backends answering for web.local is exactly `want`; returns how long it took.
async fn wait_for_set(proxy: &Proxy, want: &[&str], limit: Duration) -> Duration {
    let started = Instant::now();
    let last = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let found = eventually_async(limit, || {
        let last = &last;
        async move {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..8 {
                let (status, name) = backend_for_web(proxy).await;
                if status == 200 {
                    seen.insert(name);
                }
            }
            let done = seen.iter().map(String::as_str).eq(want.iter().copied());
            *last.borrow_mut() = seen;
            done.then_some(())
        }
    })
    .await;
    assert!(
        found.is_some(),
        "never saw {want:?} (last {:?}); log:\n{}",
        last.borrow(),
        proxy.log_text()
    );
    started.elapsed()
}

/// The `web` service of the Consul at `consul` (after one that refuses connections) routed as
/// web.local/, with `token`.
fn consul_discovery(consul: SocketAddr, token: &str) -> Discovery {
    Discovery::consul(&["http://127.0.0.1:1", &format!("http://{consul}")]).token(token)
}

fn consul_routes(consul: SocketAddr, token: &str) -> String {
    let web = Service::new("web.local", "web", "/").client_headers(&["X-Via:consul"]);
    Upstreams::new()
        .discovery(consul_discovery(consul, token).service(web))
        .render()
}

#[tokio::test(start_paused = true)]
async fn instances_follow_consul_and_survive_its_outage() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let (consul, state) = fake_consul(7, vec![a.addr]).await;
    // The first server in the list refuses connections: the watcher must move on to the second.
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;

    consul.set(&[a.addr, b.addr]);
    let took = wait_for_set(&proxy, &["a", "b"], Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(1),
        "an added instance took {took:?}"
    );
    consul.set(&[b.addr]);
    let took = wait_for_set(&proxy, &["b"], Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(1),
        "a removed instance took {took:?}"
    );
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(
        header(&client.get("web.local", "/").await, "x-via"),
        "consul",
        "service policies apply"
    );
    assert!(state.lock().unwrap().tokens_seen.iter().all(|t| t == "tok"));

    // Consul goes away: traffic keeps flowing to the last known backend.
    // Requests go on while the watcher fails and backs off three more times (100, 200, 400 ms
    // between tries), and after. (A failure is logged at start-up too: the first server in the
    // list refuses.)
    let failed = "keeping the last known backends";
    let failed_before = proxy.log_count(failed);
    let (addr, state, changed) = consul.stop();
    let outlasted = eventually_async(Duration::from_secs(10), || async {
        assert_eq!(backend_for_web(&proxy).await, (200, "b".to_string()));
        (proxy.log_count(failed) >= failed_before + 3).then_some(())
    })
    .await;
    assert!(
        outlasted.is_some(),
        "outage not reported:\n{}",
        proxy.log_text()
    );
    // Saying why: not only hyper's `client error (Connect)`; and counting each failure.
    let log = proxy.log_text();
    assert!(log.contains("Connection refused"), "{log}");
    let said = proxy.log_count(failed) as u64;
    let counted = proxy.discovery_failures("consul");
    assert!(
        counted >= said && said >= 4,
        "{counted} counted, {said} said"
    );
    assert_eq!(proxy.discovery_failures("kubernetes"), 0);
    for _ in 0..5 {
        assert_eq!(backend_for_web(&proxy).await, (200, "b".to_string()));
    }
    // It comes back with a lower index (a restarted agent): changes flow again.
    state.lock().unwrap().index = 1;
    let consul = FakeConsul::start(addr, state, changed).await;
    consul.set(&[a.addr]);
    wait_for_set(&proxy, &["a"], Duration::from_secs(15)).await;
    // ... and its return is said, with how long it was away.
    let log = proxy.log_text();
    assert!(log.contains("consul: answering again after"), "{log}");
}

#[tokio::test(start_paused = true)]
async fn a_wrong_token_is_reported_and_no_instance_means_503() {
    let a = Backend::start("a").await;
    let (consul, _) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "wrong"), "").await;
    let reported = eventually(Duration::from_secs(5), || {
        proxy.log_text().contains("ACL token was refused")
    })
    .await;
    assert!(reported, "{}", proxy.log_text());
    // The route is configured, its backends unknown: 503 (it was a 404, as if no such host).
    assert_eq!(
        backend_for_web(&proxy).await.0,
        503,
        "nothing discovered yet, no backend"
    );
    // ... and it says so: no backend is down, there is none yet.
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let body = body_bytes(client.get("web.local", "/").await).await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("this route has no backend"), "{body}");

    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    consul.set(&[]);
    let gone = eventually_async(Duration::from_secs(2), || async {
        (backend_for_web(&proxy).await.0 == 503).then_some(())
    })
    .await;
    assert!(gone.is_some(), "no 503 once the last instance left");
}

#[tokio::test(start_paused = true)]
async fn the_file_wins_over_a_discovered_route_on_conflict() {
    let (file_backend, discovered) = (Backend::start("file").await, Backend::start("consul").await);
    let (consul, _) = fake_consul(5, vec![discovered.addr]).await;
    // The file routes web.local/ itself; Consul also offers web.local/ and web.local/api.
    let discovery = consul_discovery(consul.addr, "tok")
        .service(Service::new("web.local", "web", "/"))
        .service(Service::new("web.local", "web", "/api"));
    let yaml = Upstreams::new()
        .discovery(discovery)
        .host(
            "web.local",
            Host::new().path("/", Path::servers(&[&file_backend])),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let appeared = eventually_async(Duration::from_secs(5), || async {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("web.local", "/api/x").await;
        (header(&resp, "x-backend") == "consul").then_some(())
    })
    .await;
    assert!(
        appeared.is_some(),
        "discovered /api never appeared:\n{}",
        proxy.log_text()
    );
    for _ in 0..10 {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("web.local", "/").await;
        assert_eq!(header(&resp, "x-backend"), "file", "the file's route wins");
    }
}

/// A discovered service whose hostname is `DEFAULT` catches every host no route names, as the
/// file's `DEFAULT` does (it was read as a host called `default`).
#[tokio::test(start_paused = true)]
async fn a_discovered_default_host_catches_every_other_host() {
    let discovered = Backend::start("consul").await;
    let (consul, _) = fake_consul(5, vec![discovered.addr]).await;
    let discovery =
        consul_discovery(consul.addr, "tok").service(Service::new("DEFAULT", "web", "/"));
    let yaml = Upstreams::new().discovery(discovery).render();
    let proxy = Proxy::start(&yaml, "").await;
    let caught = eventually_async(Duration::from_secs(5), || async {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("any.example", "/x").await;
        (header(&resp, "x-backend") == "consul").then_some(())
    })
    .await;
    assert!(caught.is_some(), "{}", proxy.log_text());
}

/// An agent whose answers carry no index returns at once each time: the watcher asked it
/// thousands of times a second. Queries now start at least 250 ms apart.
#[tokio::test(start_paused = true)]
async fn an_agent_that_answers_at_once_is_asked_four_times_a_second_at_most() {
    let a = Backend::start("a").await;
    let (consul, state) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    state.lock().unwrap().mode = Misbehaving::NoIndex;
    // The blocking query under way returns at once.
    consul.set(&[a.addr]);
    let (before, started) = (state.lock().unwrap().queries, Instant::now());
    let asked = eventually(Duration::from_secs(30), || {
        state.lock().unwrap().queries >= before + 9
    })
    .await;
    assert!(asked, "the watcher stopped asking");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1750), "8 queries in {took:?}");
    assert_eq!(backend_for_web(&proxy).await, (200, "a".to_string()));
}

/// An answer whose body never ends is cut at 64 MiB: it was read into memory without limit
/// (13 GB in 30 s). The last known backends keep serving.
#[tokio::test(start_paused = true)]
async fn an_answer_without_end_is_cut_and_the_backends_kept() {
    let a = Backend::start("a").await;
    let (consul, state) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    // The blocking query under way ends with its wait; the next one meets the endless body.
    state.lock().unwrap().mode = Misbehaving::Endless;
    let cut = eventually(Duration::from_secs(120), || {
        proxy
            .log_text()
            .contains("reading the answer: larger than 64 MiB")
    })
    .await;
    assert!(cut, "{}", proxy.log_text());
    assert_eq!(backend_for_web(&proxy).await, (200, "a".to_string()));
}

/// A new file config that changes `consul:` restarts the watchers on it: the change was dropped
/// silently ("no route changes"), the old service still watched and routed, even with the
/// section gone.
#[tokio::test(start_paused = true)]
async fn a_changed_consul_section_is_followed() {
    let a = Backend::start("a").await;
    let (consul, _state) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    let moved = Upstreams::new()
        .discovery(consul_discovery(consul.addr, "tok").service(Service::new(
            "web2.local",
            "web",
            "/",
        )))
        .render();
    proxy
        .ctx
        .reloader
        .apply_text(&moved, false)
        .expect("applied");
    let served = |host: &'static str| {
        let proxy = &proxy;
        async move {
            let mut client = Client::connect(Proto::H1, proxy.addr).await;
            let resp = client.get(host, "/").await;
            let status = resp.status().as_u16();
            body_bytes(resp).await;
            status
        }
    };
    let followed = eventually_async(Duration::from_secs(5), || async {
        (served("web2.local").await == 200).then_some(())
    })
    .await;
    assert!(followed.is_some(), "{}", proxy.log_text());
    assert_eq!(served("web.local").await, 404);
    // The same service with other settings: a change in Consul afterwards must not bring the
    // earlier section's back. Its watch went on, and published its own view over the new one
    // at each change (an `authorization` just added came and went).
    let marked = Service::new("web2.local", "web", "/").client_headers(&["X-Via:second"]);
    let again = Upstreams::new()
        .discovery(consul_discovery(consul.addr, "tok").service(marked))
        .render();
    let reloader = &proxy.ctx.reloader;
    reloader.apply_text(&again, false).expect("applied");
    let via = || async {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("web2.local", "/").await;
        let via = header(&resp, "x-via");
        body_bytes(resp).await;
        via
    };
    let second = eventually_async(Duration::from_secs(5), || async {
        (via().await == "second").then_some(())
    });
    assert!(second.await.is_some(), "{}", proxy.log_text());
    let b = Backend::start("b").await;
    consul.set(&[a.addr, b.addr]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..4 {
        assert_eq!(via().await, "second", "{}", proxy.log_text());
    }
    // Only the watch of the serving section published: the earlier ones, when they went on,
    // each put their own routes back, and which one came last decided what served.
    let log = proxy.log_text();
    assert_eq!(log.matches("hosts added: web.local;").count(), 1, "{log}");
    let without = Upstreams::new()
        .host("other.local", Host::new().path("/", Path::servers(&[&a])))
        .render();
    proxy
        .ctx
        .reloader
        .apply_text(&without, false)
        .expect("applied");
    assert_eq!(served("web2.local").await, 404);
}

/// A changed `consul:` section while Consul is down: the services it still lists keep their
/// last known backends, under the new settings (they all went, 404, until Consul answered).
#[tokio::test(start_paused = true)]
async fn a_changed_section_keeps_the_last_known_backends_while_consul_is_down() {
    let a = Backend::start("a").await;
    let (consul, _) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    let (consul_addr, _, _) = consul.stop();
    let marked = Service::new("web.local", "web", "/").client_headers(&["X-Via:changed"]);
    let other = Service::new("api.local", "api", "/");
    let changed = Upstreams::new()
        .discovery(
            consul_discovery(consul_addr, "tok")
                .service(marked)
                .service(other),
        )
        .render();
    proxy
        .ctx
        .reloader
        .apply_text(&changed, false)
        .expect("applied");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("web.local", "/").await;
    assert_eq!(resp.status(), 200, "{}", proxy.log_text());
    assert_eq!(header(&resp, "x-via"), "changed", "the new settings apply");
    body_bytes(resp).await;
    // A service never answered for yet: its route, no backend.
    let resp = client.get("api.local", "/").await;
    assert_eq!(resp.status(), 503);
    body_bytes(resp).await;
}

/// The first server takes connections and never answers: its first query (which does not
/// block) is given 5 s, then the next server is asked. It was given the blocking queries' 40 s,
/// every discovered route answering 503 meanwhile.
#[tokio::test(start_paused = true)]
async fn a_silent_first_server_is_left_after_5_s() {
    let a = Backend::start("a").await;
    let (consul, _state) = fake_consul(3, vec![a.addr]).await;
    let silent_addr = support::silent_server().await;
    let servers = [
        format!("http://{silent_addr}"),
        format!("http://{}", consul.addr),
    ];
    let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
    let web = Service::new("web.local", "web", "/");
    let routes = Upstreams::new()
        .discovery(Discovery::consul(&servers).token("tok").service(web))
        .render();
    let proxy = Proxy::start(&routes, "").await;
    let took = wait_for_set(&proxy, &["a"], Duration::from_secs(20)).await;
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(proxy.log_text().contains("no whole answer within 5s"));
}

/// An answer of more than 10,000 instances is refused, the last known backends kept: building
/// routes of 100,000 backends held the control plane for half a minute.
#[tokio::test(start_paused = true)]
async fn an_answer_of_too_many_instances_keeps_the_last_known_backends() {
    let a = Backend::start("a").await;
    let (consul, state) = fake_consul(3, vec![a.addr]).await;
    let proxy = Proxy::start(&consul_routes(consul.addr, "tok"), "").await;
    wait_for_set(&proxy, &["a"], Duration::from_secs(5)).await;
    state.lock().unwrap().mode = Misbehaving::Crowded;
    consul.set(&[a.addr]);
    let said = eventually(Duration::from_secs(60), || {
        proxy
            .log_text()
            .contains("the service lists 10001 backends, more than 10000")
    });
    assert!(said.await, "{}", proxy.log_text());
    assert_eq!(backend_for_web(&proxy).await, (200, "a".to_string()));
}
