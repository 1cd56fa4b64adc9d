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
}

/// Answers each request head read from `stream` with `answer`, then does as `then` says.
pub async fn scripted_backend<S>(mut stream: S, answer: &'static [u8], then: Then)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            seen.drain(..end + 4);
            if stream.write_all(answer).await.is_err() {
                return;
            }
            if let Then::Stall = then {
                // Unread until the proxy lets go.
                let _ = stream.read(&mut buf).await;
                return;
            }
        }
    }
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
