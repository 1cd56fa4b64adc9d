//! The access log (SPEC §11): one line per request, written by a background thread.
//!
//! The sink ([`AccessLog`]) is built once at start and handed to the server; nothing here is
//! process-wide. Workers hand a small [`Entry`] to a bounded channel and never wait: when the writer falls
//! behind (a slow disk, a full pipe) the entry is dropped and counted in `aralez_logging_errors`.
//! The line is formatted and written on the writer thread, off the request path. Lines go to
//! `log_file` (appended, whole lines per write) or, without one, to stdout.
//!
//! Line format (logfmt, one per request, fields always in this order):
//! `access time=2026-01-02T03:04:05.678Z client=10.0.0.1 method=GET target="/a?b=1" host="x.org"
//! version=HTTP/1.1 status=200 bytes=512 duration_ms=1.234 request_id=5f0c... backend=10.0.0.5:8000`
//! (`client` is the real client: behind a trusted proxy, the one its `X-Forwarded-For` names)
//! (`status=-` when the client went away before a response; `host=-`, `backend=-` when absent).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Method, Uri, Version};

use crate::config::main_conf::AccessLog as Mode;
use crate::metrics::Metrics;
use crate::vocab::token_param::QUERY_PARAM;

/// Entries that may wait for the writer before new ones are dropped.
const DEFAULT_QUEUE: usize = 16384;
/// Bytes gathered before one write.
const BATCH_BYTES: usize = 32 * 1024;
/// After a line arrives the writer waits this long for more, so a busy proxy costs one wake-up
/// and one write per interval instead of one per request.
const GATHER: Duration = Duration::from_millis(10);

/// What a worker records about one request; formatted later by the writer.
#[derive(Debug)]
pub struct Entry {
    pub time: SystemTime,
    pub start: Instant,
    pub client: IpAddr,
    /// The request's `X-Request-Id` (kept from a trusted proxy, or made).
    pub request_id: Option<HeaderValue>,
    pub method: Method,
    pub target: Uri,
    pub version: Version,
    pub host: Option<HeaderValue>,
    pub status: Option<u16>,
    pub bytes: u64,
    pub duration: Duration,
    /// The label of the backend that answered.
    pub backend: Option<Arc<str>>,
}

/// What workers (and the shutdown) send to the writer.
enum Msg {
    Line(Box<Entry>),
    /// Write everything queued, then answer.
    Flush(std::sync::mpsc::Sender<()>),
    /// Wakes the writer to reopen the log file (SIGUSR1; the flag in [`Sink`] says so).
    Reopen,
}

struct Sink {
    mode: Mode,
    tx: SyncSender<Msg>,
    /// Set by SIGUSR1: the writer opens the file's path again before it writes more.
    reopen: Arc<AtomicBool>,
    /// Where dropped and unwritten lines are counted.
    metrics: Arc<Metrics>,
}

/// The access log of one proxy: where workers send their records (nowhere when it is off).
#[derive(Clone, Default)]
pub struct AccessLog(Option<Arc<Sink>>);

/// Why the access log could not start.
#[derive(Debug, thiserror::Error)]
pub enum AccessLogError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the access log writer: {0}")]
    Thread(std::io::Error),
}

/// Starts the writer when `mode` is not `Off`. The destination is opened here (before privileges
/// are dropped). `ARALEZ_ACCESS_LOG_QUEUE` overrides the queue length (tuning and tests).
pub fn start(
    mode: Mode,
    log_file: Option<&Path>,
    metrics: Arc<Metrics>,
) -> Result<AccessLog, AccessLogError> {
    if mode == Mode::Off {
        return Ok(AccessLog::default());
    }
    let writer: Box<dyn Write + Send> = match log_file {
        Some(path) => Box::new(open_append(path).map_err(|source| AccessLogError::Open {
            path: path.display().to_string(),
            source,
        })?),
        None => Box::new(std::io::stdout()),
    };
    let queue = std::env::var("ARALEZ_ACCESS_LOG_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_QUEUE);
    let (tx, rx) = sync_channel::<Msg>(queue);
    let writer_metrics = metrics.clone();
    let out = Output {
        path: log_file.map(Path::to_path_buf),
        out: writer,
    };
    let reopen = Arc::new(AtomicBool::new(false));
    let writer_reopen = reopen.clone();
    std::thread::Builder::new()
        .name("aralez-access-log".into())
        .spawn(move || write_loop(rx, out, &writer_reopen, &writer_metrics))
        .map_err(AccessLogError::Thread)?;
    Ok(AccessLog(Some(Arc::new(Sink {
        mode,
        tx,
        reopen,
        metrics,
    }))))
}

impl AccessLog {
    /// Starts a record for a request (an empty one when the access log is off).
    pub fn begin(
        &self,
        client: IpAddr,
        method: &Method,
        target: &Uri,
        version: Version,
        host: Option<&HeaderValue>,
        start: Instant,
    ) -> Record {
        let Some(sink) = &self.0 else {
            return Record(None);
        };
        let entry = Box::new(Entry {
            time: SystemTime::now(),
            start,
            client,
            request_id: None,
            method: method.clone(),
            target: target.clone(),
            version,
            host: host.cloned().or_else(|| {
                target
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            }),
            status: None,
            bytes: 0,
            duration: Duration::ZERO,
            backend: None,
        });
        Record(Some((entry, sink.clone())))
    }
}

/// One request's pending line; submitted when dropped (after the body, or when the client left).
pub struct Record(Option<(Box<Entry>, Arc<Sink>)>);

impl Record {
    /// Notes the response head. In `error` mode, a successful response is not logged.
    pub fn respond(&mut self, status: u16, backend: Option<&Arc<str>>) {
        let Some((entry, sink)) = self.0.as_mut() else {
            return;
        };
        if status < 400 && sink.mode == Mode::Errors {
            self.0 = None;
            return;
        }
        entry.status = Some(status);
        entry.backend = backend.cloned();
    }

    /// Notes the request's id.
    pub fn request_id(&mut self, id: &HeaderValue) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.request_id = Some(id.clone());
        }
    }

    /// Adds body bytes sent to the client.
    pub fn add_bytes(&mut self, n: usize) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.bytes += n as u64;
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let Some((mut entry, sink)) = self.0.take() else {
            return;
        };
        entry.duration = entry.start.elapsed();
        match sink.tx.try_send(Msg::Line(entry)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                sink.metrics.logging_error();
            }
        }
    }
}

impl AccessLog {
    /// Has the writer open its file's path again before it writes more (SIGUSR1); lines queued
    /// before go to the old file or the new one.
    pub fn reopen(&self) {
        if let Some(sink) = &self.0 {
            sink.reopen.store(true, Ordering::Relaxed);
            // A wake-up only: a full queue means the writer is busy and sees the flag anyway.
            let _ = sink.tx.try_send(Msg::Reopen);
        }
    }

    /// Writes what is queued before the process exits (waits up to one second).
    pub fn flush(&self) {
        if let Some(sink) = &self.0 {
            flush_sink(sink);
        }
    }
}

fn flush_sink(sink: &Sink) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut msg = Msg::Flush(done_tx);
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match sink.tx.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                msg = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// The log file, created if missing, written at its end (at start and on SIGUSR1 alike).
fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Where lines go: stdout, or a file that SIGUSR1 reopens at its path.
struct Output {
    path: Option<PathBuf>,
    out: Box<dyn Write + Send>,
}

impl Output {
    fn reopen(&mut self) {
        let Some(path) = &self.path else {
            return;
        };
        match open_append(path) {
            Ok(file) => self.out = Box::new(file),
            Err(e) => tracing::warn!(
                "access log: cannot reopen {}: {e}; still writing to the old file",
                path.display()
            ),
        }
    }
}

/// What a gathered burst of messages asked for besides lines.
#[derive(Default)]
struct Asked {
    flushed: Option<std::sync::mpsc::Sender<()>>,
}

impl Asked {
    fn take(&mut self, msg: Msg, batch: &mut String, clock: &mut Clock, lines: &mut u64) {
        match msg {
            Msg::Line(entry) => {
                format_line(batch, clock, &entry);
                *lines += 1;
            }
            Msg::Flush(done) => self.flushed = Some(done),
            Msg::Reopen => {}
        }
    }
}

fn write_loop(rx: Receiver<Msg>, mut out: Output, reopen: &AtomicBool, metrics: &Metrics) {
    let mut batch = String::with_capacity(BATCH_BYTES * 2);
    let mut clock = Clock::default();
    let mut lines = 0;
    while let Ok(msg) = rx.recv() {
        let mut asked = Asked::default();
        let gather = matches!(msg, Msg::Line(_));
        asked.take(msg, &mut batch, &mut clock, &mut lines);
        if gather {
            std::thread::sleep(GATHER);
        }
        if reopen.swap(false, Ordering::Relaxed) {
            out.reopen();
        }
        while let Ok(msg) = rx.try_recv() {
            asked.take(msg, &mut batch, &mut clock, &mut lines);
            if batch.len() >= BATCH_BYTES {
                write_batch(&mut out.out, &mut batch, &mut lines, metrics);
            }
        }
        write_batch(&mut out.out, &mut batch, &mut lines, metrics);
        if let Some(done) = asked.flushed {
            let _ = done.send(());
        }
    }
}

fn write_batch(
    out: &mut Box<dyn Write + Send>,
    batch: &mut String,
    lines: &mut u64,
    metrics: &Metrics,
) {
    if batch.is_empty() {
        return;
    }
    if out
        .write_all(batch.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        for _ in 0..*lines {
            metrics.logging_error();
        }
    }
    batch.clear();
    *lines = 0;
}

/// The formatted `YYYY-MM-DDTHH:MM:SS` of the last second seen, reused within that second.
#[derive(Default)]
pub struct Clock {
    second: u64,
    text: String,
}

/// Appends one access log line (with its newline) for `e`.
pub fn format_line(out: &mut String, clock: &mut Clock, e: &Entry) {
    out.push_str("access time=");
    write_time(out, clock, e.time);
    out.push_str(" client=");
    push_ip(out, e.client);
    out.push_str(" method=");
    push_escaped(out, e.method.as_str().as_bytes());
    out.push_str(" target=\"");
    // Origin form for every version: HTTP/2's absolute URI loses its authority (that is `host`).
    let target = e.target.path_and_query().map_or("/", |p| p.as_str());
    push_target(out, target);
    out.push_str("\" host=");
    match &e.host {
        Some(h) => {
            out.push('"');
            push_escaped(out, h.as_bytes());
            out.push('"');
        }
        None => out.push('-'),
    }
    out.push_str(" version=");
    out.push_str(match e.version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        _ => "HTTP/3.0",
    });
    out.push_str(" status=");
    match e.status {
        Some(s) => push_int(out, u64::from(s)),
        None => out.push('-'),
    }
    out.push_str(" bytes=");
    push_int(out, e.bytes);
    out.push_str(" duration_ms=");
    let micros = u64::try_from(e.duration.as_micros()).unwrap_or(u64::MAX);
    push_int(out, micros / 1000);
    out.push('.');
    push_padded(out, micros % 1000, 3);
    out.push_str(" request_id=");
    match &e.request_id {
        Some(id) => push_escaped(out, id.as_bytes()),
        None => out.push('-'),
    }
    out.push_str(" backend=");
    match &e.backend {
        Some(b) => push_escaped(out, b.as_bytes()),
        None => out.push('-'),
    }
    out.push('\n');
}

/// The target with the value of every `araleztoken` query parameter replaced by `REDACTED`: a
/// token must not outlive the request in a log file.
fn push_target(out: &mut String, target: &str) {
    let Some((path, query)) = target
        .split_once('?')
        .filter(|(_, q)| q.contains(QUERY_PARAM))
    else {
        push_escaped(out, target.as_bytes());
        return;
    };
    push_escaped(out, path.as_bytes());
    for (i, pair) in query.split('&').enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        match pair.split_once('=') {
            Some((name, _)) if name == QUERY_PARAM => {
                out.push_str(QUERY_PARAM);
                out.push_str("=REDACTED");
            }
            _ => push_escaped(out, pair.as_bytes()),
        }
    }
}

fn push_int(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// `n` with leading zeros to `width` digits.
fn push_padded(out: &mut String, n: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(n);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_int(out, u64::from(*octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Copies printable ASCII except `"` and `\\`; everything else becomes `\\xNN`.
fn push_escaped(out: &mut String, bytes: &[u8]) {
    let plain = |b: &u8| (b.is_ascii_graphic() && *b != b'"' && *b != b'\\') || *b == b' ';
    let mut rest = bytes;
    while !rest.is_empty() {
        let run = rest.iter().position(|b| !plain(b)).unwrap_or(rest.len());
        // The run is printable ASCII, hence UTF-8.
        out.push_str(std::str::from_utf8(&rest[..run]).unwrap_or_default());
        let Some(&odd) = rest.get(run) else { break };
        let _ = write!(out, "\\x{odd:02x}");
        rest = &rest[run + 1..];
    }
}

/// RFC 3339 UTC with milliseconds; the part up to the second is formatted once per second.
fn write_time(out: &mut String, clock: &mut Clock, time: SystemTime) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    if clock.text.is_empty() || clock.second != secs {
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        clock.text.clear();
        let _ = write!(
            clock.text,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        );
        clock.second = secs;
    }
    out.push_str(&clock.text);
    out.push('.');
    push_padded(out, u64::from(since.subsec_millis()), 3);
    out.push('Z');
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_reach_the_log() {
        let mut out = String::new();
        push_target(&mut out, "/a?x=1&araleztoken=eyJ.secret.sig&y=2");
        assert_eq!(out, "/a?x=1&araleztoken=REDACTED&y=2");
        out.clear();
        push_target(&mut out, "/a?araleztokenx=1");
        assert_eq!(out, "/a?araleztokenx=1");
    }

    #[test]
    fn dates_convert() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn line_has_every_field_and_escapes_quotes() {
        let entry = Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            start: Instant::now(),
            client: "10.0.0.1".parse().unwrap(),
            request_id: Some(HeaderValue::from_static("id-1")),
            method: Method::GET,
            target: "/a?b=1".parse().unwrap(),
            version: Version::HTTP_11,
            host: Some(HeaderValue::from_static("x\".org")),
            status: Some(200),
            bytes: 5,
            duration: Duration::from_micros(1500),
            backend: None,
        };
        let mut line = String::new();
        format_line(&mut line, &mut Clock::default(), &entry);
        assert_eq!(
            line,
            "access time=2023-11-14T22:13:20.123Z client=10.0.0.1 method=GET target=\"/a?b=1\" \
             host=\"x\\x22.org\" version=HTTP/1.1 status=200 bytes=5 duration_ms=1.500 request_id=id-1 backend=-\n"
        );
    }
}
