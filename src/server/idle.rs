//! Drives one client connection to its end, and asks it to close gracefully when the worker
//! drains or when it has carried no request for `client_idle_timeout`.
//!
//! "Gracefully" is hyper's `graceful_shutdown`: an idle HTTP/1 connection closes, a busy one
//! after its response; HTTP/2 gets GOAWAY and its open streams finish. Requests are counted by
//! an [`InFlight`] guard that lives in the response body, so a stream counts until its body has
//! been sent (a long download, a WebSocket tunnel over extended CONNECT) and never as idle.
//!
//! HTTP/1 keep-alive connections also have hyper's header-read timer, which runs while a
//! connection waits for its next request: such a connection closes after the shorter of
//! `client_header_timeout` and `client_idle_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio::time::Instant;

/// When a connection last carried a request, and how many it carries now.
pub struct Activity {
    base: Instant,
    /// The listener is draining: HTTP/1 responses ask the client to close.
    draining: Arc<std::sync::atomic::AtomicBool>,
    open: AtomicUsize,
    /// Nanoseconds from `base` to the end of the last request (0: none yet).
    last_end: AtomicU64,
    /// Signs of life of open requests so far (a start, a response head, a body frame): a
    /// counter, so the request path never reads the clock for it; the connection's timer
    /// notices when it stops moving.
    progress: AtomicU64,
}

impl Activity {
    pub fn new(draining: Arc<std::sync::atomic::AtomicBool>) -> Arc<Activity> {
        Arc::new(Activity {
            base: Instant::now(),
            draining,
            open: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            progress: AtomicU64::new(0),
        })
    }

    /// A request starts; it ends when the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.progress();
        InFlight(self.clone())
    }

    fn now_nanos(&self) -> u64 {
        let since_base = Instant::now().saturating_duration_since(self.base);
        u64::try_from(since_base.as_nanos()).unwrap_or(u64::MAX)
    }

    fn progress(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// How long the connection has carried no request, or `None` while one is open.
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.open.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.base + Duration::from_nanos(self.last_end.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(last))
    }
}

/// One request of a connection, from its start until its response body is done or dropped.
pub struct InFlight(Arc<Activity>);

impl InFlight {
    /// The request made progress (its response head, or a body frame, went out).
    pub fn progress(&self) {
        self.0.progress();
    }

    /// Whether the listener is draining.
    pub fn draining(&self) -> bool {
        self.0.draining.load(Ordering::Relaxed)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let nanos = self.0.now_nanos();
        self.0.last_end.store(nanos, Ordering::Relaxed);
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A served connection that can be asked to finish gracefully.
pub trait Graceful: Future {
    fn shut_down(self: Pin<&mut Self>);
}

/// The bounds under which hyper-util offers `graceful_shutdown` (as in its own `graceful`).
macro_rules! graceful_for {
    ($conn:ident) => {
        impl<I, B, S, E> Graceful for auto::$conn<'_, I, S, E>
        where
            S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
            S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
            S::Future: 'static,
            I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
            B: Body + 'static,
            B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
            E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
        {
            fn shut_down(self: Pin<&mut Self>) {
                self.graceful_shutdown();
            }
        }
    };
}
graceful_for!(Connection);
graceful_for!(UpgradeableConnection);

/// The timers of one connection.
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    /// No request at all for this long: asked to close gracefully.
    pub idle: Duration,
    /// Requests open but none making progress for this long: closed at once (nginx's
    /// `send_timeout`; a client that stops reading, or an HTTP/2 client that never opens its
    /// flow-control window, would otherwise hold its streams and their backend connections).
    pub send: Duration,
}

/// Polls `conn` to its end; asks it to shut down once, when `drain` turns true (or its sender
/// is gone) or when `activity` has been idle for `timers.idle`; drops it when its requests have
/// made no progress for `timers.send`.
pub async fn drive<C, E>(
    conn: C,
    mut drain: watch::Receiver<bool>,
    activity: Arc<Activity>,
    timers: Timers,
) -> Result<(), E>
where
    C: Graceful<Output = Result<(), E>>,
{
    let idle = timers.idle;
    tokio::pin!(conn);
    let check = tokio::time::sleep(idle);
    tokio::pin!(check);
    // The stall check looks every half send timeout whether the progress counter moved.
    let look_every = timers.send / 2;
    let stall = tokio::time::sleep(look_every);
    tokio::pin!(stall);
    let mut seen = (activity.progress.load(Ordering::Relaxed), Instant::now());
    let mut asked = *drain.borrow();
    if asked {
        conn.as_mut().shut_down();
    }
    loop {
        tokio::select! {
            biased;
            done = conn.as_mut() => return done,
            _ = drain.wait_for(|d| *d), if !asked => {
                asked = true;
                conn.as_mut().shut_down();
            }
            () = &mut check, if !asked => {
                let now = Instant::now();
                match activity.idle_for(now) {
                    Some(for_long) if for_long >= idle => {
                        tracing::debug!("closing a connection idle for {for_long:?}");
                        asked = true;
                        conn.as_mut().shut_down();
                    }
                    Some(for_short) => check.as_mut().reset(now + (idle - for_short)),
                    None => check.as_mut().reset(now + idle),
                }
            }
            () = &mut stall => {
                let now = Instant::now();
                let progress = activity.progress.load(Ordering::Relaxed);
                let open = activity.open.load(Ordering::Relaxed) > 0;
                if progress != seen.0 || !open {
                    seen = (progress, now);
                } else if now.saturating_duration_since(seen.1) >= timers.send {
                    tracing::debug!("closing a connection whose requests made no progress for {:?}", now - seen.1);
                    return Ok(());
                }
                stall.as_mut().reset(now + look_every);
            }
        }
    }
}
