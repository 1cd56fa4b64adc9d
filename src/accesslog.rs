//! The access log (SPEC §11): one line per request, written by a background thread.
//!
//! Workers hand a small [`Entry`] to a bounded channel and never wait: when the writer falls
//! behind (a slow disk, a full pipe) the entry is dropped and counted in `aralez_logging_errors`.
//! The line is formatted and written on the writer thread, off the request path. Lines go to
//! `log_file` (appended, whole lines per write) or, without one, to stdout.
//!
//! Line format (logfmt, one per request, fields always in this order):
//! `access time=2026-01-02T03:04:05.678Z client=10.0.0.1 method=GET target="/a?b=1" host="x.org"
//! version=HTTP/1.1 status=200 bytes=512 duration_ms=1.234 backend=10.0.0.5:8000`
//! (`status=-` when the client went away before a response; `host=-`, `backend=-` when absent).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Method, Uri, Version};

use crate::config::main_conf::AccessLog as Mode;
use crate::upstream::Backend;

/// Entries that may wait for the writer before new ones are dropped.
const DEFAULT_QUEUE: usize = 16384;
/// Bytes gathered before one write.
const BATCH_BYTES: usize = 32 * 1024;

/// What a worker records about one request; formatted later by the writer.
#[derive(Debug)]
pub struct Entry {
    pub time: SystemTime,
    pub start: Instant,
    pub client: IpAddr,
    pub method: Method,
    pub target: Uri,
    pub version: Version,
    pub host: Option<HeaderValue>,
    pub status: Option<u16>,
    pub bytes: u64,
    pub duration: Duration,
    pub backend: Option<Arc<Backend>>,
}

struct Sink {
    mode: Mode,
    tx: SyncSender<Box<Entry>>,
}

static SINK: OnceLock<Sink> = OnceLock::new();

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
pub fn start(mode: Mode, log_file: Option<&Path>) -> Result<(), AccessLogError> {
    if mode == Mode::Off {
        return Ok(());
    }
    let out: Box<dyn Write + Send> = match log_file {
        Some(path) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| AccessLogError::Open {
                    path: path.display().to_string(),
                    source,
                })?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let queue = std::env::var("ARALEZ_ACCESS_LOG_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_QUEUE);
    let (tx, rx) = sync_channel(queue);
    std::thread::Builder::new()
        .name("aralez-access-log".into())
        .spawn(move || write_loop(rx, out))
        .map_err(AccessLogError::Thread)?;
    let _ = SINK.set(Sink { mode, tx });
    Ok(())
}

/// Starts a record for a request, or `None` when the access log is off.
pub fn begin(
    client: IpAddr,
    method: &Method,
    target: &Uri,
    version: Version,
    host: Option<&HeaderValue>,
    start: Instant,
) -> Record {
    if SINK.get().is_none() {
        return Record(None);
    }
    Record(Some(Box::new(Entry {
        time: SystemTime::now(),
        start,
        client,
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
    })))
}

/// One request's pending line; submitted when dropped (after the body, or when the client left).
#[derive(Debug)]
pub struct Record(Option<Box<Entry>>);

impl Record {
    /// Notes the response head. In `error` mode, a successful response is not logged.
    pub fn respond(&mut self, status: u16, backend: Option<&Arc<Backend>>) {
        let Some(entry) = self.0.as_mut() else {
            return;
        };
        if status < 400 && SINK.get().is_some_and(|s| s.mode == Mode::Errors) {
            self.0 = None;
            return;
        }
        entry.status = Some(status);
        entry.backend = backend.cloned();
    }

    /// Adds body bytes sent to the client.
    pub fn add_bytes(&mut self, n: usize) {
        if let Some(entry) = self.0.as_mut() {
            entry.bytes += n as u64;
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let (Some(mut entry), Some(sink)) = (self.0.take(), SINK.get()) else {
            return;
        };
        entry.duration = entry.start.elapsed();
        match sink.tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                crate::metrics::logging_error();
            }
        }
    }
}

fn write_loop(rx: Receiver<Box<Entry>>, mut out: Box<dyn Write + Send>) {
    let mut batch = String::with_capacity(BATCH_BYTES * 2);
    while let Ok(entry) = rx.recv() {
        format_line(&mut batch, &entry);
        let mut lines = 1;
        while batch.len() < BATCH_BYTES {
            let Ok(entry) = rx.try_recv() else { break };
            format_line(&mut batch, &entry);
            lines += 1;
        }
        if out
            .write_all(batch.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            for _ in 0..lines {
                crate::metrics::logging_error();
            }
        }
        batch.clear();
    }
}

/// Appends one access log line (with its newline) for `e`.
pub fn format_line(out: &mut String, e: &Entry) {
    out.push_str("access time=");
    write_time(out, e.time);
    let _ = write!(out, " client={} method=", e.client);
    push_escaped(out, e.method.as_str().as_bytes());
    out.push_str(" target=\"");
    // Origin form for every version: HTTP/2's absolute URI loses its authority (that is `host`).
    let target = e.target.path_and_query().map_or("/", |p| p.as_str());
    push_escaped(out, target.as_bytes());
    out.push_str("\" host=");
    match &e.host {
        Some(h) => {
            out.push('"');
            push_escaped(out, h.as_bytes());
            out.push('"');
        }
        None => out.push('-'),
    }
    let _ = write!(out, " version={:?} status=", e.version);
    match e.status {
        Some(s) => {
            let _ = write!(out, "{s}");
        }
        None => out.push('-'),
    }
    let millis = e.duration.as_secs_f64() * 1000.0;
    let _ = write!(out, " bytes={} duration_ms={millis:.3} backend=", e.bytes);
    match &e.backend {
        Some(b) => push_escaped(out, b.label.as_bytes()),
        None => out.push('-'),
    }
    out.push('\n');
}

/// Copies printable ASCII except `"` and `\`; everything else becomes `\xNN`.
fn push_escaped(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        if (b.is_ascii_graphic() && b != b'"' && b != b'\\') || b == b' ' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// RFC 3339 UTC with milliseconds.
fn write_time(out: &mut String, time: SystemTime) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    );
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
        format_line(&mut line, &entry);
        assert_eq!(
            line,
            "access time=2023-11-14T22:13:20.123Z client=10.0.0.1 method=GET target=\"/a?b=1\" \
             host=\"x\\x22.org\" version=HTTP/1.1 status=200 bytes=5 duration_ms=1.500 backend=-\n"
        );
    }
}
