//! Opening a new connection to a backend: TCP (TCP_NODELAY, each resolved address in turn, the
//! connect timeout), then TLS for `https://` backends, then the HTTP/1.1 or HTTP/2 handshake.
//! Connect outcomes feed the backend's passive health.

use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::backend::Backend;
use super::pool::UpBody;

/// Why a connection could not be opened, and whether it was a timeout.
pub type ConnectFailure = (String, bool);

/// A freshly opened connection, by the protocol it speaks.
pub enum Fresh {
    H1(http1::SendRequest<UpBody>),
    H2(http2::SendRequest<UpBody>),
}

async fn tcp(backend: &Backend, timeout: Duration) -> Result<TcpStream, ConnectFailure> {
    let addrs = backend.addrs();
    if addrs.is_empty() {
        backend.connect_failed();
        return Err((
            format!("`{}` did not resolve to any address", backend.spec.host),
            false,
        ));
    }
    let mut last: ConnectFailure = (String::new(), false);
    for addr in addrs.iter() {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                backend.connect_succeeded();
                return Ok(stream);
            }
            Ok(Err(e)) => last = (format!("connect to {addr}: {e}"), false),
            Err(_) => {
                last = (
                    format!("connect to {addr}: timed out after {timeout:?}"),
                    true,
                )
            }
        }
    }
    backend.connect_failed();
    Err(last)
}

async fn h1_over<IO>(io: IO) -> Result<http1::SendRequest<UpBody>, ConnectFailure>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| (format!("HTTP/1.1 handshake: {e}"), false))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("upstream connection ended: {e}");
        }
    });
    Ok(sender)
}

async fn h2_over<IO>(io: IO) -> Result<http2::SendRequest<UpBody>, ConnectFailure>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .adaptive_window(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| (format!("HTTP/2 handshake: {e}"), false))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream h2 connection ended: {e}");
        }
    });
    Ok(sender)
}

/// Opens a connection for HTTP/1.1 (plain backends) or, for TLS backends, whatever ALPN picks;
/// `sni` is the name to present.
pub async fn open(
    backend: &Backend,
    sni: &str,
    timeout: Duration,
) -> Result<Fresh, ConnectFailure> {
    let stream = tcp(backend, timeout).await?;
    if !backend.tls {
        return h1_over(stream).await.map(Fresh::H1);
    }
    let (tls, h2) =
        match tokio::time::timeout(timeout, super::tls::handshake(stream, sni, true)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                backend.connect_failed();
                return Err((format!("TLS handshake: {e}"), false));
            }
            Err(_) => {
                backend.connect_failed();
                return Err((format!("TLS handshake: timed out after {timeout:?}"), true));
            }
        };
    if h2 {
        h2_over(tls).await.map(Fresh::H2)
    } else {
        h1_over(tls).await.map(Fresh::H1)
    }
}

/// Opens an h2c (prior knowledge) connection.
pub async fn open_h2c(
    backend: &Backend,
    timeout: Duration,
) -> Result<http2::SendRequest<UpBody>, ConnectFailure> {
    let stream = tcp(backend, timeout).await?;
    h2_over(stream).await
}
