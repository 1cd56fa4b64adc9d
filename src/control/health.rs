//! Active health checks (SPEC §6.1), run on the control-plane runtime.
//!
//! Every `hc_interval` seconds, one round: each distinct (backend, route path) pair of the serving
//! snapshot is probed once, all at the same time, with `hc_method` on the path over a fresh
//! connection. A probe passes when a response with status < 500 arrives within
//! min(`hc_interval`, 5 s). A failed probe takes the backend out of the routes at that path
//! (a backend shared with another route whose probe passes stays in that one) until a round
//! where it passes. Routes with `healthcheck: false` are not probed
//! (their backends count as up; passive health still applies).
//!
//! A probe that only ran out of time does not fail while the backend answered proxied requests
//! (status < 500) meanwhile: it is alive, only slow to take a new connection or to answer the
//! probe, as under load. Taking it out would turn a slow moment into 503s, or move its load onto
//! the others. A backend that answers nothing, or answers the probe 5xx, leaves as before.
//!
//! The state lives on [`Backend`], which the registry shares between snapshots, so it survives
//! reloads. A blackholed backend only costs its own probe's timeout: probes never wait for each
//! other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Method, Request};
use http_body_util::{Either, Empty};
use tokio::task::JoinSet;

use crate::routing::Snapshot;
use crate::upstream::connector::{self, ConnectError};
use crate::upstream::{detect, Backend, UpBody};

/// Longest a probe may take, whatever the interval.
pub const MAX_PROBE_TIME: Duration = Duration::from_secs(5);

/// How rounds are run.
#[derive(Clone, Debug)]
pub struct HealthSettings {
    pub method: Method,
    pub interval: Duration,
}

impl HealthSettings {
    /// `hc_method` and `hc_interval` of `main.yaml`.
    pub fn from_main(main: &crate::config::MainConfig) -> HealthSettings {
        HealthSettings {
            method: main.hc_method.clone(),
            interval: main.hc_interval,
        }
    }

    /// How long one probe may take: min(interval, 5 s).
    pub fn probe_timeout(&self) -> Duration {
        self.interval.min(MAX_PROBE_TIME)
    }
}

/// Starts the checks on `runtime`; they run until it shuts down.
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    main: &crate::config::MainConfig,
    snapshot: Arc<ArcSwap<Snapshot>>,
) {
    runtime.spawn(run(snapshot, HealthSettings::from_main(main)));
}

/// Runs a round every interval over the serving snapshot, forever.
pub async fn run(snapshot: Arc<ArcSwap<Snapshot>>, settings: HealthSettings) {
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let current = snapshot.load_full();
        round(&current, &settings).await;
    }
}

/// One round over every probed (backend, path) pair, each verdict for that path's routes
/// only; returns how many probes ran. A TLS backend is probed once for each server name its
/// routes of that path ask for (a certificate good for one host may not be for another); any
/// other once, its verdict for every name.
pub async fn round(snapshot: &Snapshot, settings: &HealthSettings) -> usize {
    let mut probes: JoinSet<()> = JoinSet::new();
    let mut pairs: HashMap<(usize, &str), AskedFor> = HashMap::new();
    for route in snapshot.routes().filter(|r| r.backends.health_checked()) {
        for backend in route.backends.iter() {
            let id = Arc::as_ptr(backend) as usize;
            let asked = pairs
                .entry((id, &route.prefix))
                .or_insert_with(|| AskedFor {
                    backend: backend.clone(),
                    names: Vec::new(),
                });
            let name = backend.server_name_for(&route.host);
            if !asked.names.iter().any(|n| n == name) {
                asked.names.push(name.to_string());
            }
        }
    }
    for ((_, path), AskedFor { backend, names }) in pairs {
        let by_name = speaks_tls(&backend);
        let probed: Vec<(String, Vec<String>)> = match by_name {
            true => names.into_iter().map(|n| (n.clone(), vec![n])).collect(),
            false => vec![(names[0].clone(), names)],
        };
        for (name, verdict_for) in probed {
            let (backend, path) = (backend.clone(), path.to_string());
            let (method, timeout) = (settings.method.clone(), settings.probe_timeout());
            probes.spawn(async move {
                if let Some(verdict) = probe(&backend, &name, &path, method, timeout).await {
                    let verdict = verdict.as_ref().copied().map_err(String::as_str);
                    for name in &verdict_for {
                        backend.set_probed(name, &path, verdict);
                    }
                }
            });
        }
    }
    let count = probes.len();
    while probes.join_next().await.is_some() {}
    count
}

/// A backend probed on one path, and the server names its routes there ask for.
struct AskedFor {
    backend: Arc<Backend>,
    names: Vec<String>,
}

/// Whether `backend` is spoken to over TLS: so configured, or so detected.
fn speaks_tls(backend: &Backend) -> bool {
    backend.spec.scheme == Some(crate::config::values::Scheme::Https)
        || backend.wire() == Some(connector::Wire::Tls)
}

/// One probe: passed when a status below 500 arrives within `timeout`, asking for `name` over
/// TLS, else failed with why; `None` when the proxy could not even try (no socket: its own
/// shortage, not the backend's).
pub async fn probe(
    backend: &Backend,
    name: &str,
    path: &str,
    method: Method,
    timeout: Duration,
) -> Option<Result<(), String>> {
    let attempt = async {
        let wire = detect::wire_of(backend, timeout).await?;
        let addrs = backend.addrs();
        let ep = backend.endpoint(&addrs, wire);
        let req = probe_request(backend, path, method);
        connector::exchange_once(ep, name, req, timeout).await
    };
    let answers_before = backend.answers();
    // Detecting first (no protocol known yet) has the TLS probe's time on top: within the
    // probe's own, a backend that sits on a ClientHello for as long as probes may take was
    // never detected, its probes all failed, and it stayed out of rotation for good.
    let budget = match backend.wire() {
        Some(_) => timeout,
        None => timeout + detect::tls_probe_wait(timeout),
    };
    let outcome: Result<Result<_, ConnectError>, _> = tokio::time::timeout(budget, attempt).await;
    let timed_out = match &outcome {
        Err(_) => true,
        Ok(Err(e)) => e.is_timeout(),
        Ok(Ok(_)) => false,
    };
    let answered_meanwhile = backend.answers().saturating_sub(answers_before);
    if timed_out && answered_meanwhile > 0 {
        tracing::debug!(backend = %backend.label, path, "health probe: no answer within {timeout:?}, but {answered_meanwhile} requests were answered meanwhile; kept in rotation");
        return Some(Ok(()));
    }
    if let Ok(Err(e)) = &outcome {
        if e.kind() == connector::ConnectErrorKind::Local {
            // The proxy could not even try: this round says nothing of the backend.
            tracing::warn!(backend = %backend.label, path, "health probe not made: {e}");
            return None;
        }
        doubt_detection(backend, e);
    }
    let why = match outcome {
        Ok(Ok(resp)) if resp.status().as_u16() < 500 => return Some(Ok(())),
        Ok(Ok(resp)) => format!("status {}", resp.status()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {timeout:?}"),
    };
    tracing::debug!(backend = %backend.label, path, "health probe: {why}");
    Some(Err(why))
}

/// What a failed probe says about the backend's detected protocol. No connection: it may come
/// back speaking something else, so it is detected again. A connection that failed later (a
/// handshake, a reset, an answer that is not HTTP) may be the protocol or only this path (a
/// path that resets, shared with routes whose requests are answered): a doubt, three in a row
/// without an answer between detect it again ([`Backend::doubt_protocol`]). Detecting holds
/// every request to the backend, on every route, for up to the TLS probe's wait: one path's
/// failing probe did that every round. A probe that ran out of time says nothing.
fn doubt_detection(backend: &Backend, error: &ConnectError) {
    use connector::ConnectErrorKind as Kind;
    // A refused certificate says the backend speaks TLS.
    if error.is_timeout() || error.is_certificate_refused() {
        return;
    }
    match error.kind() {
        Kind::Resolve | Kind::Tcp => backend.forget_detection(),
        Kind::Tls | Kind::Handshake | Kind::Exchange | Kind::BadResponse => {
            backend.doubt_protocol()
        }
        Kind::BodyTooLarge | Kind::Capacity | Kind::Local => {}
    }
}

/// The probe in HTTP/1.1 form; the connector rewrites it when the backend speaks HTTP/2.
fn probe_request(backend: &Backend, path: &str, method: Method) -> Request<UpBody> {
    let path = PathAndQuery::try_from(path).unwrap_or_else(|_| PathAndQuery::from_static("/"));
    let mut req = Request::new(Either::Right(Empty::new()));
    *req.method_mut() = method;
    *req.uri_mut() = Uri::from(path);
    let headers = req.headers_mut();
    if let Ok(host) = HeaderValue::from_str(backend.authority.as_str()) {
        headers.insert(header::HOST, host);
    }
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("aralez-health-check"),
    );
    if method_has_a_body(req.method()) {
        // RFC 9110 §8.6: a POST says its length even when it is 0 (HAProxy's does; a server
        // that demands it answered 411, which passed, never running the handler probed).
        let headers = req.headers_mut();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    req
}

fn method_has_a_body(method: &Method) -> bool {
    [Method::POST, Method::PUT, Method::PATCH].contains(method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_upstreams_text, Issues};
    use crate::layers::{Keys, PolicyState};
    use crate::upstream::Registry;
    use crate::vocab::WorkerId;
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A raw HTTP/1.1 server answering `status` (0: accept and never answer).
    async fn server(status: Arc<AtomicU16>, hits: Arc<AtomicUsize>) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    continue;
                };
                let (status, hits) = (status.clone(), hits.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let _ = s.read(&mut buf).await;
                    hits.fetch_add(1, Ordering::SeqCst);
                    let code = status.load(Ordering::SeqCst);
                    if code == 0 {
                        std::future::pending::<()>().await;
                    }
                    let head = format!(
                        "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                });
            }
        });
        addr
    }

    fn snapshot(yaml: &str, registry: &Registry) -> Snapshot {
        let mut issues = Issues::default();
        let cfg = parse_upstreams_text(yaml, "test", &mut issues).expect("valid");
        Snapshot::build(&cfg, registry, &PolicyState::new(Keys::for_tests(None)))
    }

    #[tokio::test]
    async fn failing_and_silent_backends_leave_rotation_and_come_back() {
        let (ok, bad, silent) = (
            Arc::new(AtomicU16::new(204)),
            Arc::new(AtomicU16::new(500)),
            Arc::new(AtomicU16::new(0)),
        );
        let hits = Arc::new(AtomicUsize::new(0));
        let a = server(ok.clone(), hits.clone()).await;
        let b = server(bad.clone(), hits.clone()).await;
        let c = server(silent.clone(), hits.clone()).await;
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml = format!(
            "upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{a}\", \"{b}\", \"{c}\"]\n      /x:\n        servers: [\"{a}\"]\n"
        );
        let snap = snapshot(&yaml, &registry);
        let settings = HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_millis(300),
        };
        let started = std::time::Instant::now();
        assert_eq!(
            round(&snap, &settings).await,
            4,
            "(a,/), (b,/), (c,/), (a,/x)"
        );
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "the silent one only costs its own timeout"
        );
        let route = snap.routes().find(|r| &*r.prefix == "/").unwrap();
        let up: Vec<bool> = route.backends.iter().map(|b| b.is_up()).collect();
        assert_eq!(up, [true, false, false]);
        bad.store(200, Ordering::SeqCst);
        silent.store(404, Ordering::SeqCst);
        round(&snap, &settings).await;
        assert!(
            route.backends.iter().all(|b| b.is_up()),
            "fixed backends come back"
        );
        // A reload keeps the state: same registry, new snapshot.
        bad.store(503, Ordering::SeqCst);
        round(&snap, &settings).await;
        let reloaded = snapshot(&yaml, &registry);
        let route = reloaded.routes().find(|r| &*r.prefix == "/").unwrap();
        assert!(!route.backends.get(1).unwrap().is_up());
    }

    /// One route's path that fails its probes takes that route's backend out, but does not
    /// make the backend's protocol be detected again every round (detecting holds every
    /// request to it, on every route).
    #[tokio::test]
    async fn one_failing_path_does_not_make_its_backend_detected_again() {
        let addr = answering_heads(|head| !head.windows(8).any(|w| w == b" /reset ")).await;
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml = format!(
            "upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{addr}\"]\n      /reset:\n        servers: [\"{addr}\"]\n"
        );
        let snap = snapshot(&yaml, &registry);
        let settings = HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_millis(500),
        };
        for _ in 0..2 {
            round(&snap, &settings).await;
            let by_path = |p: &str| snap.routes().find(|r| &*r.prefix == p).unwrap();
            let backend = by_path("/").backends.get(0).unwrap().clone();
            assert!(backend.wire().is_some(), "detected again");
            assert!(by_path("/").backends.usable_at(0));
            assert!(!by_path("/reset").backends.usable_at(0));
        }
    }

    /// A raw HTTP/1.1 server that answers 204 once it has a request head `answers` takes, and
    /// says nothing to anything else, a TLS ClientHello included (as many small servers do); a
    /// head it does not take is answered by a close without a word (as a path failing behind it
    /// would).
    async fn answering_heads(answers: fn(&[u8]) -> bool) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 2048];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    if !answers(&seen) {
                        return;
                    }
                    let head = "HTTP/1.1 204 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = s.write_all(head.as_bytes()).await;
                });
            }
        });
        addr
    }

    /// A POST probe says its length (0): a backend that demands it is probed for real.
    #[tokio::test]
    async fn a_post_probe_says_its_length() {
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let probe_post = |addr: std::net::SocketAddr| {
            let yaml = format!(
                "upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"http://{addr}\"]\n"
            );
            let snap = snapshot(&yaml, &registry);
            let backend = snap
                .routes()
                .next()
                .unwrap()
                .backends
                .iter()
                .next()
                .cloned();
            async move {
                let backend = backend.unwrap();
                probe(&backend, "h", "/", Method::POST, Duration::from_secs(1)).await
            }
        };
        let closing = answering_heads(|_| false).await;
        let post = probe_post(closing).await;
        assert!(post.is_some_and(|r| r.is_err()), "a closed probe fails");
        let says_length = |head: &[u8]| {
            let head = String::from_utf8_lossy(head).to_ascii_lowercase();
            head.contains("\r\ncontent-length: 0\r\n")
        };
        let wanting_a_length = answering_heads(says_length).await;
        assert_eq!(probe_post(wanting_a_length).await, Some(Ok(())));
    }

    #[tokio::test]
    async fn a_backend_that_sits_on_a_client_hello_for_the_whole_probe_time_is_detected() {
        let addr = answering_heads(|_| true).await;
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml =
            format!("upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{addr}\"]\n");
        let snap = snapshot(&yaml, &registry);
        // Probes have 1 s; the TLS probe waits as long for an answer that never comes.
        let settings = HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_secs(1),
        };
        round(&snap, &settings).await;
        let route = snap.routes().next().unwrap();
        let backend = route.backends.iter().next().unwrap();
        assert!(backend.is_up(), "the probe ran out of time while detecting");
        assert_eq!(backend.wire(), Some(crate::upstream::Wire::Http1));
    }

    /// A raw HTTP/1.1 server answering 500 to requests for `/admin`, 204 to the others.
    async fn failing_at_admin() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let admin = buf[..n].windows(7).any(|w| w == b" /admin");
                    let code = if admin { 500 } else { 204 };
                    let head = format!(
                        "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                });
            }
        });
        addr
    }

    /// SPEC §6.1 probes each (backend, path): a backend failing one route's probe leaves that
    /// route only. It left every route, taking the whole site down with one broken path.
    #[tokio::test]
    async fn a_failed_probe_takes_the_backend_out_of_its_paths_routes_only() {
        let (a, b) = (failing_at_admin().await, failing_at_admin().await);
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml = format!(
            "upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{a}\", \"{b}\"]\n      /admin:\n        servers: [\"{a}\", \"{b}\"]\n"
        );
        let snap = snapshot(&yaml, &registry);
        let settings = HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_millis(300),
        };
        assert_eq!(round(&snap, &settings).await, 4);
        let usable = |prefix: &str| {
            let route = snap.routes().find(|r| &*r.prefix == prefix).unwrap();
            (0..2)
                .map(|i| route.backends.usable_at(i))
                .collect::<Vec<_>>()
        };
        assert_eq!(usable("/"), [true, true]);
        assert_eq!(usable("/admin"), [false, false]);
        // The verdicts outlive a reload (the registry keeps them).
        let reloaded = snapshot(&yaml, &registry);
        let route = reloaded.routes().find(|r| &*r.prefix == "/admin").unwrap();
        assert!(!route.backends.usable_at(0));
    }

    #[tokio::test]
    async fn a_probe_out_of_time_keeps_a_backend_that_answers_requests_meanwhile() {
        let hits = Arc::new(AtomicUsize::new(0));
        let silent = server(Arc::new(AtomicU16::new(0)), hits.clone()).await;
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml =
            format!("upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{silent}\"]\n");
        let snap = snapshot(&yaml, &registry);
        let settings = HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_millis(200),
        };
        let route = snap.routes().next().unwrap();
        let backend = route.backends.get(0).unwrap().clone();
        // Proxied requests answered while the probe waits: alive, so it stays.
        let serving = answering(&backend, http::StatusCode::NOT_FOUND);
        round(&snap, &settings).await;
        serving.abort();
        assert!(backend.is_up(), "answering requests, so kept");
        // Answers of 5xx are no sign of life.
        let failing = answering(&backend, http::StatusCode::BAD_GATEWAY);
        round(&snap, &settings).await;
        failing.abort();
        assert!(!backend.is_up(), "only 5xx answers, so out");
    }

    /// Notes an answer of `status` from `backend` every 20 ms, as proxied traffic would.
    fn answering(backend: &Arc<Backend>, status: http::StatusCode) -> tokio::task::JoinHandle<()> {
        let backend = backend.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                backend.note_answer(WorkerId(0), status);
            }
        })
    }

    #[tokio::test]
    async fn healthcheck_false_is_not_probed() {
        let hits = Arc::new(AtomicUsize::new(0));
        let a = server(Arc::new(AtomicU16::new(500)), hits.clone()).await;
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let yaml = format!("upstreams:\n  h:\n    paths:\n      /:\n        servers: [\"{a}\"]\n        healthcheck: false\n");
        let snap = snapshot(&yaml, &registry);
        let settings = HealthSettings {
            method: Method::GET,
            interval: Duration::from_secs(1),
        };
        assert_eq!(round(&snap, &settings).await, 0);
        assert_eq!(hits.load(Ordering::SeqCst), 0);
        let route = snap.routes().next().unwrap();
        assert!(route.backends.usable_at(0));
    }

    #[test]
    fn probe_timeout_is_capped() {
        let s = |secs| HealthSettings {
            method: Method::HEAD,
            interval: Duration::from_secs(secs),
        };
        assert_eq!(s(2).probe_timeout(), Duration::from_secs(2));
        assert_eq!(s(30).probe_timeout(), MAX_PROBE_TIME);
    }
}
