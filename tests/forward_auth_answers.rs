//! What forward auth does with answers an auth service should not give: an interim one (a 101,
//! which reached HTTP/1.1 clients as an empty reply and HTTP/2 ones as a protocol error) is a
//! 502; a refusal whose body is over the 64 KiB relayed still reaches the client with its status
//! and headers (it was a 502, and the login page's `WWW-Authenticate` was lost).

use crate::support;

use std::net::SocketAddr;

use support::upstreams::{Host, Path, Upstreams};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An auth service answering each question by its `X-Forwarded-Uri`: `/switch` a 101, anything
/// else a 401 with a challenge and a 100 KiB body. Closes after each answer.
async fn scripted_auth_service() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let answer = if head.contains("x-forwarded-uri: /switch") {
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                        .to_vec()
                } else {
                    let body = "x".repeat(100 * 1024);
                    format!(
                        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"sso\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .into_bytes()
                };
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_answer_is_a_502_and_a_long_refusal_keeps_its_status_and_headers() {
    let backend = Backend::start("b").await;
    let auth = scripted_auth_service().await;
    let routes = Upstreams::new()
        .host(
            "fwd.test",
            Host::new().path(
                "/",
                Path::servers(&[&backend])
                    .healthcheck(false)
                    .authorization_data("forward", &format!("http://{auth}/check")),
            ),
        )
        .render();
    let proxy = ProxyProcess::start(&routes, "");
    for proto in [Proto::H1, Proto::H2c] {
        let mut c = Client::connect(proto, proxy.addr).await;
        let resp = c.get("fwd.test", "/switch").await;
        assert_eq!(resp.status(), 502, "{proto:?}: a 101 answers nothing");
        body_bytes(resp).await;
        let resp = c.get("fwd.test", "/page").await;
        assert_eq!(resp.status(), 401, "{proto:?}");
        assert_eq!(header(&resp, "www-authenticate"), "Bearer realm=\"sso\"");
        assert!(
            body_bytes(resp).await.is_empty(),
            "the body over 64 KiB is left out"
        );
    }
    assert_eq!(
        backend.requests(),
        0,
        "refused requests never reach the backend"
    );
    let log = proxy.log_text();
    assert!(
        log.contains("an interim answer where a final one was due"),
        "{log}"
    );
    assert!(log.contains("relayed without it"), "{log}");
}
