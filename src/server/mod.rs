//! Client-facing serving: worker threads, each with its own listener and current-thread runtime,
//! serving HTTP/1.1 and HTTP/2 (h2c prior knowledge) through hyper-util's auto connection.
//!
//! Owns connection-level limits (header timeout, header size, max connections) and the drain on
//! shutdown; knows nothing about routes beyond handing each request to the [`Proxy`].

mod idle;
pub mod listener;
mod observe;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;

use crate::metrics::OPEN_CONNECTIONS;
use crate::proxy::{ClientConn, Proxy};
pub use listener::{bind_reuseport, TcpKeepalive};
use observe::DrainFlag;

/// How long a draining worker lets busy HTTP/1 connections finish their next request (answered
/// with `Connection: close`, so the client closes cleanly between requests) before it closes the
/// idle ones.
const DRAIN_LINGER: Duration = Duration::from_secs(2);

/// Connection-level settings shared by every worker.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub keepalive: Option<TcpKeepalive>,
    pub grace_period: Duration,
    /// A connection that carries no request for this long is asked to close.
    pub idle_timeout: Duration,
}

fn http_builder(settings: &ServeSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256)
        .adaptive_window(true)
        // RFC 8441: WebSocket from HTTP/2 clients (extended CONNECT).
        .enable_connect_protocol();
    builder
}

/// The HTTP server settings, two ways: sniffing the protocol from the first bytes, with
/// HTTP/1.1 upgrades (plain connections, and TLS unless ALPN chose h2), and HTTP/2 only for TLS
/// connections whose ALPN chose h2: a client that agreed on h2 and then sends something else
/// gets the connection closed (RFC 9113 §3.4), not an HTTP/1.1 answer. (hyper-util ignores
/// `http2_only` when serving with upgrades; HTTP/2 needs none, CONNECT is handled inside.)
struct Builders {
    sniffing: auto::Builder<TokioExecutor>,
    h2_only: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(sniffing: auto::Builder<TokioExecutor>) -> Builders {
        Builders {
            h2_only: sniffing.clone().http2_only(),
            sniffing,
        }
    }
}

/// A client connection being served, counted in [`OPEN_CONNECTIONS`] and in its worker's
/// `live` count from its creation (in the accept loop, so a burst of accepts sees every earlier
/// one) until it is dropped.
struct OpenConnection {
    peer: SocketAddr,
    live: Arc<AtomicUsize>,
}

impl OpenConnection {
    fn new(peer: SocketAddr, live: &Arc<AtomicUsize>) -> OpenConnection {
        OPEN_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        live.fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            peer,
            live: live.clone(),
        }
    }

    /// Drives the connection to its end.
    async fn run<E: std::fmt::Display>(
        self,
        conn: impl std::future::Future<Output = Result<(), E>>,
    ) {
        if let Err(e) = conn.await {
            tracing::debug!(peer = %self.peer, "connection ended with an error: {e}");
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::Relaxed);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The TLS side of the proxy listener.
#[derive(Clone)]
pub struct TlsSide {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Add HSTS to TLS responses that lack it (grade `high`).
    pub hsts: bool,
}

/// The listening sockets of the workers: one plain and (with TLS) one TLS listener each.
pub struct Listeners {
    pub http: Vec<std::net::TcpListener>,
    pub tls: Vec<std::net::TcpListener>,
    pub acceptor: Option<TlsSide>,
}

/// Starts one worker thread per plain listener; a worker also serves the TLS listener of its
/// index. Each returns when `shutdown` flips and its connections have drained (or the grace
/// period ran out).
pub fn spawn_workers(
    listeners: Listeners,
    proxy: Arc<Proxy>,
    settings: ServeSettings,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(listeners.http.len());
    let mut tls_listeners = listeners.tls.into_iter();
    for (index, listener) in listeners.http.into_iter().enumerate() {
        let proxy = proxy.clone();
        let settings = settings.clone();
        let shutdown = shutdown.clone();
        let tls = tls_listeners.next().zip(listeners.acceptor.clone());
        let handle = std::thread::Builder::new()
            .name(format!("aralez-worker-{index}"))
            .spawn(move || {
                crate::upstream::set_worker_index(index);
                crate::metrics::set_worker_index(index);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("worker {index}: cannot start its runtime: {e}");
                        return;
                    }
                };
                let plain = accept_loop(
                    listener,
                    None,
                    proxy.clone(),
                    settings.clone(),
                    shutdown.clone(),
                );
                match tls {
                    Some((tls_listener, side)) => runtime.block_on(async {
                        let secure =
                            accept_loop(tls_listener, Some(side), proxy, settings, shutdown);
                        tokio::join!(plain, secure);
                    }),
                    None => runtime.block_on(plain),
                }
            })?;
        handles.push(handle);
    }
    Ok(handles)
}

async fn accept_loop(
    listener: std::net::TcpListener,
    tls: Option<TlsSide>,
    proxy: Arc<Proxy>,
    settings: ServeSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot register listener: {e}");
            return;
        }
    };

    let builder = Arc::new(Builders::new(http_builder(&settings)));
    let (drain_tx, drain_rx) = watch::channel(false);
    let live = Arc::new(AtomicUsize::new(0));
    let draining: DrainFlag = Arc::new(AtomicBool::new(false));
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if OPEN_CONNECTIONS.load(Ordering::Relaxed) >= settings.max_connections {
            tracing::warn!(%peer, "connection refused: max_connections reached");
            continue;
        }
        let _ = stream.set_nodelay(true);
        if let Some(ka) = settings.keepalive {
            listener::apply_keepalive(&stream, ka);
        }
        let conn = Conn {
            peer,
            proxy: &proxy,
            builder: &builder,
            drain: &drain_rx,
            live: &live,
            idle: settings.idle_timeout,
            draining: &draining,
        };
        match &tls {
            None => conn.serve(stream, false, false),
            Some(side) => conn.handshake_then_serve(stream, side, settings.header_timeout),
        }
    }
    drop(listener);
    drain(&drain_tx, &live, &draining, settings.grace_period).await;
}

/// Stops keep-alive: HTTP/1 responses say `Connection: close` for [`DRAIN_LINGER`], then idle
/// connections are closed (HTTP/2 gets GOAWAY) and in-flight requests finish within `grace`.
async fn drain(
    drain: &watch::Sender<bool>,
    live: &AtomicUsize,
    draining: &AtomicBool,
    grace: Duration,
) {
    draining.store(true, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + grace;
    let linger_end = tokio::time::Instant::now() + DRAIN_LINGER.min(grace);
    let open = || live.load(Ordering::Relaxed) > 0;
    while open() && tokio::time::Instant::now() < linger_end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drain.send_replace(true);
    while open() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if open() {
        tracing::warn!("grace period over; closing the connections still open");
    }
}

type ClientRequest = http::Request<hyper::body::Incoming>;
type ClientResponse = http::Response<observe::LoggedBody>;
/// What a request's future gives: never an error, errors are responses.
type Answer = Result<ClientResponse, Infallible>;

/// The service of one client connection (every request through [`observe::handle`] with the
/// connection's context), and the activity its idle timer watches.
fn connection_service(
    proxy: Arc<Proxy>,
    peer: SocketAddr,
    tls: bool,
    draining: DrainFlag,
    hsts: bool,
) -> (
    impl Service<
            ClientRequest,
            Response = ClientResponse,
            Error = Infallible,
            Future = impl std::future::Future<Output = Answer> + Send,
        > + Clone
        + Send
        + 'static,
    Arc<idle::Activity>,
) {
    let activity = idle::Activity::new();
    let ctx = Arc::new(observe::ConnCtx {
        proxy,
        client: ClientConn::new(peer, tls),
        draining,
        hsts,
        activity: activity.clone(),
    });
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(observe::handle(&ctx, req).await) }
    });
    (service, activity)
}

/// What serving one accepted connection needs.
struct Conn<'a> {
    peer: SocketAddr,
    proxy: &'a Arc<Proxy>,
    builder: &'a Arc<Builders>,
    drain: &'a watch::Receiver<bool>,
    live: &'a Arc<AtomicUsize>,
    idle: Duration,
    draining: &'a DrainFlag,
}

impl Conn<'_> {
    /// Serves HTTP on `io` (plain TCP or an established TLS stream) until it closes.
    fn serve<IO>(self, io: IO, tls: bool, hsts: bool)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let peer = self.peer;
        let (service, activity) =
            connection_service(self.proxy.clone(), peer, tls, self.draining.clone(), hsts);
        let conn = self
            .builder
            .sniffing
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        let conn = idle::drive(conn.into_owned(), self.drain.clone(), activity, self.idle);
        tokio::spawn(OpenConnection::new(peer, self.live).run(conn));
    }

    /// Runs the TLS handshake (bounded by the header timeout) in its own task, then serves.
    fn handshake_then_serve(self, stream: tokio::net::TcpStream, side: &TlsSide, limit: Duration) {
        let (peer, proxy, builder, draining) = (
            self.peer,
            self.proxy.clone(),
            self.builder.clone(),
            self.draining.clone(),
        );
        let (drain, live, idle) = (self.drain.clone(), self.live.clone(), self.idle);
        let (acceptor, hsts) = (side.acceptor.clone(), side.hsts);
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let (service, activity) = connection_service(proxy, peer, true, draining, hsts);
            let counted = OpenConnection::new(peer, &live);
            let io = TokioIo::new(stream);
            if io.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
                let conn = builder.h2_only.serve_connection(io, service);
                counted
                    .run(idle::drive(conn.into_owned(), drain, activity, idle))
                    .await;
            } else {
                let conn = builder.sniffing.serve_connection_with_upgrades(io, service);
                counted
                    .run(idle::drive(conn.into_owned(), drain, activity, idle))
                    .await;
            }
        });
    }
}
