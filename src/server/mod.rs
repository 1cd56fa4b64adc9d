//! Client-facing serving: worker threads, each with its own listener and current-thread runtime,
//! serving HTTP/1.1 and HTTP/2 (h2c prior knowledge) through hyper-util's auto connection.
//!
//! Owns connection-level limits (header timeout, header size, max connections) and the drain on
//! shutdown; knows nothing about routes beyond handing each request to the [`Proxy`].

pub mod listener;
mod observe;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
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
        .adaptive_window(true);
    builder
}

/// Starts one worker thread per listener. Each returns when `shutdown` flips and its connections
/// have drained (or the grace period ran out).
pub fn spawn_workers(
    listeners: Vec<std::net::TcpListener>,
    proxy: Arc<Proxy>,
    settings: ServeSettings,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(listeners.len());
    for (index, listener) in listeners.into_iter().enumerate() {
        let proxy = proxy.clone();
        let settings = settings.clone();
        let shutdown = shutdown.clone();
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
                runtime.block_on(accept_loop(listener, proxy, settings, shutdown));
            })?;
        handles.push(handle);
    }
    Ok(handles)
}

async fn accept_loop(
    listener: std::net::TcpListener,
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
    let local = listener.local_addr().ok();
    let builder = Arc::new(http_builder(&settings));
    let graceful = GracefulShutdown::new();
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
        serve_connection(stream, peer, local, &proxy, &builder, &graceful, &draining);
    }
    drop(listener);
    drain(graceful, &draining, settings.grace_period).await;
}

/// Stops keep-alive: HTTP/1 responses say `Connection: close` for [`DRAIN_LINGER`], then idle
/// connections are closed (HTTP/2 gets GOAWAY) and in-flight requests finish within `grace`.
async fn drain(graceful: GracefulShutdown, draining: &AtomicBool, grace: Duration) {
    draining.store(true, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + grace;
    let linger_end = tokio::time::Instant::now() + DRAIN_LINGER.min(grace);
    while graceful.count() > 0 && tokio::time::Instant::now() < linger_end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing the connections still open");
    }
}

fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    _local: Option<SocketAddr>,
    proxy: &Arc<Proxy>,
    builder: &Arc<auto::Builder<TokioExecutor>>,
    graceful: &GracefulShutdown,
    draining: &DrainFlag,
) {
    let ctx = Arc::new(observe::ConnCtx {
        proxy: proxy.clone(),
        client: ClientConn::new(peer, false),
        draining: draining.clone(),
    });
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(observe::handle(&ctx, req).await) }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    let conn = graceful.watch(conn.into_owned());
    OPEN_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(%peer, "connection ended with an error: {e}");
        }
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::Relaxed);
    });
}
