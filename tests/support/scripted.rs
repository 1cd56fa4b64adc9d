//! Scripted backends: raw bytes for an answer, whatever was asked, to show what the proxy does
//! with answers no well-behaved server sends.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{any_local, bind_local, serve_tls, tls_backend_acceptor, Host, Path, Upstreams};

/// What a scripted backend does after an answer.
#[derive(Clone, Copy)]
pub enum Then {
    AnswerTheNext,
    /// Holds the connection open without a byte more.
    Stall,
    /// Closes the connection (an answer that was cut short ends there).
    Close,
}

/// Answers each request head read from `stream` with `answer`, then does as `then` says.
pub async fn scripted_backend<S>(mut stream: S, answer: &'static [u8], then: Then)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut seen = Vec::new();
    while read_more(&mut stream, &mut seen).await {
        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            seen.drain(..end + 4);
            if stream.write_all(answer).await.is_err() {
                return;
            }
            match then {
                Then::AnswerTheNext => {}
                // Unread until the proxy lets go.
                Then::Stall => {
                    let _ = stream.read(&mut [0u8; 1]).await;
                    return;
                }
                Then::Close => return,
            }
        }
    }
}

/// Reads what comes next from `stream` onto `seen`; `false` once the stream has ended.
pub async fn read_more<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    seen: &mut Vec<u8>,
) -> bool {
    let mut buf = [0u8; 4096];
    match stream.read(&mut buf).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            seen.extend_from_slice(&buf[..n]);
            true
        }
    }
}

/// Reads from `stream` until a whole head has come (or the stream ends): what was read.
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && read_more(stream, &mut head).await {}
    head
}

/// Routes `/plain` (aralez's HTTP/1.1 client) and `/tls` (hyper's, HTTP/1.1 over TLS) to a
/// scripted backend each.
pub async fn scripted_routes(answer: &'static [u8], then: Then) -> String {
    let plain = bind_local().await;
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = plain.accept().await {
            tokio::spawn(scripted_backend(stream, answer, then));
        }
    });
    let acceptor = tls_backend_acceptor(&[b"http/1.1"]);
    let tls_addr = serve_tls(acceptor, any_local(), move |tls| {
        scripted_backend(tls, answer, then)
    })
    .await;
    Upstreams::new()
        .host(
            "DEFAULT",
            Host::new()
                .path(
                    "/plain",
                    Path::addrs(&[format!("http://{plain_addr}")]).healthcheck(false),
                )
                .path(
                    "/tls",
                    Path::addrs(&[format!("https://{tls_addr}")])
                        .healthcheck(false)
                        .upstream_tls_verify(false),
                ),
        )
        .render()
}

/// What one client got over one route: which (`H1 /plain`, ...), the head, and the body read to
/// its end or its error.
pub struct Got {
    pub what: String,
    pub head: http::response::Parts,
    pub body: Result<http_body_util::Collected<bytes::Bytes>, hyper::Error>,
}

/// `answer`, from the scripted backends of [`scripted_routes`] (aralez's HTTP/1.1 client and
/// hyper's over TLS), as an HTTP/1.1 and an h2c client each get it, their requests carrying
/// `headers`. Each head and each body must come within 5 s.
pub async fn answers_to_every_client(answer: &'static [u8], headers: &[(&str, &str)]) -> Vec<Got> {
    use http_body_util::BodyExt;
    let limit = std::time::Duration::from_secs(5);
    let proxy = super::ProxyProcess::start(&scripted_routes(answer, Then::AnswerTheNext).await, "");
    let mut got = Vec::new();
    for proto in super::PROTOCOLS {
        let mut client = super::Client::connect(proto, proxy.addr).await;
        for path in ["/plain", "/tls"] {
            let what = format!("{proto:?} {path}");
            let empty = super::full(bytes::Bytes::new());
            let asked = client.send(http::Method::GET, Some("a"), path, headers, empty);
            let resp = tokio::time::timeout(limit, asked)
                .await
                .unwrap_or_else(|_| panic!("{what}: no answer"));
            let (head, body) = resp.into_parts();
            let body = tokio::time::timeout(limit, body.collect())
                .await
                .unwrap_or_else(|_| panic!("{what}: the body never ended"));
            got.push(Got { what, head, body });
        }
    }
    got
}
