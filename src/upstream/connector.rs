//! The one way to reach an upstream: TCP (TCP_NODELAY, each resolved address in turn, under the
//! connect timeout), then TLS for TLS endpoints, then the HTTP/1.1 or HTTP/2 handshake. Pooled
//! forwarding ([`super::pool`]), protocol detection ([`super::detect`]), health probes and
//! forward auth all connect through here, and every failure is one typed [`ConnectError`].
//!
//! `Backend::connect` is [`open`] for a configured backend, whose connect outcomes feed its
//! passive health; [`exchange_once`] sends a single request on a fresh, never pooled connection
//! (health probes, forward auth), whose connection task is bounded by the caller's limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::uri::Scheme;
use http::{header, Request, Response, Uri};
use http_body::Body as _;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::h2_settings::{SettingsWatch, StreamLimit};
use crate::vocab::request_body::RequestBody;
use crate::vocab::CountedSlot;

/// HTTP/2 flow-control windows the proxy offers its backends.
const UPSTREAM_STREAM_WINDOW: u32 = 1 << 20;
const UPSTREAM_CONNECTION_WINDOW: u32 = 16 << 20;

/// Body of a request sent upstream: the client's own body, or nothing (a retry, a probe).
pub type UpBody = Either<RequestBody, Empty<Bytes>>;

/// What an upstream's connections are: plain HTTP/1.1, h2c (prior knowledge), or TLS (where
/// ALPN picks h2 or HTTP/1.1). Pinned by a scheme prefix, else detected (`detect.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Http1 = 1,
    H2c = 2,
    Tls = 3,
}

impl Wire {
    pub(super) fn from_u8(v: u8) -> Option<Wire> {
        match v {
            1 => Some(Wire::Http1),
            2 => Some(Wire::H2c),
            3 => Some(Wire::Tls),
            _ => None,
        }
    }

    /// As shown by `/status`.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Http1 => "http1",
            Wire::H2c => "h2c",
            Wire::Tls => "tls",
        }
    }
}

/// What step of reaching an upstream failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectErrorKind {
    /// The name resolved to no address.
    Resolve,
    /// No TCP connection.
    Tcp,
    /// The TLS handshake failed.
    Tls,
    /// The HTTP/1.1 or HTTP/2 handshake failed.
    Handshake,
    /// The request was sent (at least in part) and the exchange broke.
    Exchange,
    /// The answer was not HTTP.
    BadResponse,
    /// A body was larger than the caller accepts.
    BodyTooLarge,
    /// The backend already has as many connections as it may (`upstream_max_connections`).
    Capacity,
    /// The proxy itself could not open a socket: out of file descriptors, memory or local
    /// ports. Says nothing about the backend.
    Local,
}

impl ConnectErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ConnectErrorKind::Resolve => "resolve",
            ConnectErrorKind::Tcp => "connect",
            ConnectErrorKind::Tls => "TLS handshake",
            ConnectErrorKind::Handshake => "HTTP handshake",
            ConnectErrorKind::Exchange => "exchange",
            ConnectErrorKind::BadResponse => "invalid response",
            ConnectErrorKind::BodyTooLarge => "body too large",
            ConnectErrorKind::Capacity => "connection limit",
            ConnectErrorKind::Local => "no socket",
        }
    }
}

/// Why an upstream could not be reached or asked.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}: {detail}", .kind.as_str())]
pub struct ConnectError {
    kind: ConnectErrorKind,
    timed_out: bool,
    /// A TLS handshake that ended on the backend's certificate (`upstream_tls_verify`).
    certificate_refused: bool,
    detail: String,
}

impl ConnectError {
    pub fn new(kind: ConnectErrorKind, detail: impl Into<String>) -> ConnectError {
        ConnectError {
            kind,
            timed_out: false,
            certificate_refused: false,
            detail: detail.into(),
        }
    }

    pub fn timeout(kind: ConnectErrorKind, limit: Duration) -> ConnectError {
        ConnectError {
            kind,
            timed_out: true,
            certificate_refused: false,
            detail: format!("timed out after {limit:?}"),
        }
    }

    /// The TLS handshake's failure `e`, noting whether it ended on the backend's certificate.
    fn tls(e: &std::io::Error) -> ConnectError {
        let refused = crate::vocab::error_text::tls_error_of(e);
        ConnectError {
            certificate_refused: matches!(refused, Some(rustls::Error::InvalidCertificate(_))),
            ..ConnectError::new(ConnectErrorKind::Tls, e.to_string())
        }
    }

    /// The backend speaks TLS, and its certificate was refused.
    pub fn is_certificate_refused(&self) -> bool {
        self.certificate_refused
    }

    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }

    pub fn is_timeout(&self) -> bool {
        self.timed_out
    }

    /// Nothing reached the upstream's HTTP layer, so the request may go elsewhere unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ConnectErrorKind::Resolve
                | ConnectErrorKind::Tcp
                | ConnectErrorKind::Tls
                | ConnectErrorKind::Handshake
                | ConnectErrorKind::Capacity
                | ConnectErrorKind::Local
        )
    }
}

/// Where to connect: addresses, the name for messages and TLS, and how the connection speaks.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    pub addrs: &'a [SocketAddr],
    /// The configured host (a name or an IP literal).
    pub host: &'a str,
    pub wire: Wire,
    /// Check the certificate chain and name (`upstream_tls_verify: true`).
    pub verify_tls: bool,
}

/// A freshly opened connection, by the protocol it speaks.
pub enum Fresh {
    H1(http1::SendRequest<UpBody>),
    /// With the number of streams the upstream allows on it.
    H2(http2::SendRequest<UpBody>, Arc<StreamLimit>),
}

/// A TCP connection to the first of `addrs` that answers within `timeout` each.
pub async fn tcp(
    addrs: &[SocketAddr],
    host: &str,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    if addrs.is_empty() {
        let detail = format!("`{host}` did not resolve to any address");
        return Err(ConnectError::new(ConnectErrorKind::Resolve, detail));
    }
    let mut last = ConnectError::new(ConnectErrorKind::Tcp, "no address tried");
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) if is_local_shortage(&e) => {
                let detail = format!("{addr}: {e} (the proxy's own shortage, not the backend's)");
                return Err(ConnectError::new(ConnectErrorKind::Local, detail));
            }
            Ok(Err(e)) => last = ConnectError::new(ConnectErrorKind::Tcp, format!("{addr}: {e}")),
            Err(_) => last = ConnectError::timeout(ConnectErrorKind::Tcp, timeout),
        }
    }
    Err(last)
}

/// Whether a failed connect is the proxy's own shortage: descriptors (EMFILE, ENFILE), memory
/// (ENOBUFS, ENOMEM) or local ports (EADDRNOTAVAIL). Counted against the backend, a burst of
/// clients that used up the descriptors took a healthy backend out of rotation, and every
/// client got 503 after the burst had gone.
fn is_local_shortage(error: &std::io::Error) -> bool {
    use nix::errno::Errno;
    let Some(code) = error.raw_os_error() else {
        return false;
    };
    [
        Errno::EMFILE,
        Errno::ENFILE,
        Errno::ENOBUFS,
        Errno::ENOMEM,
        Errno::EADDRNOTAVAIL,
    ]
    .iter()
    .any(|errno| *errno as i32 == code)
}

/// Opens a connection to `ep`: HTTP/1.1 or h2c on plain TCP; on TLS, whatever ALPN picks
/// (`offer_h2: false` asks for HTTP/1.1 only, for upgrades). `sni` is the name to present.
/// With `task_limit`, the connection's task ends after that long at the latest (one-shot use).
/// With `counted`, the connection holds that place in its backend's count until its task ends.
pub async fn open(
    ep: Endpoint<'_>,
    sni: &str,
    timeout: Duration,
    offer_h2: bool,
    task_limit: Option<Duration>,
    counted: Option<CountedSlot>,
) -> Result<Fresh, ConnectError> {
    let task = TaskBounds {
        limit: task_limit,
        counted,
    };
    let stream = tcp(ep.addrs, ep.host, timeout).await?;
    match ep.wire {
        Wire::Http1 => return h1_over(stream, task).await,
        Wire::H2c if offer_h2 => return h2_over(stream, timeout, task).await,
        Wire::H2c => return h1_over(stream, task).await,
        Wire::Tls => {}
    }
    let handshake = super::tls::handshake(stream, sni, offer_h2, ep.verify_tls);
    let (tls, h2) = match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(ConnectError::tls(&e)),
        Err(_) => return Err(ConnectError::timeout(ConnectErrorKind::Tls, timeout)),
    };
    if h2 {
        h2_over(tls, timeout, task).await
    } else {
        h1_over(tls, task).await
    }
}

/// What bounds a connection's task: how long it may live (one-shot use), and the place it holds
/// in its backend's count.
struct TaskBounds {
    limit: Option<Duration>,
    counted: Option<CountedSlot>,
}

fn spawn_bounded<F>(task: F, bounds: TaskBounds)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let counted = bounds.counted;
    // A map, not an `async move` block: that would hold `task` twice (captured and awaited).
    let task = task.map(move |()| drop(counted));
    match bounds.limit {
        Some(limit) => drop(tokio::spawn(tokio::time::timeout(limit, task))),
        None => drop(tokio::spawn(task)),
    }
}

/// The most an HTTP/1.1 upstream connection reads ahead of its client. hyper's default (about
/// 400 KiB) is what each slow-reading client could pin; nginx reads upstreams in 4-8 KiB
/// buffers. 64 KiB keeps a fast download's reads large.
const UPSTREAM_READ_BUFFER: usize = 64 * 1024;

async fn h1_over<IO>(io: IO, bounds: TaskBounds) -> Result<Fresh, ConnectError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(UPSTREAM_READ_BUFFER)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| ConnectError::new(ConnectErrorKind::Handshake, e.to_string()))?;
    let task = conn.with_upgrades().map(|ended| {
        if let Err(e) = ended {
            tracing::debug!("upstream connection ended: {e}");
        }
    });
    spawn_bounded(task, bounds);
    Ok(Fresh::H1(sender))
}

/// The HTTP/2 handshake, then a wait (at most `timeout`) for the upstream's SETTINGS, so the
/// first burst of requests knows how many streams this connection takes.
async fn h2_over<IO>(io: IO, timeout: Duration, bounds: TaskBounds) -> Result<Fresh, ConnectError>
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
        .map_err(|e| ConnectError::new(ConnectErrorKind::Handshake, e.to_string()))?;
    let task = conn.map(|ended| {
        if let Err(e) = ended {
            tracing::debug!("upstream h2 connection ended: {e}");
        }
    });
    spawn_bounded(task, bounds);
    let _ = tokio::time::timeout(timeout, limit.learned()).await;
    Ok(Fresh::H2(sender, limit))
}

/// Whether a failed exchange means the answer was not HTTP, or the connection broke. Over
/// HTTP/2 an answer h2 itself refused (a field name in capitals, no `:status`, a
/// connection-specific field: h2's own reset of the stream or the connection) was not HTTP
/// either; it was said as a connection the backend closed.
pub fn exchange_error(error: &hyper::Error) -> ConnectErrorKind {
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<h2::Error>());
    let refused_by_h2 = h2.is_some_and(|e| {
        use h2::Reason;
        let broke_the_protocol = matches!(
            e.reason(),
            Some(Reason::PROTOCOL_ERROR | Reason::COMPRESSION_ERROR | Reason::FRAME_SIZE_ERROR)
        );
        e.is_library() && broke_the_protocol
    });
    if error.is_parse() || error.is_parse_status() || error.is_parse_too_large() || refused_by_h2 {
        ConnectErrorKind::BadResponse
    } else {
        ConnectErrorKind::Exchange
    }
}

/// Whether hyper's client failed because the request body did (the client's malformed or cut
/// body). Over HTTP/1.1 hyper says so: a user error with a cause, the body's error (the client
/// side's other user errors, a connection's task gone among them, carry none). Over HTTP/2 the
/// stream was reset by hyper on this side, which it does for a failed body (or a request nobody
/// waits for any more).
pub fn is_client_body_error(error: &hyper::Error) -> bool {
    if error.is_user() {
        return std::error::Error::source(error).is_some();
    }
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<h2::Error>());
    h2.is_some_and(|e| e.is_reset() && !e.is_remote() && !e.is_library())
}

/// Rewrites an HTTP/1.1-form request (origin-form target, `Host`) for HTTP/2: an absolute target
/// whose authority is the `Host` header (else `fallback`). A request in that form already (sent
/// again after a refusal) is left as it is.
pub fn to_h2_form<B>(
    mut req: Request<B>,
    tls: bool,
    fallback: &http::uri::Authority,
) -> Request<B> {
    if req.version() == http::Version::HTTP_2 && req.uri().authority().is_some() {
        return req;
    }
    let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
    let authority = req
        .headers_mut()
        .remove(header::HOST)
        .and_then(|h| h.to_str().ok().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| fallback.clone());
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(scheme);
    parts.authority = Some(authority);
    parts.path_and_query = req
        .uri()
        .path_and_query()
        .cloned()
        .or_else(|| Some(http::uri::PathAndQuery::from_static("/")));
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
    *req.version_mut() = http::Version::HTTP_2;
    req
}

/// The reverse of [`to_h2_form`], for a request an HTTP/2 backend refused that goes to the next
/// backend, of whichever protocol: the target's authority back in `Host`, an origin-form target.
pub fn to_h1_form<B>(mut req: Request<B>) -> Request<B> {
    if req.version() != http::Version::HTTP_2 {
        return req;
    }
    let host = req
        .uri()
        .authority()
        .map(|a| http::HeaderValue::from_str(a.as_str()));
    if let Some(Ok(host)) = host {
        req.headers_mut().insert(header::HOST, host);
    }
    let target = req.uri().path_and_query().cloned();
    *req.uri_mut() = target.map_or_else(|| Uri::from_static("/"), Uri::from);
    *req.version_mut() = http::Version::HTTP_11;
    req
}

/// Sends one request (HTTP/1.1 form, with `Host`) on a fresh connection that is never pooled;
/// over TLS, h2 is offered as requests do (an h2-only gRPC backend refuses an HTTP/1.1-only
/// offer). The whole exchange, and the connection's task, end within `limit`.
pub async fn exchange_once(
    ep: Endpoint<'_>,
    sni: &str,
    mut req: Request<UpBody>,
    limit: Duration,
) -> Result<Response<Incoming>, ConnectError> {
    let attempt = async {
        let offer_h2 = ep.wire != Wire::Http1;
        match open(ep, sni, limit, offer_h2, Some(limit), None).await? {
            Fresh::H1(mut sender) => {
                req.headers_mut()
                    .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
                sender.send_request(req).await
            }
            Fresh::H2(mut sender, _) => {
                let authority = authority_of(ep.host);
                let req = to_h2_form(req, ep.wire == Wire::Tls, &authority);
                sender.send_request(req).await
            }
        }
        .map_err(|e| ConnectError::new(exchange_error(&e), e.to_string()))
    };
    let deadline = tokio::time::Instant::now() + limit;
    match tokio::time::timeout_at(deadline, attempt).await {
        // The connection's task ends at the same deadline, and a request whose connection is
        // gone may be seen first: it failed for want of time all the same.
        Ok(Err(_)) if tokio::time::Instant::now() >= deadline => {
            Err(ConnectError::timeout(ConnectErrorKind::Exchange, limit))
        }
        Ok(outcome) => outcome,
        Err(_) => Err(ConnectError::timeout(ConnectErrorKind::Exchange, limit)),
    }
}

fn authority_of(host: &str) -> http::uri::Authority {
    host.parse()
        .unwrap_or_else(|_| http::uri::Authority::from_static("upstream"))
}

/// Reads a whole body of at most `max` bytes.
pub async fn read_body(mut body: Incoming, max: usize) -> Result<Bytes, ConnectError> {
    use http_body_util::BodyExt as _;
    let mut out = BytesMut::new();
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame =
            frame.map_err(|e| ConnectError::new(ConnectErrorKind::Exchange, e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                let detail = format!("over {max} bytes");
                return Err(ConnectError::new(ConnectErrorKind::BodyTooLarge, detail));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn a_request_in_http2_form_comes_back_as_it_went() {
        let fallback = http::uri::Authority::from_static("backend:80");
        for (target, host) in [("/a?b=1", "h.test:8080"), ("/", "h.test")] {
            let req = Request::builder()
                .uri(target)
                .header(header::HOST, host)
                .header("x-a", "1")
                .body(())
                .unwrap();
            let h2 = to_h2_form(req, false, &fallback);
            assert_eq!(h2.uri().to_string(), format!("http://{host}{target}"));
            let back = to_h1_form(h2);
            assert_eq!(back.version(), http::Version::HTTP_11);
            assert_eq!(back.uri().to_string(), target);
            assert_eq!(back.headers()[header::HOST], host);
            assert_eq!(back.headers()["x-a"], "1");
        }
    }

    /// A server that takes connections, reads, and never answers.
    async fn silent_server() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        addr
    }

    // Real time on two workers: the connection's task, bounded by the same limit, may end
    // before the exchange sees its deadline, and that race is what is tested.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exchange_without_an_answer_ends_as_a_timeout() {
        let addrs = [silent_server().await];
        let attempts = (0..32).map(|_| async {
            let ep = Endpoint {
                addrs: &addrs,
                host: "127.0.0.1",
                wire: Wire::Http1,
                verify_tls: false,
            };
            let req = Request::get("/").body(Either::Right(Empty::new())).unwrap();
            exchange_once(ep, "127.0.0.1", req, Duration::from_millis(300)).await
        });
        for outcome in futures_util::future::join_all(attempts).await {
            let error = outcome.expect_err("the server never answers");
            assert!(error.is_timeout(), "not a timeout: {error}");
        }
    }
}
