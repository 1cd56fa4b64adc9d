//! Hostile or broken input: the right 4xx/502, and other connections unaffected.

use crate::support;

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::scripted::{answers_to_every_client, scripted_routes, Then};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes raw bytes to the proxy and returns the status line it answers with ("" if none).
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    status_line(stream).await
}

/// [`raw_exchange`], the client closing its side after the bytes.
async fn raw_exchange_then_close(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    stream.shutdown().await.unwrap();
    status_line(stream).await
}

/// The status line the proxy answers on `stream` with ("" if none).
async fn status_line(mut stream: TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 5 s");
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// A "backend" that answers every connection with bytes that are not HTTP.
async fn garbage_backend() -> std::net::SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(b"SSH-2.0-OpenSSH_9.2 definitely not http\r\n\r\n")
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_4xx_and_garbage_backends_502() {
    let good = Backend::start("good").await;
    let garbage = garbage_backend().await;
    let yaml = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new()
                .path("/", Path::servers(&[&good]))
                .path("/garbage", Path::addrs(&[garbage]).healthcheck(false)),
        )
        .render();
    let proxy = ProxyProcess::start(&yaml, "max_request_header_bytes: 16384");
    // A keep-alive connection opened before the abuse, used after it.
    let mut bystander = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(bystander.get("a", "/").await.status(), 200);

    let status = raw_exchange(proxy.addr, b"this is not http at all\r\n\r\n").await;
    assert!(
        status.starts_with("HTTP/1.1 400"),
        "malformed request line: {status:?}"
    );

    let status = raw_exchange(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n",
    )
    .await;
    assert!(
        status.starts_with("HTTP/1.1 400"),
        "space in header name: {status:?}"
    );

    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    let status = raw_exchange(proxy.addr, big.as_bytes()).await;
    assert!(
        status.starts_with("HTTP/1.1 431"),
        "oversized header block: {status:?}"
    );

    for proto in PROTOCOLS {
        let mut client = Client::connect(proto, proxy.addr).await;
        let resp = client.get("a", "/garbage").await;
        assert_eq!(resp.status(), 502, "{proto:?}: backend answering garbage");
        body_bytes(resp).await;
    }

    let resp = bystander.get("a", "/still-here").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-backend"), "good");
}

/// A request body that breaks (a malformed chunk, or the client gone before the length it
/// declared) is the client's 400, never the backend's 502. It is not sent again on another
/// backend connection: polled past its error the body ends cleanly, so the backend took the
/// request with an empty body and answered 200; each try also dropped a pooled connection.
/// A backend connection the request never reached stays in the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_request_body_is_the_clients_400_and_never_sent_again() {
    let h1 = Backend::builder("h1").h1_only().start().await;
    let h2 = Backend::start("h2").await;
    let tls = start_tls_backend("tls", &[b"http/1.1"]).await;
    let yaml = Upstreams::new()
        .host(
            "h1.test",
            Host::new().path("/", Path::servers(&[&h1]).healthcheck(false)),
        )
        .host(
            "h2.test",
            Host::new().path("/", Path::servers(&[&h2]).healthcheck(false)),
        )
        .host(
            "tls.test",
            Host::new().path(
                "/",
                Path::addrs(&[format!("https://{tls}")])
                    .healthcheck(false)
                    .upstream_tls_verify(false),
            ),
        )
        .render();
    // One worker: one pool, which the first requests fill.
    let proxy = ProxyProcess::start(&yaml, "threads: 1");
    let malformed: [(&str, &str); 2] = [
        (
            "a chunk size past 64 bits",
            "fffffffffffffffff1\r\nab\r\n0\r\n\r\n",
        ),
        ("a chunk line ended by a bare LF", "2\nab\n0\n\n"),
    ];
    // aralez's HTTP/1.1 client, hyper's over HTTP/2 (h2c detected) and over HTTP/1.1 (TLS).
    for (route, backend) in [
        ("h1.test", Some(&h1)),
        ("h2.test", Some(&h2)),
        ("tls.test", None),
    ] {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        for _ in 0..2 {
            assert_eq!(client.get(route, "/").await.status(), 200, "{route}");
        }
        let accepts = backend.map(Backend::accepts);
        for (what, body) in malformed {
            let request = format!(
                "POST / HTTP/1.1\r\nHost: {route}\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
            );
            let status = raw_exchange(proxy.addr, request.as_bytes()).await;
            assert!(
                status.starts_with("HTTP/1.1 400"),
                "{route}, {what}: {status:?}"
            );
        }
        assert_eq!(
            backend.map(Backend::accepts),
            accepts,
            "{route}: backend connections opened for bodies that broke before a byte went out"
        );
        // The backend answers without reading the body: it waits a little (`/slow/`), so the
        // body is cut before the answer could come, as the case is meant.
        let cut =
            format!("POST /slow/300 HTTP/1.1\r\nHost: {route}\r\nContent-Length: 10\r\n\r\nab");
        let status = raw_exchange_then_close(proxy.addr, cut.as_bytes()).await;
        assert!(
            status.starts_with("HTTP/1.1 400"),
            "{route}, a cut body: {status:?}"
        );
        assert_eq!(client.get(route, "/").await.status(), 200, "{route}");
    }
}

/// RFC 9112 §3.2: a target that is not a path (`GET x` was sent on as `GET /`), a `Host` that
/// is no host name (it went to `DEFAULT` and on to the backend as it was), and one that names
/// another host than an absolute target, are each a 400; a transfer coding other than one
/// `chunked` is a 501 (§6.1); the well-formed neighbours pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_hosts_and_codings_that_are_not_one_are_refused() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "");
    let cases: [(&str, &str); 12] = [
        ("GET x HTTP/1.1\r\nHost: a", "400"),
        ("GET x HTTP/1.0", "400"),
        ("GET * HTTP/1.1\r\nHost: a", "400"),
        ("GET / HTTP/1.1\r\nHost: a b", "400"),
        ("GET / HTTP/1.1\r\nHost: user@a", "400"),
        ("GET http://admin.example/x HTTP/1.1\r\nHost: a", "400"),
        ("GET http://a/x HTTP/1.1\r\nHost: A:80", "200"),
        ("OPTIONS * HTTP/1.1\r\nHost: a", "200"),
        ("GET /x HTTP/1.1\r\nHost: a_b.example.:8080", "200"),
        // A coding the proxy does not decode would reach the backend unlabelled.
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0",
            "501",
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0",
            "501",
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n0",
            "200",
        ),
    ];
    for (head, want) in cases {
        let request = format!("{head}\r\n\r\n");
        let status = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert_eq!(status.split(' ').nth(1), Some(want), "{head:?}: {status:?}");
    }
}

/// CONNECT (a tunnel to anywhere) and TRACE (the request echoed back, with what the proxy
/// added: cross-site tracing) are refused with 405, as nginx refuses them; the backend sees
/// neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_trace_are_refused() {
    let good = Backend::start("good").await;
    let yaml = Upstreams::new()
        .host("DEFAULT", Host::new().path("/", Path::servers(&[&good])))
        .render();
    let proxy = ProxyProcess::start(&yaml, "access_log: all");
    for request in [
        &b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"[..],
        b"TRACE / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0\r\n\r\n",
    ] {
        let status = raw_exchange(proxy.addr, request).await;
        assert!(status.starts_with("HTTP/1.1 405"), "{status:?}");
    }
    assert_eq!(good.requests(), 0);
    // A CONNECT's line names the authority it asked for (it said `target="/"`).
    let said = "method=CONNECT target=\"example.com:443\" ";
    proxy.wait_log(said, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_max_connections_is_closed_at_accept() {
    let backend = Backend::start("a").await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "max_connections: 5");
    // The proxy is frozen while 20 connections complete in the kernel's backlog, so a worker
    // accepts them in one burst; every accepted one stays open (keep-alive) and must count
    // before the next accept is checked.
    proxy.signal(nix::sys::signal::Signal::SIGSTOP);
    let mut streams = Vec::new();
    for _ in 0..20 {
        streams.push(TcpStream::connect(proxy.addr).await.unwrap());
    }
    proxy.signal(nix::sys::signal::Signal::SIGCONT);
    let mut served = 0;
    for stream in &mut streams {
        let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let mut buf = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut buf)).await;
        if matches!(read, Ok(Ok(_))) && &buf == b"HTTP/1.1 200" {
            served += 1;
        }
    }
    // Two workers check the shared count at the same moment at most once: 5, or 6.
    assert!(
        (5..=6).contains(&served),
        "{served} of 20 connections served with max_connections: 5"
    );
}

/// Reads until the proxy closes `stream`; how long that took.
async fn time_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(
            tokio::time::Instant::from_std(start + limit),
            stream.read(&mut buf),
        )
        .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_client_idle_timeout_busy_ones_stay() {
    let backend = Backend::start("a").await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "client_idle_timeout: 1");

    // HTTP/2: a response slower than the idle timeout is not cut; once nothing is open, the
    // proxy sends GOAWAY and closes within about the timeout.
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let asked = std::time::Instant::now();
    let req = http::Request::get("http://x/slow/2500")
        .body(full(""))
        .unwrap();
    let resp = send.send_request(req).await.expect("the slow response");
    assert_eq!(resp.status(), 200);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("its body")
        .to_bytes();
    assert_eq!(&body[..], b"a");
    assert!(asked.elapsed() >= Duration::from_millis(2400));
    let answered = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        ended.is_ok(),
        "the idle HTTP/2 connection is still open after 5 s"
    );
    let idle_for = answered.elapsed();
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(3)).contains(&idle_for),
        "HTTP/2 connection closed after {idle_for:?} idle, timeout 1 s"
    );

    // HTTP/1.1 keep-alive: closed after the idle timeout (the header timeout is 10 s).
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let closed = time_until_closed(&mut stream, Duration::from_secs(5)).await;
    let closed = closed.expect("the idle HTTP/1.1 connection is still open after 5 s");
    assert!(
        (Duration::from_millis(700)..Duration::from_secs(3)).contains(&closed),
        "HTTP/1.1 connection closed after {closed:?} idle, timeout 1 s"
    );
}

/// A backend answer with both `Content-Length` and `Transfer-Encoding: chunked` is framed by
/// the chunks (RFC 9112 §6.3), and its length does not go on to the client: it did, beside the
/// chunks' 3 bytes, so the client waited for 5, or aralez's own HTTP/1.1 writer gave up on the
/// answer and the client got an empty reply. Over aralez's HTTP/1.1 client (plain) and hyper's
/// (TLS), to HTTP/1.1 and h2c clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_beside_a_transfer_coding_does_not_reach_the_client() {
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    for got in answers_to_every_client(ANSWER, &[]).await {
        let what = &got.what;
        assert_eq!(got.head.status, 200, "{what}");
        assert!(
            got.head
                .headers
                .get("content-length")
                .is_none_or(|l| l != "5"),
            "{what}"
        );
        let body = got
            .body
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .to_bytes();
        assert_eq!(&body[..], b"abc", "{what}");
    }
}

/// A backend answer in a transfer coding the proxy does not decode (`gzip, chunked`) is a 502,
/// as nginx answers it: the chunks were decoded and the gzip went with the field, so the client
/// took gzip bytes for the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_a_transfer_coding_not_decoded_is_a_502() {
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    answers_are_502(ANSWER).await;
}

/// A status past 599 is no status (RFC 9110 §15): it was passed on, with the reason `<none>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_status_past_599_is_a_502() {
    answers_are_502(b"HTTP/1.1 600 Odd\r\nContent-Length: 3\r\n\r\nabc").await;
}

/// A 101 to a request that asked for no upgrade (RFC 9110 §15.2.2): hyper's client passed it on
/// as a final answer, to an HTTP/1.1 client without its `Upgrade`, to an HTTP/2 one as a 101
/// that ended the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_101_is_a_502() {
    answers_are_502(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\nraw",
    )
    .await;
}

/// A 204 never carries a `Content-Length` (RFC 9110 §8.6), whatever its backend sent: HTTP/2
/// clients were given the backend's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_reaches_every_client_without_a_length() {
    const ANSWER: &[u8] = b"HTTP/1.1 204 No Content\r\nContent-Length: 64\r\n\r\n";
    for got in answers_to_every_client(ANSWER, &[]).await {
        let what = &got.what;
        assert_eq!(got.head.status, 204, "{what}");
        let length = got.head.headers.get("content-length");
        assert!(length.is_none(), "{what}: {length:?}");
        let body = got.body.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(body.to_bytes().is_empty(), "{what}");
    }
}

/// `answer`, from a backend behind each of both clients, reaches HTTP/1.1 and h2c clients as
/// a 502.
async fn answers_are_502(answer: &'static [u8]) {
    for got in answers_to_every_client(answer, &[]).await {
        assert_eq!(got.head.status, 502, "{}", got.what);
    }
}

/// A backend that stops sending in the middle of a body is cut once nothing has come for the
/// response timeout (nginx's `proxy_read_timeout`): the client's answer ends in an error then.
/// It used to wait as long as the client did, holding both connections. Over aralez's HTTP/1.1
/// client (plain) and hyper's (TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_stalls_mid_body_is_cut_after_the_response_timeout() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst part";
    let yaml = scripted_routes(ANSWER, Then::Stall).await;
    let proxy = ProxyProcess::start(&yaml, "upstream_response_timeout: 1");
    for proto in PROTOCOLS {
        for path in ["/plain", "/tls"] {
            let what = format!("{proto:?} {path}");
            let mut client = Client::connect(proto, proxy.addr).await;
            let resp = client.get("a", path).await;
            assert_eq!(resp.status(), 200, "{what}");
            let started = std::time::Instant::now();
            let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
                .await
                .unwrap_or_else(|_| panic!("{what}: the stalled body was never cut"));
            assert!(body.is_err(), "{what}: a cut body ended cleanly");
            let waited = started.elapsed();
            assert!(
                waited >= Duration::from_millis(900),
                "{what}: cut after {waited:?}"
            );
        }
    }
}

/// A plain HTTP request sent to the TLS port gets nginx's readable 400 rather than a TLS alert
/// (its body and all, read whole by the client: no reset), is logged and counted as refused,
/// and the port goes on serving TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_on_the_tls_port_gets_a_readable_400() {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().unwrap();
    let roots = [write_self_signed(certs.path(), "d", &["127.0.0.1"])];
    let main = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\naccess_log: all",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&default_route(&[&backend]), &main);
    let tls = proxy.logged_addr("listening on https://");
    let mut stream = TcpStream::connect(tls).await.unwrap();
    let request = b"POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello";
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
    assert!(matches!(read.await, Ok(Ok(_))), "{answer:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with("The plain HTTP request was sent to an HTTPS port.\n"),
        "{answer}"
    );
    let logged = eventually(Duration::from_secs(5), || {
        proxy.log_text().lines().any(|l| {
            l.starts_with("access ")
                && l.contains(" status=400 ")
                && l.contains(" method=- ")
                && l.contains(" bytes=50 ")
        })
    });
    assert!(logged.await, "the 400's 50 bytes: {}", proxy.log_text());
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    let mut client = Client::connect_tls(tls, "127.0.0.1", config).await;
    assert_eq!(client.get("a.test", "/").await.status(), 200);
}

/// A backend whose chunked answer ends early (it closes mid-body): the client gets the head
/// and what came, then the close, an answer cut short as nginx sends it. It got an empty reply
/// (logged as a 200) about one time in three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_short_by_its_backend_reaches_the_client_cut_short() {
    use support::scripted::{scripted_routes, Then};
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    let proxy = ProxyProcess::start(&scripted_routes(ANSWER, Then::Close).await, "");
    for round in 0..6 {
        let path = if round % 2 == 0 { "/plain" } else { "/tls" };
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let ask = format!("GET {path} HTTP/1.1\r\nHost: x.test\r\n\r\n");
        stream.write_all(ask.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            while support::scripted::read_more(&mut stream, &mut got).await {}
        });
        read.await.expect("the connection ends");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text:?}");
        assert!(text.contains("hello"), "{path}: {text:?}");
        assert!(
            !text.ends_with("0\r\n\r\n"),
            "{path}: not cut short: {text:?}"
        );
    }
    // Said, naming the backend, over the inline client (plain) and hyper's (TLS): nothing
    // was, and the access log has the head's 200.
    let said = "the backend's answer was cut after its head";
    assert!(proxy.wait_log_count(said, 6, Duration::from_secs(5)).await);
    let log = proxy.log_text();
    assert!(
        !log.lines()
            .any(|l| l.contains(said) && l.contains("backend=-")),
        "{log}"
    );
}

/// What a client sending `ask` reads, lowercased, until the proxy closes, the backend of
/// `/plain` answering `answer`.
async fn through_the_proxy(answer: &'static [u8], ask: &[u8]) -> String {
    let proxy = ProxyProcess::start(&scripted_routes(answer, Then::AnswerTheNext).await, "");
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(ask).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got));
    read.await.expect("the answer, then the close").unwrap();
    String::from_utf8_lossy(&got).to_lowercase()
}

/// The head of `answer` as an HTTP/1.1 client's `HEAD /plain` gets it through the proxy.
async fn head_answer_through_the_proxy(answer: &'static [u8]) -> String {
    let ask = b"HEAD /plain HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n";
    through_the_proxy(answer, ask).await
}

/// A backend's answer to HEAD has its Content-Length checked as a GET's is: two that differ,
/// or one that is no length, are a 502; the same one twice goes on once. They went to the
/// client as the backend wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_answers_content_length_is_checked_as_a_gets() {
    let differing = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    let signed = b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n";
    for answer in [&differing[..], &signed[..]] {
        let got = head_answer_through_the_proxy(answer).await;
        assert!(got.starts_with("http/1.1 502"), "{got:?}");
    }
    let twice = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n";
    let got = head_answer_through_the_proxy(twice).await;
    assert!(got.starts_with("http/1.1 200"), "{got:?}");
    assert_eq!(got.matches("content-length: 5\r\n").count(), 1, "{got:?}");
}

/// An HTTP/1.0 client that asks to keep its connection is told `close` when the answer's end
/// can only be the close (the backend's answer is chunked: HTTP/1.0 has no chunks). It was told
/// `keep-alive`, and its next request on the connection went unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_answer_of_no_known_length_says_close() {
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let ask = b"GET /plain HTTP/1.0\r\nHost: x.test\r\nConnection: keep-alive\r\n\r\n";
    let got = through_the_proxy(ANSWER, ask).await;
    let (head, body) = got.split_once("\r\n\r\n").unwrap_or_default();
    assert!(head.contains("connection: close"), "{got:?}");
    assert!(!head.contains("keep-alive"), "{got:?}");
    assert_eq!(body, "hello", "{got:?}");
}
