//! 10,000 idle keep-alive client connections against the real binary: each asks one thing and
//! then stays open. The proxy's RSS per connection is printed, a new client is still served at
//! once, and past `max_connections` a new connection is closed at once, not queued.
//!
//! The goal is 10 KiB per idle connection; today it is about 22 KiB (release build 21.8,
//! `ARALEZ_TEST_BINARY=target/release/aralez`; 41 before transparent huge pages were turned off
//! for the process and each kind of connection got a task type of its own, 24.4 before the
//! hyper connection was boxed out of the task and no future held it twice). What is left is
//! mostly hyper's: its HTTP/1 write buffer (8 KiB, allocated with the connection) and read
//! buffer (8 KiB from the first byte), kept for the connection's life, plus the boxed hyper
//! connection (1.7 KiB) and the task (0.7 KiB). The bound below catches a regression; reaching
//! the goal needs an HTTP/1 server that lets its buffers go between requests, which hyper does
//! not offer (issue 14).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE: usize = 10_000;
/// Today's cost with a margin (see the module comment): a regression bound, not the goal.
const BOUND_KIB: f64 = 28.0;

/// Raises this process's open-file limit (inherited by the proxy) to `wanted`, past the hard
/// limit when allowed (root), else to the hard limit; the limit it got.
fn raise_nofile(wanted: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let above = wanted.max(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, above, above).is_ok() {
        return above;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    hard
}

/// Opens a connection, asks `GET /` (keep-alive) and reads the whole answer.
async fn one_request(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n").await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        if answer_complete(&got) {
            return Ok(s);
        }
    }
}

/// Whether `got` holds a whole HTTP/1.1 answer with a Content-Length body.
fn answer_complete(got: &[u8]) -> bool {
    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    got.len() >= end + 4 + length
}

/// `count` idle keep-alive connections, opened 250 at a time.
async fn open_idle(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(count);
    while open.len() < count {
        let batch = (count - open.len()).min(250);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..batch {
            set.spawn(one_request(addr));
        }
        while let Some(done) = set.join_next().await {
            let stream = done
                .expect("connection task")
                .unwrap_or_else(|e| panic!("connection {} failed: {e}", open.len() + 1));
            open.push(stream);
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_are_cheap_and_the_cap_refuses_at_once() {
    let limit = raise_nofile(IDLE as u64 + 1_000);
    assert!(
        limit > IDLE as u64 + 500,
        "open-file hard limit {limit} is too low for {IDLE} connections"
    );
    let backend = Backend::start("b").await;
    let main = format!(
        "max_connections: {}\nclient_header_timeout: 300\nclient_idle_timeout: 300",
        IDLE + 1
    );
    let proxy = ProxyProcess::start(&default_route(&[&backend]), &main);
    // Warm up: the pool's upstream connection, the allocator's first arenas.
    let warm = open_idle(proxy.addr, 100).await;
    drop(warm);
    let settled = eventually_async(Duration::from_secs(10), || async {
        let mut c = Client::connect(Proto::H1, proxy.addr).await;
        (c.get("idle", "/").await.status() == 200).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the proxy does not answer");
    let before = proxy.rss_kib();

    let started = Instant::now();
    let idle = open_idle(proxy.addr, IDLE).await;
    let opened_in = started.elapsed();
    let after = proxy.rss_kib();
    let per_connection = (after.saturating_sub(before)) as f64 / IDLE as f64;
    eprintln!(
        "{IDLE} idle keep-alive connections opened in {opened_in:.1?}: proxy RSS {before} -> {after} KiB, {per_connection:.1} KiB each"
    );

    // The last place under the cap goes to a new client, served at once.
    let served = Instant::now();
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(c.get("idle", "/").await.status(), 200);
    eprintln!("a new client was served in {:.1?}", served.elapsed());

    // Past max_connections: closed at once.
    let refused = Instant::now();
    let mut extra = TcpStream::connect(proxy.addr).await.expect("connect");
    let _ = extra
        .write_all(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a connection past max_connections was not closed at once: {read:?}"
    );
    eprintln!(
        "a connection past max_connections was closed in {:.1?}",
        refused.elapsed()
    );
    assert!(
        per_connection <= BOUND_KIB,
        "{per_connection:.1} KiB of RSS per idle connection"
    );
    drop(idle);
}
