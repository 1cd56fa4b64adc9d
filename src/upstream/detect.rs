//! Protocol detection for backends without a scheme (SPEC §6.3).
//!
//! A TLS handshake offering ALPN `h2,http/1.1` comes first: a backend that completes it, or
//! refuses it with a TLS alert, is TLS (ALPN then picks h2 or HTTP/1.1 per connection). Otherwise, on a new connection, the HTTP/2
//! preface and an empty SETTINGS frame: a backend that answers with SETTINGS is h2c, anything
//! else (an HTTP/1.1 error, a close, silence) is plain HTTP/1.1. TLS goes first because some
//! TLS servers (nginx) answer plain text with an HTTP/1.1 error, which would look like a plain
//! backend.
//!
//! Every backend without a scheme is detected on its first connection, whether or not its route
//! runs health checks. The result is cached on the backend and forgotten when connections start
//! failing ([`Backend::forget_detection`]): connects, or three exchanges in a row on new
//! connections ([`Backend::doubt_protocol`]); the next connection, or the next health check round,
//! detects again. Detection only learns whether the backend speaks TLS, so its handshake never
//! verifies the certificate; real connections do when `upstream_tls_verify` asks for it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::backend::Backend;
use super::connector::{ConnectError, Wire};

/// Longest wait for the TLS probe: a plain server may sit on a ClientHello it cannot parse.
const TLS_PROBE_TIME: Duration = Duration::from_secs(2);

/// The client connection preface followed by an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The backend's protocol: the cached one, or detected now (one detection per backend at a
/// time; callers that wait reuse its answer, a failure too: each had tried again in turn, the
/// Nth waiting N connect timeouts for an unreachable backend). Fails only when no TCP
/// connection can be made.
pub async fn wire_of(backend: &Backend, timeout: Duration) -> Result<Wire, ConnectError> {
    if let Some(wire) = backend.wire() {
        return Ok(wire);
    }
    let ran_before = backend.detections.load(Ordering::Acquire);
    let mut last_failure = backend.detecting.lock().await;
    if let Some(wire) = backend.wire() {
        return Ok(wire);
    }
    if backend.detections.load(Ordering::Acquire) != ran_before {
        if let Some(failure) = last_failure.as_ref() {
            return Err(failure.clone());
        }
    }
    let started = tokio::time::Instant::now();
    let detected = detect(backend, timeout).await;
    backend.detections.fetch_add(1, Ordering::Release);
    let wire = match detected {
        Ok(wire) => wire,
        Err(failure) => {
            *last_failure = Some(failure.clone());
            return Err(failure);
        }
    };
    *last_failure = None;
    tracing::debug!(backend = %backend.label, protocol = wire.name(), took = ?started.elapsed(), "protocol detection finished");
    backend.set_detected(wire);
    Ok(wire)
}

/// How long detection waits on the TLS probe, for a caller whose steps take `timeout` each.
pub fn tls_probe_wait(timeout: Duration) -> Duration {
    timeout.min(TLS_PROBE_TIME)
}

async fn detect(backend: &Backend, timeout: Duration) -> Result<Wire, ConnectError> {
    let stream = backend.tcp(timeout).await?;
    let tls_wait = tls_probe_wait(timeout);
    let handshake = super::tls::handshake(stream, &backend.spec.host, true, false);
    match tokio::time::timeout(tls_wait, handshake).await {
        Ok(Ok(_)) => return Ok(Wire::Tls),
        Ok(Err(e)) if spoke_tls(&e) => return Ok(Wire::Tls),
        _ => {}
    }
    let stream = backend.tcp(timeout).await?;
    if answers_h2_preface(stream, timeout).await {
        Ok(Wire::H2c)
    } else {
        Ok(Wire::Http1)
    }
}

/// Whether a handshake that failed was still with a TLS server: it answered with a TLS alert
/// (a version or cipher it does not take). Such a backend was taken for plain HTTP, and its
/// "plain HTTP request sent to an HTTPS port" 400 went to the clients; as TLS, its connections
/// fail with the handshake's reason.
fn spoke_tls(e: &std::io::Error) -> bool {
    matches!(
        crate::vocab::error_text::tls_error_of(e),
        Some(rustls::Error::AlertReceived(_) | rustls::Error::PeerIncompatible(_))
    )
}

/// Sends the HTTP/2 preface; true when the first frame back is a SETTINGS frame on stream 0.
async fn answers_h2_preface(mut stream: TcpStream, timeout: Duration) -> bool {
    let exchange = async {
        stream.write_all(H2_PREFACE).await?;
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(head)) => head[3] == 0x4 && head[5..9] == [0, 0, 0, 0],
        _ => false,
    }
}
