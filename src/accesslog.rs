//! The access log (SPEC §11): one line per request, written by a background thread.
//!
//! The sink ([`AccessLog`]) is built once at start and handed to the server; nothing here is
//! process-wide. Workers hand a small [`Entry`] to a bounded channel and never wait: when the writer falls
//! behind (a slow disk, a full pipe) the entry is dropped and counted in `aralez_logging_errors_total`.
//! The line is formatted and written on the writer thread, off the request path. Lines go to
//! `log_file` (appended, whole lines per write) or, without one, to stdout.
//!
//! Lines go to `access_log_file`, else to `log_file` (the same [`LogFile`] as the app log), else to
//! stdout; the line formats are in [`line`].

mod line;

use std::io::Write;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::header::{HOST, REFERER, USER_AGENT};
use http::{HeaderValue, Method, Request, Uri, Version};

use crate::config::log_conf::AccessLogFormat;
use crate::config::main_conf::AccessLog as Mode;
use crate::logfile::{write_counted, LogFile, PartWritten};
use crate::metrics::{Metrics, CLIENT_CLOSED_REQUEST};
use crate::vocab::request_body::{BodyCounter, BytesIn};
use crate::vocab::TlsFacts;
use line::{format_line, Clock};

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
    /// The request line's parts; `None` for a request refused before it was read
    /// ([`AccessLog::refused`]).
    pub method: Option<Method>,
    pub target: Option<Uri>,
    pub version: Option<Version>,
    pub host: Option<HeaderValue>,
    pub status: Option<u16>,
    pub bytes: u64,
    pub duration: Duration,
    /// The label of the backend that answered.
    pub backend: Option<Arc<str>>,
    /// The backends exchanges failed with before, and why (`a (connect), b (reset)`); the
    /// field is left out of the line when none did.
    pub tried: Option<Box<str>>,
    /// From the start of the exchange with the backend that answered to its response head.
    pub upstream_time: Option<Duration>,
    /// What the cache did, on a cached route's answer.
    pub cache: Option<&'static str>,
    /// Request body bytes read from the client and passed on.
    pub bytes_in: Option<u64>,
    pub request_id: Option<HeaderValue>,
    /// `TLSv1.2`/`TLSv1.3` on TLS connections.
    pub tls_version: Option<&'static str>,
    /// The server name the TLS client asked for.
    pub sni: Option<Arc<str>>,
    pub referer: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
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

/// Where the access log writes.
pub enum Destination {
    Stdout,
    /// A log file, shared with the app log when both name the same path.
    File(Arc<LogFile>),
}

/// Starts the writer when `mode` is not `Off`. The destination was opened by the caller
/// (before privileges are dropped). `ARALEZ_ACCESS_LOG_QUEUE` overrides the queue length
/// (tuning and tests).
pub fn start(
    mode: Mode,
    format: AccessLogFormat,
    destination: Destination,
    metrics: Arc<Metrics>,
) -> Result<AccessLog, AccessLogError> {
    if mode == Mode::Off {
        return Ok(AccessLog::default());
    }
    let queue = std::env::var("ARALEZ_ACCESS_LOG_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_QUEUE);
    let (tx, rx) = sync_channel::<Msg>(queue);
    let writer_metrics = metrics.clone();
    let reopen = Arc::new(AtomicBool::new(false));
    let writer_reopen = reopen.clone();
    std::thread::Builder::new()
        .name("aralez-access-log".into())
        .spawn(move || write_loop(rx, destination, format, &writer_reopen, &writer_metrics))
        .map_err(AccessLogError::Thread)?;
    Ok(AccessLog(Some(Arc::new(Sink {
        mode,
        tx,
        reopen,
        metrics,
    }))))
}

impl AccessLog {
    /// Starts a record for a request (an empty one when the access log is off). `client` is the
    /// client's address as the limits see it; `tls` what the connection's handshake said.
    pub fn begin<B>(
        &self,
        client: IpAddr,
        tls: &TlsFacts,
        req: &Request<B>,
        start: Instant,
    ) -> Record {
        let Some(sink) = &self.0 else {
            return Record(None, None);
        };
        let headers = req.headers();
        let target = req.uri();
        let entry = Box::new(Entry {
            time: SystemTime::now(),
            start,
            client,
            method: Some(req.method().clone()),
            target: Some(target.clone()),
            version: Some(req.version()),
            host: headers.get(HOST).cloned().or_else(|| {
                target
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            }),
            status: None,
            bytes: 0,
            duration: Duration::ZERO,
            backend: None,
            tried: None,
            upstream_time: None,
            cache: None,
            // A counted body (`Record::count_body`) replaces this when the line is written.
            bytes_in: Some(0),
            // Set by the request-id step (`Record::request_id`): a client's own is not logged
            // unless it was trusted.
            request_id: None,
            tls_version: tls.version,
            sni: tls.sni.clone(),
            referer: headers.get(REFERER).cloned(),
            user_agent: headers.get(USER_AGENT).cloned(),
        });
        Record(Some((entry, sink.clone())), None)
    }
}

impl AccessLog {
    /// Logs a request refused before it could be read as one (a malformed or oversized
    /// head: hyper answers it itself), from `client`, with the `status` it was answered and
    /// the `body_bytes` of that answer.
    pub fn refused(&self, client: IpAddr, tls: &TlsFacts, status: u16, body_bytes: u64) {
        let Some(sink) = &self.0 else {
            return;
        };
        let entry = Box::new(Entry {
            time: SystemTime::now(),
            start: Instant::now(),
            client,
            method: None,
            target: None,
            version: None,
            host: None,
            status: Some(status),
            bytes: body_bytes,
            duration: Duration::ZERO,
            backend: None,
            tried: None,
            upstream_time: None,
            cache: None,
            bytes_in: None,
            request_id: None,
            tls_version: tls.version,
            sni: tls.sni.clone(),
            referer: None,
            user_agent: None,
        });
        submit(sink, entry);
    }
}

/// One request's pending line; submitted when dropped (after the body, or when the client left),
/// or, when the request body is counted, once that body is done too.
pub struct Record(Option<(Box<Entry>, Arc<Sink>)>, Option<Arc<BodyDone>>);

/// A line that waits for the request body's end as well: the body's counter holds it, and the
/// last of the two to let go submits it.
struct BodyDone {
    line: Mutex<Option<Box<Entry>>>,
    sink: Arc<Sink>,
    bytes_in: AtomicU64,
}

impl BodyCounter for BodyDone {
    fn add(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl Drop for BodyDone {
    fn drop(&mut self) {
        let line = self.line.get_mut().map_or(None, Option::take);
        if let Some(mut entry) = line {
            entry.bytes_in = Some(self.bytes_in.load(Ordering::Relaxed));
            submit(&self.sink, entry);
        }
    }
}

impl Record {
    /// Notes the response head, ready at `now` (and, when a backend sent it, how long since it
    /// was asked at `upstream_start`: worked out only for a line that is written). In `error`
    /// mode, a successful response is not logged.
    pub fn respond(
        &mut self,
        status: u16,
        backend: Option<&Arc<str>>,
        (upstream_start, now): (Option<Instant>, Instant),
    ) {
        let Some((entry, sink)) = self.0.as_mut() else {
            return;
        };
        if status < 400 && sink.mode == Mode::Errors {
            self.0 = None;
            return;
        }
        entry.status = Some(status);
        entry.backend = backend.cloned();
        entry.upstream_time = upstream_start.map(|start| now.saturating_duration_since(start));
    }

    /// Notes the backends exchanges failed with ([`Entry::tried`]).
    pub fn tried(&mut self, failures: Option<Box<str>>) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.tried = failures;
        }
    }

    /// Notes the backend the request was with when its client left (no answer had come).
    pub fn left_with(&mut self, backend: Arc<str>) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.backend.get_or_insert(backend);
        }
    }

    /// Notes what the cache did with the request.
    pub fn cache_status(&mut self, word: &'static str) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.cache = Some(word);
        }
    }

    /// Notes the request's id.
    pub fn request_id(&mut self, id: &HeaderValue) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.request_id = Some(id.clone());
        }
    }

    /// Has the request's body counted for `bytes_in`: the extension to put on the request
    /// (`None` when the access log is off or the request has no body, so nothing counts).
    pub fn count_body<B: http_body::Body>(&mut self, req: &Request<B>) -> Option<BytesIn> {
        let (_, sink) = self.0.as_ref()?;
        if req.body().is_end_stream() {
            return None;
        }
        let done = Arc::new(BodyDone {
            line: Mutex::new(None),
            sink: sink.clone(),
            bytes_in: AtomicU64::new(0),
        });
        self.1 = Some(done.clone());
        Some(BytesIn(done))
    }

    /// An upgraded connection ended having carried `to_client` bytes to the client and
    /// `from_client` bytes from it: its line says so (written when the record is dropped, its
    /// duration then the tunnel's whole life), as nginx logs a WebSocket when it closes.
    pub fn tunnel_ended(&mut self, to_client: u64, from_client: u64) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.bytes += to_client;
            entry.bytes_in = Some(entry.bytes_in.unwrap_or(0) + from_client);
        }
    }

    /// Adds body bytes sent to the client.
    pub fn add_bytes(&mut self, n: usize) {
        if let Some((entry, _)) = self.0.as_mut() {
            entry.bytes += n as u64;
        }
    }
}

impl Default for Record {
    /// A record that writes no line.
    fn default() -> Record {
        Record(None, None)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let Some((mut entry, sink)) = self.0.take() else {
            return;
        };
        entry.duration = entry.start.elapsed();
        // No response head: the request was dropped because its client left.
        entry.status.get_or_insert(CLIENT_CLOSED_REQUEST);
        match self.1.take() {
            // The request body's counter may still be counting: the later of the two submits.
            Some(done) => {
                if let Ok(mut line) = done.line.lock() {
                    *line = Some(entry);
                }
            }
            None => submit(&sink, entry),
        }
    }
}

fn submit(sink: &Sink, entry: Box<Entry>) {
    match sink.tx.try_send(Msg::Line(entry)) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            sink.metrics.logging_error();
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

impl Destination {
    fn reopen(&self) {
        if let Destination::File(file) = self {
            match file.reopen() {
                Ok(()) => tracing::info!("access log: reopened {}", file.path().display()),
                Err(e) => tracing::warn!(
                    "access log: cannot reopen {}: {e}; still writing to the old file",
                    file.path().display()
                ),
            }
        }
    }

    fn write_all(&self, bytes: &[u8]) -> Result<(), PartWritten> {
        match self {
            Destination::Stdout => {
                let mut out = std::io::stdout().lock();
                write_counted(&mut out, bytes)?;
                out.flush().map_err(|error| PartWritten {
                    bytes: bytes.len(),
                    error,
                })
            }
            Destination::File(file) => file.append(bytes),
        }
    }
}

/// What a gathered burst of messages asked for besides lines.
struct Asked {
    format: AccessLogFormat,
    flushed: Option<std::sync::mpsc::Sender<()>>,
}

impl Asked {
    fn take(&mut self, msg: Msg, batch: &mut String, clock: &mut Clock, lines: &mut u64) {
        match msg {
            Msg::Line(entry) => {
                format_line(batch, clock, self.format, &entry);
                *lines += 1;
            }
            Msg::Flush(done) => self.flushed = Some(done),
            Msg::Reopen => {}
        }
    }
}

fn write_loop(
    rx: Receiver<Msg>,
    out: Destination,
    format: AccessLogFormat,
    reopen: &AtomicBool,
    metrics: &Metrics,
) {
    let mut batch = String::with_capacity(BATCH_BYTES * 2);
    let mut clock = Clock::default();
    let mut lines = 0;
    let mut failures = WriteFailures::default();
    let metrics = (metrics, &mut failures);
    while let Ok(msg) = rx.recv() {
        let mut asked = Asked {
            format,
            flushed: None,
        };
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
                write_batch(&out, &mut batch, &mut lines, metrics.0, metrics.1);
            }
        }
        write_batch(&out, &mut batch, &mut lines, metrics.0, metrics.1);
        if let Some(done) = asked.flushed {
            let _ = done.send(());
        }
    }
    failures.ended();
}

fn write_batch(
    out: &Destination,
    batch: &mut String,
    lines: &mut u64,
    metrics: &Metrics,
    failures: &mut WriteFailures,
) {
    if batch.is_empty() {
        return;
    }
    if failures.torn {
        // A write that failed may have left part of a line: ended here, or the next line
        // would be glued to it (a JSON line no shipper can read).
        batch.insert(0, '\n');
    }
    match out.write_all(batch.as_bytes()) {
        Ok(()) => failures.wrote(),
        Err(part) => {
            let lost = lines_lost(batch, part.bytes, *lines, failures.torn);
            for _ in 0..lost {
                metrics.logging_error();
            }
            failures.note(&part.error, lost);
            failures.torn = true;
        }
    }
    batch.clear();
    *lines = 0;
}

/// How many of a batch's `lines` a write that stopped after `written` bytes lost: those that
/// went out whole are in the file. A `torn` batch starts with a newline that ends no line.
fn lines_lost(batch: &str, written: usize, lines: u64, torn: bool) -> u64 {
    let out = batch.as_bytes().get(..written).unwrap_or_default();
    let ends = out.iter().filter(|b| **b == b'\n').count() as u64;
    let whole = ends.saturating_sub(u64::from(torn && written > 0));
    lines.saturating_sub(whole)
}

/// Failed writes of the access log, said in the app log at most once a minute (as nginx logs
/// a failed `write()`; counting them in `aralez_logging_errors_total` alone told no one why),
/// and a write that goes through again, with the lines lost since the last report (also said
/// when the log ends): the lines of a burst that failed and stopped were told only by the next
/// failure, whenever that came.
#[derive(Default)]
struct WriteFailures {
    said_at: Option<Instant>,
    lost_since: u64,
    /// The last write failed, maybe after part of a line went out.
    torn: bool,
}

impl WriteFailures {
    const EVERY: Duration = Duration::from_secs(60);

    fn note(&mut self, error: &std::io::Error, lost: u64) {
        self.lost_since += lost;
        let now = Instant::now();
        if self.said_at.is_some_and(|at| now < at + Self::EVERY) {
            return;
        }
        tracing::error!(
            "access log: write failed ({error}); {} line(s) lost since the last report",
            self.lost_since
        );
        self.said_at = Some(now);
        self.lost_since = 0;
    }

    /// A write went through: says the lines lost since the last report, when some were and a
    /// line is due (once a minute with the failures' own: a disk at the edge of full flaps).
    fn wrote(&mut self) {
        self.torn = false;
        if self.lost_since == 0 {
            return;
        }
        let now = Instant::now();
        if self.said_at.is_some_and(|at| now < at + Self::EVERY) {
            return;
        }
        let lost = std::mem::take(&mut self.lost_since);
        tracing::warn!("access log: writing again; {lost} line(s) lost since the last report");
        self.said_at = Some(now);
    }

    /// The log ends: what was lost since the last report, if anything was.
    fn ended(&mut self) -> Option<u64> {
        let lost = std::mem::take(&mut self.lost_since);
        if lost > 0 {
            tracing::error!("access log: {lost} line(s) lost to failed writes since the last report, as it ends");
        }
        (lost > 0).then_some(lost)
    }
}

#[cfg(test)]
mod tests;
