//! The Prometheus text exposition of the [`Metrics`] registry (version 0.0.4): aralez's own
//! families, Aralez's names for them, the backends' health, and the standard `process_*` ones.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::upstreams::{self, UpstreamCounts};
use super::{
    load, BackendUp, Metrics, Shard, UpstreamFailure, BUCKETS, METHODS, STATUS_COUNT, STATUS_MIN,
    VERSIONS,
};

impl Metrics {
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
                list.retain(|counts| kept(&counts.label));
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
        let totals = upstreams::summed(self.shards.iter().map(|s| &s.by_upstream));
        let responses = |out: &mut String, name: &str| {
            for t in totals.iter().filter(|t| t.responses > 0) {
                let label = escape(&t.label);
                let _ = writeln!(out, "{name}{{upstream=\"{label}\"}} {}", t.responses);
            }
        };
        responses(out, name);
        // The same under Aralez's name (SPEC §11); `untyped`, as a counter's name ends in
        // `_total` and Aralez's does not.
        let name = "aralez_requests_by_upstream";
        header(
            out,
            name,
            "untyped",
            "Responses by the backend that sent them (Aralez's name).",
        );
        responses(out, name);
        render_upstream_failures(out, &totals);
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
        let name = "aralez_discovery_failures_total";
        let help = "Failed Consul queries and Kubernetes lists or watches; the backends found before keep serving.";
        header(out, name, "counter", help);
        for registry in super::Discovery::ALL {
            let n = self.discovery_failures[registry as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{source=\"{}\"}} {n}", registry.as_str());
        }
        let name = "aralez_rate_limited_total";
        header(out, name, "counter", "Requests refused by a rate limit.");
        let _ = writeln!(out, "{name} {}", self.sum(|s| load(&s.rate_limited)));
        let name = "aralez_tls_handshake_failures_total";
        let help = "Client TLS handshakes that failed, by why.";
        header(out, name, "counter", help);
        for (why, n) in self.tls_failures.each() {
            let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", why.as_str());
        }
    }
}

/// The failed exchanges per backend and why, and the requests sent on after them.
fn render_upstream_failures(out: &mut String, totals: &[UpstreamCounts]) {
    let name = "aralez_upstream_failures_total";
    let help = "Exchanges with the backend that failed, by why (connect, busy, timeout, reset, \
                bad_response, cut).";
    header(out, name, "counter", help);
    for t in totals {
        let label = escape(&t.label);
        for (failure, n) in UpstreamFailure::ALL.iter().zip(t.failures) {
            if n > 0 {
                let reason = failure.as_str();
                let _ = writeln!(
                    out,
                    "{name}{{upstream=\"{label}\",reason=\"{reason}\"}} {n}"
                );
            }
        }
    }
    let name = "aralez_upstream_retries_total";
    let help = "Requests sent on to another attempt after the backend failed them.";
    header(out, name, "counter", help);
    for t in totals.iter().filter(|t| t.retried > 0) {
        let _ = writeln!(
            out,
            "{name}{{upstream=\"{}\"}} {}",
            escape(&t.label),
            t.retried
        );
    }
}

/// A family's `# HELP` and `# TYPE` lines.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
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
pub fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}
