//! Failover, passive health, keep-alive reuse and timeouts through the in-process proxy on
//! tokio's paused clock (timeouts are virtual time; nothing waits on the wall clock).

use crate::inproc;
use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Method;
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

/// The round robin shares a backend that is down out evenly among the others, as nginx and
/// HAProxy do: the next one in the list used to take its whole share.
#[tokio::test(start_paused = true)]
async fn a_backend_out_of_rotation_leaves_an_even_share_to_each_other() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    b.stop();
    let proxy = one_route(&[&a, &b, &c], "").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..300 {
        let resp = client.get("any", "/").await;
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
    }
    let (at_a, at_c) = (
        a.requests.load(Ordering::SeqCst),
        c.requests.load(Ordering::SeqCst),
    );
    assert!(at_a.abs_diff(at_c) <= 6, "a answered {at_a}, c {at_c}");
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

/// A URL its backend answers too slowly gets its 504 each time, and takes nothing else down:
/// counted as the backend's failures, three such answers took the backend out of every route
/// for `hc_interval` (a route's only backend: every request a 503), and so did clients that
/// gave up on a slow page.
#[tokio::test(start_paused = true)]
async fn a_slow_url_takes_its_backend_out_of_nothing() {
    let a = Backend::start("a").await;
    let proxy = one_route(&[&a], "upstream_response_timeout: 1\nhc_interval: 30").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..4 {
        let resp = client.get("any", "/slow/3000").await;
        assert_eq!(resp.status(), 504);
        body_bytes(resp).await;
    }
    let resp = client.get("any", "/").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-backend"), "a");
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

/// A plain HTTP/1.1 backend that answers the first `answered` requests on each connection
/// (`200 ok`, keep-alive), then reads the next request whole and closes without a word.
/// Counts the requests it read, answered or not.
struct Dropper {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Dropper {
    async fn start(answered: usize) -> Dropper {
        let listener = bind_local().await;
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(Dropper::serve(stream, answered, counter.clone()));
            }
        });
        Dropper { addr, seen }
    }

    async fn serve(
        mut stream: tokio::net::TcpStream,
        answered: usize,
        seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use tokio::io::AsyncWriteExt;
        let mut buf = Vec::new();
        for served in 0.. {
            // The head, then as many body bytes as its Content-Length says.
            let head_end = loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                if !Dropper::read_more(&mut stream, &mut buf).await {
                    return;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < head_end + length {
                if !Dropper::read_more(&mut stream, &mut buf).await {
                    return;
                }
            }
            buf.drain(..head_end + length);
            seen.fetch_add(1, Ordering::SeqCst);
            if served == answered {
                return;
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-backend: dropper\r\n\r\nok";
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    /// Appends what the socket has to `buf`; false once it is closed or broken.
    async fn read_more(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }
}

fn route_to(servers: &[String]) -> String {
    Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(servers).healthcheck(false)),
        )
        .render()
}

/// A route over a dropper (first in the round robin, so the first request starts there) and a
/// real backend, with a client of `proto` connected to it.
async fn dropper_before_backend(proto: Proto) -> (Dropper, Backend, Proxy, Client) {
    let dropper = Dropper::start(0).await;
    let b = Backend::start("b").await;
    let servers = [
        format!("http://{}", dropper.addr),
        format!("http://{}", b.addr),
    ];
    let proxy = Proxy::start(&route_to(&servers), "").await;
    let client = Client::connect(proto, proxy.addr).await;
    (dropper, b, proxy, client)
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_unanswered_goes_to_the_next_backend_only_when_idempotent() {
    for proto in PROTOCOLS {
        let (dropper, b, _proxy, mut client) = dropper_before_backend(proto).await;
        let resp = client.get("any", "/get").await;
        assert_eq!(resp.status(), 200, "{proto:?}: a GET is sent again");
        assert_eq!(header(&resp, "x-backend"), "b");
        body_bytes(resp).await;
        assert_eq!((dropper.seen(), b.requests()), (1, 1), "{proto:?}");

        // A PUT with a body is not sent again either (SPEC §5: only an empty body is), even
        // one small enough to have been read whole before it set out.
        let (dropper, b, _proxy, mut client) = dropper_before_backend(proto).await;
        let resp = client
            .send(Method::PUT, Some("any"), "/echo", &[], full("payload"))
            .await;
        assert_eq!(
            resp.status(),
            502,
            "{proto:?}: a PUT with a body is not sent again"
        );
        body_bytes(resp).await;
        assert_eq!((dropper.seen(), b.requests()), (1, 0), "{proto:?}");

        // A POST with a body may have been acted on: never sent twice.
        let (dropper, b, _proxy, mut client) = dropper_before_backend(proto).await;
        let resp = client
            .send(Method::POST, Some("any"), "/post", &[], full("payload"))
            .await;
        assert_eq!(resp.status(), 502, "{proto:?}: a POST is not sent again");
        body_bytes(resp).await;
        assert_eq!((dropper.seen(), b.requests()), (1, 0), "{proto:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_pooled_connection_dropped_under_a_get_is_replayed_on_a_fresh_one() {
    for proto in PROTOCOLS {
        // Each connection answers one request and drops the second: the second GET finds the
        // pooled connection stale and goes again, on a new connection to the same backend.
        let dropper = Dropper::start(1).await;
        let proxy = Proxy::start(&route_to(&[format!("http://{}", dropper.addr)]), "").await;
        let mut client = Client::connect(proto, proxy.addr).await;
        for n in 0..3 {
            let resp = client.get("any", &format!("/{n}")).await;
            assert_eq!(resp.status(), 200, "{proto:?}: request {n}");
            assert_eq!(header(&resp, "x-backend"), "dropper");
            body_bytes(resp).await;
        }
        // 3 answered, and the 2 that met a stale connection.
        assert_eq!(dropper.seen(), 5, "{proto:?}");
        let resp = client
            .send(Method::POST, Some("any"), "/post", &[], full("payload"))
            .await;
        assert_eq!(resp.status(), 502, "{proto:?}: a POST is not replayed");
        body_bytes(resp).await;
        assert_eq!(dropper.seen(), 6, "{proto:?}");
    }
}

/// `n` clients at once, each on its own connection, each asking for an answer that takes 50 ms:
/// `n` requests in flight to the backend together.
async fn burst(proxy: &Proxy, n: usize) {
    let mut calls = Vec::new();
    for i in 0..n {
        let addr = proxy.addr;
        calls.push(tokio::spawn(async move {
            let mut client = Client::connect(Proto::H1, addr).await;
            let resp = client.get("any", &format!("/slow/50?{i}")).await;
            let status = resp.status();
            body_bytes(resp).await;
            status
        }));
    }
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_over_the_pool_size_finds_its_connections_until_they_go_unused() {
    let backend = Backend::start("a").await;
    let plain_h1 = route_to(&[format!("http://{}", backend.addr)]);
    let proxy = Proxy::start(&plain_h1, "upstream_keepalive_pool_size: 2").await;
    burst(&proxy, 6).await;
    assert_eq!(backend.accepts(), 6);
    // The next burst finds all six, not only the pool's two.
    burst(&proxy, 6).await;
    assert_eq!(
        backend.accepts(),
        6,
        "the surplus was kept for the next burst"
    );
    // Unused for two grace periods, the four above the pool size are closed.
    proxy.pass(Duration::from_millis(2100)).await;
    burst(&proxy, 6).await;
    assert_eq!(backend.accepts(), 10, "two kept, four opened again");

    // Past half of `upstream_max_connections` a worker keeps no surplus (another worker may
    // need those places): of the four above the size, three are closed as they come back (6,
    // 5, then 4 open) and the last, back with 3 open, is kept.
    let capped = Backend::start("b").await;
    let plain_h1 = route_to(&[format!("http://{}", capped.addr)]);
    let main = "upstream_keepalive_pool_size: 2\nupstream_max_connections: 6";
    let proxy = Proxy::start(&plain_h1, main).await;
    burst(&proxy, 6).await;
    burst(&proxy, 6).await;
    assert_eq!(capped.accepts(), 9, "three closed on return");
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_its_backend_closed_is_closed_too() {
    use tokio::io::AsyncWriteExt;
    // A backend that answers once and ends the connection (its keep-alive timeout), then waits
    // for the proxy's side to end too.
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let (ended, proxy_ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            assert!(Dropper::read_more(&mut stream, &mut buf).await);
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-backend: once\r\n\r\nok";
        stream.write_all(answer).await.unwrap();
        stream.shutdown().await.unwrap();
        while Dropper::read_more(&mut stream, &mut buf).await {}
        let _ = ended.send(());
    });
    let proxy = Proxy::start(&route_to(&[format!("http://{addr}")]), "").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("any", "/").await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;
    // A sweep or two later the pooled connection is closed, not left in CLOSE-WAIT.
    proxy.pass(Duration::from_secs(5)).await;
    let closed = inproc::in_real_time(Duration::from_secs(5), proxy_ended).await;
    assert!(
        closed.is_some(),
        "the proxy kept the idle connection its backend had closed"
    );
}

/// The scrape's line for `series` (its value), over the backends at `addrs`.
fn scraped(proxy: &Proxy, addrs: &[String], series: &str) -> Option<f64> {
    let configured = addrs.iter().map(|backend| aralez::metrics::BackendUp {
        host: "DEFAULT",
        path: "/",
        backend,
        up: true,
    });
    let text = proxy.ctx.metrics.render_prometheus(configured);
    let line = text.lines().find(|l| l.starts_with(series))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(start_paused = true)]
async fn metrics_and_warnings_name_the_backend_that_failed_an_exchange_and_the_request() {
    let (dropper, b, proxy, mut client) = dropper_before_backend(Proto::H1).await;
    let addrs = [dropper.addr.to_string(), b.addr.to_string()];
    let resp = client.get("any", "/get").await;
    assert_eq!(resp.status(), 200);
    // The warning of the reset names the request (its id, as its access log line does).
    let id = header(&resp, "x-request-id");
    body_bytes(resp).await;
    let warned = format!("request_id={id}");
    let log = proxy.log_text();
    let reset_line = log.lines().find(|l| l.contains("backend reset"));
    assert!(reset_line.is_some_and(|l| l.contains(&warned)), "{log}");
    let dropped = format!("{{upstream=\"{}\"", dropper.addr);
    let reset = format!("aralez_upstream_failures_total{dropped},reason=\"reset\"}}");
    let retried = format!("aralez_upstream_retries_total{dropped}}}");
    let answered = format!("aralez_upstream_responses_total{{upstream=\"{}\"}}", b.addr);
    assert_eq!(scraped(&proxy, &addrs, &reset), Some(1.0));
    assert_eq!(scraped(&proxy, &addrs, &retried), Some(1.0));
    assert_eq!(scraped(&proxy, &addrs, &answered), Some(1.0));
    // The backend that failed sent no response: it has no line there.
    let its_responses = format!("aralez_upstream_responses_total{dropped}");
    assert_eq!(scraped(&proxy, &addrs, &its_responses), None);

    // A POST is not sent on: a failure, no retry.
    let (dropper, b, proxy, mut client) = dropper_before_backend(Proto::H1).await;
    let addrs = [dropper.addr.to_string(), b.addr.to_string()];
    let dropped = format!("{{upstream=\"{}\"", dropper.addr);
    let reset = format!("aralez_upstream_failures_total{dropped},reason=\"reset\"}}");
    let retried = format!("aralez_upstream_retries_total{dropped}}}");
    let resp = client
        .send(Method::POST, Some("any"), "/post", &[], full("payload"))
        .await;
    assert_eq!(resp.status(), 502);
    body_bytes(resp).await;
    assert_eq!(scraped(&proxy, &addrs, &reset), Some(1.0));
    assert_eq!(scraped(&proxy, &addrs, &retried), None);

    // A backend that refuses connections: counted as `connect`, and the request went on.
    let closed = bind_local().await;
    let refusing = closed.local_addr().unwrap();
    drop(closed);
    let servers = [format!("http://{refusing}"), format!("http://{}", b.addr)];
    let proxy = Proxy::start(&route_to(&servers), "").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("any", "/").await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;
    let addrs = [refusing.to_string(), b.addr.to_string()];
    let connect =
        format!("aralez_upstream_failures_total{{upstream=\"{refusing}\",reason=\"connect\"}}");
    assert_eq!(scraped(&proxy, &addrs, &connect), Some(1.0));
}

/// Without health checks, a backend whose connects fail is out once three have, tried by one
/// request when its mark lapses, and each failed trial doubles the mark (`hc_interval`, up to
/// 30 s): over a minute of a request a second, the refusing backend is tried a handful of
/// times, where it was about every other second. Marked, it is out of rotation for `/metrics`
/// and `/status`, lapsed or not (they said it was up once the mark lapsed).
#[tokio::test(start_paused = true)]
async fn a_backend_refusing_connects_without_health_checks_is_tried_ever_more_rarely() {
    let b = Backend::start("b").await;
    let closed = bind_local().await;
    let refusing = closed.local_addr().unwrap();
    drop(closed);
    let servers = [format!("http://{refusing}"), format!("http://{}", b.addr)];
    let proxy = Proxy::start(&route_to(&servers), "hc_interval: 1").await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..60 {
        let resp = client.get("any", "/").await;
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
        proxy.pass(Duration::from_secs(1)).await;
    }
    let addrs = [refusing.to_string(), b.addr.to_string()];
    let connect =
        format!("aralez_upstream_failures_total{{upstream=\"{refusing}\",reason=\"connect\"}}");
    let tries = scraped(&proxy, &addrs, &connect).unwrap_or(0.0);
    // Three to mark it, then trials after marks of 1, 2, 4, 8 and 16 s.
    assert!((4.0..=9.0).contains(&tries), "{tries} connects tried");
    let snapshot = proxy.ctx.reloader.snapshot.load();
    let route = snapshot.routes().next().expect("the route");
    assert!(!route.backends.in_rotation_at(0), "marked: not in rotation");
    assert!(route.backends.in_rotation_at(1));
}

/// A listener whose queue is full: a connect to it waits until it times out. Its sockets are
/// kept alive by the caller.
fn blackholed() -> (std::net::SocketAddr, Vec<socket2::Socket>) {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    listener.bind(&any.into()).unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let mut held = vec![listener];
    for _ in 0..4 {
        let filler = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        filler.set_nonblocking(true).unwrap();
        let _ = filler.connect(&addr.into());
        held.push(filler);
    }
    std::thread::sleep(Duration::from_millis(50));
    (addr, held)
}

/// Requests that wait together for a backend's protocol to be detected share the detection's
/// failure: each had tried again in turn, the Nth waiting N connect timeouts (16 at once took
/// 2, 4 ... 16 s with a 2 s timeout) before it went to the next backend.
#[tokio::test(start_paused = true)]
async fn requests_waiting_on_one_detection_share_its_failure() {
    let good = Backend::start("good").await;
    let (silent, _held) = blackholed();
    let servers = [silent.to_string(), good.addr.to_string()];
    let proxy = Proxy::start(&route_to(&servers), "upstream_connect_timeout: 2").await;
    let started = Instant::now();
    let asked = (0..8).map(|i| {
        let addr = proxy.addr;
        tokio::spawn(async move {
            let mut client = Client::connect(Proto::H1, addr).await;
            let resp = client.get("any", &format!("/{i}")).await;
            let status = resp.status();
            body_bytes(resp).await;
            (status, started.elapsed())
        })
    });
    for answer in futures_util::future::join_all(asked).await {
        let (status, took) = answer.unwrap();
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(3), "answered after {took:?}");
    }
}
