//! One-shot HTTP exchanges off the forwarding path: active health probes and forward-auth
//! questions. One fresh connection per exchange (`Connection: close`), plain HTTP/1.1 or h2c,
//! never pooled. The caller bounds the whole exchange with a timeout; the connection task is
//! bounded by the same limit so nothing outlives it.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpStream, ToSocketAddrs};

use super::Protocol;

/// Why a one-shot exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum OneShotError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Detect(String),
    #[error("handshake: {0}")]
    Handshake(hyper::Error),
    #[error("exchange: {0}")]
    Exchange(hyper::Error),
    #[error("response body larger than {0} bytes")]
    BodyTooLarge(usize),
}

/// Opens a TCP connection (TCP_NODELAY) to the first address that answers.
pub async fn connect(addrs: impl ToSocketAddrs) -> Result<TcpStream, OneShotError> {
    let stream = TcpStream::connect(addrs)
        .await
        .map_err(OneShotError::Connect)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Sends `req` on `stream` and returns the response head; the body streams from the connection,
/// whose task ends after `limit` at the latest.
pub async fn exchange<IO>(
    stream: IO,
    protocol: Protocol,
    req: Request<Empty<Bytes>>,
    limit: Duration,
) -> Result<Response<Incoming>, OneShotError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    match protocol {
        Protocol::Http1 => {
            let (mut send, conn) = http1::handshake(io)
                .await
                .map_err(OneShotError::Handshake)?;
            tokio::spawn(tokio::time::timeout(limit, conn));
            send.send_request(req).await.map_err(OneShotError::Exchange)
        }
        Protocol::H2 => {
            let (mut send, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(OneShotError::Handshake)?;
            tokio::spawn(tokio::time::timeout(limit, conn));
            send.send_request(req).await.map_err(OneShotError::Exchange)
        }
    }
}

/// Reads a whole body of at most `max` bytes.
pub async fn read_body(mut body: Incoming, max: usize) -> Result<Bytes, OneShotError> {
    use http_body_util::BodyExt as _;
    let mut out = BytesMut::new();
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(OneShotError::Exchange)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(OneShotError::BodyTooLarge(max));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}
