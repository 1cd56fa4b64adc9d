//! Protocol upgrades (WebSocket and any other `Upgrade:` protocol) with no config: the request
//! keeps its `Upgrade` and `Connection: upgrade` headers, and when the backend answers
//! `101 Switching Protocols` both upgraded connections are joined and bytes flow both ways until
//! either side closes (a half-close is passed on, the other direction keeps going).
//!
//! HTTP/2 clients ask with an extended CONNECT (RFC 8441: `:method CONNECT`, `:protocol
//! websocket`). Backends are always asked with an HTTP/1.1 upgrade: the CONNECT becomes a `GET`
//! with `Upgrade: <protocol>` (and a fresh `Sec-WebSocket-Key` for WebSocket, which RFC 8441
//! requests do not carry), and the backend's `101` becomes the `200` that opens the client's
//! stream. The WebSocket frames are the same on both sides, so only bytes are copied.
//!
//! Upgraded connections leave hyper's HTTP handling, so HTTP timeouts no longer apply to them;
//! instead a tunnel counts among the listener's open connections (`max_connections`) until it
//! ends, and is closed when no byte has crossed it, either way, for `client_idle_timeout` (as
//! nginx's `proxy_read_timeout` closes an idle WebSocket). What it carried each way is reported
//! when it ends ([`TunnelEnd`]), for its access log line.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{Either, Full};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::RespBody;
use crate::upstream::{keep_served_by, PooledBody};
use crate::vocab::{StreamHeld, TunnelLimits};

/// A client's request to switch protocols.
pub struct ClientUpgrade {
    pub ask: UpgradeAsk,
    on_client: OnUpgrade,
    /// An HTTP/2 stream's place on its connection, kept while the tunnel lives.
    held: Option<StreamHeld>,
}

/// What the backend is asked to switch to, and how the client asked.
pub struct UpgradeAsk {
    /// The `Upgrade` header (HTTP/1.1) or `:protocol` (RFC 8441) the client sent.
    pub protocol: HeaderValue,
    /// An HTTP/2 extended CONNECT: the client gets `200`, not `101`.
    pub over_h2: bool,
    /// The `Sec-WebSocket-Key` the proxy made for the backend (an extended CONNECT bridged to
    /// an HTTP/1.1 upgrade): the backend's `Sec-WebSocket-Accept` is checked against it, as the
    /// client, who never sees the key, cannot (RFC 6455 §4.1).
    pub key_sent: std::sync::OnceLock<HeaderValue>,
}

impl UpgradeAsk {
    /// Whether a backend's `101` answers the key the proxy sent, if it sent one.
    pub fn accepted_by(&self, answer: &http::HeaderMap) -> bool {
        let Some(key) = self.key_sent.get() else {
            return true;
        };
        let sent = answer.get(header::SEC_WEBSOCKET_ACCEPT);
        sent.is_some_and(|accept| accept.as_bytes() == websocket_accept(key.as_bytes()).as_bytes())
    }
}

/// RFC 6455 §4.2.2: base64 of the SHA-1 of the key and the protocol's GUID.
fn websocket_accept(key: &[u8]) -> String {
    use aws_lc_rs::digest;
    use base64::Engine as _;
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(ctx.finish())
}

/// An HTTP/2 extended CONNECT (RFC 8441): `CONNECT` with a `:protocol`.
pub fn is_extended_connect<B>(req: &Request<B>) -> bool {
    // `:protocol h2c` is no tunnel this proxy opens (an HTTP/1 `Upgrade: h2c` is refused too):
    // it is a plain CONNECT then, refused (405) before routing.
    let protocol = req.extensions().get::<hyper::ext::Protocol>();
    req.method() == Method::CONNECT && protocol.is_some_and(|p| !names_h2c(p.as_str().as_bytes()))
}

/// Takes the upgrade out of a request that asks for one (HTTP/1.1 `Connection: upgrade` and an
/// `Upgrade` header, or an HTTP/2 extended CONNECT), before hop-by-hop headers are removed.
pub fn take<B>(req: &mut Request<B>) -> Option<ClientUpgrade> {
    if is_extended_connect(req) {
        return take_extended_connect(req);
    }
    if req.version() != Version::HTTP_11 {
        return None;
    }
    // `Upgrade` first: nearly every request has none, and then `Connection` is not looked up.
    let protocol = req.headers().get(header::UPGRADE)?.clone();
    let wants = req.headers().get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    });
    if !wants || names_h2c(protocol.as_bytes()) {
        // `Upgrade: h2c` is refused (RFC 9113 §3.1 removed it; smuggling tools use it to reach a
        // backend's HTTP/2 side past the proxy's checks): the request goes on as plain HTTP/1.1
        // and its hop-by-hop headers, `HTTP2-Settings` included, are removed.
        return None;
    }
    let on_client = req.extensions_mut().remove::<OnUpgrade>()?;
    Some(ClientUpgrade {
        ask: UpgradeAsk {
            protocol,
            over_h2: false,
            key_sent: std::sync::OnceLock::new(),
        },
        on_client,
        held: None,
    })
}

/// Whether an `Upgrade` value (or a `:protocol`) lists `h2c`, read as bytes: a value with
/// obs-text (`h2c, \xff`) is no text, and was read as naming nothing.
fn names_h2c(protocol: &[u8]) -> bool {
    protocol
        .split(|&b| b == b',')
        .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"h2c"))
}

fn take_extended_connect<B>(req: &mut Request<B>) -> Option<ClientUpgrade> {
    let protocol = req.extensions().get::<hyper::ext::Protocol>()?.as_str();
    let protocol = HeaderValue::from_str(protocol).ok()?;
    let on_client = req.extensions_mut().remove::<OnUpgrade>()?;
    let held = req.extensions_mut().remove::<StreamHeld>();
    Some(ClientUpgrade {
        ask: UpgradeAsk {
            protocol,
            over_h2: true,
            key_sent: std::sync::OnceLock::new(),
        },
        on_client,
        held,
    })
}

/// Makes the request to the backend an HTTP/1.1 upgrade (after hop-by-hop removal): the
/// upgrade headers back, and an extended CONNECT turned into the `GET` it stands for.
pub fn prepare_backend_request(parts: &mut Parts, ask: &UpgradeAsk) {
    let headers = &mut parts.headers;
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, ask.protocol.clone());
    if !ask.over_h2 {
        return;
    }
    parts.method = Method::GET;
    parts.extensions.remove::<hyper::ext::Protocol>();
    let websocket = ask.protocol.as_bytes().eq_ignore_ascii_case(b"websocket");
    if websocket && !headers.contains_key(header::SEC_WEBSOCKET_KEY) {
        if let Some(key) = fresh_websocket_key() {
            headers.insert(header::SEC_WEBSOCKET_KEY, key.clone());
            let _ = ask.key_sent.set(key);
        }
    }
}

/// 16 random bytes in base64 (RFC 6455 §4.1); `None` only if the system RNG fails.
fn fresh_websocket_key() -> Option<HeaderValue> {
    use base64::Engine as _;
    let mut nonce = [0u8; 16];
    aws_lc_rs::rand::fill(&mut nonce).ok()?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(nonce);
    HeaderValue::from_str(&encoded).ok()
}

/// Answers the client with the backend's 101 (a 200 for an extended CONNECT) and joins the two
/// upgraded connections under `limits`.
pub fn bridge(
    resp: Response<PooledBody>,
    client: ClientUpgrade,
    limits: &Arc<TunnelLimits>,
) -> Response<RespBody> {
    let (mut parts, body) = resp.into_parts();
    keep_served_by(&mut parts, &body);
    let protocol = parts
        .headers
        .get(header::UPGRADE)
        .cloned()
        .unwrap_or_else(|| client.ask.protocol.clone());
    let on_server = parts.extensions.remove::<OnUpgrade>();
    crate::vocab::hop_by_hop::remove_hop_by_hop(&mut parts.headers);
    if client.ask.over_h2 {
        // RFC 8441 §5: the stream opens with a 2xx; the key exchange stayed on the backend leg.
        parts.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        parts.status = StatusCode::OK;
    } else {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, protocol);
        parts.status = StatusCode::SWITCHING_PROTOCOLS;
    }
    let limits = limits.clone();
    let end = TunnelEnd::default();
    parts.extensions.insert(end.clone());
    tokio::spawn(async move {
        let Some(on_server) = on_server else {
            tracing::warn!("backend switched protocols but its connection cannot be upgraded");
            return;
        };
        match tokio::try_join!(client.on_client, on_server) {
            Ok((client_io, server_io)) => {
                let _counted = limits.count_tunnel();
                let _held = client.held;
                let (c, s) = (TokioIo::new(client_io), TokioIo::new(server_io));
                let carried = tunnel(c, s, limits.idle).await;
                end.report(carried.to_client, carried.from_client);
            }
            Err(e) => tracing::debug!("upgrade did not complete: {e}"),
        }
    });
    Response::from_parts(parts, Either::Right(Full::new(Bytes::new())))
}

/// On an upgrade's answer: where its tunnel reports, when it ends, the bytes it carried to the
/// client and from it. The access log hands its record over ([`TunnelEnd::on_end`]); a tunnel
/// that never began drops it unreported, and the line is written all the same.
#[derive(Clone, Default)]
pub struct TunnelEnd(Arc<std::sync::Mutex<Option<OnEnd>>>);

type OnEnd = Box<dyn FnOnce(u64, u64) + Send>;

impl TunnelEnd {
    /// What to do with the bytes carried when the tunnel ends.
    pub fn on_end(&self, then: impl FnOnce(u64, u64) + Send + 'static) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(Box::new(then));
        }
    }

    fn report(&self, to_client: u64, from_client: u64) {
        let then = self.0.lock().ok().and_then(|mut slot| slot.take());
        if let Some(then) = then {
            then(to_client, from_client);
        }
    }
}

/// The bytes a tunnel carried each way.
struct Carried {
    to_client: u64,
    from_client: u64,
}

/// Copies both ways until either side closes (half-closes pass through) or nothing has moved for
/// `idle`; says how much it carried.
async fn tunnel<C, S>(client: C, server: S, idle: Duration) -> Carried
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut c = Watched::new(client, started, last.clone());
    let mut s = Watched::new(server, started, last.clone());
    copy_while_busy(&mut c, &mut s, idle, (started, &last)).await;
    Carried {
        to_client: s.read,
        from_client: c.read,
    }
}

/// The copy both ways, until it ends or both sides have been quiet for `idle` (the last byte's
/// time is `last`, in nanoseconds since `started`).
async fn copy_while_busy<C, S>(
    c: &mut Watched<C>,
    s: &mut Watched<S>,
    idle: Duration,
    (started, last): (Instant, &AtomicU64),
) where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let copy = tokio::io::copy_bidirectional(c, s);
    tokio::pin!(copy);
    let mut check = Box::pin(tokio::time::sleep(idle));
    loop {
        tokio::select! {
            done = &mut copy => {
                if let Err(e) = done {
                    tracing::debug!("upgraded connection ended: {e}");
                }
                return;
            }
            () = &mut check => {
                let since = started + Duration::from_nanos(last.load(Ordering::Relaxed));
                let quiet = Instant::now().saturating_duration_since(since);
                if quiet >= idle {
                    tracing::debug!("closing an upgraded connection idle for {quiet:?}");
                    return;
                }
                check.as_mut().reset(since + idle);
            }
        }
    }
}

/// An upgraded IO that notes when a byte last crossed it, and counts the bytes read from it.
struct Watched<IO> {
    io: IO,
    started: Instant,
    last: Arc<AtomicU64>,
    read: u64,
}

impl<IO> Watched<IO> {
    fn new(io: IO, started: Instant, last: Arc<AtomicU64>) -> Watched<IO> {
        Watched {
            io,
            started,
            last,
            read: 0,
        }
    }

    fn touch(&self) {
        let nanos = Instant::now()
            .saturating_duration_since(self.started)
            .as_nanos();
        self.last
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if matches!(polled, Poll::Ready(Ok(()))) && read > 0 {
            self.read += read as u64;
            self.touch();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `h2c` is refused however it is written: among others, with obs-text beside it (which
    /// made the value no text, read as naming nothing), and as an extended CONNECT's protocol.
    #[test]
    fn h2c_is_found_however_it_is_written() {
        for value in [
            &b"h2c"[..],
            b"H2C",
            b" h2c ",
            b"websocket, h2c",
            b"h2c, \xff",
        ] {
            assert!(names_h2c(value), "{value:?}");
        }
        for value in [&b"websocket"[..], b"h2", b"h2cx", b""] {
            assert!(!names_h2c(value), "{value:?}");
        }
        let connect = |protocol: &'static str| {
            let mut req = Request::builder().method(Method::CONNECT).body(()).unwrap();
            req.extensions_mut()
                .insert(hyper::ext::Protocol::from_static(protocol));
            req
        };
        assert!(is_extended_connect(&connect("websocket")));
        assert!(!is_extended_connect(&connect("h2c")));
    }

    #[test]
    fn the_accept_answers_the_key_as_rfc_6455_computes_it() {
        // RFC 6455 §1.3's own example.
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(
            websocket_accept(key.as_bytes()),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let ask = UpgradeAsk {
            protocol: HeaderValue::from_static("websocket"),
            over_h2: true,
            key_sent: std::sync::OnceLock::from(key),
        };
        let mut answer = http::HeaderMap::new();
        assert!(!ask.accepted_by(&answer), "no accept at all");
        answer.insert(
            header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_static("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        );
        assert!(ask.accepted_by(&answer));
        answer.insert(
            header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_static("AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        );
        assert!(!ask.accepted_by(&answer));
    }
}
