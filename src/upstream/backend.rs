//! A backend: its address, its passive health, and its per-worker idle connections.
//!
//! Backends are shared between snapshots through the [`Registry`], so a reload keeps health state
//! and pooled connections for every backend that stays.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::config::values::{Scheme, ServerSpec};

use super::pool::WorkerSlot;

/// Consecutive connect failures after which a backend is taken out of rotation.
const FAILS_BEFORE_DOWN: u32 = 3;

/// How an HTTP exchange is framed on a connection (plain or TLS underneath).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    H2,
}

/// What a backend's connections are: plain HTTP/1.1, h2c (prior knowledge), or TLS (where ALPN
/// picks h2 or HTTP/1.1). Pinned by a scheme prefix, else detected (`detect.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Http1 = 1,
    H2c = 2,
    Tls = 3,
}

impl Wire {
    fn from_u8(v: u8) -> Option<Wire> {
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

/// One backend server.
pub struct Backend {
    pub spec: ServerSpec,
    /// `host:port`, as shown in logs and errors.
    pub label: Box<str>,
    /// Resolved when the backend was created and again periodically for host names (see
    /// [`Backend::re_resolve`]); empty while the name does not resolve.
    addrs: arc_swap::ArcSwap<Box<[SocketAddr]>>,
    /// Set by a scheme prefix (`http://`, `h2c://`, `https://`); detection never overrides it.
    pinned: Option<Wire>,
    /// The detected [`Wire`] as a number; 0 while unknown.
    detected: AtomicU8,
    /// A health-checked route uses this backend, so its protocol may be detected (SPEC §6.3);
    /// otherwise an unprefixed backend is plain HTTP/1.1.
    detection_allowed: AtomicBool,
    /// One detection at a time per backend.
    pub(super) detecting: tokio::sync::Mutex<()>,
    /// Verify the backend's certificate (`upstream_tls_verify: true`).
    pub verify_tls: bool,
    /// Value for the `:authority` of HTTP/2 requests when the client sent none.
    pub authority: http::uri::Authority,
    health: Health,
    pub(super) slots: Box<[WorkerSlot]>,
    pub(super) idle_per_worker: usize,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("label", &self.label)
            .finish()
    }
}

/// Passive health (consecutive connect failures mark the backend down for a while) and the
/// verdict of the last active health check round (`health.rs`).
#[derive(Default)]
struct Health {
    /// The last health check round found this backend failing.
    probe_down: AtomicBool,
    consecutive_failures: AtomicU32,
    /// Milliseconds since [`epoch`] until which the backend is out of rotation.
    down_until_ms: AtomicU64,
    down_for_ms: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// The addresses of a server entry: the literal IP, or what the host name resolves to now.
fn resolve(spec: &ServerSpec) -> Box<[SocketAddr]> {
    match spec.ip_addr() {
        Some(addr) => Box::new([addr]),
        None => (spec.host.as_str(), spec.port)
            .to_socket_addrs()
            .map(|it| it.collect())
            .unwrap_or_default(),
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
        let fresh = resolve(&self.spec);
        if fresh.is_empty() || **self.addrs.load() == fresh {
            return false;
        }
        tracing::info!(backend = %self.label, "resolved again: {:?}", fresh);
        self.addrs.store(Arc::new(fresh));
        true
    }

    /// How to speak to this backend, if known: pinned, detected, or plain HTTP/1.1 when
    /// detection does not apply. `None`: detect first.
    pub fn wire(&self) -> Option<Wire> {
        if self.pinned.is_some() {
            return self.pinned;
        }
        if !self.detection_allowed.load(Ordering::Relaxed) {
            return Some(Wire::Http1);
        }
        Wire::from_u8(self.detected.load(Ordering::Relaxed))
    }

    /// Whether this backend's protocol may be detected: a health-checked route of the current
    /// routing table uses it. Set again by every new table.
    pub fn set_detection_allowed(&self, allowed: bool) {
        self.detection_allowed.store(allowed, Ordering::Relaxed);
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

    fn new(
        spec: ServerSpec,
        verify_tls: bool,
        workers: usize,
        pool_size: usize,
        down_for: Duration,
    ) -> Backend {
        let label: Box<str> = spec.authority().into();
        let addrs = arc_swap::ArcSwap::from_pointee(resolve(&spec));
        let pinned = spec.scheme.map(|scheme| match scheme {
            Scheme::Https => Wire::Tls,
            Scheme::H2c => Wire::H2c,
            Scheme::Http => Wire::Http1,
        });
        let authority = label
            .parse()
            .unwrap_or_else(|_| http::uri::Authority::from_static("backend"));
        let workers = workers.max(1);
        let health = Health::default();
        health
            .down_for_ms
            .store(down_for.as_millis() as u64, Ordering::Relaxed);
        Backend {
            spec,
            label,
            addrs,
            pinned,
            detected: AtomicU8::new(0),
            detection_allowed: AtomicBool::new(false),
            detecting: tokio::sync::Mutex::new(()),
            verify_tls,
            authority,
            health,
            slots: (0..workers).map(|_| WorkerSlot::default()).collect(),
            idle_per_worker: pool_size.div_ceil(workers),
        }
    }

    /// In rotation: the last health check passed (or none ran) and passive health has not
    /// marked it down (or its time out has passed; then it gets another chance).
    pub fn is_up(&self) -> bool {
        !self.health.probe_down.load(Ordering::Relaxed) && self.passive_up()
    }

    /// Passive health only (for routes with `healthcheck: false`).
    pub fn passive_up(&self) -> bool {
        let until = self.health.down_until_ms.load(Ordering::Relaxed);
        until == 0 || now_ms() >= until
    }

    /// Records a health check round's verdict; a pass also clears passive marking.
    pub fn set_probed(&self, healthy: bool) {
        let was_down = self.health.probe_down.swap(!healthy, Ordering::Relaxed);
        if healthy {
            self.connect_succeeded();
        }
        match (was_down, healthy) {
            (false, false) => {
                tracing::warn!(backend = %self.label, "health check failed; out of rotation")
            }
            (true, true) => {
                tracing::info!(backend = %self.label, "health check passed; back in rotation")
            }
            _ => {}
        }
    }

    /// Records a failed connect; enough of them in a row take the backend out of rotation.
    pub fn connect_failed(&self) {
        let fails = self
            .health
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if fails >= FAILS_BEFORE_DOWN {
            self.forget_detection();
            let down_for = self.health.down_for_ms.load(Ordering::Relaxed);
            self.health
                .down_until_ms
                .store(now_ms() + down_for.max(1), Ordering::Relaxed);
            if fails == FAILS_BEFORE_DOWN {
                tracing::warn!(backend = %self.label, "backend marked down after {fails} failed connects");
            }
        }
    }

    /// Records a successful connect.
    pub fn connect_succeeded(&self) {
        if self.health.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.health.consecutive_failures.store(0, Ordering::Relaxed);
            self.health.down_until_ms.store(0, Ordering::Relaxed);
        }
    }
}

/// Creates backends, or hands out the live one for the same entry, so state survives reloads.
pub struct Registry {
    workers: usize,
    pool_size: usize,
    down_for: Duration,
    live: Mutex<HashMap<(ServerSpec, bool), Weak<Backend>>>,
}

impl Registry {
    pub fn new(workers: usize, pool_size: usize, down_for: Duration) -> Registry {
        Registry {
            workers,
            pool_size,
            down_for,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The backend for `spec` (with certificate verification or not): the existing one if any
    /// snapshot still holds it, else a new one.
    pub fn backend(&self, spec: &ServerSpec, verify_tls: bool) -> Arc<Backend> {
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (spec.clone(), verify_tls);
        if let Some(existing) = live.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        live.retain(|_, weak| weak.strong_count() > 0);
        let backend = Arc::new(Backend::new(
            spec.clone(),
            verify_tls,
            self.workers,
            self.pool_size,
            self.down_for,
        ));
        live.insert(key, Arc::downgrade(&backend));
        backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_server;

    #[test]
    fn registry_reuses_live_backends() {
        let reg = Registry::new(2, 8, Duration::from_secs(1));
        let spec = parse_server("127.0.0.1:9").unwrap();
        let a = reg.backend(&spec, false);
        let b = reg.backend(&spec, false);
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        let c = reg.backend(&spec, false);
        assert_eq!(&*c.label, "127.0.0.1:9");
        assert_eq!(c.idle_per_worker, 4);
    }

    #[test]
    fn host_names_resolve_and_re_resolve_without_change() {
        let reg = Registry::new(1, 8, Duration::from_secs(1));
        let named = reg.backend(&parse_server("localhost:8080").unwrap(), false);
        assert!(named
            .addrs()
            .iter()
            .any(|a| a.ip().is_loopback() && a.port() == 8080));
        assert!(!named.re_resolve(), "same answer: nothing swapped");
        let literal = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
        assert!(!literal.re_resolve(), "IP literals are never looked up");
        let missing = reg.backend(&parse_server("no-such-host.invalid:80").unwrap(), false);
        assert!(missing.addrs().is_empty());
        assert!(
            !missing.re_resolve(),
            "a failed lookup keeps what there was"
        );
    }

    #[test]
    fn passive_health_marks_down_after_three_failures() {
        let reg = Registry::new(1, 8, Duration::from_secs(60));
        let b = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
        b.connect_failed();
        b.connect_failed();
        assert!(b.is_up());
        b.connect_failed();
        assert!(!b.is_up());
        b.connect_succeeded();
        assert!(b.is_up());
    }

    #[test]
    fn probes_decide_and_a_pass_clears_passive_marking() {
        let reg = Registry::new(1, 8, Duration::from_secs(60));
        let b = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
        b.set_probed(false);
        assert!(!b.is_up());
        assert!(b.passive_up());
        for _ in 0..3 {
            b.connect_failed();
        }
        b.set_probed(true);
        assert!(
            b.is_up(),
            "a passing probe brings a passively marked backend back"
        );
    }
}
