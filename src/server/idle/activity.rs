//! What a client connection's requests tell its timer ([`Activity`]): when the last one ended,
//! how many are open, whether they move or wait for their backend, and why the timer closed the
//! connection ([`Closed`]); and the guard each request holds while it is open ([`InFlight`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Timers;

/// When a connection last carried a request, and how many it carries now.
pub struct Activity {
    base: Instant,
    /// The listener is draining: HTTP/1 responses ask the client to close.
    draining: Arc<AtomicBool>,
    pub(super) open: AtomicUsize,
    /// Nanoseconds from `base` to the end of the last request (0: none yet).
    last_end: AtomicU64,
    /// Signs of life of open requests so far (a start, a response head, a body frame): a
    /// counter, so the request path never reads the clock for it; the connection's timer
    /// notices when it stops moving.
    pub(super) progress: AtomicU64,
    /// Open requests waiting for their backend (its head, or its next body bytes): time the
    /// backend's own deadlines bound, never the client's doing.
    pub(super) waiting: AtomicUsize,
    /// The connection speaks HTTP/2: no request-head deadline between requests.
    pub(super) http2: AtomicBool,
    /// The timer asks the connection to park ([`super::park`]): hyper's next read that would
    /// wait ends it instead.
    pub(super) park_asked: AtomicBool,
    /// Bytes came from the client since the last request ended: part of a head may sit in
    /// hyper's buffer, so the connection must not park.
    read_since_end: AtomicBool,
    /// The last request carried a body: hyper may still be reading it after the response, so
    /// the connection must not park (the rest of the body would be read as a request).
    request_body: AtomicBool,
    /// The HTTP/2 connection has settled (and carried no request since): each read of its
    /// socket that waits gives back the socket's idle buffers ([`super::settle`]).
    pub(super) settled: AtomicBool,
    /// Why the timer closed the connection, if it did for the client's doing ([`Closed`] as
    /// [`Closed::code`]; 0: it did not).
    pub(super) closed_for: AtomicU8,
}

/// Why [`drive`] closed a connection for what its client did (or did not do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Part of a request head came, and not the rest within `client_header_timeout`
    /// (slowloris): nginx logs it as a 408.
    HeadTimedOut,
    /// Its requests made no progress for `client_send_timeout`: the client stopped reading.
    Stalled,
}

impl Closed {
    const ALL: [Closed; 2] = [Closed::HeadTimedOut, Closed::Stalled];

    /// As [`Activity`] keeps it (never 0).
    pub(super) fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl Activity {
    pub fn new(draining: Arc<AtomicBool>) -> Arc<Activity> {
        Arc::new(Activity {
            base: Instant::now(),
            draining,
            open: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            progress: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            http2: AtomicBool::new(false),
            park_asked: AtomicBool::new(false),
            read_since_end: AtomicBool::new(false),
            request_body: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            closed_for: AtomicU8::new(0),
        })
    }

    /// Why the timer closed the connection for its client's doing, if it did.
    pub fn closed_for(&self) -> Option<Closed> {
        let code = self.closed_for.load(Ordering::Relaxed);
        Closed::ALL.into_iter().find(|why| why.code() == code)
    }

    /// The head deadline passed: notes a slowloris, one that had sent part of a head (bytes
    /// read since the last request ended, and not the rest of a body answered early).
    pub(super) fn note_head_deadline(&self) {
        let first = self.last_end.load(Ordering::Relaxed) == 0;
        let body_rest = !first && self.request_body.load(Ordering::Relaxed);
        if self.read_since_end.load(Ordering::Relaxed) && !body_rest {
            self.closed_for
                .store(Closed::HeadTimedOut.code(), Ordering::Relaxed);
        }
    }

    /// The connection turned out to speak HTTP/2 (ALPN, or its first request).
    pub fn mark_http2(&self) {
        if !self.http2.load(Ordering::Relaxed) {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    /// A request starts, with a body or not; it ends when the guard drops.
    pub fn begin(self: &Arc<Self>, with_body: bool) -> InFlight {
        self.open.fetch_add(1, Ordering::Relaxed);
        if self.request_body.load(Ordering::Relaxed) != with_body {
            self.request_body.store(with_body, Ordering::Relaxed);
        }
        self.progress();
        InFlight {
            activity: self.clone(),
            waiting: false,
        }
    }

    /// Requests open on the connection.
    pub fn open_requests(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Whether the last request began with a body to come: its client may still be sending
    /// what nobody reads.
    pub fn last_request_had_body(&self) -> bool {
        self.request_body.load(Ordering::Relaxed)
    }

    fn now_nanos(&self) -> u64 {
        let since_base = Instant::now().saturating_duration_since(self.base);
        u64::try_from(since_base.as_nanos()).unwrap_or(u64::MAX)
    }

    fn progress(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes came from the client: no parking until the next request has ended.
    pub fn note_read(&self) {
        if !self.read_since_end.load(Ordering::Relaxed) {
            self.read_since_end.store(true, Ordering::Relaxed);
        }
        if self.park_asked.load(Ordering::Relaxed) {
            self.park_asked.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the connection must be woken by the drain signal: HTTP/2 (a stream may stay
    /// quiet for long), or HTTP/1 with no request open. A busy HTTP/1 connection is woken by its
    /// request anyway, looks at the signal then, and its answer says `Connection: close` while
    /// the listener drains.
    pub(super) fn waits_for_drain(&self) -> bool {
        self.http2.load(Ordering::Relaxed) || self.open.load(Ordering::Relaxed) == 0
    }

    /// Whether an HTTP/1 request waits for its backend.
    pub(super) fn waits_for_backend_over_http1(&self) -> bool {
        !self.http2.load(Ordering::Relaxed) && self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Whether parking was asked; asking again is needed for the next time.
    pub fn take_park_ask(&self) -> bool {
        self.park_asked.swap(false, Ordering::Relaxed)
    }

    /// Whether an HTTP/2 connection has settled: no request for two `park`s (it was polled
    /// then), and none since.
    pub fn settled(&self) -> bool {
        self.settled.load(Ordering::Relaxed)
    }

    /// An HTTP/1 connection that has ended a request without a body and read nothing since.
    pub(super) fn may_park(&self) -> bool {
        !self.http2.load(Ordering::Relaxed)
            && self.last_end.load(Ordering::Relaxed) > 0
            && !self.request_body.load(Ordering::Relaxed)
            && !self.read_since_end.load(Ordering::Relaxed)
            && !self.park_asked.load(Ordering::Relaxed)
    }

    /// When a parked connection closes: its idle or request-head deadline, whichever is first.
    pub fn parked_until(&self, timers: Timers) -> Instant {
        let last = self.base + Duration::from_nanos(self.last_end.load(Ordering::Relaxed));
        last + timers.idle.min(timers.head)
    }

    /// An HTTP/2 connection that has carried no request for `quiet`: its progress count then
    /// (a new request moves it).
    pub(super) fn quiet_http2(&self, now: Instant, quiet: Duration) -> Option<u64> {
        let http2 = self.http2.load(Ordering::Relaxed);
        let idle = self.idle_for(now).is_some_and(|waited| waited >= quiet);
        (http2 && idle).then(|| self.progress.load(Ordering::Relaxed))
    }

    /// How long the connection has carried no request, or `None` while one is open.
    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.open.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.base + Duration::from_nanos(self.last_end.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(last))
    }
}

/// One request of a connection, from its start until its response body is done or dropped.
pub struct InFlight {
    activity: Arc<Activity>,
    /// Counted in [`Activity::waiting`].
    waiting: bool,
}

impl InFlight {
    /// The request made progress (its response head, or a body frame, went out).
    pub fn progress(&self) {
        self.activity.progress();
    }

    /// The request waits for its backend (`true`: its answer, or its body, was not ready when
    /// asked for), or no longer does. While one does, the connection is not stalled: the
    /// backend's deadlines bound that wait, and a client that stops reading asks for nothing.
    pub fn set_waiting(&mut self, waiting: bool) {
        if self.waiting != waiting {
            self.waiting = waiting;
            if waiting {
                self.activity.waiting.fetch_add(1, Ordering::Relaxed);
            } else {
                self.activity.waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether the listener is draining.
    pub fn draining(&self) -> bool {
        self.activity.draining.load(Ordering::Relaxed)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set_waiting(false);
        let activity = &self.activity;
        // At least 1: 0 means no request has ended yet.
        let nanos = activity.now_nanos().max(1);
        activity.last_end.store(nanos, Ordering::Relaxed);
        activity.read_since_end.store(false, Ordering::Relaxed);
        activity.open.fetch_sub(1, Ordering::Relaxed);
    }
}
