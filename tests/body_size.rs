//! `client_max_body_size` (nginx's name and meaning): a request body larger than it is a 413,
//! whether its length is declared (refused before any of it is read, the backend never asked)
//! or not (chunked, an HTTP/2 stream without `content-length`: the exchange stops once past
//! it). Bodies within it pass whole.

use crate::support;

use http::Method;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_client_max_body_size_are_refused_with_413() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(
        &default_route(&[&backend]),
        "client_max_body_size: 64k\naccess_log: all",
    );
    for proto in PROTOCOLS {
        for (declared, body) in [
            (true, full(vec![b'x'; 65_536])),
            (false, generated_body(65_536)),
        ] {
            let (status, said) = post(proto, proxy.addr, body).await;
            assert_eq!(status, 200, "{proto:?}, declared: {declared}");
            assert_eq!(said, "65536", "{proto:?}");
        }
        let asked = backend.requests();
        let (status, said) = post(proto, proxy.addr, full(vec![b'x'; 65_537])).await;
        assert_eq!(status, 413, "{proto:?}: declared past the cap");
        assert!(said.contains("client_max_body_size"), "{said}");
        let asked_now = backend.requests();
        assert_eq!(asked_now, asked, "{proto:?}: the backend was asked");
        let (status, _) = post(proto, proxy.addr, generated_body(1 << 20)).await;
        assert_eq!(
            status,
            413,
            "{proto:?}: past the cap as it came: {}",
            proxy.log_text()
        );
    }
    // A length no upload of the route would have: answered at once, the rest never waited for.
    let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST /collect HTTP/1.1\r\nHost: any\r\nContent-Length: 10000000000\r\n\r\nxxxx";
    raw.write_all(head.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 1024];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut got));
    let n = read.await.expect("an answer in time").unwrap();
    let answer = String::from_utf8_lossy(&got[..n]);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    let logged = eventually(std::time::Duration::from_secs(5), || {
        let log = proxy.log_text();
        let refused = log.lines().filter(|l| l.starts_with("access "));
        refused.filter(|l| l.contains(" status=413 ")).count() == 5
    });
    assert!(logged.await, "{}", proxy.log_text());
}

/// A POST of `body` to `/collect` on a connection of its own: the status and the answer.
async fn post(proto: Proto, addr: std::net::SocketAddr, body: ClientBody) -> (u16, String) {
    let mut client = Client::connect(proto, addr).await;
    let resp = client
        .send(Method::POST, Some("any"), "/collect", &[], body)
        .await;
    let status = resp.status().as_u16();
    let said = body_bytes(resp).await;
    (status, String::from_utf8_lossy(&said).into_owned())
}
