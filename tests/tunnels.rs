//! Upgraded connections (WebSocket and any other `Upgrade:`) after they leave HTTP: they still
//! count toward `max_connections`, and they close after `client_idle_timeout` without a byte
//! either way. In process, on tokio's paused clock.

use crate::inproc;
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use inproc::{in_real_time, Proxy};
use support::{bind_local, default_route_to};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A backend that switches every request to the `echo` protocol and then echoes bytes.
async fn echo_upgrades() -> SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let switch = "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n";
                if s.write_all(switch.as_bytes()).await.is_err() {
                    return;
                }
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Opens a tunnel through the proxy and checks one echo.
async fn open_tunnel(proxy: SocketAddr) -> TcpStream {
    let (s, head) = try_open_tunnel(proxy).await;
    s.unwrap_or_else(|| panic!("closed: {}", String::from_utf8_lossy(&head)))
}

/// [`open_tunnel`], `None` (with what came of the answer) when the proxy closes the connection.
async fn try_open_tunnel(proxy: SocketAddr) -> (Option<TcpStream>, Vec<u8>) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let ask = "GET /t HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n";
    let mut head = Vec::new();
    if s.write_all(ask.as_bytes()).await.is_err() {
        return (None, head);
    }
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if !matches!(s.read(&mut byte).await, Ok(1)) {
            return (None, head);
        }
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    assert_eq!(echo(&mut s, b"ping").await, Some(b"ping".to_vec()));
    (Some(s), head)
}

/// Sends `data` and reads the echo; `None` if the tunnel is closed.
async fn echo(s: &mut TcpStream, data: &[u8]) -> Option<Vec<u8>> {
    s.write_all(data).await.ok()?;
    let mut back = vec![0u8; data.len()];
    match in_real_time(REAL_WAIT, s.read_exact(&mut back)).await {
        Some(Ok(_)) => Some(back),
        _ => None,
    }
}

/// Whether the proxy has closed `s` (EOF or reset). Waited for in real time with the paused
/// clock held: a close in flight under load is not mistaken for an open tunnel.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        in_real_time(REAL_WAIT, s.read(&mut buf)).await,
        Some(Ok(0) | Err(_))
    )
}

/// How long a check waits on the kernel (wall clock; a tunnel that answers takes microseconds).
const REAL_WAIT: Duration = Duration::from_secs(5);

const MAIN: &str = "max_connections: 3\nclient_idle_timeout: 7\nclient_header_timeout: 2";

#[tokio::test(start_paused = true)]
async fn tunnels_count_toward_max_connections() {
    let backend = echo_upgrades().await;
    let proxy = Proxy::start(&default_route_to(&[backend]), MAIN).await;
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        tunnels.push(open_tunnel(proxy.addr).await);
    }
    // Three tunnels fill the cap: the next connection is closed at accept (which comes with
    // its first bytes: the listener defers accepts).
    let mut fourth = TcpStream::connect(proxy.addr).await.unwrap();
    fourth
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert!(closed(&mut fourth).await, "a 4th connection was served");
    // Closing a tunnel gives its place back, once the proxy has seen it closed (waited for
    // in real time: a sleep on the paused clock could end before the close arrived).
    drop(tunnels.pop());
    let reopened = in_real_time(REAL_WAIT, async {
        loop {
            if let (Some(tunnel), _) = try_open_tunnel(proxy.addr).await {
                break tunnel;
            }
        }
    });
    tunnels.push(reopened.await.expect("the closed tunnel's place came back"));
}

#[tokio::test(start_paused = true)]
async fn an_idle_tunnel_closes_after_the_idle_timeout_and_a_busy_one_does_not() {
    let backend = echo_upgrades().await;
    let proxy = Proxy::start(&default_route_to(&[backend]), MAIN).await;
    let mut quiet = open_tunnel(proxy.addr).await;
    let mut busy = open_tunnel(proxy.addr).await;
    // The header timeout (2 s) no longer applies; traffic every 5 s keeps `busy` open.
    for _ in 0..4 {
        proxy.pass(Duration::from_secs(5)).await;
        assert_eq!(echo(&mut busy, b"tick").await, Some(b"tick".to_vec()));
    }
    assert!(
        closed(&mut quiet).await,
        "20 s idle with a 7 s idle timeout"
    );
    // The closed tunnel no longer counts: two more fit beside `busy`.
    let _more = [open_tunnel(proxy.addr).await, open_tunnel(proxy.addr).await];
}
