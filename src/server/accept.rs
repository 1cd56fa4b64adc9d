//! The one way to accept and serve connections, used by every listener (the proxy's plain and
//! TLS listeners, the admin API, the file server): a connection cap, the TLS handshake and the
//! request head under `client_header_timeout`, the idle timeout, header size limits, and the
//! drain on shutdown, the HTTP/2 control-frame flood guard ([`super::h2_guard`]), and on
//! listeners that ask for it the PROXY protocol header ([`super::proxy_protocol`]), read under
//! the header timeout before TLS and HTTP. What a listener serves is a hyper service made per
//! connection by its caller; this module wraps it so each request counts as activity (for the
//! idle timeout and the drain) until its response body is done, and so HTTP/1 responses say
//! `Connection: close` while draining.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body::Body;
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::client_tcp::{ClientListener, ClientTcp};
use super::h1;
use super::h2_guard::FloodGuard;
use super::idle::{self, Activity, Closed, Timers};
use super::limits::{Builders, Limits};
use super::listener::{apply_keepalive, pass_on_connection_options};
use super::observe::Refusals;
use super::park::{self, ClientSocket, Dock, Left, Parkable, Wake};
use super::per_client::{spawn_evictable, ClientSlot, PerClient};
use super::tracked::{HeadWriter, Tracked};
use crate::vocab::late_id::LateId;
use crate::vocab::said_every::SaidEvery;
use crate::vocab::{ClientBody, TlsFacts};

mod proxied;
mod tls;
use proxied::serve_proxied;
use tls::serve_tls;

/// How long a draining listener lets busy HTTP/1 connections finish their next request
/// (answered with `Connection: close`, so the client closes cleanly between requests) before it
/// closes the idle ones.
const DRAIN_LINGER: Duration = Duration::from_secs(2);

/// The client side of an accepted connection, for the per-connection service.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub tls: bool,
    /// The handshake's version and server name, on TLS connections.
    pub tls_facts: TlsFacts,
}

/// What a listener serves: a function making each connection's hyper service, whose answers
/// are never errors (errors are responses) and whose bodies may carry the request id for the
/// head ([`LateId`]).
pub trait MakeService: Send + Sync + 'static {
    type Service: Service<
            Request<ClientBody>,
            Response = Response<Self::Body>,
            Error = Infallible,
            Future: Send + Unpin + 'static,
        > + Clone
        + Send
        + Unpin
        + 'static;
    type Body: Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + LateId
        + Send
        + Unpin
        + 'static;

    fn make(&self, info: ConnInfo) -> Self::Service;
}

impl<F, S, B> MakeService for F
where
    F: Fn(ConnInfo) -> S + Send + Sync + 'static,
    S: Service<Request<ClientBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + Unpin + 'static,
    B: Body<Data = Bytes> + LateId + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Service = S;
    type Body = B;

    fn make(&self, info: ConnInfo) -> S {
        self(info)
    }
}

/// One listener's accept loop: where it listens, with TLS or not, under which limits, counting
/// open connections in `open` (shared by every loop of the same listener family, so the cap
/// holds across workers).
pub struct AcceptLoop {
    /// For logs: `proxy`, `admin API`, `file server`.
    pub name: &'static str,
    pub listener: std::net::TcpListener,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub limits: Limits,
    pub open: Arc<AtomicUsize>,
    /// Connections parked between HTTP/1 requests ([`super::park`]), counted like `open`.
    pub parked: Arc<AtomicUsize>,
    /// Every connection starts with a PROXY protocol header naming the client.
    pub proxy_protocol: bool,
    /// A cap on each client address's connections (the admin API's), if any.
    pub per_client: Option<Arc<PerClient>>,
    /// Where requests hyper refuses itself are counted and logged (the proxy's listeners).
    pub refusals: Option<Refusals>,
}

/// Warns of `what` failing with `error` if a line is due on `said` (once a second), with how
/// many went unsaid since the last.
fn warn_every(said: &SaidEvery, what: &str, error: &dyn std::fmt::Display) {
    if let Some(more) = said.due_note(tokio::time::Instant::now()) {
        tracing::warn!("{what}: {error}{more}");
    }
}

/// A line a second at most, with how many went unsaid before it.
fn once_a_second() -> SaidEvery {
    SaidEvery::new(Duration::from_secs(1))
}

/// A connection being served, counted in the family's `open` count and in its loop's `live`
/// count from its creation (in the accept loop, so a burst of accepts sees every earlier one)
/// until it is dropped.
struct OpenConnection {
    peer: SocketAddr,
    open: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
    /// Its place among its address's connections, where the listener caps them.
    client: Option<ClientSlot>,
}

impl OpenConnection {
    fn new(
        peer: SocketAddr,
        (open, live): (&Arc<AtomicUsize>, &Arc<AtomicUsize>),
        client: Option<ClientSlot>,
    ) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        live.fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            peer,
            open: open.clone(),
            live: live.clone(),
            client,
        }
    }

    /// The connection serves HTTP now, its requests counted in `activity` (one serving a
    /// request is never closed for another of its address's: `per_client`).
    fn serves(&self, activity: &Arc<Activity>) {
        if let Some(client) = &self.client {
            client.serves(activity);
        }
    }

    /// Drives the connection to its end. Not an `async fn`: one would hold `conn` twice (as its
    /// argument and as the future it awaits), and this future is most of a connection's task.
    fn run<E: std::fmt::Display>(
        self,
        conn: impl Future<Output = Result<(), E>>,
    ) -> impl Future<Output = ()> {
        // The whole of `self` is moved in (a closure naming only `self.peer` would take only
        // that): the connection stays counted until it ends.
        let counted = self;
        conn.map(move |ended| {
            ended_cleanly(ended, counted.peer);
            drop(counted);
        })
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What serving one accepted connection shares with its loop.
struct Shared<F> {
    make: F,
    builders: Builders,
    drain: watch::Receiver<bool>,
    draining: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    parked: Arc<AtomicUsize>,
    limits: Limits,
    name: &'static str,
    proxy_protocol: bool,
    per_client: Option<Arc<PerClient>>,
    refusals: Option<Refusals>,
    /// Connections closed for a missing or bad PROXY header, said at most once a second: an
    /// operator who turned `proxy_protocol` on while the load balancer does not send it saw
    /// only resets.
    bad_proxy_headers: SaidEvery,
    /// Connections closed for a request head that never came whole, or an answer the client
    /// stopped reading, said at most once a second each: a slowloris of thousands of
    /// connections made a line apiece (the access log keeps the 408s).
    head_timeouts: SaidEvery,
    stalls: SaidEvery,
    /// TLS handshakes that failed, said at most once a second with how many went unsaid.
    tls_failures: SaidEvery,
}

impl<F> Shared<F> {
    fn said_bad_proxy_header(&self, what: &str, why: &dyn std::fmt::Display) {
        warn_every(&self.bad_proxy_headers, what, why);
    }
}

impl AcceptLoop {
    /// Accepts until `shutdown` turns true, then drains: no new connections, HTTP/1 keep-alive
    /// stops, idle connections close, and in-flight requests finish within the grace period.
    /// `make` builds the service of each connection.
    pub async fn run<F: MakeService>(self, make: F, mut shutdown: watch::Receiver<bool>) {
        if let Err(e) = pass_on_connection_options(&self.listener) {
            tracing::warn!(
                "{}: cannot set the connections' socket options: {e}",
                self.name
            );
        }
        let listener = match ClientListener::new(self.listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{}: cannot register the listener: {e}", self.name);
                return;
            }
        };
        let (drain_tx, drain_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            make,
            builders: Builders::new(&self.limits),
            drain: drain_rx,
            draining: Arc::new(AtomicBool::new(false)),
            live: Arc::new(AtomicUsize::new(0)),
            open: self.open,
            parked: self.parked,
            limits: self.limits,
            name: self.name,
            proxy_protocol: self.proxy_protocol,
            per_client: self.per_client,
            refusals: self.refusals,
            bad_proxy_headers: once_a_second(),
            head_timeouts: once_a_second(),
            stalls: once_a_second(),
            tls_failures: once_a_second(),
        });
        let accept_errors = once_a_second();
        // Said at warn level (at most once a second): at debug only, an operator whose cap was
        // too low saw nothing (nginx: "worker_connections are not enough", at alert).
        let at_cap = once_a_second();
        // Likewise one address at its own cap: the sign of a client holding places open.
        let address_at_cap = once_a_second();
        // A second handle on the stop signal, to ask cheaply after each accept whether it moved:
        // the wait below borrows the first, and is polled only when no connection is waiting.
        let peek = shutdown.clone();
        // Kept across accepts: a wait made anew for each accept joined and left the signal's
        // waiters every time (callgrind: about 360 instructions a connection).
        let mut stopped = std::pin::pin!(shutdown.wait_for(|stop| *stop));
        loop {
            if stop_asked(&peek) {
                break;
            }
            let accepted = tokio::select! {
                biased;
                accepted = listener.accept() => accepted,
                _ = stopped.as_mut() => break,
            };
            let (stream, peer) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly instead of spinning.
                    warn_every(&accept_errors, &format!("{}: accept failed", self.name), &e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            if shared.open.load(Ordering::Relaxed) >= shared.limits.max_connections {
                let cap = shared.limits.max_connections;
                let why = format_args!("its connection cap ({cap}) is reached");
                warn_every(&at_cap, &format!("{}: connection refused", self.name), &why);
                continue;
            }
            if let Some(ka) = shared.limits.keepalive {
                apply_keepalive(&stream, ka);
            }
            let client = match &shared.per_client {
                None => None,
                Some(table) => match table.take(peer.ip()) {
                    Some(taken) => {
                        if taken.evicted_one {
                            tracing::debug!(
                                "{}: {}'s oldest idle connection closed for its new one (it holds as many as one may)",
                                self.name,
                                peer.ip()
                            );
                        }
                        Some(taken.slot)
                    }
                    None => {
                        let what = format!("{}: connection from {} refused", self.name, peer.ip());
                        warn_every(
                            &address_at_cap,
                            &what,
                            &"that address holds as many as one may",
                        );
                        continue;
                    }
                },
            };
            let counted = OpenConnection::new(peer, (&shared.open, &shared.live), client);
            spawn_serving(&shared, counted, stream, self.tls.as_ref());
        }
        drop(listener);
        drain(&shared, &drain_tx).await;
    }
}

/// Whether the listener's stop signal moved to stop, or its sender is gone: one atomic load
/// while it has not moved.
fn stop_asked(signal: &watch::Receiver<bool>) -> bool {
    match signal.has_changed() {
        Ok(false) => false,
        Ok(true) => *signal.borrow(),
        Err(_) => true,
    }
}

/// Serves one connection in its own task: the PROXY header (with `proxy_protocol`) and the TLS
/// handshake, both within one header timeout counted from the accept, then HTTP. A connection
/// without a valid PROXY header, or whose handshake fails or is late, is closed.
///
/// Each kind of connection is a task of its own type, holding only its own state: a plain
/// connection's task has no room for a TLS handshake or session.
fn spawn_serving<F: MakeService>(
    shared: &Arc<Shared<F>>,
    counted: OpenConnection,
    stream: ClientTcp,
    tls: Option<&tokio_rustls::TlsAcceptor>,
) {
    let deadline = tokio::time::Instant::now() + shared.limits.header_timeout;
    let shared = shared.clone();
    let evicted = counted.client.as_ref().map(ClientSlot::evicted);
    match (tls.cloned(), shared.proxy_protocol) {
        (None, false) => spawn_evictable(serve_plain(shared, counted, stream), evicted),
        (Some(acceptor), false) => {
            let serving = serve_tls(shared, counted, stream, acceptor, deadline);
            spawn_evictable(serving, evicted);
        }
        (tls, true) => {
            let serving = serve_proxied(shared, counted, stream, tls, deadline);
            spawn_evictable(serving, evicted);
        }
    }
}

async fn serve_plain<F: MakeService>(
    shared: Arc<Shared<F>>,
    counted: OpenConnection,
    stream: ClientTcp,
) {
    let info = ConnInfo {
        peer: counted.peer,
        tls: false,
        tls_facts: TlsFacts::default(),
    };
    serve_parking(shared, counted, stream, info).await;
}

/// Serves a connection that is HTTP/1 or says which by its first bytes (HTTP/2 prior
/// knowledge): aralez's own HTTP/1.1 side ([`super::h1`]) first, hyper from the first request
/// it leaves to hyper (on a fresh connection hyper also tells HTTP/2 from HTTP/1 then). Either
/// way the connection parks whenever it is HTTP/1 and idle ([`super::park`]) and is served
/// again, by aralez's side first, when the client sends more.
async fn serve_parking<F: MakeService, S: ClientSocket>(
    shared: Arc<Shared<F>>,
    counted: OpenConnection,
    socket: S,
    info: ConnInfo,
) {
    let (peer, timers) = (counted.peer, shared.limits.timers());
    let activity = Activity::new(shared.draining.clone());
    counted.serves(&activity);
    let dock = Dock::new();
    let service = |writer| Tracked::new(shared.make.make(info.clone()), activity.clone(), writer);
    let mut drain = shared.drain.clone();
    let mut socket = socket;
    loop {
        let io = Parkable::new(socket, activity.clone(), dock.clone());
        let own = h1::Connection::new(io, service(HeadWriter::Own), BytesMut::new())
            .with_head_limit(shared.limits.max_header_bytes.max(8192));
        let served_cleanly =
            match idle::drive_boxed(own, drain.clone(), activity.clone(), timers).await {
                Ok(None) => true,
                Ok(Some(handoff)) => {
                    let hyper = HyperSide {
                        shared: &shared,
                        activity: &activity,
                        info: &info,
                        timers,
                    };
                    // Boxed, as the parked wait below: both are rare, and held inline they
                    // would make every connection's task larger than 1 KiB, which the
                    // allocator serves as a 2 KiB block (a task is aligned to 128 bytes;
                    // see `allocator`).
                    Box::pin(hyper.serve(handoff, service(HeadWriter::Hyper))).await
                }
                Err(h1::H1Error::Refused(refusal)) => {
                    if let Some(refusals) = &shared.refusals {
                        let status = refusal.status();
                        refusals.refused(peer.ip(), &info.tls_facts, status, 0);
                    }
                    false
                }
                Err(e) => ended_cleanly(Err(e), peer),
            };
        let mut parked = match dock.take() {
            Some(Left::Parked(parked)) if served_cleanly => parked,
            // hyper ended it after a request with a body, or with bytes unread: the client
            // may still be sending a body its answer came before, and a close now would send a
            // reset that loses the answer (what it sent may all have been read into hyper's or
            // rustls's buffer, the rest still on its way). Otherwise (an idle connection
            // closed, a client that said `Connection: close`) the close is clean, and nothing
            // need wait for a client that may never close its side.
            Some(Left::Ended(mut ended)) => {
                if activity.last_request_had_body() || ended.tcp().has_unread_bytes() {
                    let closing = h1::lingering_close(&mut ended, true);
                    let _ = Box::pin(tokio::time::timeout(timers.head, closing)).await;
                }
                break;
            }
            _ => break,
        };
        let woke = park::wait_parked(&mut parked, &activity, timers, &mut drain, &shared.parked);
        if Box::pin(woke).await == Wake::Close {
            break;
        }
        socket = parked;
    }
    say_closed_for(&shared, &activity, &info);
    drop(counted);
}

/// Says why the connection's timer closed it when its client was the cause, with the client's
/// address: a request head that never came whole also gets the access log's 408 line and its
/// count, as nginx logs a `client_header_timeout`.
fn say_closed_for<F>(shared: &Shared<F>, activity: &Activity, info: &ConnInfo) {
    let peer = info.peer;
    match activity.closed_for() {
        Some(Closed::HeadTimedOut) => {
            let limit = shared.limits.header_timeout;
            if let Some(more) = shared.head_timeouts.due_note(tokio::time::Instant::now()) {
                tracing::info!("client {peer}: no whole request head within {limit:?} (client_header_timeout); closed{more}");
            }
            if let Some(refusals) = &shared.refusals {
                refusals.refused(peer.ip(), &info.tls_facts, StatusCode::REQUEST_TIMEOUT, 0);
            }
        }
        Some(Closed::Stalled) => {
            let limit = shared.limits.send_timeout;
            if let Some(more) = shared.stalls.due_note(tokio::time::Instant::now()) {
                tracing::info!("client {peer}: its answer made no progress for {limit:?} (client_send_timeout: the client stopped reading); closed{more}");
            }
        }
        None => {}
    }
}

/// What serving a connection handed over by [`h1`] needs.
struct HyperSide<'a, F> {
    shared: &'a Shared<F>,
    activity: &'a Arc<Activity>,
    info: &'a ConnInfo,
    timers: Timers,
}

impl<F: MakeService> HyperSide<'_, F> {
    /// Serves a handed-over connection with hyper until it ends or parks: sniffing for HTTP/2
    /// when nothing was served on it yet, HTTP/1 only otherwise. Whether it ended cleanly.
    async fn serve<S: ClientSocket>(
        self,
        handoff: h1::Handoff<Parkable<S>>,
        service: Tracked<F::Service>,
    ) -> bool {
        let mut io = handoff.io;
        io.unread(handoff.read);
        io.linger_when_ended();
        let peer = self.info.peer;
        let io = TokioIo::new(FloodGuard::new(io, peer));
        let (drain, activity) = (self.shared.drain.clone(), self.activity.clone());
        let ended = if handoff.served == 0 {
            let builder = &self.shared.builders.sniffing;
            let conn = builder.serve_connection_with_upgrades(io, service);
            let conn = idle::drive_boxed(conn.into_owned(), drain, activity, self.timers);
            let refusals = h2_refusals(self.shared, self.info);
            h2::refusals::scope(refusals, conn).await
        } else {
            let builder = &self.shared.builders.http1;
            let conn = builder.serve_connection(io, service).with_upgrades();
            let ended = idle::drive_boxed(conn, drain, activity, self.timers).await;
            ended.map_err(Into::into)
        };
        if let (Err(e), Some(refusals)) = (&ended, &self.shared.refusals) {
            if let Some(status) = refused_with(&**e) {
                refusals.refused(peer.ip(), &self.info.tls_facts, status, 0);
            }
        }
        ended_cleanly(ended, peer)
    }
}

/// The status hyper answered a request it refused itself, if `error` says it did: 400 for a
/// malformed head, 431 for one too large, 414 for a target too long (hyper's `on_error`).
/// An HTTP/2 preface on an HTTP/1 connection and hyper's internal errors get no answer.
fn refused_with(error: &(dyn std::error::Error + 'static)) -> Option<StatusCode> {
    let error = error.downcast_ref::<hyper::Error>()?;
    if error.is_parse_too_large() {
        let uri = error.to_string().starts_with("URI too long");
        return Some(match uri {
            true => StatusCode::URI_TOO_LONG,
            false => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        });
    }
    let text = error.to_string();
    let unanswered = text.contains("HTTP2 preface") || text.starts_with("internal error");
    (error.is_parse() && !error.is_parse_status() && !unanswered).then_some(StatusCode::BAD_REQUEST)
}

/// Whether a connection ended without an error; logs the error otherwise.
fn ended_cleanly<E: std::fmt::Display>(ended: Result<(), E>, peer: SocketAddr) -> bool {
    match ended {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(%peer, "connection ended with an error: {e}");
            false
        }
    }
}

/// Where an HTTP/2 connection's refused request heads are told (see [`Refusals::h2_note`]).
fn h2_refusals<F>(shared: &Shared<F>, info: &ConnInfo) -> Option<h2::refusals::Note> {
    let refusals = shared.refusals.as_ref()?;
    Some(refusals.h2_note(info.peer.ip(), info.tls_facts.clone()))
}

/// Stops keep-alive: HTTP/1 responses say `Connection: close` for [`DRAIN_LINGER`], then idle
/// connections are closed (HTTP/2 gets GOAWAY) and in-flight requests finish within the grace
/// period.
async fn drain<F>(shared: &Shared<F>, drain: &watch::Sender<bool>) {
    shared.draining.store(true, Ordering::Relaxed);
    let grace = shared.limits.grace_period;
    let deadline = tokio::time::Instant::now() + grace;
    let linger_end = tokio::time::Instant::now() + DRAIN_LINGER.min(grace);
    let open = || shared.live.load(Ordering::Relaxed) > 0;
    while open() && tokio::time::Instant::now() < linger_end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drain.send_replace(true);
    while open() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if open() {
        tracing::warn!(
            "{}: grace period over; closing the connections still open",
            shared.name
        );
    }
}
