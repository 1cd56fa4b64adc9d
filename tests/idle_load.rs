//! 10,000 idle keep-alive client connections against the real binary: each asks one thing and
//! then stays open. Once they have parked (idle for a second: hyper's connection and buffers
//! dropped, the bare socket waiting; `aralez_parked_sessions` counts them) and the allocator
//! has given back what they freed, the proxy's RSS per connection must be at most 4 KiB (issue
//! 14's goal is 10); a new client is still served at once, a parked one is
//! served again, and past `max_connections` a new connection is closed at once, not queued.
//!
//! Before parking, a connection idle in hyper cost about 22 KiB (release build 21.8,
//! `ARALEZ_TEST_BINARY=target/release/aralez`): hyper's HTTP/1 write and read buffers (8 KiB
//! each, kept for the connection's life), the boxed hyper connection (1.7 KiB) and the task.
//! That figure is printed too, measured right after the connections opened.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE: usize = 10_000;
/// What a parked connection may keep once the allocator has given back what it freed (the
/// goal of issue 14 is 10 KiB; it keeps about 2.3).
const GIVEN_BACK_KIB: f64 = 4.0;

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
    open_in_batches(count, 250, |n| async move {
        one_request(addr)
            .await
            .unwrap_or_else(|e| panic!("connection {} failed: {e}", n + 1))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_are_cheap_and_the_cap_refuses_at_once() {
    allow_connections(IDLE);
    let backend = Backend::start("b").await;
    let main = format!(
        "max_connections: {}\nclient_header_timeout: 300\nclient_idle_timeout: 300\n\
         config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"",
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
    let opened = proxy.rss_kib();
    let per_open = (opened.saturating_sub(before)) as f64 / IDLE as f64;
    eprintln!(
        "{IDLE} idle keep-alive connections opened in {opened_in:.1?}: proxy RSS {before} -> {opened} KiB, {per_open:.1} KiB each"
    );
    let admin = proxy.logged_addr("admin API on http://");
    let parked = eventually_async(Duration::from_secs(30), || async {
        let parked = metric(admin, "aralez_parked_sessions").await?;
        (parked >= IDLE as f64).then_some(parked)
    })
    .await;
    assert!(parked.is_some(), "the idle connections did not all park");
    eprintln!(
        "all parked {:.1?} after the first opened: proxy RSS {} KiB",
        started.elapsed(),
        proxy.rss_kib()
    );
    // What the parked connections freed goes back to the system at the worker's next
    // allocator housekeeping (every 2 s, a second after it was freed), although the worker is
    // quiet: without it, mimalloc kept about 3 KiB a connection resident (release build).
    let after = eventually_async(Duration::from_secs(30), || async {
        let rss = proxy.rss_kib();
        ((rss.saturating_sub(before)) as f64 / IDLE as f64 <= GIVEN_BACK_KIB).then_some(rss)
    })
    .await
    .unwrap_or_else(|| proxy.rss_kib());
    let per_connection = (after.saturating_sub(before)) as f64 / IDLE as f64;
    eprintln!(
        "parked after {:.1?}: proxy RSS {after} KiB, {per_connection:.1} KiB each",
        started.elapsed()
    );

    // A parked connection is served again, on the same socket.
    let mut idle = idle;
    let again = idle.last_mut().expect("a connection");
    again
        .write_all(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n")
        .await
        .expect("write");
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), again.read(&mut answer))
        .await
        .expect("a parked connection's answer in time")
        .expect("read");
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200 OK\r\n"),
        "{:?}",
        String::from_utf8_lossy(&answer[..n])
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
        per_connection <= GIVEN_BACK_KIB,
        "{per_connection:.1} KiB of RSS per parked connection, 30 s after they parked: \
         what they freed was not given back to the system"
    );
    drop(idle);
}
