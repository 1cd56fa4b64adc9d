//! Opening a new connection to a backend: TCP (TCP_NODELAY, each resolved address in turn, the
//! connect timeout), then TLS for TLS backends, then the HTTP/1.1 or HTTP/2 handshake.
//! Connect outcomes feed the backend's passive health.

use std::sync::Arc;
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::backend::{Backend, Wire};
use super::h2_settings::{SettingsWatch, StreamLimit};
use super::pool::UpBody;

/// HTTP/2 flow-control windows the proxy offers its backends.
const UPSTREAM_STREAM_WINDOW: u32 = 1 << 20;
const UPSTREAM_CONNECTION_WINDOW: u32 = 16 << 20;

/// Why a connection could not be opened, and whether it was a timeout.
pub type ConnectFailure = (String, bool);

/// A freshly opened connection, by the protocol it speaks.
pub enum Fresh {
    H1(http1::SendRequest<UpBody>),
    /// With the number of streams the backend allows on it.
    H2(http2::SendRequest<UpBody>, Arc<StreamLimit>),
}

pub(super) async fn tcp(backend: &Backend, timeout: Duration) -> Result<TcpStream, ConnectFailure> {
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

/// The HTTP/2 handshake, then a wait (at most `timeout`) for the backend's SETTINGS, so the
/// first burst of requests knows how many streams this connection takes.
async fn h2_over<IO>(io: IO, timeout: Duration) -> Result<Fresh, ConnectFailure>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, limit) = SettingsWatch::new(io);
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        // Fixed windows, not adaptive ones (which grow to 16 MiB a stream): what a backend may
        // send ahead of the client's reading is what the proxy holds in memory. 1 MiB a stream
        // bounds that; 16 MiB a connection lets 16 slow readers sit full before the other
        // streams on the shared connection wait.
        .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
        .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| (format!("HTTP/2 handshake: {e}"), false))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream h2 connection ended: {e}");
        }
    });
    let _ = tokio::time::timeout(timeout, limit.learned()).await;
    Ok(Fresh::H2(sender, limit))
}

/// Opens a connection over `wire`: HTTP/1.1 or h2c on plain TCP; on TLS, whatever ALPN picks
/// (`offer_h2: false` asks for HTTP/1.1 only, for upgrades). `sni` is the name to present.
pub async fn open(
    backend: &Backend,
    wire: Wire,
    sni: &str,
    timeout: Duration,
    offer_h2: bool,
) -> Result<Fresh, ConnectFailure> {
    let stream = tcp(backend, timeout).await?;
    match wire {
        Wire::Http1 => return h1_over(stream).await.map(Fresh::H1),
        Wire::H2c if offer_h2 => return h2_over(stream, timeout).await,
        Wire::H2c => return h1_over(stream).await.map(Fresh::H1),
        Wire::Tls => {}
    }
    let handshake = super::tls::handshake(stream, sni, offer_h2, backend.verify_tls);
    let (tls, h2) = match tokio::time::timeout(timeout, handshake).await {
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
        h2_over(tls, timeout).await
    } else {
        h1_over(tls).await.map(Fresh::H1)
    }
}
