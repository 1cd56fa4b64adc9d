//! Rate limits, 4xx limits and passive health's time out through the in-process proxy on
//! tokio's paused clock: the seconds these limits count are virtual, so the tests are exact and
//! take no wall-clock time.

use crate::inproc;
use crate::policies_support;
use crate::support;

use std::net::IpAddr;
use std::time::Duration;

use http::Method;
use inproc::Proxy;
use policies_support::connect_from;
use support::{
    body_bytes, default_route, full, header, Backend, Client, Host, Path, Proto, Upstreams,
};
use tokio::time::Instant;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// Status and `Retry-After` of a GET.
async fn get(c: &mut Client, host: &str, path: &str) -> (u16, String) {
    let resp = c
        .send(
            Method::GET,
            Some(host),
            path,
            &[],
            full(bytes::Bytes::new()),
        )
        .await;
    let status = resp.status().as_u16();
    let retry_after = header(&resp, "retry-after");
    body_bytes(resp).await;
    (status, retry_after)
}

#[tokio::test(start_paused = true)]
async fn rate_limit_is_per_client_across_workers_and_refills_each_second() {
    let backend = Backend::start("b").await;
    let limited = |n| Path::servers(&[&backend]).rate_limit(n).healthcheck(false);
    let yaml = Upstreams::new()
        .host(
            "rl.test",
            Host::new()
                .path("/", limited(10))
                .path("/free", limited(1000)),
        )
        .render();
    let proxy = Proxy::start_workers(&yaml, "", 2).await;
    for (proto, me, other) in [(Proto::H1, ip(2), ip(3)), (Proto::H2c, ip(4), ip(5))] {
        // Several connections from one address land on both workers; the limit is still one.
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(connect_from(proto, proxy.addr, me).await);
        }
        let started = Instant::now();
        let mut statuses = Vec::new();
        for i in 0..14 {
            let (status, retry_after) = get(&mut conns[i % 4], "rl.test", "/").await;
            if status == 429 {
                assert_eq!(retry_after, "1");
            }
            statuses.push(status);
        }
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "no time passes in a burst"
        );
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            10,
            "{proto:?}: {statuses:?}"
        );
        assert!(statuses[10..].iter().all(|s| *s == 429), "{statuses:?}");
        // Another client, and another path with its own limit, are not affected.
        let mut c = connect_from(proto, proxy.addr, other).await;
        assert_eq!(get(&mut c, "rl.test", "/").await.0, 200);
        assert_eq!(get(&mut conns[0], "rl.test", "/free").await.0, 200);
        // 100 ms later one request's worth has come back; a second later the whole burst.
        proxy.pass(Duration::from_millis(100)).await;
        assert_eq!(get(&mut conns[1], "rl.test", "/").await.0, 200);
        assert_eq!(get(&mut conns[1], "rl.test", "/").await.0, 429);
        proxy.pass(Duration::from_secs(1)).await;
        for conn in conns.iter_mut() {
            assert_eq!(get(conn, "rl.test", "/").await.0, 200);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn x4xx_limit_blocks_until_a_quiet_second() {
    let backend = Backend::builder("b").status(404).start().await;
    let yaml = Upstreams::new()
        .host(
            "x.test",
            Host::new()
                .x4xx_limit(3)
                .path("/", Path::servers(&[&backend]).healthcheck(false)),
        )
        .render();
    let proxy = Proxy::start(&yaml, "").await;
    let mut me = connect_from(Proto::H1, proxy.addr, ip(6)).await;
    for _ in 0..3 {
        assert_eq!(get(&mut me, "x.test", "/").await.0, 404);
    }
    let reached = backend.requests();
    backend.set_status(200);
    assert_eq!(get(&mut me, "x.test", "/").await, (429, "1".to_string()));
    assert_eq!(
        backend.requests(),
        reached,
        "blocked requests stay in the proxy"
    );
    let mut other = connect_from(Proto::H1, proxy.addr, ip(7)).await;
    assert_eq!(get(&mut other, "x.test", "/").await.0, 200);
    proxy.pass(Duration::from_millis(999)).await;
    assert_eq!(
        get(&mut me, "x.test", "/").await.0,
        429,
        "knocking restarts the quiet second"
    );
    proxy.pass(Duration::from_millis(999)).await;
    assert_eq!(get(&mut me, "x.test", "/").await.0, 429);
    proxy.pass(Duration::from_millis(1001)).await;
    assert_eq!(
        get(&mut me, "x.test", "/").await.0,
        200,
        "free after a quiet second"
    );
}

#[tokio::test(start_paused = true)]
async fn passive_health_keeps_a_failing_backend_out_for_hc_interval() {
    let a = Backend::start("a").await;
    let addr = a.addr;
    let proxy = Proxy::start(&default_route(&[&a]), "hc_interval: 10").await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(get(&mut c, "any", "/").await.0, 200);
    a.stop();
    drop(a);
    // Three refused connects take the backend out (502 each), then 503 without trying.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(&mut c, "any", "/").await.0);
    }
    assert_eq!(statuses, [502, 502, 502, 503]);
    let back = Backend::builder("a").start_on(addr).await;
    proxy.pass(Duration::from_millis(9_900)).await;
    assert_eq!(
        get(&mut c, "any", "/").await.0,
        503,
        "still out before hc_interval"
    );
    proxy.pass(Duration::from_millis(200)).await;
    assert_eq!(
        get(&mut c, "any", "/").await.0,
        200,
        "back after hc_interval"
    );
    assert!(back.requests() >= 1);
}

#[tokio::test(start_paused = true)]
async fn two_proxies_in_one_process_share_no_state() {
    // The same config twice: limiter tables, keys and metrics are each proxy's own, so one
    // proxy's exhausted limit and its counters say nothing about the other's.
    let backend = Backend::start("b").await;
    let route = Path::servers(&[&backend]).rate_limit(2).healthcheck(false);
    let yaml = Upstreams::new()
        .host("rl.test", Host::new().path("/", route))
        .render();
    let first = Proxy::start(&yaml, "").await;
    let second = Proxy::start(&yaml, "").await;
    let mut one = connect_from(Proto::H1, first.addr, ip(9)).await;
    let statuses = [
        get(&mut one, "rl.test", "/").await.0,
        get(&mut one, "rl.test", "/").await.0,
        get(&mut one, "rl.test", "/").await.0,
    ];
    assert_eq!(statuses, [200, 200, 429]);
    let mut two = connect_from(Proto::H1, second.addr, ip(9)).await;
    assert_eq!(
        get(&mut two, "rl.test", "/").await.0,
        200,
        "the other proxy's table"
    );
    let scrape = |p: &Proxy| p.ctx.metrics.render_prometheus(std::iter::empty());
    assert_eq!(first.ctx.metrics.requests(), 3);
    assert!(scrape(&first).contains("aralez_rate_limited_total 1\n"));
    assert_eq!(second.ctx.metrics.requests(), 1);
    assert!(scrape(&second).contains("aralez_rate_limited_total 0\n"));
}
