//! Access log and metrics end to end (issue 6): every request logged once with its fields, a
//! blocked log writer never slows requests (lines are dropped and counted), and the metrics count
//! exactly the requests sent. Metrics are read from the admin API's `GET /metrics`.

use crate::support;

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use support::*;

const ADMIN: &str = "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"";

fn upstreams_for(backend: &Backend) -> String {
    Upstreams::new()
        .host("x.test", Host::new().path("/", Path::servers(&[backend])))
        .render()
}

fn access_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.starts_with("access ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_has_one_line_per_request_with_every_field() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start(&upstreams_for(&backend), "access_log: all");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for i in 0..25 {
            let resp = client.get("x.test", &format!("/item?n={proto:?}{i}")).await;
            assert_eq!(resp.status(), 200);
            body_bytes(resp).await;
        }
        let resp = client.get("nowhere.test", "/missing").await;
        assert_eq!(resp.status(), 404);
    }
    let want = 52;
    let complete = eventually(Duration::from_secs(5), || {
        access_lines(&proxy.log_text()).len() >= want
    });
    assert!(complete.await, "{}", proxy.log_text());
    let log = proxy.log_text();
    let lines = access_lines(&log);
    assert_eq!(lines.len(), want, "{log}");
    for proto in PROTOCOLS {
        let version = if proto == Proto::H1 {
            "HTTP/1.1"
        } else {
            "HTTP/2.0"
        };
        for i in 0..25 {
            let target = format!("target=\"/item?n={proto:?}{i}\"");
            let found: Vec<&&str> = lines.iter().filter(|l| l.contains(&target)).collect();
            assert_eq!(found.len(), 1, "{target} logged {} times", found.len());
            let line = found[0];
            for field in [
                "client=127.0.0.1 ",
                "method=GET ",
                "status=200 ",
                "bytes=5 ",
                &format!("version={version} "),
                &format!("backend={}", backend.addr),
            ] {
                assert!(line.contains(field), "`{field}` missing in {line}");
            }
            assert!(line.contains("host=\"x.test\" "), "{line}");
            assert!(line.starts_with("access time=20") && line.contains("duration_ms="));
        }
    }
    let misses: Vec<&&str> = lines.iter().filter(|l| l.contains("/missing")).collect();
    assert_eq!(misses.len(), 2);
    assert!(misses
        .iter()
        .all(|l| l.contains("status=404") && l.contains(" backend=- upstream_ms=- ")));
}

/// A 204 or a 304 leaves with an empty body of the proxy's own in place of the backend's; its
/// line still names the backend and how long it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_answers_still_name_their_backend() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start(&upstreams_for(&backend), "access_log: all");
    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        for status in [204, 304] {
            backend.set_status(status);
            let resp = client
                .get("x.test", &format!("/bodiless?{proto:?}{status}"))
                .await;
            assert_eq!(resp.status(), status);
            body_bytes(resp).await;
        }
    }
    let bodiless = |log: &str| -> Vec<String> {
        access_lines(log)
            .into_iter()
            .filter(|l| l.contains("/bodiless"))
            .map(str::to_string)
            .collect()
    };
    let logged = eventually(Duration::from_secs(5), || {
        bodiless(&proxy.log_text()).len() >= 4
    });
    assert!(logged.await, "{}", proxy.log_text());
    let lines = bodiless(&proxy.log_text());
    assert_eq!(lines.len(), 4, "{lines:?}");
    for line in &lines {
        assert!(
            line.contains(&format!("backend={} upstream_ms=", backend.addr))
                && !line.contains("upstream_ms=- "),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_error_mode_logs_only_failures() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start(&upstreams_for(&backend), "access_log: error");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..10 {
        body_bytes(client.get("x.test", "/fine").await).await;
    }
    let resp = client.get("nowhere.test", "/broken").await;
    assert_eq!(resp.status(), 404);
    let logged = eventually(Duration::from_secs(5), || {
        proxy.log_text().contains("/broken")
    });
    assert!(logged.await);
    // The writer keeps order: once /broken is there, any /fine line would be too.
    assert_eq!(
        access_lines(&proxy.log_text()).len(),
        1,
        "{}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_the_requests_sent() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start(&upstreams_for(&backend), ADMIN);
    let admin = proxy.logged_addr("admin API on http://");
    let n = 37;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..n {
        let resp = client.get("x.test", "/").await;
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
    }
    let mut h2 = Client::connect(Proto::H2c, proxy.addr).await;
    let resp = h2.get("nowhere.test", "/").await;
    assert_eq!(resp.status(), 404);
    let n = n as f64;
    let h1_gets = "aralez_requests_total{method=\"GET\",version=\"HTTP/1.1\"}";
    assert_eq!(metric(admin, h1_gets).await, Some(n));
    let h2_gets = "aralez_requests_total{method=\"GET\",version=\"HTTP/2\"}";
    assert_eq!(metric(admin, h2_gets).await, Some(1.0));
    assert_eq!(
        metric(admin, "aralez_responses_total{status=\"200\"}").await,
        Some(n)
    );
    assert_eq!(
        metric(admin, "aralez_responses_total{status=\"404\"}").await,
        Some(1.0)
    );
    let upstream = format!(
        "aralez_upstream_responses_total{{upstream=\"{}\"}}",
        backend.addr
    );
    assert_eq!(metric(admin, &upstream).await, Some(n));
    let count = "aralez_response_latency_seconds_count";
    assert_eq!(metric(admin, count).await, Some(n + 1.0));
    let up = format!(
        "aralez_backend_up{{upstream=\"x.test\",path=\"/\",backend=\"{}\"}}",
        backend.addr
    );
    assert_eq!(metric(admin, &up).await, Some(1.0));
    assert_eq!(metric(admin, "aralez_active_sessions").await, Some(2.0));
    // One client connection, sequential requests: one new backend connection, the rest reused.
    let reused = metric(admin, "aralez_upstream_connections_total{reused=\"true\"}").await;
    let fresh = metric(admin, "aralez_upstream_connections_total{reused=\"false\"}").await;
    assert_eq!(
        reused.unwrap_or(0.0) + fresh.unwrap_or(0.0),
        n,
        "{reused:?} {fresh:?}"
    );
    assert!(
        fresh.unwrap_or(0.0) <= 2.0 && reused.unwrap_or(0.0) >= n - 2.0,
        "{reused:?} {fresh:?}"
    );
    assert!(metric(admin, "aralez_memory_bytes").await.unwrap_or(0.0) > 1e6);
    // Prometheus naming across the whole scrape: counters end in `_total`, and no metric name
    // carries a label's name (`_by_method`), but for Aralez's own names (SPEC §11), kept beside
    // for its dashboards.
    let aralez_names = [
        "aralez_requests_by_method_total",
        "aralez_requests_by_version_total",
        "aralez_requests_by_upstream",
    ];
    let (_, _, body) = http_get(admin, "/metrics", &[("x-api-key", "k")]).await;
    let text = String::from_utf8_lossy(&body);
    let mut counters = 0;
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').unwrap_or((line, ""));
        if kind == "counter" {
            counters += 1;
            assert!(
                name.ends_with("_total"),
                "counter {name} does not end in _total"
            );
        }
        assert!(
            !name.contains("_by_") || aralez_names.contains(&name),
            "{name} names a label"
        );
    }
    assert!(counters >= 6, "{text}");
}

/// The log goes to a FIFO the test stops reading: the pipe fills, the writer blocks, and the
/// requests must still complete; every request is then either a line or a counted drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_access_log_drops_and_counts_but_never_delays_requests() {
    let backend = Backend::start("alpha").await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("log.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let extra = format!("access_log: all\nlog_file: \"{}\"\n{ADMIN}", fifo.display());
    let proxy = spawn_logging_to_fifo(&backend, &extra, &mut reader);
    let (addr, admin) = (proxy.0, proxy.1);

    let total = 1200;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(Proto::H1, addr).await;
            for _ in 0..total / 8 {
                let resp = client.get("x.test", "/").await;
                assert_eq!(resp.status(), 200);
                body_bytes(resp).await;
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("requests waited on the log")
            .unwrap();
    }
    println!(
        "{total} requests with a blocked log writer in {:?}",
        started.elapsed()
    );
    // Now read the FIFO again: what was queued gets written; the rest was dropped and counted.
    let drain = std::thread::spawn(move || drain_fifo(reader, Duration::from_secs(5)));
    let text = tokio::task::block_in_place(|| drain.join().unwrap());
    let lines = access_lines(&text).len();
    // A line is submitted when hyper drops the response body, a moment after the client has it.
    let dropped_now = || async {
        metric(admin, "aralez_logging_errors_total")
            .await
            .unwrap_or(0.0) as usize
    };
    let dropped = match eventually_async(Duration::from_secs(2), || async {
        let dropped = dropped_now().await;
        (lines + dropped >= total).then_some(dropped)
    })
    .await
    {
        Some(dropped) => dropped,
        None => dropped_now().await,
    };
    println!("{lines} lines written, {dropped} dropped");
    assert!(dropped > 0, "the writer never fell behind");
    assert_eq!(
        lines + dropped,
        total,
        "every request is a line or a counted drop"
    );
    drop(proxy.2);
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the proxy logging to the FIFO, reads until both addresses appear, then stops reading.
fn spawn_logging_to_fifo(
    backend: &Backend,
    extra: &str,
    reader: &mut std::fs::File,
) -> (
    std::net::SocketAddr,
    std::net::SocketAddr,
    Child,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), upstreams_for(backend)).unwrap();
    let main = format!(
        "threads: 2\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{0}/p.pid\"\nupgrade_sock: \"{0}/u.sock\"\n{extra}\n",
        dir.path().display()
    );
    std::fs::write(dir.path().join("main.yaml"), main).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
        .arg("-c")
        .arg(dir.path().join("main.yaml"))
        .env("ARALEZ_ACCESS_LOG_QUEUE", "256")
        .spawn()
        .unwrap();
    let child = Child(child);
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 4096];
    loop {
        let proxy = text
            .lines()
            .find_map(|l| address_after(l, "listening on http://"));
        let admin = text
            .lines()
            .find_map(|l| address_after(l, "admin API on http://"));
        if let (Some(p), Some(a)) = (proxy, admin) {
            return (p, a, child, dir);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "proxy did not start:\n{text}");
        if !wait_readable(reader, left) {
            continue;
        }
        match reader.read(&mut buf) {
            Ok(0) => panic!("the proxy closed its log before it started:\n{text}"),
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading the log FIFO: {e}"),
        }
    }
}

/// Waits up to `limit` until the FIFO `file` has data (or its writer closed it); false if the
/// time passed first.
fn wait_readable(file: &std::fs::File, limit: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = nix::libc::pollfd {
        fd: file.as_raw_fd(),
        events: nix::libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid, initialised pollfd that outlives the call.
    unsafe { nix::libc::poll(&mut fd, 1, ms) > 0 }
}

/// Reads the FIFO until it has been quiet for 500 ms (or `limit` passes).
fn drain_fifo(mut reader: std::fs::File, limit: Duration) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !wait_readable(&reader, left.min(Duration::from_millis(500))) {
            return text;
        }
        match reader.read(&mut buf) {
            Ok(0) => return text,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading the log FIFO: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_still_queued_at_sigterm_are_written() {
    let backend = Backend::start("alpha").await;
    let mut proxy = ProxyProcess::start(&upstreams_for(&backend), "access_log: all");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for i in 0..5 {
        body_bytes(client.get("x.test", &format!("/last/{i}")).await).await;
    }
    drop(client);
    proxy.signal(nix::sys::signal::Signal::SIGTERM);
    proxy.expect_clean_exit(Duration::from_secs(10), "after SIGTERM");
    let all = eventually(Duration::from_secs(5), || {
        access_lines(&proxy.log_text()).len() == 5
    });
    assert!(all.await, "{}", proxy.log_text());
}

/// A backend that reads each request head and waits up to 10 s for the proxy to let go of the
/// connection before it answers: it reports each request's arrival, then whether the proxy
/// closed the connection (`true`) or it had to answer (`false`).
async fn backend_that_notices_cancels() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    if !scripted::read_more(&mut stream, &mut seen).await {
                        return;
                    }
                }
                let wait = tokio::time::timeout(Duration::from_secs(10), async {
                    while stream.read(&mut [0u8; 512]).await.is_ok_and(|n| n > 0) {}
                });
                let closed = wait.await.is_ok();
                let _ = tx.send(closed);
                if !closed {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    let _ = stream.write_all(answer).await;
                }
            });
        }
    });
    (addr, rx)
}

/// The next outcome of [`backend_that_notices_cancels`], within 12 s.
async fn next_outcome(outcomes: &mut tokio::sync::mpsc::UnboundedReceiver<bool>) -> Option<bool> {
    let next = tokio::time::timeout(Duration::from_secs(12), outcomes.recv());
    next.await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_its_answer_cancels_the_backend_request_and_is_logged_499() {
    use tokio::io::AsyncWriteExt;
    let (backend, mut outcomes) = backend_that_notices_cancels().await;
    let upstreams = Upstreams::new()
        .host(
            "x.test",
            Host::new().path(
                "/",
                Path::addrs(&[format!("http://{backend}")]).healthcheck(false),
            ),
        )
        .render();
    let proxy = ProxyProcess::start(&upstreams, &format!("{ADMIN}\naccess_log: all"));
    let admin = proxy.logged_addr("admin API on http://");

    // HTTP/1.1, aralez's own server side: the client sends its request and closes.
    let mut h1 = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    h1.write_all(b"GET /h1 HTTP/1.1\r\nhost: x.test\r\n\r\n")
        .await
        .unwrap();
    // Long enough for the request to reach the backend.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = Instant::now();
    drop(h1);
    assert_eq!(
        next_outcome(&mut outcomes).await,
        Some(true),
        "h1: not cancelled"
    );
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "{:?}",
        left.elapsed()
    );

    // HTTP/2: the client resets its stream.
    let mut h2 = Client::connect(Proto::H2c, proxy.addr).await;
    let asked = tokio::time::timeout(Duration::from_millis(300), h2.get("x.test", "/h2"));
    assert!(asked.await.is_err(), "the backend does not answer");
    assert_eq!(
        next_outcome(&mut outcomes).await,
        Some(true),
        "h2: not cancelled"
    );

    let logged = eventually(Duration::from_secs(5), || {
        access_lines(&proxy.log_text()).len() >= 2
    });
    assert!(logged.await, "{}", proxy.log_text());
    let log = proxy.log_text();
    for target in ["target=\"/h1\"", "target=\"/h2\""] {
        let line = access_lines(&log)
            .into_iter()
            .find(|l| l.contains(target))
            .unwrap_or_else(|| panic!("{target} not logged: {log}"));
        assert!(line.contains(" status=499 "), "{line}");
        // With the backend it was waiting for, as nginx logs `$upstream_addr`.
        assert!(line.contains(&format!(" backend={backend} ")), "{line}");
    }
    assert_eq!(
        metric(admin, "aralez_responses_total{status=\"499\"}").await,
        Some(2.0)
    );
    // A status, not a latency: no response head came (the time the clients waited went into
    // the histogram of request head to response head, and the status page's p99).
    assert_eq!(
        metric(admin, "aralez_response_latency_seconds_count").await,
        Some(0.0)
    );
}

/// Sends `bytes` on a new connection and reads what comes back until `heads` answer heads
/// have come (or the connection ends).
async fn raw_answer(addr: std::net::SocketAddr, bytes: &[u8], heads: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while got.windows(4).filter(|w| *w == b"\r\n\r\n").count() < heads {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    assert!(read.await.is_ok(), "no answer in time");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_for_their_head_are_logged_and_counted() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start(
        &upstreams_for(&backend),
        &format!("{ADMIN}\naccess_log: all"),
    );
    let admin = proxy.logged_addr("admin API on http://");
    let bad_name = b"GET /a HTTP/1.1\r\nHost: x.test\r\nBad Header: x\r\n\r\n".to_vec();
    let two_lengths =
        b"POST /b HTTP/1.1\r\nHost: x.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy"
            .to_vec();
    let big = format!(
        "GET /c HTTP/1.1\r\nHost: x.test\r\nX-Big: {}\r\n\r\n",
        "y".repeat(100_000)
    );
    // A request line longer than the whole head may be: 414, as nginx answers (it was 431).
    let long = format!(
        "GET /{} HTTP/1.1\r\nHost: x.test\r\n\r\n",
        "a".repeat(70_000)
    );
    // A length no file can have, one of hyper's two markers: 400, as nginx answers (it was 431).
    let huge_length =
        b"POST /e HTTP/1.1\r\nHost: x.test\r\nContent-Length: 18446744073709551615\r\n\r\n"
            .to_vec();
    // After a request served on the same connection (hyper's HTTP/1-only side then).
    let after_one = b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\nGET /d HTTP/1.1\r\nHost: x.test\r\nBad Header: x\r\n\r\n".to_vec();
    for (bytes, status, heads) in [
        (bad_name, "400", 1),
        (two_lengths, "400", 1),
        (big.into_bytes(), "431", 1),
        (long.into_bytes(), "414", 1),
        (huge_length, "400", 1),
        (after_one, "400", 2),
    ] {
        let answer = raw_answer(proxy.addr, &bytes, heads).await;
        let last = answer.rfind("HTTP/1.1 ").map_or("", |at| &answer[at..]);
        assert!(last.starts_with(&format!("HTTP/1.1 {status}")), "{answer}");
    }
    // One line each, and the good request's.
    let logged = eventually(Duration::from_secs(5), || {
        access_lines(&proxy.log_text()).len() >= 7
    });
    assert!(logged.await, "{}", proxy.log_text());
    let log = proxy.log_text();
    let refused: Vec<&str> = access_lines(&log)
        .into_iter()
        .filter(|l| l.contains(" method=- target=- "))
        .collect();
    assert_eq!(refused.len(), 6, "{log}");
    assert_eq!(
        refused
            .iter()
            .filter(|l| l.contains(" status=400 "))
            .count(),
        4,
        "{log}"
    );
    assert_eq!(
        refused
            .iter()
            .filter(|l| l.contains(" status=431 "))
            .count(),
        1,
        "{log}"
    );
    let uri_too_long = refused.iter().filter(|l| l.contains(" status=414 "));
    assert_eq!(uri_too_long.count(), 1, "{log}");
    assert!(
        refused.iter().all(|l| l.contains("client=127.0.0.1 ")),
        "{log}"
    );
    for (status, count) in [("400", 4.0), ("431", 1.0), ("414", 1.0), ("200", 1.0)] {
        let series = format!("aralez_responses_total{{status=\"{status}\"}}");
        assert_eq!(metric(admin, &series).await, Some(count), "{series}");
    }
    let other = "aralez_requests_total{method=\"OTHER\",version=\"OTHER\"}";
    assert_eq!(metric(admin, other).await, Some(6.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_exchange_is_logged_with_the_backend_it_failed_with() {
    // A port nothing listens on, and a backend that reads requests and never answers.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let silent = Backend::builder("silent").status(0).start().await;
    let good = Backend::start("good").await;
    let retried = [format!("http://{dead}"), format!("http://{}", good.addr)];
    let upstreams = Upstreams::new()
        .host(
            "x.test",
            Host::new()
                .path(
                    "/dead",
                    Path::addrs(&[format!("http://{dead}")]).healthcheck(false),
                )
                .path("/retried", Path::addrs(&retried).healthcheck(false))
                .path(
                    "/silent",
                    Path::addrs(&[format!("http://{}", silent.addr)]).healthcheck(false),
                ),
        )
        .render();
    let proxy = ProxyProcess::start(&upstreams, "access_log: all\nupstream_response_timeout: 1");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    // Round robin: one of the two `/retried` starts with the dead backend.
    let asked = [
        ("/dead", 502),
        ("/silent", 504),
        ("/retried", 200),
        ("/retried", 200),
    ];
    for (path, status) in asked {
        let resp = client.get("x.test", path).await;
        assert_eq!(resp.status(), status, "{path}");
        body_bytes(resp).await;
    }
    let logged = eventually(Duration::from_secs(5), || {
        access_lines(&proxy.log_text()).len() >= 4
    });
    assert!(logged.await, "{}", proxy.log_text());
    let log = proxy.log_text();
    let line_of = |target: &str| {
        access_lines(&log)
            .into_iter()
            .find(|l| l.contains(&format!("target=\"{target}\"")))
            .unwrap_or_else(|| panic!("{target} not logged: {log}"))
    };
    // Each exchange that failed is named with why, as nginx's `$upstream_addr` lists them.
    let failed = [
        ("/dead", dead, "connect"),
        ("/silent", silent.addr, "timeout"),
    ];
    for (target, backend, why) in failed {
        let line = line_of(target);
        assert!(line.contains(&format!(" backend={backend} ")), "{line}");
        assert!(line.contains(" upstream_ms=- "), "no answer came: {line}");
        let tried = format!(" tried=\"{backend} ({why})\" ");
        assert!(line.contains(&tried), "{line}");
    }
    // Both answered by the good backend; the one that tried the dead one first says so, the
    // other has no `tried` at all.
    let retried: Vec<&str> = access_lines(&log)
        .into_iter()
        .filter(|l| l.contains("target=\"/retried\""))
        .collect();
    assert_eq!(retried.len(), 2, "{log}");
    let good_backend = format!(" backend={} ", good.addr);
    assert!(retried.iter().all(|l| l.contains(&good_backend)), "{log}");
    let said = format!(" tried=\"{dead} (connect)\" ");
    assert_eq!(
        retried.iter().filter(|l| l.contains(&said)).count(),
        1,
        "{log}"
    );
    assert_eq!(
        retried.iter().filter(|l| l.contains(" tried=")).count(),
        1,
        "{log}"
    );
}
