//! Drives one client connection to its end, and asks it to close gracefully when the worker
//! drains or when it has carried no request for `client_idle_timeout`.
//!
//! "Gracefully" is hyper's `graceful_shutdown`: an idle HTTP/1 connection closes, a busy one
//! after its response; HTTP/2 gets GOAWAY and its open streams finish. One with no request open
//! that has not closed `client_header_timeout` after it was asked is closed (an HTTP/2 client
//! that never answers the GOAWAY's PING keeps hyper waiting for good). Requests are counted by
//! an [`InFlight`] guard that lives in the response body, so a stream counts until its body has
//! been sent (a long download, a WebSocket tunnel over extended CONNECT) and never as idle.
//!
//! An HTTP/1 connection (or one that has not said which protocol it speaks) must also bring a
//! request head within `client_header_timeout` of its start or of its previous request's end,
//! or it is closed at once: a half-sent head (slowloris) and a keep-alive connection left
//! waiting both end there, as with nginx's `client_header_timeout`. This is the connection's
//! own timer rather than hyper's header-read timer, which registers and drops a timer for every
//! request; here one timer per connection serves the idle, head and stall checks.
//!
//! When it finds an HTTP/1 request waiting for its backend, the timer has the connection watch
//! its client ([`Graceful::watch_client`]): one that leaves ends the request (nginx's 499),
//! with no look at the socket for the requests answered sooner.
//!
//! The same timer asks an HTTP/1 connection to park ([`super::park`]) once it has carried no
//! request for [`Timers::park`] and read nothing since its last one. To notice a request's end
//! in time it looks at least that often on HTTP/1 connections (once a second: a cheap poll of
//! an idle connection, instead of resetting the timer on every request).
//! An HTTP/2 connection is looked at as often until it has been polled two `park`s after its
//! last request: h2 (patched, `vendor/h2/PATCHED.md`) notes at a poll that it has no streams,
//! and gives back its buffers at a poll half a second later. It is looked at that often again
//! only once another request comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio::time::Instant;

mod activity;

pub use activity::{Activity, Closed, InFlight};

/// A served connection that can be asked to finish gracefully.
pub trait Graceful: Future {
    fn shut_down(self: Pin<&mut Self>);

    /// An HTTP/1 request has been waiting for its backend: from now until its answer comes,
    /// a client that leaves ends it. (hyper's servers notice on their own.)
    fn watch_client(self: Pin<&mut Self>) {}
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

/// An HTTP/1-only connection (a parked connection served again).
impl<I, B, S> Graceful for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shut_down(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The timers of one connection.
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    /// No request at all for this long: asked to close gracefully.
    pub idle: Duration,
    /// HTTP/1: no request head for this long after the connection's start or its previous
    /// request's end: closed at once.
    pub head: Duration,
    /// Requests open but none making progress, and none waiting for its backend, for this
    /// long: closed at once (nginx's `send_timeout`; a client that stops reading, or an HTTP/2
    /// client that never opens its flow-control window, would otherwise hold its streams and
    /// their backend connections). A slow backend is bounded by its own deadlines instead.
    pub send: Duration,
    /// HTTP/1: no request for this long and nothing read since the last one: parked
    /// ([`super::park`]).
    pub park: Duration,
}

/// What the idle check decided.
enum IdleStep {
    /// Look again at this instant.
    LookAt(Instant),
    /// Ask the connection to finish gracefully (idle timeout).
    ShutDown,
    /// Close it now (no request head in time).
    Close,
    /// Ask it to park.
    Park,
}

/// The idle and head rules, looked at `now`; `settled`: an HTTP/2 connection was polled after
/// carrying no request for two `park`s and has carried none since.
fn idle_step(activity: &Activity, timers: Timers, now: Instant, settled: bool) -> IdleStep {
    let http1 = !activity.http2.load(Ordering::Relaxed);
    let limit = if http1 {
        timers.idle.min(timers.head)
    } else {
        timers.idle
    };
    // HTTP/1 looks at least every `park`: a request's end is noticed in time to park. So does
    // HTTP/2 until settled: polled two `park`s after its last request, h2 frees its buffers.
    let look = |after: Duration| match http1 || !settled {
        true => IdleStep::LookAt(now + after.min(timers.park)),
        false => IdleStep::LookAt(now + after),
    };
    let may_park = activity.may_park();
    match activity.idle_for(now) {
        None => look(limit),
        Some(waited) if http1 && waited >= timers.head => IdleStep::Close,
        Some(waited) if waited >= timers.idle => IdleStep::ShutDown,
        Some(waited) if may_park && waited >= timers.park => IdleStep::Park,
        Some(waited) if may_park => look(timers.park - waited),
        Some(waited) => look(limit.saturating_sub(waited)),
    }
}

/// [`drive`], boxed together with `conn`: a connection's task holds a pointer, not hyper's
/// connection and its timers, so a parked connection's task keeps room for neither.
pub fn drive_boxed<C, T, E>(
    conn: C,
    drain: watch::Receiver<bool>,
    activity: Arc<Activity>,
    timers: Timers,
) -> Pin<Box<impl Future<Output = Result<T, E>>>>
where
    C: Graceful<Output = Result<T, E>>,
    T: Default,
{
    Box::pin(drive(conn, drain, activity, timers))
}

/// Polls `conn` to its end; asks it to shut down once, when `drain` turns true (or its sender
/// is gone) or when `activity` has been idle for `timers.idle`; drops it when an HTTP/1 request
/// head is late (`timers.head`) or its requests have made no progress for `timers.send`
/// (a connection dropped so ends with `T`'s default).
///
/// Not an `async fn`: one moves its arguments into locals of its own, and the future keeps room
/// for both (rust-lang/rust#62958), so hyper's connection (1.7 KiB for HTTP/2) was held twice in
/// every connection's box. Here the block pins `conn` where it was captured.
#[allow(clippy::manual_async_fn)] // an `async fn` would keep `conn` twice, see above
pub fn drive<C, T, E>(
    mut conn: C,
    mut drain: watch::Receiver<bool>,
    activity: Arc<Activity>,
    timers: Timers,
) -> impl Future<Output = Result<T, E>>
where
    C: Graceful<Output = Result<T, E>>,
    T: Default,
{
    async move {
        // SAFETY: `conn` lives in this future's state, which does not move once polled (a
        // future is pinned to be polled), and is never moved out of it: only this pinned
        // reference is used, and `conn` is dropped in place with the future.
        #[allow(unsafe_code)]
        let conn = unsafe { Pin::new_unchecked(&mut conn) };
        drive_pinned(conn, &mut drain, &activity, &timers).await
    }
}

/// [`drive`]'s work, on a connection pinned where its future holds it. The rest by reference
/// too: an `async fn` keeps each argument twice.
async fn drive_pinned<C, T, E>(
    mut conn: Pin<&mut C>,
    drain: &mut watch::Receiver<bool>,
    activity: &Activity,
    timers: &Timers,
) -> Result<T, E>
where
    C: Graceful<Output = Result<T, E>>,
    T: Default,
{
    let start = Instant::now();
    // The stall check looks every half send timeout whether the progress counter moved.
    let look_every = timers.send / 2;
    let mut stall_at = start + look_every;
    // HTTP/2: the progress count when the connection was polled after two `park`s without
    // requests (h2 then gives back its buffers, see vendor/h2/PATCHED.md); `None` until then,
    // and again once a request moves the count.
    let mut settled: Option<u64> = None;
    let mut idle_at = match idle_step(activity, *timers, start, false) {
        IdleStep::LookAt(at) => at,
        _ => start,
    };
    // One timer for both checks: the earlier of the two.
    let timer = tokio::time::sleep_until(idle_at.min(stall_at));
    tokio::pin!(timer);
    let mut seen = (activity.progress.load(Ordering::Relaxed), start);
    let mut asked = *drain.borrow();
    // When the connection was asked to finish: one without requests that has not closed a head
    // timeout later is closed (an HTTP/2 client that never answers the PING after GOAWAY would
    // hold it for good).
    let mut asked_at = asked.then_some(start);
    // A second handle on the drain signal, to ask cheaply whether it moved: the wait below
    // borrows the first.
    let peek = drain.clone();
    if asked {
        conn.as_mut().shut_down();
        idle_at = idle_at.min(start + timers.head);
    }
    // Whether the timer has the task's waker since its last reset: then the connection's other
    // wake-ups only look at its state instead of polling it. The task's waker does not change:
    // this future is only ever polled by the connection's own task. (Callgrind: 370
    // instructions a request less than `tokio::select!` polling all three every wake-up.)
    let mut timer_has_waker = false;
    loop {
        // Kept across the wake-ups of one turn: it holds the task's place among the drain
        // signal's waiters.
        let mut drained = std::pin::pin!(drain.wait_for(|d| *d));
        // Likewise the wait, once it has the waker, is polled again only when the signal moved
        // (its version goes up before its waiters are woken) or its sender is gone. It gets the
        // waker only when the connection needs it ([`Activity::waits_for_drain`]): joining
        // and leaving the signal's waiters cost about 330 instructions, the price of a request
        // on a connection that carries one (callgrind, tcpnew).
        let mut drain_has_waker = false;
        let woke = std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = conn.as_mut().poll(cx) {
                return Poll::Ready(Woke::Done(done));
            }
            if settled.is_some_and(|at| activity.progress.load(Ordering::Relaxed) != at) {
                // A request on a settled HTTP/2 connection: look again a `park` after it.
                settled = None;
                activity.settled.store(false, Ordering::Relaxed);
                idle_at = idle_at.min(Instant::now() + timers.park);
                timer.as_mut().reset(idle_at.min(stall_at));
                timer_has_waker = false;
            }
            let moved = || peek.has_changed().unwrap_or(true);
            if !asked && ((!drain_has_waker && activity.waits_for_drain()) || moved()) {
                if drained.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Drain);
                }
                drain_has_waker = true;
            }
            if timer_has_waker && !timer.is_elapsed() {
                return Poll::Pending;
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woke::Timer);
            }
            timer_has_waker = true;
            Poll::Pending
        })
        .await;
        match woke {
            Woke::Done(done) => return done,
            Woke::Drain => {
                asked = true;
                let now = Instant::now();
                asked_at = Some(now);
                conn.as_mut().shut_down();
                idle_at = idle_at.min(now + timers.head);
                timer.as_mut().reset(idle_at.min(stall_at));
                timer_has_waker = false;
            }
            Woke::Timer => {
                let now = Instant::now();
                if activity.waits_for_backend_over_http1() {
                    conn.as_mut().watch_client();
                }
                let unanswered = asked_at.is_some_and(|at| now >= at + timers.head);
                if now >= idle_at && unanswered && activity.open.load(Ordering::Relaxed) == 0 {
                    tracing::debug!(
                        "closing a connection without requests still open {:?} after it was asked to close",
                        timers.head
                    );
                    return Ok(T::default());
                }
                if now >= idle_at {
                    // Two `park`s: h2 may first learn that it has no streams at the poll a `park`
                    // after the last request (its last stream's end need not wake it).
                    if settled.is_none() {
                        settled = activity.quiet_http2(now, timers.park * 2);
                        // Polled next turn: the socket's reads that wait give back its buffers
                        // from then on, as h2 does its own.
                        activity.settled.store(settled.is_some(), Ordering::Relaxed);
                    }
                    match idle_step(activity, *timers, now, settled.is_some()) {
                        IdleStep::LookAt(at) => idle_at = at,
                        IdleStep::Close => {
                            activity.note_head_deadline();
                            tracing::debug!(
                                "closing a connection that sent no request head within {:?}",
                                timers.head
                            );
                            return Ok(T::default());
                        }
                        IdleStep::ShutDown => {
                            if !asked {
                                tracing::debug!("closing a connection idle for {:?}", timers.idle);
                                asked = true;
                                asked_at = Some(now);
                                conn.as_mut().shut_down();
                            }
                            // Asked already: closed a head timeout later if it has not closed.
                            idle_at = now + timers.head;
                        }
                        IdleStep::Park => {
                            // The connection is polled again next turn: its read that would
                            // wait now ends it, unless the client sent something meanwhile.
                            activity.park_asked.store(true, Ordering::Relaxed);
                            idle_at = now + timers.park;
                        }
                    }
                }
                if now >= stall_at {
                    let progress = activity.progress.load(Ordering::Relaxed);
                    let open = activity.open.load(Ordering::Relaxed) > 0;
                    let waiting = activity.waiting.load(Ordering::Relaxed) > 0;
                    if progress != seen.0 || !open || waiting {
                        seen = (progress, now);
                    } else if now.saturating_duration_since(seen.1) >= timers.send {
                        let code = Closed::Stalled.code();
                        activity.closed_for.store(code, Ordering::Relaxed);
                        tracing::debug!(
                            "closing a connection whose requests made no progress for {:?}",
                            now - seen.1
                        );
                        return Ok(T::default());
                    }
                    stall_at = now + look_every;
                }
                timer.as_mut().reset(idle_at.min(stall_at));
                timer_has_waker = false;
            }
        }
    }
}

/// What woke [`drive`]'s connection task.
enum Woke<T> {
    /// The connection ended.
    Done(T),
    /// The listener drains.
    Drain,
    /// The timer is due.
    Timer,
}
