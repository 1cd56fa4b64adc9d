//! The [`Registry`] of backends: one [`Backend`] per server entry (and certificate choice) for as
//! long as some snapshot holds it, so a reload keeps health and pooled connections, and a new
//! one's host name looked up when it is made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::Backend;
use crate::config::values::ServerSpec;
use crate::metrics::Metrics;

/// Creates backends, or hands out the live one for the same entry, so state survives reloads.
pub struct Registry {
    pub(super) workers: usize,
    pub(super) pool_size: usize,
    /// `upstream_max_connections`: open connections per backend, across workers.
    pub(super) max_conns: usize,
    pub(super) down_for: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) live: Mutex<Live>,
    /// Host name lookups running ([`super::lookup`]).
    lookups: Arc<std::sync::atomic::AtomicUsize>,
}

impl Registry {
    /// `workers` slots per backend (and one for threads that are no worker) sharing
    /// `pool_size` idle connections; `down_for`: how long
    /// passive health keeps a failing backend out; connections counted in `metrics`.
    pub fn new(
        workers: usize,
        pool_size: usize,
        down_for: Duration,
        metrics: Arc<Metrics>,
    ) -> Registry {
        Registry {
            workers,
            pool_size,
            max_conns: usize::MAX,
            down_for,
            metrics,
            live: Mutex::default(),
            lookups: Arc::default(),
        }
    }

    /// At most `max` open connections per backend (`upstream_max_connections`).
    pub fn with_max_connections(mut self, max: usize) -> Registry {
        self.max_conns = max.max(1);
        self
    }

    /// A registry with its own metrics and a pool of 8 (unit tests).
    pub fn for_tests(workers: usize, down_for: Duration) -> Registry {
        Registry::new(workers, 8, down_for, Arc::new(Metrics::new(workers)))
    }

    /// The backend for `spec` (with certificate verification or not): the existing one if any
    /// snapshot still holds it, else a new one.
    pub fn backend(&self, spec: &ServerSpec, verify_tls: bool) -> Arc<Backend> {
        let backend = self.backend_unresolved(spec, verify_tls);
        // Looked up once, when made, outside the registry's lock.
        let made = Arc::strong_count(&backend) == 1;
        if made && spec.ip_addr().is_none() && backend.addrs().is_empty() {
            let (spec, running) = (spec.clone(), &self.lookups);
            let lookup = move || crate::upstream::lookup::resolve(&spec);
            crate::upstream::lookup::first_lookup(
                &backend,
                running,
                lookup,
                crate::upstream::lookup::WAIT,
            );
        }
        backend
    }

    /// [`Registry::backend`] without looking a new one's host name up.
    pub(in crate::upstream) fn backend_unresolved(
        &self,
        spec: &ServerSpec,
        verify_tls: bool,
    ) -> Arc<Backend> {
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (spec.clone(), verify_tls);
        if let Some(existing) = live.backends.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        live.sweep_when_grown();
        let backend = Arc::new(Backend::new(spec.clone(), verify_tls, self));
        live.backends.insert(key, Arc::downgrade(&backend));
        backend
    }
}

/// The backends some snapshot may still hold, by entry.
#[derive(Default)]
pub(super) struct Live {
    pub(super) backends: HashMap<(ServerSpec, bool), Weak<Backend>>,
    /// The size at which entries no snapshot holds any more are swept out: twice what was
    /// left by the last sweep. A sweep on every new backend made a discovery answer of 100,000
    /// backends take 100,000 walks over up to as many (half a minute of the control plane).
    pub(super) sweep_at: usize,
}

impl Live {
    fn sweep_when_grown(&mut self) {
        if self.backends.len() < self.sweep_at {
            return;
        }
        self.backends.retain(|_, weak| weak.strong_count() > 0);
        self.sweep_at = (2 * self.backends.len()).max(64);
    }
}
