//! Process metrics (SPEC §11): the [`Metrics`] registry, built once at start and passed to
//! whoever counts (server, router, upstream pools, access log, reloader), rendered in the
//! Prometheus text format by [`Metrics::render_prometheus`]. A second proxy in one process
//! builds its own.
//!
//! Per-request counters live in one shard per worker (cache-line aligned, written only by that
//! worker with relaxed atomics; the worker is named by its [`WorkerId`]), so the hot path shares
//! no cache line; a scrape sums the shards. Every label has a bounded set of values: status codes 100..=599, a fixed method list
//! (others count as `OTHER`), four HTTP versions, and at most [`MAX_UPSTREAMS`] upstream labels
//! per shard (more count as `other`); a backend no longer configured is forgotten at the next
//! scrape.
//!
//! This module only counts and renders; serving `/metrics` is the admin API's job, which also
//! hands in the backends' health (`aralez_backend_up`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode, Version};

use crate::vocab::WorkerId;

/// Distinct upstream labels counted per shard before the rest go to `other`.
pub const MAX_UPSTREAMS: usize = 256;
const METHODS: [&str; 9] = [
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT",
];
const VERSIONS: [&str; 5] = ["HTTP/1.0", "HTTP/1.1", "HTTP/2", "HTTP/3", "OTHER"];
/// Method x version pairs counted per shard.
const KINDS: usize = (METHODS.len() + 1) * VERSIONS.len();
/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` is implied. Aralez's own
/// (0.001 ... 0.075, 0.1 ... 1, 2, 5) are all among them, so its dashboards' `le` still match.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0,
];
const STATUS_MIN: usize = 100;
/// The status counted and logged for a request whose client left before its answer (nginx's
/// 499).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;
const STATUS_COUNT: usize = 500;

/// One line of `aralez_backend_up`: a backend of a route, and whether it is in rotation.
pub struct BackendUp<'a> {
    pub host: &'a str,
    pub path: &'a str,
    pub backend: &'a str,
    pub up: bool,
}

/// Upper bounds (seconds) of the latency buckets of [`Totals::latency_buckets`], in order; the
/// last bucket there counts what took longer than the largest bound.
pub const LATENCY_BOUNDS: &[f64] = &BUCKETS;

/// The request counters summed over the shards at one moment, since start (for the admin
/// side's history; reading them costs the request path nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests received.
    pub requests: u64,
    /// Responses by status class: 1xx, 2xx, 3xx, 4xx, 5xx.
    pub responses: [u64; 5],
    /// Responses per latency bucket of [`LATENCY_BOUNDS`] (not cumulative), then one for
    /// those slower than the largest bound.
    pub latency_buckets: [u64; BUCKETS.len() + 1],
    /// Sum of the response latencies, in microseconds.
    pub latency_sum_micros: u64,
}

/// Every counter of one proxy.
pub struct Metrics {
    /// One per worker, then one for every other thread.
    shards: Box<[Shard]>,
    /// Open client connections of the proxy listeners (`aralez_active_sessions`), kept by the
    /// server, which also enforces `max_connections` with it.
    pub open_connections: Arc<AtomicUsize>,
    /// Of those, the ones parked between HTTP/1 requests (`aralez_parked_sessions`).
    pub parked_connections: Arc<AtomicUsize>,
    logging_errors: AtomicU64,
    reloads: Mutex<Vec<(Box<str>, bool, u64)>>,
    tls_failures: TlsFailures,
    /// Failed Consul queries and Kubernetes lists or watches, by [`Discovery`].
    discovery_failures: [AtomicU64; 2],
}

/// A service registry backends are discovered from.
#[derive(Clone, Copy, Debug)]
pub enum Discovery {
    Consul = 0,
    Kubernetes = 1,
}

impl Discovery {
    const ALL: [Discovery; 2] = [Discovery::Consul, Discovery::Kubernetes];

    pub fn as_str(self) -> &'static str {
        match self {
            Discovery::Consul => "consul",
            Discovery::Kubernetes => "kubernetes",
        }
    }
}

#[repr(align(128))]
struct Shard {
    by_status: [AtomicU64; STATUS_COUNT],
    /// Requests by method (row; `OTHER` last) and HTTP version (column).
    by_method_version: [AtomicU64; KINDS],
    /// Responses per latency bucket; the last one counts what took longer than every bound, so
    /// the buckets add up to the count and no separate counter can run ahead of them.
    latency_buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_micros: AtomicU64,
    upstream_connections: [AtomicU64; 2],
    rate_limited: AtomicU64,
    by_upstream: Mutex<Vec<UpstreamCounts>>,
}

impl Shard {
    const fn new() -> Shard {
        Shard {
            by_status: [const { AtomicU64::new(0) }; STATUS_COUNT],
            by_method_version: [const { AtomicU64::new(0) }; KINDS],
            latency_buckets: [const { AtomicU64::new(0) }; BUCKETS.len() + 1],
            latency_sum_micros: AtomicU64::new(0),
            upstream_connections: [const { AtomicU64::new(0) }; 2],
            rate_limited: AtomicU64::new(0),
            by_upstream: Mutex::new(Vec::new()),
        }
    }
}

impl Metrics {
    /// Counters for `workers` workers.
    pub fn new(workers: usize) -> Metrics {
        Metrics {
            shards: (0..=workers).map(|_| Shard::new()).collect(),
            open_connections: Arc::new(AtomicUsize::new(0)),
            parked_connections: Arc::new(AtomicUsize::new(0)),
            logging_errors: AtomicU64::new(0),
            reloads: Mutex::new(Vec::new()),
            tls_failures: TlsFailures::default(),
            discovery_failures: Default::default(),
        }
    }

    /// The shard `worker` writes (threads that are no worker share the last).
    fn shard(&self, worker: WorkerId) -> &Shard {
        let last = self.shards.len() - 1;
        &self.shards[worker.0.min(last)]
    }

    /// Counts a request as it arrives.
    pub fn request_started(&self, worker: WorkerId, method: &Method, version: Version) {
        let m = METHODS
            .iter()
            .position(|m| *m == method.as_str())
            .unwrap_or(METHODS.len());
        let v = match version {
            Version::HTTP_10 => 0,
            Version::HTTP_11 => 1,
            Version::HTTP_2 => 2,
            Version::HTTP_3 => 3,
            _ => 4,
        };
        bump(&self.shard(worker).by_method_version[m * VERSIONS.len() + v]);
    }

    /// Counts a response head: its status, the time it took, and the backend that sent it.
    pub fn response_ready(
        &self,
        worker: WorkerId,
        status: StatusCode,
        elapsed: Duration,
        upstream: Option<&str>,
    ) {
        self.count_answer(worker, status.as_u16(), elapsed, upstream);
    }

    /// Counts a request refused before it could be read as one (hyper answered `status` to a
    /// malformed or oversized head): method and version `OTHER`, and its status.
    pub fn request_refused(&self, worker: WorkerId, status: StatusCode) {
        let shard = self.shard(worker);
        bump(&shard.by_method_version[KINDS - 1]);
        self.count_answer(worker, status.as_u16(), Duration::ZERO, None);
    }

    /// Counts a request dropped because its client left before the answer, as
    /// [`CLIENT_CLOSED_REQUEST`]: a status, not a latency (there was no response head; the time
    /// the client waited went into the histogram of request head to response head, and into
    /// the status page's p99).
    pub fn client_left(&self, worker: WorkerId) {
        let index = usize::from(CLIENT_CLOSED_REQUEST).saturating_sub(STATUS_MIN);
        if let Some(counter) = self.shard(worker).by_status.get(index) {
            bump(counter);
        }
    }

    fn count_answer(
        &self,
        worker: WorkerId,
        status: u16,
        elapsed: Duration,
        upstream: Option<&str>,
    ) {
        let shard = self.shard(worker);
        let index = usize::from(status).saturating_sub(STATUS_MIN);
        if let Some(counter) = shard.by_status.get(index) {
            bump(counter);
        }
        let secs = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|upper| secs <= *upper)
            .unwrap_or(BUCKETS.len());
        bump(&shard.latency_buckets[bucket]);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        shard
            .latency_sum_micros
            .fetch_add(micros, Ordering::Relaxed);
        if let Some(label) = upstream {
            upstreams::count(&shard.by_upstream, label, |c| c.responses += 1);
        }
    }

    /// Counts a connection to a backend: a reused pooled one or a new one.
    pub fn upstream_connection(&self, worker: WorkerId, reused: bool) {
        bump(&self.shard(worker).upstream_connections[usize::from(reused)]);
    }

    /// Counts an exchange with the backend `label` that failed, and why (`worker`'s shard;
    /// a body cut after its head is counted from whichever thread reads it).
    #[cold]
    pub fn upstream_failed(&self, worker: WorkerId, label: &str, failure: UpstreamFailure) {
        upstreams::count(&self.shard(worker).by_upstream, label, |c| {
            c.failures[failure as usize] += 1;
        });
    }

    /// Counts a request that went on to another attempt after the backend `label` failed it:
    /// to the next backend, or again on a fresh connection to this one.
    #[cold]
    pub fn upstream_retried(&self, worker: WorkerId, label: &str) {
        upstreams::count(&self.shard(worker).by_upstream, label, |c| c.retried += 1);
    }

    /// Counts a client's TLS handshake that failed, and why.
    #[cold]
    pub fn tls_handshake_failed(&self, why: TlsFailure) {
        self.tls_failures.count(why);
    }

    /// Counts a request refused by a rate limit.
    pub fn rate_limited(&self, worker: WorkerId) {
        bump(&self.shard(worker).rate_limited);
    }

    /// Counts an access log line that was dropped (or could not be written).
    pub fn logging_error(&self) {
        self.logging_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed query, list or watch of `registry`: the backends it had found keep
    /// serving meanwhile, unchanged (Prometheus' own `prometheus_sd_consul_rpc_failures_total`).
    pub fn discovery_failed(&self, registry: Discovery) {
        self.discovery_failures[registry as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a configuration reload from `source` (`SIGHUP`, `file`, `api`, ...), applied or not.
    pub fn config_reload(&self, source: &str, applied: bool) {
        let Ok(mut list) = self.reloads.lock() else {
            return;
        };
        let source = if list.len() >= 32 { "other" } else { source };
        match list
            .iter_mut()
            .find(|(s, ok, _)| &**s == source && *ok == applied)
        {
            Some(entry) => entry.2 += 1,
            None => list.push((source.into(), applied, 1)),
        }
    }

    fn sum(&self, f: impl Fn(&Shard) -> u64) -> u64 {
        self.shards.iter().map(f).sum()
    }

    /// Requests received, summed over methods, versions and shards.
    pub fn requests(&self) -> u64 {
        self.sum(|s| s.by_method_version.iter().map(load).sum())
    }

    /// The request counters now, summed over the shards (see [`Totals`]).
    pub fn totals(&self) -> Totals {
        let mut responses = [0; 5];
        for (index, class) in responses.iter_mut().enumerate() {
            let codes = index * 100..(index + 1) * 100;
            *class = self.sum(|s| s.by_status[codes.clone()].iter().map(load).sum());
        }
        let mut latency_buckets = [0; BUCKETS.len() + 1];
        for (index, bucket) in latency_buckets.iter_mut().enumerate() {
            *bucket = self.sum(|s| load(&s.latency_buckets[index]));
        }
        Totals {
            requests: self.requests(),
            responses,
            latency_buckets,
            latency_sum_micros: self.sum(|s| load(&s.latency_sum_micros)),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

mod render;
mod tls_failures;
mod upstreams;

pub use render::{escape as escape_label_value, header as family_header};
pub use tls_failures::TlsFailure;
use tls_failures::TlsFailures;

use upstreams::UpstreamCounts;
pub use upstreams::UpstreamFailure;

#[cfg(test)]
mod tests;
