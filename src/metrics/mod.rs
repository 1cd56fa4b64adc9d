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

use std::fmt::Write as _;
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
    by_upstream: Mutex<Vec<(Box<str>, u64)>>,
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
    /// [`CLIENT_CLOSED_REQUEST`].
    pub fn client_left(&self, worker: WorkerId, elapsed: Duration) {
        self.count_answer(worker, CLIENT_CLOSED_REQUEST, elapsed, None);
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
            count_upstream(shard, label);
        }
    }

    /// Counts a connection to a backend: a reused pooled one or a new one.
    pub fn upstream_connection(&self, worker: WorkerId, reused: bool) {
        bump(&self.shard(worker).upstream_connections[usize::from(reused)]);
    }

    /// Counts a request refused by a rate limit.
    pub fn rate_limited(&self, worker: WorkerId) {
        bump(&self.shard(worker).rate_limited);
    }

    /// Counts an access log line that was dropped (or could not be written).
    pub fn logging_error(&self) {
        self.logging_errors.fetch_add(1, Ordering::Relaxed);
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

    /// Renders every metric in the Prometheus text exposition format (version 0.0.4).
    pub fn render_prometheus<'a>(&self, backends: impl Iterator<Item = BackendUp<'a>>) -> String {
        let mut out = String::with_capacity(8192);
        self.render_requests(&mut out);
        self.render_latency(&mut out);
        self.render_upstreams(&mut out, backends);
        let process = ProcessNow::read();
        self.render_process(&mut out, &process);
        self.render_control(&mut out);
        render_standard(&mut out, &process);
        out
    }

    fn render_requests(&self, out: &mut String) {
        let name = "aralez_requests_total";
        header(
            out,
            name,
            "counter",
            "Requests received, by method (others as OTHER) and HTTP version.",
        );
        let methods = METHODS.iter().chain(["OTHER"].iter());
        for (m, method) in methods.enumerate() {
            for (v, version) in VERSIONS.iter().enumerate() {
                let n = self.sum(|s| load(&s.by_method_version[m * VERSIONS.len() + v]));
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "{name}{{method=\"{method}\",version=\"{version}\"}} {n}"
                    );
                }
            }
        }
        self.render_aralez_request_families(out);
        header(
            out,
            "aralez_responses_total",
            "counter",
            "Responses sent, by status code.",
        );
        for index in 0..STATUS_COUNT {
            let n = self.sum(|s| load(&s.by_status[index]));
            if n > 0 {
                let status = index + STATUS_MIN;
                let _ = writeln!(out, "aralez_responses_total{{status=\"{status}\"}} {n}");
            }
        }
    }

    /// Aralez's own request families (SPEC §11), for its dashboards: by method alone and by
    /// version alone (`aralez_requests_total` carries both labels here).
    fn render_aralez_request_families(&self, out: &mut String) {
        let count =
            |m: usize, v: usize| self.sum(|s| load(&s.by_method_version[m * VERSIONS.len() + v]));
        let name = "aralez_requests_by_method_total";
        header(
            out,
            name,
            "counter",
            "Requests received, by method (others as OTHER).",
        );
        let methods = METHODS.iter().chain(["OTHER"].iter());
        for (m, method) in methods.enumerate() {
            let n: u64 = (0..VERSIONS.len()).map(|v| count(m, v)).sum();
            if n > 0 {
                let _ = writeln!(out, "{name}{{method=\"{method}\"}} {n}");
            }
        }
        let name = "aralez_requests_by_version_total";
        header(out, name, "counter", "Requests received, by HTTP version.");
        for (v, version) in VERSIONS.iter().enumerate() {
            let n: u64 = (0..=METHODS.len()).map(|m| count(m, v)).sum();
            if n > 0 {
                let _ = writeln!(out, "{name}{{version=\"{version}\"}} {n}");
            }
        }
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

    /// A counter family with one label, each value summed over the shards.
    fn labelled<'a, F: Fn(&Shard) -> u64>(
        &self,
        out: &mut String,
        (name, label): (&str, &str),
        help: &str,
        values: impl Iterator<Item = (&'a str, F)>,
    ) {
        header(out, name, "counter", help);
        for (value, counter) in values {
            let n = self.sum(counter);
            let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
        }
    }

    fn render_latency(&self, out: &mut String) {
        let name = "aralez_response_latency_seconds";
        header(
            out,
            name,
            "histogram",
            "Time from request head to response head.",
        );
        let mut cumulative = 0;
        for (index, upper) in BUCKETS.iter().enumerate() {
            cumulative += self.sum(|s| load(&s.latency_buckets[index]));
            let _ = writeln!(out, "{name}_bucket{{le=\"{upper}\"}} {cumulative}");
        }
        // The `+Inf` bucket is every response: the buckets above plus the overflow one.
        let count = cumulative + self.sum(|s| load(&s.latency_buckets[BUCKETS.len()]));
        let micros = self.sum(|s| load(&s.latency_sum_micros));
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", micros as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }

    /// Forgets the per-backend counts of backends no longer configured (`configured`): their
    /// series end, and their places go to new ones. Churned pods kept theirs for good, and once
    /// [`MAX_UPSTREAMS`] were taken the new ones counted as `other`.
    fn forget_gone_upstreams(&self, configured: &[BackendUp<'_>]) {
        // A set first: the workers count under the same locks.
        let configured: std::collections::HashSet<&str> =
            configured.iter().map(|b| b.backend).collect();
        let kept = |label: &str| label == "other" || configured.contains(label);
        for shard in self.shards.iter() {
            if let Ok(mut list) = shard.by_upstream.lock() {
                list.retain(|(label, _)| kept(label));
            }
        }
    }

    fn render_upstreams<'a>(
        &self,
        out: &mut String,
        backends: impl Iterator<Item = BackendUp<'a>>,
    ) {
        let backends: Vec<BackendUp<'a>> = backends.collect();
        self.forget_gone_upstreams(&backends);
        let name = "aralez_upstream_responses_total";
        header(
            out,
            name,
            "counter",
            "Responses by the backend that sent them.",
        );
        let mut totals: Vec<(Box<str>, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let Ok(list) = shard.by_upstream.lock() else {
                continue;
            };
            for (label, n) in list.iter() {
                match totals.iter_mut().find(|(l, _)| l == label) {
                    Some(entry) => entry.1 += n,
                    None => totals.push((label.clone(), *n)),
                }
            }
        }
        totals.sort();
        for (label, n) in &totals {
            let _ = writeln!(out, "{name}{{upstream=\"{}\"}} {n}", escape(label));
        }
        // The same under Aralez's name (SPEC §11); `untyped`, as a counter's name ends in
        // `_total` and Aralez's does not.
        let name = "aralez_requests_by_upstream";
        header(
            out,
            name,
            "untyped",
            "Responses by the backend that sent them (Aralez's name).",
        );
        for (label, n) in &totals {
            let _ = writeln!(out, "{name}{{upstream=\"{}\"}} {n}", escape(label));
        }
        self.labelled(
            out,
            ("aralez_upstream_connections_total", "reused"),
            "Backend connections used, new or reused from the pool.",
            ["false", "true"]
                .iter()
                .enumerate()
                .map(|(i, r)| (*r, move |s: &Shard| load(&s.upstream_connections[i]))),
        );
        let name = "aralez_backend_up";
        header(
            out,
            name,
            "gauge",
            "1 when the backend is in rotation, 0 when health took it out.",
        );
        for b in &backends {
            let _ = writeln!(
                out,
                "{name}{{upstream=\"{}\",path=\"{}\",backend=\"{}\"}} {}",
                escape(b.host),
                escape(b.path),
                escape(b.backend),
                u8::from(b.up)
            );
        }
    }

    fn render_process(&self, out: &mut String, process: &ProcessNow) {
        let open = self.open_connections.load(Ordering::Relaxed);
        let help = "Open client connections.";
        gauge(out, "aralez_active_sessions", help, open);
        let parked = self.parked_connections.load(Ordering::Relaxed);
        let help = "Open client connections idle between HTTP/1 requests, holding no HTTP buffers.";
        gauge(out, "aralez_parked_sessions", help, parked);
        let help = "Resident memory of the process.";
        gauge(out, "aralez_memory_bytes", help, process.resident_bytes);
        let help = "Open file descriptors.";
        gauge(out, "aralez_open_files", help, process.open_fds);
        let name = "aralez_logging_errors_total";
        header(
            out,
            name,
            "counter",
            "Access log lines dropped or not written.",
        );
        let errors = self.logging_errors.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name} {errors}");
        let name = "aralez_logging_errors";
        header(
            out,
            name,
            "untyped",
            "Access log lines dropped or not written (Aralez's name).",
        );
        let _ = writeln!(out, "{name} {errors}");
    }

    fn render_control(&self, out: &mut String) {
        let name = "aralez_config_reloads_total";
        header(
            out,
            name,
            "counter",
            "Configuration reloads by source and result.",
        );
        if let Ok(list) = self.reloads.lock() {
            for (source, applied, n) in list.iter() {
                let result = if *applied { "applied" } else { "rejected" };
                let source = escape(source);
                let _ = writeln!(out, "{name}{{source=\"{source}\",result=\"{result}\"}} {n}");
            }
        }
        let name = "aralez_rate_limited_total";
        header(out, name, "counter", "Requests refused by a rate limit.");
        let _ = writeln!(out, "{name} {}", self.sum(|s| load(&s.rate_limited)));
    }
}

fn count_upstream(shard: &Shard, label: &str) {
    let Ok(mut list) = shard.by_upstream.lock() else {
        return;
    };
    if let Some(entry) = list.iter_mut().find(|(l, _)| &**l == label) {
        entry.1 += 1;
    } else if list.len() < MAX_UPSTREAMS {
        list.push((label.into(), 1));
    } else if let Some(entry) = list.iter_mut().find(|(l, _)| &**l == "other") {
        entry.1 += 1;
    } else {
        list.push(("other".into(), 1));
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One unlabelled gauge, with its header.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

/// What /proc says of this process at a scrape, read once for both aralez's own names
/// (SPEC §11) and the standard `process_*` ones.
struct ProcessNow {
    resident_bytes: u64,
    open_fds: usize,
}

impl ProcessNow {
    fn read() -> ProcessNow {
        ProcessNow {
            resident_bytes: crate::allocator::resident_bytes(),
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count),
        }
    }
}

/// The standard `process_*` metrics of Prometheus' client libraries (from /proc, whose times
/// are in USER_HZ = 100 ticks a second), and `aralez_build_info`.
fn render_standard(out: &mut String, process: &ProcessNow) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let field = |n: usize| fields.get(n).and_then(|f| f.parse::<f64>().ok());
    const TICKS: f64 = 100.0;
    // utime and stime are fields 14 and 15 of stat(5); `fields[0]` is field 3.
    if let (Some(user), Some(system)) = (field(11), field(12)) {
        header(
            out,
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
        );
        let _ = writeln!(out, "process_cpu_seconds_total {}", (user + system) / TICKS);
    }
    let boot = std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    if let (Some(boot), Some(start)) = (boot, field(19)) {
        header(
            out,
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
        );
        let _ = writeln!(out, "process_start_time_seconds {}", boot + start / TICKS);
    }
    if let Some(virt) = field(20) {
        header(
            out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
        );
        let _ = writeln!(out, "process_virtual_memory_bytes {virt}");
    }
    header(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
    );
    let _ = writeln!(
        out,
        "process_resident_memory_bytes {}",
        process.resident_bytes
    );
    header(
        out,
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
    );
    let _ = writeln!(out, "process_open_fds {}", process.open_fds);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).map(str::to_string));
    if let Some(max) = max_fds.filter(|m| m.bytes().all(|b| b.is_ascii_digit())) {
        header(
            out,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
        );
        let _ = writeln!(out, "process_max_fds {max}");
    }
    header(
        out,
        "aralez_build_info",
        "gauge",
        "The running build: version and git commit.",
    );
    let _ = writeln!(
        out,
        "aralez_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        env!("ARALEZ_COMMIT")
    );
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

#[cfg(test)]
mod tests;
