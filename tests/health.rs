//! Active health checks (SPEC §6.1) through the in-process proxy on tokio's paused clock:
//! failing backends leave rotation within two rounds and come back when fixed, a blackholed
//! backend does not delay the other checks, one that serves requests stays although its probes
//! run out of time, `healthcheck: false` is never probed, a route with
//! nothing up answers 503. The rounds' timing is virtual: no test waits on the wall clock.

use crate::inproc;
use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use inproc::Proxy;
use support::{body_bytes, header, Backend, Client, Host, Path, Proto, Upstreams};

/// hc_interval of 1 s; a response timeout short enough that a request sent to the blackholed
/// backend before its first probe does not stall the test.
const MAIN: &str = "hc_interval: 1\nupstream_response_timeout: 2";

/// `h.test/` to `backends`, health-checked unless `checked` is false.
fn route(backends: &[&Backend], checked: bool) -> String {
    let mut path = Path::servers(backends);
    if !checked {
        path = path.healthcheck(false);
    }
    Upstreams::new()
        .host("h.test", Host::new().path("/", path))
        .render()
}

/// A backend answering `status` (0: accepts and never answers).
async fn backend(name: &'static str, status: u16) -> Backend {
    Backend::builder(name).status(status).start().await
}

/// Which backends answered `n` requests, and every status seen.
async fn answered_by(c: &mut Client, n: usize) -> (HashSet<String>, HashSet<u16>) {
    let (mut names, mut statuses) = (HashSet::new(), HashSet::new());
    for _ in 0..n {
        let resp = c.get("h.test", "/").await;
        statuses.insert(resp.status().as_u16());
        names.insert(header(&resp, "x-backend"));
        body_bytes(resp).await;
    }
    (names, statuses)
}

fn set(names: &[&str]) -> HashSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn failing_backend_leaves_within_two_rounds_and_comes_back() {
    let a = backend("a", 200).await;
    let b = backend("b", 200).await;
    let proxy = Proxy::start(&route(&[&a, &b], true), MAIN).await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(answered_by(&mut c, 4).await.0, set(&["a", "b"]));

    b.set_status(500);
    proxy.pass(Duration::from_millis(2300)).await;
    let (names, statuses) = answered_by(&mut c, 10).await;
    assert_eq!((names, statuses), (set(&["a"]), HashSet::from([200])));
    // The warning says why the probe failed, once.
    let why = "health check failed (status 500 Internal Server Error)";
    assert_eq!(proxy.log_count(why), 1, "{}", proxy.log_text());

    b.set_status(204);
    proxy.pass(Duration::from_millis(2300)).await;
    assert_eq!(answered_by(&mut c, 6).await.0, set(&["a", "b"]));
    assert!(b.probes() >= 4, "b was probed {} times", b.probes());
}

#[tokio::test(start_paused = true)]
async fn blackholed_backend_does_not_delay_the_others() {
    let a = backend("a", 200).await;
    let hole = backend("hole", 0).await;
    let c3 = backend("c", 200).await;
    let proxy = Proxy::start(&route(&[&a, &hole, &c3], true), MAIN).await;
    proxy.pass(Duration::from_millis(1500)).await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(answered_by(&mut c, 6).await.0, set(&["a", "c"]));
    assert_eq!(
        hole.requests(),
        0,
        "the blackholed backend was out before any request"
    );

    // Rounds keep their pace although one probe per round never gets an answer...
    let before = a.probes();
    proxy.pass(Duration::from_millis(3500)).await;
    let during = a.probes() - before;
    assert!(
        during >= 3,
        "a was probed {during} times in 3.5 s with hc_interval 1"
    );
    // ...so a backend that starts failing still leaves within two rounds.
    c3.set_status(503);
    proxy.pass(Duration::from_millis(2300)).await;
    assert_eq!(
        answered_by(&mut c, 6).await,
        (set(&["a"]), HashSet::from([200]))
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_slow_to_answer_its_probes_stays_while_it_serves() {
    // Its probes get no answer (as from a backend too loaded to take a new connection at
    // once), but it answers every request: alive, so the rounds keep it in rotation.
    let a = Backend::builder("a")
        .h1_only()
        .hanging_probes()
        .start()
        .await;
    let proxy = Proxy::start(&route(&[&a], true), MAIN).await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let mut statuses = HashSet::new();
    // 4 s of requests, one every 100 ms: every round's probe runs out of time meanwhile.
    for _ in 0..40 {
        let resp = c.get("h.test", "/").await;
        statuses.insert(resp.status().as_u16());
        body_bytes(resp).await;
        proxy.pass(Duration::from_millis(100)).await;
    }
    assert_eq!(
        statuses,
        HashSet::from([200]),
        "never taken out while it served"
    );
    assert!(a.probes() >= 3, "a was probed {} times", a.probes());
    // With no requests answered meanwhile, a probe out of time takes it out.
    proxy.pass(Duration::from_millis(2300)).await;
    assert_eq!(c.get("h.test", "/").await.status(), 503);
}

#[tokio::test(start_paused = true)]
async fn healthcheck_false_is_never_probed() {
    let a = backend("a", 500).await;
    let proxy = Proxy::start(&route(&[&a], false), MAIN).await;
    proxy.pass(Duration::from_millis(2200)).await;
    assert_eq!(a.probes(), 0);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (names, statuses) = answered_by(&mut c, 3).await;
    assert_eq!((names, statuses), (set(&["a"]), HashSet::from([500])));
}

#[tokio::test(start_paused = true)]
async fn nothing_up_means_503_with_retry_after() {
    let a = backend("a", 500).await;
    let proxy = Proxy::start(&route(&[&a], true), MAIN).await;
    proxy.pass(Duration::from_millis(2300)).await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let resp = c.get("h.test", "/").await;
    assert_eq!(resp.status(), 503);
    assert_eq!(header(&resp, "retry-after"), "2");
    let before = a.requests();
    body_bytes(resp).await;
    a.set_status(200);
    proxy.pass(Duration::from_millis(2300)).await;
    assert_eq!(c.get("h.test", "/").await.status(), 200);
    assert_eq!(a.requests(), before + 1);
}
