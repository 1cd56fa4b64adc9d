//! Client-facing serving: worker threads, each with its own listener and current-thread runtime,
//! serving HTTP/1.1 and HTTP/2 (h2c prior knowledge, or ALPN over TLS) through the one accept
//! helper ([`accept`]) that every listener of the process uses.
//!
//! Owns connection-level limits (header timeout, header size, max connections, idle timeout),
//! the PROXY protocol, who a request is from ([`real_client`]) and the drain on shutdown; knows
//! nothing about routes beyond handing each request to the [`Router`] with the connection's
//! facts.

pub mod accept;
mod client_tcp;
mod ending;
mod h1;
mod h2_guard;
#[cfg(feature = "http3")]
pub mod h3;
#[cfg(not(feature = "http3"))]
#[path = "h3_absent.rs"]
pub mod h3;
mod idle;
mod limits;
pub mod listener;
mod observe;
mod park;
pub mod per_client;
mod plain_on_tls;
pub mod proxy_protocol;
pub mod real_client;
mod settle;
mod tracked;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use tokio::sync::watch;

use crate::accesslog::AccessLog;
use crate::allocator;
use crate::metrics::Metrics;
use crate::routing::Router;
use crate::vocab::{ClientConn, TunnelLimits, WorkerId};
pub use accept::{AcceptLoop, ConnInfo};
pub use limits::Limits;
pub use listener::{
    bind_listeners, bind_reuseport, pass_on_connection_options, ListenOptions, TcpKeepalive,
};

/// Streams one client HTTP/2 connection may open at once on the proxy listeners (RFC 9113's
/// recommended minimum; more only multiplies what one connection can hold open upstream).
pub const MAX_CLIENT_STREAMS: u32 = 100;

/// The listening sockets of the workers: one plain and (with TLS) one TLS listener each.
pub struct Listeners {
    pub http: Vec<std::net::TcpListener>,
    pub tls: Vec<std::net::TcpListener>,
    pub acceptor: Option<TlsSide>,
}

/// The TLS side of the proxy listener.
#[derive(Clone)]
pub struct TlsSide {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Add HSTS to TLS responses that lack it (grade `high`).
    pub hsts: bool,
    /// The certificates (HTTP/3 serves the same ones).
    pub resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    /// `Alt-Svc` on the TLS listener's responses (`h3=":PORT"; ma=86400` with HTTP/3 on).
    pub alt_svc: Option<AltSvc>,
}

/// The `Alt-Svc` that offers HTTP/3, and whether it is offered yet: only once HTTP/3 reads its
/// socket (after a live upgrade, once the previous instance has exited), so that clients are
/// not sent to a port nobody answers.
#[derive(Clone, Debug)]
pub struct AltSvc {
    pub value: http::HeaderValue,
    pub offered: Arc<std::sync::atomic::AtomicBool>,
}

/// What HTTP/3 (`server::h3`) needs from start-up: its UDP socket and the TLS listener's
/// certificates. Here, not in `h3`, so a binary without the `http3` feature has it too.
pub struct H3Side {
    pub socket: std::net::UdpSocket,
    pub resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    /// Add HSTS to responses that lack it (grade `high`), as on the TLS listener.
    pub hsts: bool,
    /// After a live upgrade: the previous instance, which reads the socket until it exits.
    pub previous_owner: Option<i32>,
    /// Set once HTTP/3 serves: the TLS listener's `Alt-Svc` offers it from then on.
    pub offered: Arc<std::sync::atomic::AtomicBool>,
}

/// What every worker's connections share: the router, and where requests are counted and
/// logged.
#[derive(Clone)]
pub struct Serving {
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
    /// `trusted_proxies`.
    pub trusted: Arc<real_client::TrustedProxies>,
    /// The proxy listeners read a PROXY protocol header first.
    pub proxy_protocol: bool,
}

/// A worker thread that could not be spawned, and the ones spawned before it: the caller stops
/// and joins those before it reports the error (a process must not exit under a thread that is
/// still starting up).
pub struct WorkersFailed {
    pub source: std::io::Error,
    pub started: Vec<std::thread::JoinHandle<()>>,
}

/// Starts one worker thread per plain listener; a worker also serves the TLS listener of its
/// index. Each returns when `shutdown` turns true and its connections have drained (or the
/// grace period ran out).
pub fn spawn_workers(
    listeners: Listeners,
    serving: Serving,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, WorkersFailed> {
    let mut handles = Vec::with_capacity(listeners.http.len());
    let mut tls_listeners = listeners.tls.into_iter();
    for (index, listener) in listeners.http.into_iter().enumerate() {
        let worker = WorkerId(index);
        let (serving, limits, shutdown) = (serving.clone(), limits.clone(), shutdown.clone());
        let tls = tls_listeners.next().zip(listeners.acceptor.clone());
        // Built here, so that a worker that cannot have one (no file descriptor left for its
        // epoll) stops the start: built in the thread, the failure was only logged, and the
        // worker's listener, bound and never served, held the connections the kernel gave it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("worker {index}: cannot start its runtime: {e}"),
                )
            });
        let handle = runtime.and_then(|runtime| {
            std::thread::Builder::new()
                .name(format!("aralez-worker-{index}"))
                .spawn(move || {
                    runtime.block_on(serve_worker(
                        worker, listener, tls, serving, limits, shutdown,
                    ));
                })
        });
        match handle {
            Ok(handle) => handles.push(handle),
            Err(source) => {
                return Err(WorkersFailed {
                    source,
                    started: handles,
                })
            }
        }
    }
    Ok(handles)
}

/// How far ahead the worker's timer wheel always has a deadline ([`timer_floor`]).
const TIMER_FLOOR: std::time::Duration = std::time::Duration::from_millis(50);

/// Keeps a deadline at most [`TIMER_FLOOR`] ahead in this worker's timer wheel, for the
/// worker's life. tokio wakes its driver through an eventfd (a write, and one more return from
/// `epoll_wait`) whenever a timer is set earlier than every deadline the driver last parked
/// with. On a worker with few connections (each new one arms its own deadlines, each request
/// its response timeout) that was two system calls a request; with this floor, only timers
/// under 50 ms away can do it. It costs 20 wake-ups a second on an idle worker.
///
/// Every [`HOUSEKEEPING_TICKS`] of them it also lets the allocator give back what this worker
/// freed ([`allocator::give_back_freed_memory`]), which it would not do on a quiet worker.
async fn timer_floor() {
    let mut ticks = 0u32;
    loop {
        tokio::time::sleep(TIMER_FLOOR).await;
        ticks += 1;
        if ticks == HOUSEKEEPING_TICKS {
            ticks = 0;
            allocator::give_back_freed_memory();
        }
    }
}

/// The allocator's housekeeping on each worker: every 2 s ([`timer_floor`]'s ticks).
const HOUSEKEEPING_TICKS: u32 = 40;

/// One worker's listeners (plain, and TLS when configured), served until the drain ends.
pub async fn serve_worker(
    worker: WorkerId,
    plain: std::net::TcpListener,
    tls: Option<(std::net::TcpListener, TlsSide)>,
    serving: Serving,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    let open = serving.metrics.open_connections.clone();
    let parked = serving.metrics.parked_connections.clone();
    // Upgraded connections still count, and still close when idle.
    let tunnels = Arc::new(TunnelLimits {
        open: open.clone(),
        live: Arc::default(),
        idle: limits.idle_timeout,
    });
    let tunnels_closed =
        tunnels_closed(tunnels.live.clone(), limits.grace_period, shutdown.clone());
    let request_ids = Arc::new(real_client::RequestIds::new());
    let floor = tokio::spawn(timer_floor());
    // The service of one proxy connection: every request through [`observe::answer`].
    let proxy_service = |hsts: bool, alt_svc: Option<AltSvc>| {
        let (serving, tunnels) = (serving.clone(), tunnels.clone());
        let request_ids = request_ids.clone();
        move |info: ConnInfo| {
            let mut client = ClientConn::with_tunnels(info.peer, info.tls, worker, tunnels.clone());
            client.trusted = serving.trusted.trusts(info.peer.ip());
            client.tls_facts = info.tls_facts;
            let ctx = Arc::new(observe::ConnCtx {
                router: serving.router.clone(),
                metrics: serving.metrics.clone(),
                access_log: serving.access_log.clone(),
                client,
                hsts,
                alt_svc: alt_svc.clone(),
                trusted: serving.trusted.clone(),
                request_ids: request_ids.clone(),
            });
            // Boxed: hyper moves the answer a few times (into its dispatcher, or into the task
            // of an HTTP/2 stream); a pointer is cheaper to move than the whole state machine.
            service_fn(move |req| Box::pin(observe::answer(ctx.clone(), req)))
        }
    };
    let refusals = observe::Refusals {
        metrics: serving.metrics.clone(),
        access_log: serving.access_log.clone(),
        worker,
    };
    let plain_loop = AcceptLoop {
        name: "proxy",
        listener: plain,
        tls: None,
        limits: limits.clone(),
        open: open.clone(),
        parked: parked.clone(),
        proxy_protocol: serving.proxy_protocol,
        per_client: None,
        refusals: Some(refusals.clone()),
    };
    let plain = plain_loop.run(proxy_service(false, None), shutdown.clone());
    match tls {
        Some((listener, side)) => {
            let tls_loop = AcceptLoop {
                name: "proxy",
                listener,
                tls: Some(side.acceptor),
                limits,
                open,
                parked,
                proxy_protocol: serving.proxy_protocol,
                per_client: None,
                refusals: Some(refusals),
            };
            let secure = tls_loop.run(proxy_service(side.hsts, side.alt_svc), shutdown);
            tokio::join!(plain, secure, tunnels_closed);
        }
        None => {
            tokio::join!(plain, tunnels_closed);
        }
    }
    floor.abort();
}

/// Once the worker is told to stop, waits for its tunnels (WebSocket and other upgraded
/// connections) to close, for at most the grace period, as its listeners wait for requests in
/// flight: nginx's old workers keep upgraded connections until `worker_shutdown_timeout`.
async fn tunnels_closed(
    live: Arc<AtomicUsize>,
    grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = shutdown.wait_for(|stop| *stop).await;
    let deadline = tokio::time::Instant::now() + grace;
    let open = || live.load(Ordering::Relaxed);
    while open() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if open() > 0 {
        tracing::warn!(
            "grace period over; closing {} upgraded connections still open",
            open()
        );
    }
}
