//! A backend: its address, its passive health, and its per-worker idle connections.
//!
//! Backends are shared between snapshots through the [`Registry`], so a reload keeps health state
//! and pooled connections for every backend that stays.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub use super::connector::Wire;
use super::connector::{self, ConnectError, ConnectErrorKind, Endpoint, Fresh};
use super::idle_list::SURPLUS_GRACE;
use super::inline::InlineConn;
use super::slot::{IdleKind, WorkerSlot};
use crate::config::values::{Scheme, ServerSpec};
use crate::metrics::Metrics;
use crate::vocab::{CountedSlot, WorkerId};
pub use registry::Registry;

/// Consecutive connect failures after which a backend is taken out of rotation.
const FAILS_BEFORE_DOWN: u32 = 3;
/// Failed exchanges on new connections in a row after which the protocol is detected again.
const DOUBTS_BEFORE_REDETECTION: u32 = 3;

/// One backend server.
pub struct Backend {
    pub spec: ServerSpec,
    /// `host:port`, as shown in logs, errors, metrics and the access log.
    pub label: Arc<str>,
    /// Resolved when the backend was created and again periodically for host names (see
    /// [`Backend::re_resolve`]); empty while the name does not resolve.
    addrs: arc_swap::ArcSwap<Box<[SocketAddr]>>,
    /// Set by a scheme prefix (`http://`, `h2c://`, `https://`); detection never overrides it.
    pinned: Option<Wire>,
    /// The detected [`Wire`] as a number; 0 while unknown (detect on the next connection).
    detected: AtomicU8,
    /// One detection at a time per backend, and the last one's failure, for those that
    /// waited for it ([`super::detect::wire_of`]).
    pub(super) detecting: tokio::sync::Mutex<Option<super::connector::ConnectError>>,
    /// Detections run so far: a caller that finds it moved while it waited had its answer.
    pub(super) detections: AtomicU64,
    /// New connections in a row whose exchange failed as a changed protocol would make it
    /// fail ([`Backend::doubt_protocol`]).
    protocol_doubts: AtomicU32,
    /// When its connection limit was last said in the log (ms of the health clock), and how
    /// many requests met it since ([`Backend::say_at_capacity`]).
    capacity_said_ms: AtomicU64,
    capacity_unsaid: AtomicU64,
    /// Verify the backend's certificate (`upstream_tls_verify: true`).
    pub verify_tls: bool,
    /// Value for the `:authority` of HTTP/2 requests when the client sent none.
    pub authority: http::uri::Authority,
    health: Health,
    slots: Box<[WorkerSlot]>,
    /// `upstream_keepalive_pool_size` split across the workers: each one's share, and how many
    /// of the first take one more.
    pool_share: (usize, usize),
    /// Where this backend's connections are counted.
    pub(super) metrics: Arc<Metrics>,
    /// `spec.host`, shared: the TLS server name and pool key when the backend is asked for by
    /// its own name (cloned per request, never re-allocated).
    pub(super) own_name: Arc<str>,
    /// Open pooled connections, across workers, and how many there may be.
    open_conns: Arc<std::sync::atomic::AtomicUsize>,
    max_conns: usize,
    /// Counts the times the host name led to other addresses: a plain connection opened
    /// before the last change is not pooled again.
    addrs_changed: AtomicU32,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("label", &self.label)
            .finish()
    }
}

/// Passive health (consecutive connect failures mark the backend down for a while,
/// [`passive`]) and the
/// verdicts of the last active health check round (`health.rs`), one per route path probed.
struct Health {
    /// Per route path: the last round's probe of that path failed. A backend that fails one
    /// route's probe leaves that route only (SPEC §6.1 probes each (backend, path)). Kept
    /// here, in the registry's backend, so verdicts survive reloads; routes read their flags.
    probe_down: Mutex<HashMap<Box<str>, Arc<AtomicBool>>>,
    consecutive_failures: AtomicU32,
    /// Milliseconds since `born` until which the backend is out of rotation (0: in rotation).
    down_until_ms: AtomicU64,
    /// `hc_interval`: how long a first mark lasts.
    down_for_ms: AtomicU64,
    /// How long the present mark lasts: `down_for_ms`, doubled by each failed trial up to
    /// [`passive::LONGEST_MARK`].
    mark_ms: AtomicU64,
    /// A trial is out ([`Backend::claim_trial`]): the failed connect that ends it doubles the
    /// mark, where those of requests already connecting when the mark was made do not.
    trial_out: AtomicBool,
    /// The clock's origin for `down_until_ms` (tokio's clock, so tests can pause it).
    born: Instant,
}

impl Health {
    fn now_ms(&self) -> u64 {
        // At least 1, so a mark made in the backend's first millisecond is not "never".
        (self.born.elapsed().as_millis() as u64).max(1)
    }
}

impl Backend {
    /// The addresses to connect to, as last resolved.
    pub fn addrs(&self) -> Arc<Box<[SocketAddr]>> {
        self.addrs.load_full()
    }

    /// Resolves a host-name backend again (blocking: call off the request path). A failed lookup
    /// keeps the previous addresses. Returns whether they changed.
    pub fn re_resolve(&self) -> bool {
        if self.spec.ip_addr().is_some() {
            return false;
        }
        let fresh = super::lookup::resolve(&self.spec);
        if fresh.is_empty() || **self.addrs.load() == fresh {
            return false;
        }
        tracing::info!(backend = %self.label, "resolved again: {:?}", fresh);
        self.use_addrs(fresh);
        true
    }

    /// The first answer of a lookup of the host name, unless it is empty or a later one came.
    pub(super) fn take_first_addrs(&self, fresh: Box<[SocketAddr]>) {
        if !fresh.is_empty() && self.addrs.load().is_empty() {
            self.addrs.store(Arc::new(fresh));
        }
    }

    /// Connects to `fresh` from now on. The idle connections to the old addresses are closed
    /// (HTTP/2 ones finish their streams first) and busy plain ones are not pooled again: kept,
    /// they carried the backend's traffic to the old address for as long as they stayed busy,
    /// and an address given to another service got its requests (nginx's keep-alive cache
    /// checks the peer's address the same way).
    fn use_addrs(&self, fresh: Box<[SocketAddr]>) {
        self.addrs.store(Arc::new(fresh));
        self.addrs_changed.fetch_add(1, Ordering::Relaxed);
        for slot in self.slots.iter() {
            slot.forget_connections();
        }
    }

    /// How to speak to this backend, if known: pinned or detected. `None`: detect first.
    pub fn wire(&self) -> Option<Wire> {
        if self.pinned.is_some() {
            return self.pinned;
        }
        Wire::from_u8(self.detected.load(Ordering::Relaxed))
    }

    /// This worker's connections to the backend. Threads that are no worker (HTTP/3's) share
    /// the last slot, one of their own: a worker's HTTP/2 and TLS connections are driven by
    /// tasks on its runtime, which stops when the worker has drained, and an HTTP/3 request
    /// still running on one of them lost its stream.
    pub(super) fn slot(&self, worker: WorkerId) -> &WorkerSlot {
        let last = self.slots.len() - 1;
        &self.slots[worker.0.min(last)]
    }

    /// `worker`'s share of `upstream_keepalive_pool_size` ([`pool_shares`]). HTTP/3's threads
    /// share one more slot, of a worker's share.
    pub(super) fn idle_max(&self, worker: WorkerId) -> usize {
        let (share, one_more) = self.pool_share;
        share + usize::from(worker.0 < one_more)
    }

    /// Gives a plain connection whose response has been read back to `worker`'s idle list.
    pub(super) fn keep_inline(self: &Arc<Self>, worker: WorkerId, conn: Box<InlineConn>) {
        if conn.addrs_changed_at_open() != self.addrs_changed.load(Ordering::Relaxed) {
            return;
        }
        let max = self.idle_max(worker);
        let trim_due = self
            .slot(worker)
            .put_inline(conn, max, || self.surplus_allowed());
        self.trim_later(trim_due, worker, IdleKind::Inline);
    }

    /// How many times the backend's addresses have changed ([`Backend::use_addrs`]).
    pub(super) fn addrs_generation(&self) -> u32 {
        self.addrs_changed.load(Ordering::Relaxed)
    }

    /// Gives hyper's HTTP/1.1 connection (opened for `sni`) back to `worker`'s idle list,
    /// unless the addresses changed since its request was sent (`generation`): it may go to
    /// the old one.
    pub(super) fn keep_hyper(
        self: &Arc<Self>,
        worker: WorkerId,
        (sni, generation): (Option<Arc<str>>, u32),
        conn: hyper::client::conn::http1::SendRequest<connector::UpBody>,
    ) {
        if generation != self.addrs_generation() {
            return;
        }
        let max = self.idle_max(worker);
        let trim_due = self
            .slot(worker)
            .put_idle(sni, conn, max, || self.surplus_allowed());
        self.trim_later(trim_due, worker, IdleKind::Hyper);
    }

    /// Closes the idle connections of every worker that the backend has closed: they would stay
    /// half-closed (CLOSE-WAIT) until the next request found them. How many.
    pub fn close_gone_idle(&self) -> usize {
        self.slots.iter().map(WorkerSlot::close_gone_inline).sum()
    }

    /// Idle connections above the pool size may wait for the next burst (see `idle_list`) while
    /// the backend has used at most half its `upstream_max_connections`: idle ones on one worker
    /// must not take the places another worker needs.
    fn surplus_allowed(&self) -> bool {
        self.open_conns.load(Ordering::Relaxed) <= self.max_conns / 2
    }

    /// After a keep that went over the pool size, trims the list every grace period on this
    /// worker's own runtime until it is back within the size. Outside a runtime (shutting down)
    /// the surplus is closed at once.
    fn trim_later(self: &Arc<Self>, trim_due: bool, worker: WorkerId, list: IdleKind) {
        if !trim_due {
            return;
        }
        let max = self.idle_max(worker);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            while self.slot(worker).trim_idle(list, max) {}
            return;
        };
        let backend = Arc::clone(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(SURPLUS_GRACE).await;
                if !backend.slot(worker).trim_idle(list, max) {
                    break;
                }
            }
        });
    }

    /// Notes a response head from this backend; one under 500 counts as a sign of life.
    pub fn note_answer(&self, worker: WorkerId, status: http::StatusCode) {
        if status.as_u16() < 500 {
            self.slot(worker).note_answer();
        }
        // Any answer shows the protocol is right, and the backend reachable.
        if self.protocol_doubts.load(Ordering::Relaxed) != 0 {
            self.protocol_doubts.store(0, Ordering::Relaxed);
        }
        self.connect_succeeded();
    }

    /// A new connection's exchange failed (a reset, an answer that is no HTTP/1.1 response) as
    /// it would if the backend spoke another protocol now. One such failure is usually that
    /// request's own (a handler that crashes, a malformed answer on one URL): the protocol is
    /// detected again only after [`DOUBTS_BEFORE_REDETECTION`] in a row, since detecting
    /// holds up every request to the backend meanwhile, for up to 2 s against a server that
    /// sits on a TLS ClientHello.
    pub fn doubt_protocol(&self) {
        let doubts = self.protocol_doubts.fetch_add(1, Ordering::Relaxed) + 1;
        if doubts >= DOUBTS_BEFORE_REDETECTION {
            self.protocol_doubts.store(0, Ordering::Relaxed);
            self.forget_detection();
        }
    }

    /// Response heads under 500 this backend has sent to any worker so far.
    pub fn answers(&self) -> u64 {
        self.slots.iter().map(WorkerSlot::answers).sum()
    }

    /// Opens a connection (see [`connector::open`]); the outcome counts in passive health (TCP
    /// and TLS failures count; a handshake the backend completes is a success), except a TLS
    /// failure for a server name the client chose (`sni_by_client`): a made-up `Host` must not
    /// take a backend out of rotation for everyone.
    pub async fn connect(
        &self,
        wire: Wire,
        sni: &str,
        sni_by_client: bool,
        timeout: Duration,
        offer_h2: bool,
    ) -> Result<Fresh, ConnectError> {
        let counted = self.reserve_connection()?;
        let addrs = self.addrs();
        let ep = self.endpoint(&addrs, wire);
        // Boxed: opening a connection (TCP, TLS, an HTTP/2 handshake) is a state machine of
        // about 7 KiB and rare; unboxed, it would sit inside every future of hyper's client
        // path (boxed per request itself, `pool::send_over`), making each 8.5 KiB, not 2.8.
        let opening = Box::pin(connector::open(
            ep,
            sni,
            timeout,
            offer_h2,
            None,
            Some(counted),
        ));
        let opened = opening.await;
        match &opened {
            Ok(_) => self.connect_succeeded(),
            Err(e) if sni_by_client && e.kind() == ConnectErrorKind::Tls => {}
            Err(e) if e.kind() == ConnectErrorKind::Local => {}
            Err(e) if e.is_certificate_refused() => self.certificate_refused(),
            Err(e) if e.is_retryable() => self.connect_failed(),
            Err(_) => {}
        }
        opened
    }

    /// A plain connection for requests that drive it themselves ([`super::inline`]), counted
    /// among the backend's open connections and in its passive health.
    pub async fn connect_inline(&self, timeout: Duration) -> Result<Box<InlineConn>, ConnectError> {
        let counted = self.reserve_connection()?;
        let changed = self.addrs_changed.load(Ordering::Relaxed);
        let tcp = self.tcp(timeout).await?;
        let mut conn = InlineConn::new(tcp, Some(counted));
        conn.note_addrs_changed_at_open(changed);
        Ok(conn)
    }

    /// A place among the backend's open connections (`upstream_max_connections`).
    /// A place in the count of open connections. At the limit, an idle plain connection (of
    /// any worker: each keeps its own) is closed to make room: only busy ones may keep a
    /// request out. Another worker's idle ones made requests get 503 while the backend idled.
    pub(super) fn reserve_connection(&self) -> Result<CountedSlot, ConnectError> {
        let reserve = || CountedSlot::reserve(&self.open_conns, self.max_conns);
        if let Some(counted) = reserve() {
            return Ok(counted);
        }
        while self.slots.iter().any(WorkerSlot::close_one_inline) {
            if let Some(counted) = reserve() {
                return Ok(counted);
            }
        }
        let detail = format!("{} connections open", self.max_conns);
        Err(ConnectError::new(ConnectErrorKind::Capacity, detail))
    }

    /// A TCP connection, counted in passive health (protocol detection).
    pub async fn tcp(&self, timeout: Duration) -> Result<tokio::net::TcpStream, ConnectError> {
        let addrs = self.addrs();
        let connected = connector::tcp(&addrs, &self.spec.host, timeout).await;
        match &connected {
            Ok(_) => self.connect_succeeded(),
            Err(e) if e.kind() == ConnectErrorKind::Local => {}
            Err(_) => self.connect_failed(),
        }
        connected
    }

    /// Where to connect, speaking `wire`, given the addresses from [`Backend::addrs`].
    pub fn endpoint<'a>(&'a self, addrs: &'a [SocketAddr], wire: Wire) -> Endpoint<'a> {
        Endpoint {
            addrs,
            host: &self.spec.host,
            wire,
            verify_tls: self.verify_tls,
        }
    }

    pub(super) fn set_detected(&self, wire: Wire) {
        let before = self.detected.swap(wire as u8, Ordering::Relaxed);
        if before != wire as u8 {
            tracing::info!(backend = %self.label, protocol = wire.name(), "backend protocol detected");
        }
    }

    /// Connections are failing: detect the protocol again before the next connection.
    pub fn forget_detection(&self) {
        if self.pinned.is_none() && self.detected.swap(0, Ordering::Relaxed) != 0 {
            tracing::info!(backend = %self.label, "backend protocol will be detected again");
        }
    }

    fn new(spec: ServerSpec, verify_tls: bool, registry: &Registry) -> Backend {
        let own_name: Arc<str> = spec.host.as_str().into();
        let (workers, pool_size) = (registry.workers, registry.pool_size);
        let label: Arc<str> = spec.authority().into();
        // A host name is looked up by the registry, off this thread ([`super::lookup`]).
        let addrs = match spec.ip_addr() {
            Some(addr) => arc_swap::ArcSwap::from_pointee(Box::new([addr]) as Box<[SocketAddr]>),
            None => arc_swap::ArcSwap::from_pointee(Box::default()),
        };
        let pinned = spec.scheme.map(|scheme| match scheme {
            Scheme::Https => Wire::Tls,
            Scheme::H2c => Wire::H2c,
            Scheme::Http => Wire::Http1,
        });
        let authority = label
            .parse()
            .unwrap_or_else(|_| http::uri::Authority::from_static("backend"));
        let workers = workers.max(1);
        let health = Health {
            probe_down: Mutex::default(),
            consecutive_failures: AtomicU32::new(0),
            down_until_ms: AtomicU64::new(0),
            down_for_ms: AtomicU64::new(registry.down_for.as_millis() as u64),
            mark_ms: AtomicU64::new(registry.down_for.as_millis() as u64),
            trial_out: AtomicBool::new(false),
            born: Instant::now(),
        };
        Backend {
            spec,
            label,
            addrs,
            pinned,
            detected: AtomicU8::new(0),
            protocol_doubts: AtomicU32::new(0),
            capacity_said_ms: AtomicU64::new(0),
            capacity_unsaid: AtomicU64::new(0),
            detecting: tokio::sync::Mutex::new(None),
            detections: AtomicU64::new(0),
            verify_tls,
            authority,
            health,
            slots: (0..=workers).map(|_| WorkerSlot::default()).collect(),
            pool_share: pool_shares(pool_size, workers),
            metrics: registry.metrics.clone(),
            own_name,
            open_conns: Arc::default(),
            addrs_changed: AtomicU32::new(0),
            max_conns: registry.max_conns,
        }
    }

    /// Up for every route: no path's last health check failed (or none ran) and passive health
    /// has not marked it down (or its time out has passed; then it gets another chance). A
    /// route asks its own path's verdict ([`Backend::probe_down_at`]).
    pub fn is_up(&self) -> bool {
        let verdicts = self
            .health
            .probe_down
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        !verdicts.values().any(|down| down.load(Ordering::Relaxed)) && self.passive_up()
    }

    /// The name a TLS backend is asked for (and its certificate checked against) by the
    /// requests of a route of host `route_host`: the route's host, or for `DEFAULT` (any host a
    /// client makes up) and for an IP address (`[::5]`, which is no server name) the backend's
    /// own name. Its probes ask for the same. A route of host `[::5]` probed its TLS backend
    /// with `[::5]` for a name, which no handshake takes: down for good, every request a 503.
    pub fn server_name_for<'a>(&'a self, route_host: &'a str) -> &'a str {
        let address = route_host.starts_with('[') || route_host.parse::<IpAddr>().is_ok();
        match route_host {
            "DEFAULT" => &self.spec.host,
            _ if address => &self.spec.host,
            host => host,
        }
    }

    /// The flag the health checks set when this backend fails the probe of route path `path`
    /// asking for server name `name` ([`Backend::server_name_for`]); a route keeps it and reads
    /// it on every request.
    pub fn probe_down_at(&self, name: &str, path: &str) -> Arc<AtomicBool> {
        let key = format!("{name} {path}");
        let mut verdicts = self
            .health
            .probe_down
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        verdicts.entry(key.into_boxed_str()).or_default().clone()
    }

    /// Records a health check round's verdict for route path `path` asking for `name` (a
    /// failure says why); a pass also clears passive marking.
    pub fn set_probed(&self, name: &str, path: &str, verdict: Result<(), &str>) {
        let healthy = verdict.is_ok();
        let was_down = self
            .probe_down_at(name, path)
            .swap(!healthy, Ordering::Relaxed);
        if healthy {
            self.connect_succeeded();
        }
        match (was_down, verdict) {
            (false, Err(why)) => {
                tracing::warn!(backend = %self.label, name, path, "health check failed ({why}); out of the route's rotation")
            }
            (true, Ok(())) => {
                tracing::info!(backend = %self.label, name, path, "health check passed; back in the route's rotation")
            }
            _ => {}
        }
    }

    /// Says in the log that a request met the connection limit (`upstream_max_connections`),
    /// at most once a second, with how many met it since: a line a request under overload
    /// wrote 4,000 a second.
    pub fn say_at_capacity(&self, error: &dyn std::fmt::Display) {
        let now = self.health.now_ms().max(1);
        let said = self.capacity_said_ms.load(Ordering::Relaxed);
        let due = said == 0 || now >= said + 1000;
        if !due
            || self
                .capacity_said_ms
                .compare_exchange(said, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.capacity_unsaid.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.capacity_unsaid.swap(0, Ordering::Relaxed) {
            0 => tracing::warn!(backend = %self.label, "{error}"),
            more => {
                tracing::warn!(backend = %self.label, "{error} ({more} more since the last report)")
            }
        }
    }
}

mod passive;
mod registry;

/// `upstream_keepalive_pool_size` split across `workers`: each one's share, and how many of the
/// first take one more of what does not divide, so that the idle connections kept add up to
/// the size (SPEC §2; rounded up for each, 4 workers kept 4 for a size of 3). One each at
/// least while the size is not 0: a worker with none opened a backend connection for every
/// request of its clients, as with no pool.
fn pool_shares(size: usize, workers: usize) -> (usize, usize) {
    match (size / workers, size % workers) {
        (0, more) if more > 0 => (1, 0),
        split => split,
    }
}

#[cfg(test)]
mod tests;
