//! Sending a request to one backend over a pooled connection.
//!
//! Each worker thread has its own slot in every backend: a short list of idle HTTP/1.1
//! connections and one shared HTTP/2 connection. The slot's mutex is only ever taken by its own
//! worker, so it is never contended. A connection goes back to the list when its response body
//! has been read to the end; one dropped early is closed.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::backend::{Backend, Protocol};

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
    h2: Mutex<Option<http2::SendRequest<UpBody>>>,
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

/// Sends `req` to `backend`, reusing an idle connection when one is ready.
pub async fn send(
    backend: &Arc<Backend>,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    match backend.protocol {
        Protocol::Http1 => send_h1(backend, req, t).await,
        Protocol::H2c => send_h2(backend, req, t).await,
    }
}

async fn send_h1(
    backend: &Arc<Backend>,
    mut req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    while let Some(mut conn) = backend.take_idle() {
        match tokio::time::timeout(t.response, conn.try_send_request(req)).await {
            Err(_) => return Err(SendError::Timeout),
            Ok(Ok(resp)) => {
                crate::metrics::upstream_connection(true);
                let conn = reusable(conn, backend)
                    .filter(|_| resp.status() != http::StatusCode::SWITCHING_PROTOCOLS);
                return Ok(PooledBody::wrap(resp, conn));
            }
            Ok(Err(mut err)) => match err.take_message() {
                // Never written: try the next idle connection, or a new one.
                Some(back) => req = back,
                None => return Err(classify(err.into_error(), true)),
            },
        }
    }
    let mut conn = match connect_h1(backend, t.connect).await {
        Ok(conn) => conn,
        Err((reason, timed_out)) => {
            return Err(SendError::Connect {
                reason,
                timed_out,
                request: Box::new(req),
            })
        }
    };
    match tokio::time::timeout(t.response, conn.send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(resp)) => {
            crate::metrics::upstream_connection(false);
            // An upgraded connection belongs to the upgrade now, never to the pool.
            let conn = reusable(conn, backend)
                .filter(|_| resp.status() != http::StatusCode::SWITCHING_PROTOCOLS);
            Ok(PooledBody::wrap(resp, conn))
        }
        Ok(Err(err)) => Err(classify(err, false)),
    }
}

async fn send_h2(
    backend: &Arc<Backend>,
    req: Request<UpBody>,
    t: Timeouts,
) -> Result<Response<PooledBody>, SendError> {
    let shared = lock(&backend.slot().h2)
        .as_ref()
        .filter(|c| !c.is_closed())
        .cloned();
    let (mut conn, reused) = match shared {
        Some(conn) => (conn, true),
        None => match connect_h2(backend, t.connect).await {
            Ok(conn) => {
                *lock(&backend.slot().h2) = Some(conn.clone());
                (conn, false)
            }
            Err((reason, timed_out)) => {
                return Err(SendError::Connect {
                    reason,
                    timed_out,
                    request: Box::new(req),
                })
            }
        },
    };
    match tokio::time::timeout(t.response, conn.send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(resp)) => {
            crate::metrics::upstream_connection(reused);
            Ok(PooledBody::wrap(resp, None))
        }
        Ok(Err(err)) => Err(classify(err, reused)),
    }
}

fn reusable(
    conn: http1::SendRequest<UpBody>,
    backend: &Arc<Backend>,
) -> Option<(http1::SendRequest<UpBody>, Arc<Backend>)> {
    Some((conn, backend.clone()))
}

fn classify(error: hyper::Error, reused: bool) -> SendError {
    if error.is_parse() || error.is_parse_status() || error.is_parse_too_large() {
        SendError::BadResponse(error)
    } else {
        SendError::Reset { error, reused }
    }
}

type ConnectFailure = (String, bool);

async fn connect_tcp(backend: &Backend, timeout: Duration) -> Result<TcpStream, ConnectFailure> {
    if backend.addrs.is_empty() {
        backend.connect_failed();
        return Err((
            format!("`{}` did not resolve to any address", backend.spec.host),
            false,
        ));
    }
    let mut last: ConnectFailure = (String::new(), false);
    for addr in backend.addrs.iter() {
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

async fn connect_h1(
    backend: &Backend,
    timeout: Duration,
) -> Result<http1::SendRequest<UpBody>, ConnectFailure> {
    let stream = connect_tcp(backend, timeout).await?;
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| (format!("HTTP/1.1 handshake: {e}"), false))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("upstream connection ended: {e}");
        }
    });
    Ok(sender)
}

async fn connect_h2(
    backend: &Backend,
    timeout: Duration,
) -> Result<http2::SendRequest<UpBody>, ConnectFailure> {
    let stream = connect_tcp(backend, timeout).await?;
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .adaptive_window(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| (format!("HTTP/2 handshake: {e}"), false))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream h2 connection ended: {e}");
        }
    });
    Ok(sender)
}

/// A backend's response body that hands its HTTP/1.1 connection back to the pool once read to the end.
pub struct PooledBody {
    inner: Incoming,
    conn: Option<(http1::SendRequest<UpBody>, Arc<Backend>)>,
}

impl PooledBody {
    fn wrap(
        resp: Response<Incoming>,
        conn: Option<(http1::SendRequest<UpBody>, Arc<Backend>)>,
    ) -> Response<PooledBody> {
        resp.map(|inner| {
            let mut body = PooledBody { inner, conn };
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
