//! Sending a request to one backend over a pooled connection.
//!
//! Each worker thread has its own slot in every backend: a short list of idle HTTP/1.1
//! connections and its shared HTTP/2 connections. The slot's mutexes are only ever taken by its
//! own worker, so they are never contended. An HTTP/1.1 connection goes back to the list when
//! its response body has been read to the end; one dropped early is closed. An HTTP/2
//! connection carries as many requests at once as the backend's SETTINGS allow (see
//! `h2_settings`); past that the worker opens another. A burst that finds no HTTP/2
//! connection opens one, not one per request.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};

use super::backend::{Backend, Wire};
use super::connect::{self, Fresh};
use super::detect;
use super::h2_settings::StreamLimit;
use http::header;
use http::uri::Scheme;
use http::Uri;

/// Body of a request sent upstream: the client's own body, or nothing (on a retry).
pub type UpBody = Either<Incoming, Empty<Bytes>>;

thread_local! {
    static WORKER_INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Tells the pool which worker this thread is; call once at the start of each worker thread.
pub fn set_worker_index(index: usize) {
    WORKER_INDEX.with(|w| w.set(index));
}

/// One worker's connections to one backend.
#[derive(Default)]
pub struct WorkerSlot {
    idle: Mutex<Vec<http1::SendRequest<UpBody>>>,
    h2: Mutex<Vec<H2Conn>>,
    /// Held while opening a connection that may be HTTP/2, so a burst waits for it.
    opening_h2: tokio::sync::Mutex<()>,
    /// The last TLS handshake with this backend chose HTTP/1.1: open TLS connections without
    /// waiting for each other.
    tls_chose_h1: std::sync::atomic::AtomicBool,
}

struct H2Conn {
    sender: http2::SendRequest<UpBody>,
    open_streams: Arc<AtomicUsize>,
    limit: Arc<StreamLimit>,
}

/// A request's place on a shared HTTP/2 connection, given back when dropped.
pub struct StreamTicket(Arc<AtomicUsize>);

impl Drop for StreamTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Backend {
    fn slot(&self) -> &WorkerSlot {
        let index = WORKER_INDEX.with(Cell::get) % self.slots.len();
        &self.slots[index]
    }

    fn take_idle(&self) -> Option<http1::SendRequest<UpBody>> {
        let mut idle = lock(&self.slot().idle);
        while let Some(conn) = idle.pop() {
            if conn.is_ready() {
                return Some(conn);
            }
            // Closed, or not yet ready after its last response: neither is worth keeping.
        }
        None
    }

    /// A place on one of this worker's HTTP/2 connections that has room.
    fn h2_stream(&self) -> Option<(http2::SendRequest<UpBody>, StreamTicket)> {
        let mut conns = lock(&self.slot().h2);
        conns.retain(|c| !c.sender.is_closed());
        let conn = conns
            .iter()
            .find(|c| c.open_streams.load(Ordering::Relaxed) < c.limit.get())?;
        conn.open_streams.fetch_add(1, Ordering::Relaxed);
        Some((conn.sender.clone(), StreamTicket(conn.open_streams.clone())))
    }

    /// Shares a new HTTP/2 connection with this worker's later requests; the ticket is the
    /// first request's place on it.
    fn add_h2(&self, sender: http2::SendRequest<UpBody>, limit: Arc<StreamLimit>) -> StreamTicket {
        let open_streams = Arc::new(AtomicUsize::new(1));
        lock(&self.slot().h2).push(H2Conn {
            sender,
            open_streams: open_streams.clone(),
            limit,
        });
        StreamTicket(open_streams)
    }

    fn put_idle(&self, conn: http1::SendRequest<UpBody>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = lock(&self.slot().idle);
        if idle.len() < self.idle_per_worker {
            idle.push(conn);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Limits for one exchange with a backend.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// Why a request to a backend got no response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made; nothing was sent, so the request comes back.
    Connect {
        reason: String,
        timed_out: bool,
        /// Boxed: this path is rare and the error stays small on the common one.
        request: Box<Request<UpBody>>,
    },
    /// The connection broke after the request started; `reused` if it came from the pool.
    Reset { error: hyper::Error, reused: bool },
    /// The backend answered with something that is not HTTP.
    BadResponse(hyper::Error),
    /// No response head within the response timeout.
    Timeout,
}

/// Sends `req` (HTTP/1.1 form) to `backend`, reusing a pooled connection when one has room.
/// A backend whose protocol is not known yet is detected first.
pub async fn send(
    backend: &Arc<Backend>,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    let wire = match backend.wire() {
        Some(wire) => wire,
        // Boxed: rare, and the detection future is large.
        None => match Box::pin(detect::wire_of(backend, t.connect)).await {
            Ok(wire) => wire,
            Err((reason, timed_out)) => return Err(connect_error(reason, timed_out, req)),
        },
    };
    let sent = send_over(backend, wire, req, t).await;
    if let Err(SendError::BadResponse(_) | SendError::Reset { reused: false, .. }) = &sent {
        // A new connection failed: the backend may speak something else now.
        backend.forget_detection();
    }
    sent
}

async fn send_over(
    backend: &Arc<Backend>,
    wire: Wire,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    // Upgrades (WebSocket) only exist in HTTP/1.1.
    if wire == Wire::Http1 || req.headers().contains_key(header::UPGRADE) {
        return send_h1(backend, wire, req, t).await;
    }
    if let Some(stream) = backend.h2_stream() {
        return send_on_h2(stream, to_h2_form(req, backend, wire), t, true).await;
    }
    if wire == Wire::Tls && backend.slot().tls_chose_h1.load(Ordering::Relaxed) {
        return send_h1(backend, wire, req, t).await;
    }
    let opening = backend.slot().opening_h2.lock().await;
    if let Some(stream) = backend.h2_stream() {
        drop(opening);
        return send_on_h2(stream, to_h2_form(req, backend, wire), t, true).await;
    }
    let sni = sni_host(&req, backend);
    match connect::open(backend, wire, &sni, t.connect, true).await {
        Ok(fresh) => send_on_fresh(backend, wire, fresh, true, Some(opening), req, t).await,
        Err((reason, timed_out)) => Err(connect_error(reason, timed_out, req)),
    }
}

/// Sends on a connection just opened. A new HTTP/2 connection is shared with this worker's
/// later requests, and `opening` (held while it was opened) is released as soon as it is. When
/// h2 was offered to a TLS backend, its choice is remembered for the next connection.
async fn send_on_fresh(
    backend: &Arc<Backend>,
    wire: Wire,
    fresh: Fresh,
    h2_offered: bool,
    opening: Option<tokio::sync::MutexGuard<'_, ()>>,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    if wire == Wire::Tls && h2_offered {
        let chose_h1 = matches!(fresh, Fresh::H1(_));
        backend
            .slot()
            .tls_chose_h1
            .store(chose_h1, Ordering::Relaxed);
    }
    match fresh {
        Fresh::H1(conn) => {
            drop(opening);
            send_on_new_h1(backend, conn, req, t).await
        }
        Fresh::H2(conn, limit) => {
            let ticket = backend.add_h2(conn.clone(), limit);
            drop(opening);
            send_on_h2((conn, ticket), to_h2_form(req, backend, wire), t, false).await
        }
    }
}

fn connect_error(reason: String, timed_out: bool, req: Request<UpBody>) -> SendError {
    SendError::Connect {
        reason,
        timed_out,
        request: Box::new(req),
    }
}

async fn send_h1(
    backend: &Arc<Backend>,
    wire: Wire,
    mut req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    while let Some(mut conn) = backend.take_idle() {
        match tokio::time::timeout(t.response, conn.try_send_request(req)).await {
            Err(_) => return Err(SendError::Timeout),
            Ok(Ok(resp)) => {
                crate::metrics::upstream_connection(true);
                return Ok(wrap_h1(resp, conn, backend));
            }
            Ok(Err(mut err)) => match err.take_message() {
                // Never written: try the next idle connection, or a new one.
                Some(back) => req = back,
                None => return Err(classify(err.into_error(), true)),
            },
        }
    }
    let sni = sni_host(&req, backend);
    let offer_h2 = !req.headers().contains_key(header::UPGRADE);
    match connect::open(backend, wire, &sni, t.connect, offer_h2).await {
        Ok(fresh) => send_on_fresh(backend, wire, fresh, offer_h2, None, req, t).await,
        Err((reason, timed_out)) => Err(connect_error(reason, timed_out, req)),
    }
}

async fn send_on_new_h1(
    backend: &Arc<Backend>,
    mut conn: http1::SendRequest<UpBody>,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    match tokio::time::timeout(t.response, conn.send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(resp)) => {
            crate::metrics::upstream_connection(false);
            Ok(wrap_h1(resp, conn, backend))
        }
        Ok(Err(err)) => Err(classify(err, false)),
    }
}

/// The response, with its connection to go back to the pool when the body ends; an upgraded
/// connection belongs to the upgrade now, never to the pool.
fn wrap_h1(
    resp: Response<Incoming>,
    conn: http1::SendRequest<UpBody>,
    backend: &Arc<Backend>,
) -> Response<PooledBody> {
    let conn =
        (resp.status() != http::StatusCode::SWITCHING_PROTOCOLS).then(|| (conn, backend.clone()));
    PooledBody::wrap(resp, conn, None)
}

async fn send_on_h2(
    (mut conn, ticket): (http2::SendRequest<UpBody>, StreamTicket),
    req: Request<UpBody>,
    t: Timeouts,
    reused: bool,
) -> Result<Response<PooledBody>, SendError> {
    match tokio::time::timeout(t.response, conn.send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(resp)) => {
            crate::metrics::upstream_connection(reused);
            Ok(PooledBody::wrap(resp, None, Some(ticket)))
        }
        Ok(Err(err)) => Err(classify(err, reused)),
    }
}

/// Rewrites an HTTP/1.1-form request (origin-form target, `Host`) for HTTP/2 (absolute target).
fn to_h2_form(mut req: Request<UpBody>, backend: &Backend, wire: Wire) -> Request<UpBody> {
    let scheme = if wire == Wire::Tls {
        Scheme::HTTPS
    } else {
        Scheme::HTTP
    };
    let authority = req
        .headers_mut()
        .remove(header::HOST)
        .and_then(|h| h.to_str().ok().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| backend.authority.clone());
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

/// The TLS server name: the request's host when it is a name, else the backend's host.
fn sni_host(req: &Request<UpBody>, backend: &Backend) -> String {
    let from_request = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| {
            crate::routing::normalise::strip_port(h)
                .trim_end_matches('.')
                .to_string()
        });
    from_request
        .filter(|h| !h.is_empty() && !h.starts_with('[') && h.parse::<std::net::IpAddr>().is_err())
        .unwrap_or_else(|| backend.spec.host.clone())
}

fn classify(error: hyper::Error, reused: bool) -> SendError {
    if error.is_parse() || error.is_parse_status() || error.is_parse_too_large() {
        SendError::BadResponse(error)
    } else {
        SendError::Reset { error, reused }
    }
}

/// A backend's response body that hands its HTTP/1.1 connection back to the pool once read to the end.
pub struct PooledBody {
    inner: Incoming,
    conn: Option<(http1::SendRequest<UpBody>, Arc<Backend>)>,
    /// The stream's place on a shared HTTP/2 connection, freed with the body.
    _stream: Option<StreamTicket>,
}

impl PooledBody {
    fn wrap(
        resp: Response<Incoming>,
        conn: Option<(http1::SendRequest<UpBody>, Arc<Backend>)>,
        stream: Option<StreamTicket>,
    ) -> Response<PooledBody> {
        resp.map(|inner| {
            let mut body = PooledBody {
                inner,
                conn,
                _stream: stream,
            };
            body.release_if_done();
            body
        })
    }

    fn release_if_done(&mut self) {
        if self.inner.is_end_stream() {
            if let Some((conn, backend)) = self.conn.take() {
                backend.put_idle(conn);
            }
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        self.release_if_done();
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release_if_done(),
            Poll::Ready(Some(Ok(_))) => self.release_if_done(),
            Poll::Ready(Some(Err(_))) => self.conn = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
