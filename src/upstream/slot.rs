//! One worker's connections to one backend: short lists of idle HTTP/1.1 connections (hyper's,
//! and the plain ones requests drive themselves, `inline`) and its shared HTTP/2 connections
//! with their open-stream counts. Only its own worker touches a slot, so its mutexes are never
//! contended. Connections are kept under the TLS server name they were
//! opened for (empty for plain ones), and a request only ever reuses one opened for its own
//! name: a session set up for one name never carries another's requests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hyper::client::conn::{http1, http2};

use super::connector::UpBody;
use super::h2_settings::StreamLimit;
use super::idle_list::IdleList;
use super::inline::InlineConn;

/// An idle HTTP/1.1 connection and the server name it was opened for (`None`: plain).
type IdleH1 = (Option<Arc<str>>, http1::SendRequest<UpBody>);

/// Which of a slot's idle lists: the plain connections requests drive themselves, or hyper's.
#[derive(Clone, Copy, Debug)]
pub enum IdleKind {
    Inline,
    Hyper,
}

/// One worker's connections to one backend.
#[derive(Default)]
pub struct WorkerSlot {
    idle: Mutex<IdleList<IdleH1>>,
    /// Boxed: a connection moves between this list and a response body as a pointer.
    idle_inline: Mutex<IdleList<Box<InlineConn>>>,
    h2: Mutex<Vec<H2Conn>>,
    /// Held while opening a connection that may be HTTP/2, so a burst waits for it.
    pub opening_h2: tokio::sync::Mutex<()>,
    /// The last TLS handshake with this backend chose HTTP/1.1: open TLS connections without
    /// waiting for each other.
    pub tls_chose_h1: std::sync::atomic::AtomicBool,
    /// Response heads under 500 this worker has had from the backend: a sign of life the
    /// health checks read (see `Backend::answers`).
    answers: AtomicU64,
}

struct H2Conn {
    sni: Option<Arc<str>>,
    sender: http2::SendRequest<UpBody>,
    open_streams: Arc<AtomicUsize>,
    limit: Arc<StreamLimit>,
}

/// A request's place on a shared HTTP/2 connection, given back when dropped.
pub struct StreamTicket(Arc<AtomicUsize>);

impl Drop for StreamTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WorkerSlot {
    /// Counts a response head under 500 from the backend.
    pub fn note_answer(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
    }

    /// Response heads under 500 so far.
    pub fn answers(&self) -> u64 {
        self.answers.load(Ordering::Relaxed)
    }

    /// An idle HTTP/1.1 connection opened for `sni` (`None`: plain) that is ready for a request.
    pub fn take_idle(&self, sni: Option<&str>) -> Option<http1::SendRequest<UpBody>> {
        let mut idle = lock(&self.idle);
        while let Some((_, conn)) = idle.take_last(|(name, _)| name.as_deref() == sni) {
            if conn.is_ready() {
                return Some(conn);
            }
            // Closed, or not yet ready after its last response: not worth keeping.
        }
        None
    }

    /// An idle plain connection that can carry a request, the latest first.
    pub fn take_inline(&self) -> Option<Box<InlineConn>> {
        let mut idle = lock(&self.idle_inline);
        while let Some(mut conn) = idle.pop() {
            if conn.is_reusable_now() {
                return Some(conn);
            }
        }
        None
    }

    /// Closes one idle plain connection, whatever its state; whether there was one.
    pub fn close_one_inline(&self) -> bool {
        let closed = lock(&self.idle_inline).pop();
        closed.is_some()
    }

    /// Closes every idle connection and stops sharing the HTTP/2 ones (their open streams
    /// finish): the backend's addresses changed.
    pub fn forget_connections(&self) {
        let inline = std::mem::take(&mut *lock(&self.idle_inline));
        let hyper = std::mem::take(&mut *lock(&self.idle));
        let h2 = std::mem::take(&mut *lock(&self.h2));
        drop((inline, hyper, h2));
    }

    /// Closes the idle plain connections the backend has closed (or sent unasked bytes on);
    /// how many.
    pub fn close_gone_inline(&self) -> usize {
        let gone = lock(&self.idle_inline).remove_gone(|conn| !conn.is_reusable_now());
        gone.len()
    }

    /// Keeps a plain connection whose response has been read: within `max` idle ones, or above
    /// that if `surplus_allowed()` (see `idle_list`). Returns whether a trim is now due.
    pub fn put_inline(
        &self,
        conn: Box<InlineConn>,
        max: usize,
        surplus_allowed: impl FnOnce() -> bool,
    ) -> bool {
        keep_in(&self.idle_inline, conn, max, surplus_allowed)
    }

    /// Closes the idle connections of one list above `max` that no request has needed since
    /// its last trim. Returns whether the list is still over `max` (another trim is due).
    pub fn trim_idle(&self, list: IdleKind, max: usize) -> bool {
        match list {
            IdleKind::Inline => trim_in(&self.idle_inline, max),
            IdleKind::Hyper => trim_in(&self.idle, max),
        }
    }

    /// A place on one of this worker's HTTP/2 connections for `sni` that has room.
    pub fn h2_stream(
        &self,
        sni: Option<&str>,
    ) -> Option<(http2::SendRequest<UpBody>, StreamTicket)> {
        let mut conns = lock(&self.h2);
        conns.retain(|c| !c.sender.is_closed());
        let conn = conns.iter().find(|c| {
            c.sni.as_deref() == sni && c.open_streams.load(Ordering::Relaxed) < c.limit.get()
        })?;
        conn.open_streams.fetch_add(1, Ordering::Relaxed);
        Some((conn.sender.clone(), StreamTicket(conn.open_streams.clone())))
    }

    /// Shares a new HTTP/2 connection with this worker's later requests; the ticket is the
    /// first request's place on it.
    pub fn add_h2(
        &self,
        sni: Option<Arc<str>>,
        sender: http2::SendRequest<UpBody>,
        limit: Arc<StreamLimit>,
    ) -> StreamTicket {
        let open_streams = Arc::new(AtomicUsize::new(1));
        lock(&self.h2).push(H2Conn {
            sni,
            sender,
            open_streams: open_streams.clone(),
            limit,
        });
        StreamTicket(open_streams)
    }

    /// Keeps `conn` (opened for `sni`) for the next request, as `put_inline` does.
    pub fn put_idle(
        &self,
        sni: Option<Arc<str>>,
        conn: http1::SendRequest<UpBody>,
        max: usize,
        surplus_allowed: impl FnOnce() -> bool,
    ) -> bool {
        !conn.is_closed() && keep_in(&self.idle, (sni, conn), max, surplus_allowed)
    }
}

/// [`IdleList::keep`] under the list's lock; a refused connection is closed after it is released.
/// Returns whether a trim is now due.
fn keep_in<T>(
    list: &Mutex<IdleList<T>>,
    item: T,
    max: usize,
    surplus_allowed: impl FnOnce() -> bool,
) -> bool {
    let kept = lock(list).keep(item, max, surplus_allowed);
    kept.unwrap_or(false)
}

/// [`IdleList::trim`] under the list's lock; the connections it takes off are closed after it is
/// released. Returns whether the list is still over `max`.
fn trim_in<T>(list: &Mutex<IdleList<T>>, max: usize) -> bool {
    let (closed, still_over) = lock(list).trim(max);
    drop(closed);
    still_over
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
