//! Choosing backends for a request (SPEC §5, §6.2): a route's [`BackendSet`] (round robin start,
//! which backends are in rotation), the sticky pin ([`Pinned`]), failover to the next backend
//! when a connection cannot be made, and one replay on a fresh connection when a pooled one
//! turned out stale. The one place that decides where a request goes next; forwarding hands it
//! a prepared request and gets back a response or the [`ProxyError`] to answer with.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use http::request::Parts;
use http::{header, HeaderValue, Request, Response};
use http_body_util::{Either, Empty};

use super::backend::Backend;
use super::connector::ConnectErrorKind;
use super::pool::{self, Exchange, SendError, Timeouts, UpBody};
use super::pooled_body::{PooledBody, ServedBy};
use crate::metrics::UpstreamFailure;
use crate::vocab::forwarded::Deferred;
use crate::vocab::tried::{TriedBackend, WithBackend};
use crate::vocab::{ProxyError, WorkerId};

/// Request extension: the balancer tries this backend (an index into the route's backends)
/// first. Set by sticky sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pinned(pub usize);

/// A route's backends, in config order, with its round-robin position.
#[derive(Debug)]
pub struct BackendSet {
    backends: Box<[Arc<Backend>]>,
    /// Active health checks run for this route; without them only passive health counts.
    health_checked: bool,
    /// Per backend, the verdict of the probe of this route's path (empty when unprobed).
    probe_down: Box<[Arc<AtomicBool>]>,
    /// The request's host may name the TLS server (a named route; never `DEFAULT`).
    sni_from_request: bool,
    next: AtomicUsize,
}

impl BackendSet {
    /// The backends of a route; `probed`: the route's host and path, when health checks run
    /// for it (each backend's verdict is the one of its probes of that path asking for the name
    /// the route's requests ask for).
    pub fn new(
        backends: Box<[Arc<Backend>]>,
        probed: Option<(&str, &str)>,
        sni_from_request: bool,
    ) -> BackendSet {
        let probe_down = match probed {
            Some((host, path)) => backends
                .iter()
                .map(|b| b.probe_down_at(b.server_name_for(host), path))
                .collect(),
            None => Box::default(),
        };
        BackendSet {
            backends,
            health_checked: probed.is_some(),
            probe_down,
            sni_from_request,
            next: AtomicUsize::new(0),
        }
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Arc<Backend>> {
        self.backends.iter()
    }

    pub fn len(&self) -> usize {
        self.backends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&Arc<Backend>> {
        self.backends.get(index)
    }

    /// Where `backend` stands in the set (the first entry, when listed twice).
    pub fn position(&self, backend: &Arc<Backend>) -> Option<usize> {
        self.backends.iter().position(|b| Arc::ptr_eq(b, backend))
    }

    pub fn health_checked(&self) -> bool {
        self.health_checked
    }

    /// Whether the backend at `index` may take requests: passive health, and its probe of this
    /// route's path when health checks run for the route.
    pub fn usable_at(&self, index: usize) -> bool {
        let probe_passed = self
            .probe_down
            .get(index)
            .is_none_or(|down| !down.load(Ordering::Relaxed));
        probe_passed && self.backends.get(index).is_some_and(|b| b.passive_up())
    }

    /// Whether the backend at `index` is in rotation, as `/metrics` and `/status` say: its
    /// probe of this route's path passed (or none runs), and no failed connects mark it down
    /// (a lapsed mark, whose trial is due, is still a mark).
    pub fn in_rotation_at(&self, index: usize) -> bool {
        let probe_passed = self
            .probe_down
            .get(index)
            .is_none_or(|down| !down.load(Ordering::Relaxed));
        probe_passed
            && self
                .backends
                .get(index)
                .is_some_and(|b| !b.passively_marked())
    }

    /// Whether any backend may take requests now.
    pub fn any_usable(&self) -> bool {
        (0..self.backends.len()).any(|index| self.usable_at(index))
    }

    /// The next turn of the round robin that falls on a usable backend: a turn that falls on
    /// one out of rotation is passed over, so the others share its turns evenly (taking the
    /// next usable one after it gave that one a double share, as nginx and HAProxy do not).
    fn next_start(&self) -> usize {
        let turn = || self.next.fetch_add(1, Ordering::Relaxed);
        let first = turn();
        let usable = |n: usize| self.usable_at(n % self.backends.len().max(1));
        if usable(first) {
            return first;
        }
        (1..self.backends.len())
            .map(|_| turn())
            .find(|n| usable(*n))
            .unwrap_or(first)
    }
}

/// A request ready for the backends: its head (HTTP/1.1 form) and body, and whether it may
/// safely be sent twice (its head replayed with an empty body).
pub struct Outgoing {
    pub head: Parts,
    /// `X-Forwarded-*` and `X-Request-Id` still to add, when the head has none of its own.
    pub deferred: Option<Deferred>,
    /// The request has no host (an HTTP/1.0 client's without `Host`): it is sent with the
    /// backend's own (as nginx's `$proxy_host`), since HTTP/1.1 requires one (RFC 9112 §3.2).
    pub no_host: bool,
    pub body: UpBody,
    pub replayable: bool,
}

/// Why no backend answered: the error to answer with, and the backend it failed with last
/// (none when none was tried).
#[derive(Debug)]
pub struct Failed {
    pub error: ProxyError,
    pub at: Option<Arc<Backend>>,
}

/// Sends `out` to the set's backends: the pinned one first if any, else the next in round
/// robin; on to the next usable backend while connections cannot be made (or a replayable
/// request's connection broke); each backend is tried once, however often it is listed. An
/// exchange dropped unfinished (the client left) leaves its backend in `dropped_at`.
pub fn send<'a>(
    set: &'a BackendSet,
    out: Outgoing,
    worker: WorkerId,
    timeouts: Timeouts,
    dropped_at: Option<&'a TriedBackend<'a>>,
) -> impl Future<Output = Result<Response<PooledBody>, Failed>> + 'a {
    // Not an `async fn`: that would keep `out` twice in its state, beside the request made of
    // it, and this future sits inside every request's.
    let len = set.len();
    let start = match out.head.extensions.get::<Pinned>() {
        Some(Pinned(index)) => *index,
        None => set.next_start(),
    };
    let replayable = out.replayable;
    let deferred = out.deferred;
    let no_host = out.no_host;
    let mut pending = Some(Request::from_parts(out.head, out.body));
    async move {
        let mut last_error = None;
        let mut last_tried: Option<&Arc<Backend>> = None;
        // Backends already tried; allocated only when a first attempt fails.
        let mut tried: Vec<usize> = Vec::new();
        for step in 0..len {
            let index = (start + step) % len;
            let backend = &set.backends[index];
            if !set.usable_at(index) || tried.contains(&identity(backend)) {
                continue;
            }
            // Once a passive mark lapses, one request tries the backend; the others pass it by.
            if !backend.claim_trial(timeouts.connect) {
                continue;
            }
            let Some(mut request) = pending.take() else {
                break;
            };
            if let Some(failed) = last_tried {
                retried(failed, worker);
            }
            if no_host {
                // Rare: allocated per attempt.
                if let Ok(host) = HeaderValue::from_str(backend.authority.as_str()) {
                    request.headers_mut().insert(header::HOST, host);
                }
            }
            let x = Exchange {
                backend,
                worker,
                timeouts,
                sni_from_request: set.sni_from_request,
                deferred: deferred.as_ref(),
            };
            let began = std::time::Instant::now();
            let with_backend = WithBackend::new(dropped_at, &backend.label);
            let sent = match pool::send(x, request, replayable).await {
                // A pooled connection turned out stale: the request, if it can be replayed,
                // goes again on a fresh connection to the same backend.
                Err(SendError::Reset {
                    reused: true,
                    error,
                    replay: Some(head),
                }) => {
                    tracing::debug!(backend = %x.backend.label, "stale pooled connection ({error}); retrying");
                    retried(backend, worker);
                    pool::send(x, replay_request(*head), true).await
                }
                other => other,
            };
            with_backend.done();
            match sent {
                Ok(resp) if resp.status().as_u16() > 599 => {
                    // RFC 9110 §15: outside 100..=599 is no status; taken as the server error it is.
                    tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "invalid response: status {}", resp.status());
                    count_failure(backend, worker, UpstreamFailure::BadResponse, dropped_at);
                    return Err(failed(ProxyError::BadResponse, backend));
                }
                Ok(mut resp) => {
                    backend.note_answer(worker, resp.status());
                    resp.body_mut()
                        .set_served_by(ServedBy(backend.clone(), began));
                    return Ok(resp);
                }
                Err(SendError::Connect { error, request }) => {
                    if error.kind() == ConnectErrorKind::Capacity {
                        backend.say_at_capacity(&error);
                        count_failure(backend, worker, UpstreamFailure::Busy, dropped_at);
                    } else {
                        tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "{error}");
                        count_failure(backend, worker, UpstreamFailure::Connect, dropped_at);
                    }
                    pending = Some(*request);
                    last_error = Some(if error.kind() == ConnectErrorKind::Capacity {
                        ProxyError::BackendBusy
                    } else if error.is_timeout() {
                        ProxyError::ConnectTimeout
                    } else {
                        ProxyError::ConnectFailed
                    });
                }
                Err(SendError::Reset { error, replay, .. }) => {
                    let said = crate::vocab::error_text::with_causes(&*error);
                    tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "backend reset: {said}");
                    count_failure(backend, worker, UpstreamFailure::Reset, dropped_at);
                    last_error = Some(ProxyError::BackendReset);
                    match replay {
                        Some(head) => pending = Some(replay_request(*head)),
                        None => return Err(failed(ProxyError::BackendReset, backend)),
                    }
                }
                Err(SendError::ClientBody(error)) => {
                    // The client's doing: said at debug level, the access log has its 400.
                    tracing::debug!(backend = %backend.label, "request body failed: {error}");
                    return Err(failed(ProxyError::ClientBody, backend));
                }
                Err(SendError::BadResponse(error)) => {
                    // The error says "invalid response" itself.
                    tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "{error}");
                    count_failure(backend, worker, UpstreamFailure::BadResponse, dropped_at);
                    return Err(failed(ProxyError::BadResponse, backend));
                }
                Err(SendError::ClientStalled) => {
                    // The client's doing, as a failed body is: not the backend's 504.
                    tracing::debug!(backend = %backend.label, "the request body stopped coming");
                    return Err(failed(ProxyError::ClientBodyTimeout, backend));
                }
                Err(SendError::Unprocessed(request)) => {
                    // Refused unprocessed each time the pool sent it: never to this backend
                    // again, to the next one if it comes back.
                    tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "backend refused the request (REFUSED_STREAM), every time");
                    count_failure(backend, worker, UpstreamFailure::Reset, dropped_at);
                    last_error = Some(ProxyError::BackendReset);
                    match request {
                        Some(request) => pending = Some(*request),
                        None => return Err(failed(ProxyError::BackendReset, backend)),
                    }
                }
                Err(SendError::Timeout) => {
                    tracing::warn!(backend = %backend.label, request_id = %logged_id(dropped_at), "no response within {:?}", timeouts.response);
                    count_failure(backend, worker, UpstreamFailure::Timeout, dropped_at);
                    return Err(failed(ProxyError::ResponseTimeout, backend));
                }
            }
            tried.push(identity(backend));
            last_tried = Some(backend);
        }
        Err(Failed {
            error: last_error.unwrap_or(if len == 0 {
                ProxyError::NoBackends
            } else {
                ProxyError::AllBackendsDown
            }),
            at: last_tried.cloned(),
        })
    }
}

/// The request id a failure is logged with (`-` for none).
fn logged_id<'a>(tried: Option<&'a TriedBackend<'a>>) -> &'a str {
    tried.map_or("-", TriedBackend::request_id)
}

/// Counts an exchange with `backend` that failed ([`UpstreamFailure`]).
#[cold]
fn count_failure(
    backend: &Backend,
    worker: WorkerId,
    failure: UpstreamFailure,
    tried: Option<&TriedBackend<'_>>,
) {
    if let Some(tried) = tried {
        tried.failed_with(&backend.label, failure.as_str());
    }
    backend
        .metrics
        .upstream_failed(worker, &backend.label, failure);
}

/// Counts a request sent on to another attempt after `backend` failed it.
#[cold]
fn retried(backend: &Backend, worker: WorkerId) {
    backend.metrics.upstream_retried(worker, &backend.label);
}

/// A failure with `backend`.
fn failed(error: ProxyError, backend: &Arc<Backend>) -> Failed {
    Failed {
        error,
        at: Some(backend.clone()),
    }
}

/// A backend's identity for "already tried" (its address; the set holds it alive).
fn identity(backend: &Arc<Backend>) -> usize {
    Arc::as_ptr(backend) as usize
}

fn replay_request(head: Parts) -> Request<UpBody> {
    Request::from_parts(head, Either::Right(Empty::new()))
}
