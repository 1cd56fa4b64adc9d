//! HPACK request heads over h2c, as a client library codes them, against the in-process proxy:
//! every request of a connection reaches the backend with its own header values. Guards the
//! vendored h2's memo of the last Huffman-coded values sent without indexing
//! (vendor/h2/PATCHED.md).

use crate::inproc;
use crate::support;

use bytes::Bytes;
use http::{HeaderValue, Request};
use inproc::Proxy;
use support::{default_route, full, header, Backend, Client, Proto};

/// Sends `GET {path}` with `Authorization: {value}`, never indexed when `sensitive` (as h2 and
/// nghttp2 send credentials; h2 never indexes `:path` or `Authorization` either way), and returns
/// the path and `Authorization` the backend saw.
async fn seen(client: &mut Client, path: &str, value: &str, sensitive: bool) -> (String, String) {
    let Client::H2(sender) = client else {
        panic!("an h2c client");
    };
    let mut value = HeaderValue::from_str(value).expect("header value");
    value.set_sensitive(sensitive);
    let request = Request::get(format!("http://x.test{path}"))
        .header("authorization", value)
        .body(full(Bytes::new()))
        .expect("request");
    sender.ready().await.expect("connection ready");
    let resp = sender.send_request(request).await.expect("answer");
    assert_eq!(resp.status(), 200);
    (
        header(&resp, "x-seen-uri"),
        header(&resp, "x-seen-authorization"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_sent_without_indexing_reach_the_backend_as_sent_on_every_request() {
    let backend = Backend::start("a").await;
    let proxy = Proxy::start(&default_route(&[&backend]), "").await;
    let mut client = Client::connect(Proto::H2c, proxy.addr).await;
    let token = |last: char| format!("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.sig{last}");
    let long = format!(
        "Bearer {}",
        "abcdefghijklmnopqrstuvwxyz0123456789".repeat(30)
    );
    let path = |n: u32| format!("/api/v1/accounts/{n}/orders?page=1");
    // The same values again; a token and a path that differ from the first only in their last
    // character ('a' and 'e', '1' and '2' have codes of the same length, so they are coded to
    // the same length); more distinct values than the memo has entries; a value too long to be
    // kept; one sent without the never-indexed flag; and the first values once more.
    let mut sequence = vec![
        (path(1), token('a'), true),
        (path(1), token('a'), true),
        (path(2), token('e'), true),
        (path(1), token('a'), true),
        ("/".to_string(), "Bearer x".to_string(), true),
    ];
    sequence.extend((10..16).map(|n| (path(n), token('a'), true)));
    sequence.extend([
        (path(1), long.clone(), true),
        (path(1), long.clone(), true),
        (path(2), token('c'), false),
        (path(1), token('a'), true),
    ]);
    for (i, (path, value, sensitive)) in sequence.iter().enumerate() {
        let (seen_path, seen_value) = seen(&mut client, path, value, *sensitive).await;
        assert_eq!(&seen_path, path, "request {i}: path");
        assert_eq!(&seen_value, value, "request {i}: authorization");
    }
}
