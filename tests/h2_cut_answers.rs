//! An answer its backend cut short (a `Content-Length` it never met, then a close), to an
//! HTTP/2 client: the head and what came go out, then the stream's reset, as nginx sends it and
//! as HTTP/1.1 clients get it. The reset used to drop the head when it had not gone out yet (h2
//! cleared the stream's queue): now and then the client got a bare RST_STREAM where the access
//! log said 200 (vendor/h2: `clear_queue_but_headers`).

use crate::support;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use support::scripted::{scripted_routes, Then};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_short_reaches_an_http2_client_with_its_head() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort";
    let proxy = ProxyProcess::start(&scripted_routes(ANSWER, Then::Close).await, "");
    let mut c = Client::connect(Proto::H2c, proxy.addr).await;
    for round in 0..60 {
        let path = if round % 2 == 0 { "/plain" } else { "/tls" };
        let sent = c.try_send(Method::GET, Some("x.test"), path, &[], full(Bytes::new()));
        let resp = sent
            .await
            .unwrap_or_else(|e| panic!("round {round} ({path}): no head, a bare reset: {e}"));
        assert_eq!(resp.status(), 200, "round {round}");
        let body = resp.into_body().collect().await;
        assert!(
            body.is_err(),
            "round {round} ({path}): the cut is passed on"
        );
    }
}
