//! Active health checks (SPEC §6.1) through the in-process proxy on tokio's paused clock:
//! failing backends leave rotation within two rounds and come back when fixed, a blackholed
//! backend does not delay the other checks, `healthcheck: false` is never probed, a route with
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
