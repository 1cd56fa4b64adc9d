//! Real client addresses and the clock, through the in-process proxy on tokio's paused clock:
//! the PROXY header deadline (`client_header_timeout`), and rate and 4xx limits keyed by the
//! client a trusted peer's `X-Forwarded-For` names (and by the peer when it is not trusted).

use crate::inproc;
use crate::policies_support;
use crate::support;

use std::net::IpAddr;
use std::time::Duration;

use http::Method;
use inproc::Proxy;
use policies_support::connect_from;
use support::{body_bytes, default_route, full, Backend, Client, Host, Path, Upstreams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Sends `bytes`, then reads until the proxy closes; the answer and how long that took.
async fn send_and_wait_close(addr: std::net::SocketAddr, bytes: &[u8]) -> (String, Duration) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(start_paused = true)]
async fn the_proxy_header_has_the_header_timeout() {
    let backend = Backend::start("b").await;
    // Accepts not deferred: the silent connection is timed from its accept on the paused clock.
    let main = "proxy_protocol: true\nclient_header_timeout: 3\ntcp:\n  tcp_defer_accept: false";
    let proxy = Proxy::start(&default_route(&[&backend]), main).await;
    // A plain request where a PROXY header must come: closed, and said in the log (it was
    // said at debug level only: an operator saw resets and nothing else).
    let plain = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let (answer, _) = send_and_wait_close(proxy.addr, plain).await;
    assert_eq!(answer, "");
    assert_eq!(
        proxy.log_count("closed (proxy_protocol is on)"),
        1,
        "{}",
        proxy.log_text()
    );
    // Silence, half a v1 header, half a v2 header: closed when the 3 s are up, not before.
    let v2_half = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c\x7f\x00".as_slice();
    for bytes in [b"".as_slice(), b"PROXY TCP4 192.0.2.1 ", v2_half] {
        let (answer, took) = send_and_wait_close(proxy.addr, bytes).await;
        assert_eq!(answer, "");
        assert!(
            took >= Duration::from_secs(3) && took < Duration::from_millis(3500),
            "closed after {took:?}"
        );
    }
    assert_eq!(
        proxy.log_count("no PROXY header within 3s"),
        3,
        "{}",
        proxy.log_text()
    );
    // A whole header in time, then a request: served, from the header's client.
    let request = b"PROXY TCP4 192.0.2.1 127.0.0.1 1234 80\r\nGET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
    let (answer, _) = send_and_wait_close(proxy.addr, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-seen-xff: 192.0.2.1\r\n"), "{answer}");
    assert_eq!(backend.requests(), 1);
}

/// Status of a GET with `X-Forwarded-For: xff`.
async fn get_as(c: &mut Client, xff: &str) -> u16 {
    let resp = c
        .send(
            Method::GET,
            Some("rl.test"),
            "/",
            &[("x-forwarded-for", xff)],
            full(bytes::Bytes::new()),
        )
        .await;
    let status = resp.status().as_u16();
    body_bytes(resp).await;
    status
}

#[tokio::test(start_paused = true)]
async fn limits_key_on_the_client_behind_a_trusted_peer() {
    let backend = Backend::start("b").await;
    let route = Path::servers(&[&backend]).rate_limit(3).healthcheck(false);
    let yaml = Upstreams::new()
        .host("rl.test", Host::new().path("/", route))
        .render();
    let proxy = Proxy::start(&yaml, "trusted_proxies: [\"127.0.0.2/32\"]").await;
    // Two clients behind the one trusted balancer are limited apart.
    let mut lb = connect_from(support::Proto::H1, proxy.addr, ip("127.0.0.2")).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get_as(&mut lb, "203.0.113.1").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(
        get_as(&mut lb, "203.0.113.2").await,
        200,
        "another client behind it"
    );
    // A trusted hop right of the client (the balancer itself, 127.0.0.2) is skipped; forged
    // entries left of the client change nothing.
    assert_eq!(
        get_as(&mut lb, "6.6.6.6, 203.0.113.1, 127.0.0.2").await,
        429
    );
    // An untrusted peer's XFF is ignored: its own address is the key.
    let mut outsider = connect_from(support::Proto::H2c, proxy.addr, ip("127.0.0.3")).await;
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for i in 0..4 {
            s.push(get_as(&mut outsider, &format!("198.51.100.{i}")).await);
        }
        s
    };
    assert_eq!(statuses, [200, 200, 200, 429]);
    // A second later everyone has their burst back.
    proxy.pass(Duration::from_secs(1)).await;
    assert_eq!(get_as(&mut lb, "203.0.113.1").await, 200);
    assert_eq!(get_as(&mut outsider, "198.51.100.9").await, 200);
}

#[tokio::test(start_paused = true)]
async fn the_4xx_limit_keys_on_the_client_behind_a_trusted_peer() {
    let backend = Backend::builder("b").status(404).start().await;
    let yaml = Upstreams::new()
        .host(
            "rl.test",
            Host::new()
                .path("/", Path::servers(&[&backend]).healthcheck(false))
                .x4xx_limit(2),
        )
        .render();
    let proxy = Proxy::start(&yaml, "trusted_proxies: [\"127.0.0.0/8\"]").await;
    let mut lb = connect_from(support::Proto::H1, proxy.addr, ip("127.0.0.2")).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get_as(&mut lb, "203.0.113.7").await);
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert_eq!(
        get_as(&mut lb, "203.0.113.8").await,
        404,
        "another client is not blocked"
    );
}
