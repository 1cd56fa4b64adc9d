//! Failover, passive health, keep-alive reuse and timeouts through the in-process proxy on
//! tokio's paused clock (timeouts are virtual time; nothing waits on the wall clock).

mod inproc;
mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use inproc::Proxy;
use support::*;
use tokio::time::Instant;

/// One route over `backends`, active probes off: these tests count requests and exercise
/// failover and passive health on their own (tests/health.rs covers active checks).
async fn one_route(backends: &[&Backend], main_extra: &str) -> Proxy {
    Proxy::start(&default_route(backends), main_extra).await
}

#[tokio::test(start_paused = true)]
async fn a_backend_stopped_mid_test_costs_no_request() {
    for proto in PROTOCOLS {
        let (a, b) = (Backend::start("a").await, Backend::start("b").await);
        let proxy = one_route(&[&a, &b], "").await;
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(Client::connect(proto, proxy.addr).await);
        }
        let mut tasks = Vec::new();
        for (i, mut client) in clients.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                for n in 0..250 {
                    let resp = client.get("any", &format!("/r/{i}/{n}")).await;
                    let status = resp.status();
                    let backend = header(&resp, "x-backend");
                    body_bytes(resp).await;
                    if status != 200 {
                        failures.push(format!("request {i}/{n}: {status} from {backend}"));
                    }
                }
                failures
            }));
        }
        // Let some traffic reach both, then stop one (its open connections are closed too).
        assert!(
            eventually(Duration::from_secs(10), || b
                .requests
                .load(Ordering::SeqCst)
                > 50)
            .await
        );
        b.stop();
        let b_at_stop = b.requests.load(Ordering::SeqCst);
        let mut failures = Vec::new();
        for t in tasks {
            failures.extend(t.await.unwrap());
        }
        assert!(
            failures.is_empty(),
            "{proto:?}: {} failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        // Read after the clients finish: a request already running in b when it stopped may
        // still have been counted (and answered) after the stop.
        let served_by_b = b.requests.load(Ordering::SeqCst);
        assert!(
            served_by_b <= b_at_stop + 8,
            "b kept serving after it stopped: {b_at_stop} -> {served_by_b}"
        );
        let total = a.requests.load(Ordering::SeqCst) + served_by_b;
        assert!(total >= 1000, "{proto:?}: backends saw {total} requests");
        assert!(served_by_b < 1000 && a.requests.load(Ordering::SeqCst) > 0);
    }
}

#[tokio::test(start_paused = true)]
async fn all_backends_down_gives_502_then_503_never_a_hang() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = one_route(&[&a, &b], "hc_interval: 30").await;
    a.stop();
    b.stop();
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let mut statuses = Vec::new();
        for _ in 0..8 {
            let started = Instant::now();
            let resp = client.get("any", "/").await;
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{proto:?}: took {:?}",
                started.elapsed()
            );
            let status = resp.status().as_u16();
            if status == 503 {
                assert_eq!(header(&resp, "retry-after"), "2");
            }
            body_bytes(resp).await;
            statuses.push(status);
        }
        assert!(
            statuses.iter().all(|s| *s == 502 || *s == 503),
            "{proto:?}: {statuses:?}"
        );
        // After three failed connects each, passive health takes both out: 503 from then on.
        assert_eq!(*statuses.last().unwrap(), 503, "{proto:?}: {statuses:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn keep_alive_reuses_backend_connections() {
    for proto in PROTOCOLS {
        let a = Backend::start("a").await;
        let proxy = one_route(&[&a], "").await;
        let mut client = Client::connect(proto, proxy.addr).await;
        for n in 0..2000 {
            let resp = client.get("any", &format!("/n/{n}")).await;
            assert_eq!(resp.status(), 200);
            body_bytes(resp).await;
        }
        let accepts = a.accepts.load(Ordering::SeqCst);
        assert_eq!(a.requests.load(Ordering::SeqCst), 2000);
        assert!(
            accepts <= 3,
            "{proto:?}: 2000 requests opened {accepts} backend connections"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn slow_backend_gets_504_after_the_response_timeout() {
    let a = Backend::start("a").await;
    let proxy = one_route(&[&a], "upstream_response_timeout: 1").await;
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let started = Instant::now();
        let resp = client.get("any", "/slow/3000").await;
        assert_eq!(resp.status(), 504, "{proto:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
            "{proto:?}: {waited:?}"
        );
        body_bytes(resp).await;
        // The connection still serves.
        let resp = client.get("any", "/").await;
        assert_eq!(resp.status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn unreachable_backend_times_out_or_is_refused_quickly() {
    // 127.0.0.1:1 refuses at once: 502, and the next backend of the route answers instead.
    let a = Backend::start("a").await;
    let servers = ["127.0.0.1:1".to_string(), a.addr.to_string()];
    let yaml = Upstreams::new()
        .host("DEFAULT", Host::new().path("/", Path::addrs(&servers)))
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..20 {
        let resp = client.get("any", "/").await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-backend"), "a");
        body_bytes(resp).await;
    }
}

#[tokio::test(start_paused = true)]
async fn failover_walks_past_any_number_of_unreachable_backends() {
    // Twelve distinct addresses that refuse, then one that answers: every request reaches it,
    // each refusing backend is tried at most once per request, and none twice.
    let a = Backend::start("a").await;
    let mut servers: Vec<String> = (2..14).map(|i| format!("127.0.0.{i}:1")).collect();
    servers.push(a.addr.to_string());
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(&servers).healthcheck(false)),
        )
        .render();
    let proxy = Proxy::start(&yaml, "hc_interval: 60").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for n in 0..5 {
        let resp = client.get("any", &format!("/{n}")).await;
        assert_eq!(resp.status(), 200, "request {n}");
        assert_eq!(header(&resp, "x-backend"), "a");
        body_bytes(resp).await;
    }
    assert_eq!(a.requests(), 5);
}
