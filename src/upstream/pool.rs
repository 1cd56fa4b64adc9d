//! Sending a request to one backend over a pooled connection.
//!
//! Each worker thread has its own slot in every backend (chosen by the [`WorkerId`] that travels
//! with the request): a short list of idle HTTP/1.1 connections and its shared HTTP/2
//! connections. The slot's mutexes are only ever taken by its own worker, so they are never
//! contended. An HTTP/1.1 connection goes back to the list when its response body has been read
//! to the end ([`PooledBody`]); one dropped early is closed. A request that finds none idle
//! looks again, after the answers already in, before opening one. An HTTP/2 connection carries as many
//! requests at once as the backend's SETTINGS allow (see `h2_settings`); past that the worker
//! opens another. A burst that finds no HTTP/2 connection opens one, not one per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{Either, FutureExt as _};
use http::header;
use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};

use super::backend::Backend;
pub use super::connector::UpBody;
use super::connector::{self, ConnectError, ConnectErrorKind, Fresh, Wire};
use super::detect;
use super::pooled_body::{PooledBody, Reusable};
use super::refused::{self, copy_head, Resendable};
use super::slot::StreamTicket;
use crate::vocab::forwarded::Deferred;
use crate::vocab::headers::only_chunked;
use crate::vocab::normalise::strip_port;
use crate::vocab::request_body::BoxError;
use crate::vocab::WorkerId;
use inline_send::{inline_body_length, send_inline, with_replay};

/// Limits for one exchange with a backend.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// Why a request to a backend got no response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made; nothing was sent, so the request comes back.
    Connect {
        error: ConnectError,
        /// Boxed: this path is rare and the error stays small on the common one.
        request: Box<Request<UpBody>>,
    },
    /// The connection broke after the request started; `reused` if it came from the pool. A
    /// request that may be sent again gives its head back (`replay`) to go with an empty body.
    Reset {
        error: BoxError,
        reused: bool,
        replay: Option<Box<Parts>>,
    },
    /// The client's request body failed (malformed, cut short): the client's fault, not the
    /// backend's; never sent again, here or elsewhere.
    ClientBody(BoxError),
    /// The backend answered with something that is not HTTP.
    BadResponse(BoxError),
    /// No response head within the response timeout.
    Timeout,
    /// The client's body stopped coming for the response timeout (the backend waited for it).
    ClientStalled,
    /// An HTTP/2 backend refused the request before processing any of it (see `refused`).
    /// Within this module it comes back whole, in HTTP/2 form, or `None`: to be made again from
    /// the caller's copy of its head ([`Target::head_held`]), and goes again. Returned once
    /// refused [`refused::RESENDS`] times more, with the request as it came when it has no
    /// body (for another backend), else `None`.
    Unprocessed(Option<Box<Request<UpBody>>>),
}

/// One request on its way to one backend: which worker sends it, under which limits.
#[derive(Clone, Copy)]
pub struct Exchange<'a> {
    pub backend: &'a Arc<Backend>,
    pub worker: WorkerId,
    pub timeouts: Timeouts,
    /// The TLS server name may come from the request's host (a named route); on a `DEFAULT`
    /// route, which takes any host a client makes up, it is always the backend's own name.
    pub sni_from_request: bool,
    /// `X-Forwarded-*` and `X-Request-Id` not in the request's map yet: written into the inline
    /// client's head, or inserted for hyper's client.
    pub deferred: Option<&'a Deferred>,
}

/// How one request reaches its backend: the wire and, for TLS, the server name its connection
/// is opened and pooled under (`None` for plain wires).
struct Target {
    wire: Wire,
    sni: Option<Arc<str>>,
    /// The name came from the client: a handshake it makes fail says nothing of the backend.
    sni_by_client: bool,
    /// The request asks to switch protocols: only then may the answer be a 101.
    upgrade: bool,
    /// The caller keeps a copy of the (bodyless) request's head for a replay: a stream refused
    /// unprocessed is sent again from it, and needs no copy of its own.
    head_held: bool,
    /// The backend's count of address changes when the request set out
    /// ([`Backend::addrs_generation`]).
    addrs_generation: u32,
}

/// Sends `req` (HTTP/1.1 form) to the backend, reusing a pooled connection when one has room.
/// A backend whose protocol is not known yet is detected first. A `replayable` request's head
/// comes back with a broken connection's error.
///
/// Neither an `async fn` nor an async block of its own: either would keep the request (280
/// bytes) in its state beside the future it was moved into, and this future sits inside every
/// request's, copied whole at each level it is moved through. The request goes straight into
/// the future that sends it.
pub fn send<'a>(
    x: Exchange<'a>,
    req: Request<UpBody>,
    replayable: bool,
) -> impl Future<Output = Result<Response<PooledBody>, SendError>> + 'a {
    let backend = x.backend;
    let sending = match backend.wire() {
        Some(wire) => send_over(x, wire, req, replayable),
        // Boxed: rare, and the detection future is large.
        None => Either::Right(Box::pin(detect_and_send(x, req, replayable)) as Boxed<'a>),
    };
    sending.map(move |sent| {
        if let Err(SendError::BadResponse(_) | SendError::Reset { reused: false, .. }) = &sent {
            // A new connection failed: the backend may speak something else now.
            backend.doubt_protocol();
        }
        sent
    })
}

/// A boxed exchange (hyper's client, or a detection first).
type Boxed<'a> = Pin<Box<dyn Future<Output = Result<Response<PooledBody>, SendError>> + Send + 'a>>;

/// The inline client for a plain HTTP/1.1 request it can frame; hyper's client for the rest.
fn send_over<'a>(
    x: Exchange<'a>,
    wire: Wire,
    req: Request<UpBody>,
    replayable: bool,
) -> Either<impl Future<Output = Result<Response<PooledBody>, SendError>> + 'a, Boxed<'a>> {
    if wire == Wire::Http1 {
        if let Some(length) = inline_body_length(&req) {
            return Either::Left(send_inline(x, req, length, replayable));
        }
    }
    // Boxed: hyper's futures are large, and unboxed they would make every request's future
    // (the inline path's too) that much larger all the way up to the router.
    Either::Right(Box::pin(send_by_hyper_replayable(x, wire, req, replayable)))
}

/// Detects the backend's protocol, then sends.
async fn detect_and_send(
    x: Exchange<'_>,
    req: Request<UpBody>,
    replayable: bool,
) -> Result<Response<PooledBody>, SendError> {
    match detect::wire_of(x.backend, x.timeouts.connect).await {
        Ok(wire) => send_over(x, wire, req, replayable).await,
        Err(error) => Err(connect_error(error, req)),
    }
}

/// hyper's client takes the request: a copy of the head stays for a replay (with the
/// `X-Forwarded-*` and `X-Request-Id` it reads from the map, as the request that may come back).
async fn send_by_hyper_replayable(
    x: Exchange<'_>,
    wire: Wire,
    mut req: Request<UpBody>,
    replayable: bool,
) -> Result<Response<PooledBody>, SendError> {
    if let Some(deferred) = x.deferred {
        deferred.insert_into(req.headers_mut());
    }
    let mut target = target(&req, x, wire);
    let replay = replayable.then(|| copy_head(&req));
    target.head_held = replay.is_some();
    let mut resends = 0;
    let sent = loop {
        match send_by_hyper(x, &target, req).await {
            Err(SendError::Unprocessed(again)) if resends < refused::RESENDS => {
                let again = again.map(|r| *r);
                let Some(again) = again.or_else(|| replay.as_ref().map(refused::bodyless)) else {
                    break Err(SendError::Unprocessed(None));
                };
                tracing::debug!(backend = %x.backend.label, "request refused unprocessed; sending it again");
                resends += 1;
                req = again;
            }
            other => break other,
        }
    };
    sent.map_err(|error| match error {
        // Refused every time: another backend may take it (RFC 9113 §8.7: it was not
        // processed), not this one once more as a stale connection's request would be. A
        // bodyless replayable request goes from the head held for it; any other from the last
        // send's own, its body kept whole, in HTTP/1.1 form again for whatever the next
        // backend speaks.
        SendError::Unprocessed(last) => SendError::Unprocessed(match replay {
            Some(head) => {
                let body = http_body_util::Either::Right(http_body_util::Empty::new());
                Some(Box::new(Request::from_parts(head, body)))
            }
            None => last.map(|req| Box::new(connector::to_h1_form(*req))),
        }),
        error => with_replay(error, replay),
    })
}

/// Sends on hyper's client: upgrades, `Expect`, TLS and HTTP/2 backends.
async fn send_by_hyper(
    x: Exchange<'_>,
    t: &Target,
    req: Request<UpBody>,
) -> Result<Response<PooledBody>, SendError> {
    let (backend, wire) = (x.backend, t.wire);
    let slot = backend.slot(x.worker);
    // Upgrades (WebSocket) only exist in HTTP/1.1.
    if wire == Wire::Http1 || req.headers().contains_key(header::UPGRADE) {
        return send_h1(x, t, req).await;
    }
    if let Some(stream) = slot.h2_stream(t.sni.as_deref()) {
        return send_on_h2(x, t, stream, h2_form(req, backend, wire), true).await;
    }
    if wire == Wire::Tls && slot.tls_chose_h1.load(Ordering::Relaxed) {
        return send_h1(x, t, req).await;
    }
    let opening = slot.opening_h2.lock().await;
    if let Some(stream) = slot.h2_stream(t.sni.as_deref()) {
        drop(opening);
        return send_on_h2(x, t, stream, h2_form(req, backend, wire), true).await;
    }
    let connecting = backend.connect(
        wire,
        t.server_name(backend),
        t.sni_by_client,
        x.timeouts.connect,
        true,
    );
    match connecting.await {
        Ok(fresh) => send_on_fresh(x, t, fresh, true, Some(opening), req).await,
        Err(error) => Err(connect_error(error, req)),
    }
}

/// Sends on a connection just opened. A new HTTP/2 connection is shared with this worker's
/// later requests, and `opening` (held while it was opened) is released as soon as it is. When
/// h2 was offered to a TLS backend, its choice is remembered for the next connection.
async fn send_on_fresh(
    x: Exchange<'_>,
    t: &Target,
    fresh: Fresh,
    h2_offered: bool,
    opening: Option<tokio::sync::MutexGuard<'_, ()>>,
    req: Request<UpBody>,
) -> Result<Response<PooledBody>, SendError> {
    let (backend, wire) = (x.backend, t.wire);
    if wire == Wire::Tls && h2_offered {
        let chose_h1 = matches!(fresh, Fresh::H1(_));
        backend
            .slot(x.worker)
            .tls_chose_h1
            .store(chose_h1, Ordering::Relaxed);
    }
    match fresh {
        Fresh::H1(conn) => {
            drop(opening);
            send_on_new_h1(x, t, conn, req).await
        }
        Fresh::H2(conn, limit) => {
            let ticket = backend
                .slot(x.worker)
                .add_h2(t.sni.clone(), conn.clone(), limit);
            drop(opening);
            send_on_h2(x, t, (conn, ticket), h2_form(req, backend, wire), false).await
        }
    }
}

fn connect_error(error: ConnectError, req: Request<UpBody>) -> SendError {
    SendError::Connect {
        error,
        request: Box::new(req),
    }
}

/// How often a request through hyper's client looks again for an idle connection, a turn of
/// the scheduler apart, before opening one: hyper's connection task hands an answer's end to
/// the body and then takes the next request, so one turn is not enough (`send_inline` needs one).
const HYPER_LOOKS_AGAIN: u32 = 2;

async fn send_h1(
    x: Exchange<'_>,
    t: &Target,
    mut req: Request<UpBody>,
) -> Result<Response<PooledBody>, SendError> {
    let backend = x.backend;
    let mut looked_again = 0;
    loop {
        while let Some(mut conn) = backend.slot(x.worker).take_idle(t.sni.as_deref()) {
            match tokio::time::timeout(x.timeouts.response, conn.try_send_request(req)).await {
                Err(_) => return Err(SendError::Timeout),
                Ok(Ok(resp)) => {
                    backend.metrics.upstream_connection(x.worker, true);
                    return wrap_h1(x, t, resp, conn);
                }
                Ok(Err(mut err)) => match err.take_message() {
                    // Never written: try the next idle connection, or a new one.
                    Some(back) => req = back,
                    None => return Err(classify(err.into_error(), true)),
                },
            }
        }
        if looked_again == HYPER_LOOKS_AGAIN {
            break;
        }
        looked_again += 1;
        // As in `send_inline`: answers already in may bring a connection back.
        tokio::task::yield_now().await;
    }
    let offer_h2 = !req.headers().contains_key(header::UPGRADE);
    let connecting = backend.connect(
        t.wire,
        t.server_name(backend),
        t.sni_by_client,
        x.timeouts.connect,
        offer_h2,
    );
    match connecting.await {
        Ok(fresh) => send_on_fresh(x, t, fresh, offer_h2, None, req).await,
        Err(error) => Err(connect_error(error, req)),
    }
}

async fn send_on_new_h1(
    x: Exchange<'_>,
    t: &Target,
    mut conn: http1::SendRequest<UpBody>,
    req: Request<UpBody>,
) -> Result<Response<PooledBody>, SendError> {
    match tokio::time::timeout(x.timeouts.response, conn.send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(resp)) => {
            x.backend.metrics.upstream_connection(x.worker, false);
            wrap_h1(x, t, resp, conn)
        }
        Ok(Err(err)) => Err(classify(err, false)),
    }
}

/// The response, with its connection to go back to the pool when the body ends; an upgraded
/// connection belongs to the upgrade now, never to the pool. A transfer coding hyper does not
/// decode (anything but one `chunked`) is refused, as the inline client refuses it, and so is a
/// 101 to a request that asked for no upgrade (RFC 9110 §15.2.2): it went on to the client as
/// a final answer, a 101 without its `Upgrade` (over HTTP/2, a 101 that protocol has not).
fn wrap_h1(
    x: Exchange<'_>,
    t: &Target,
    resp: Response<Incoming>,
    conn: http1::SendRequest<UpBody>,
) -> Result<Response<PooledBody>, SendError> {
    let codings = resp.headers().get_all(header::TRANSFER_ENCODING);
    let mut values = codings.iter().map(http::HeaderValue::as_bytes).peekable();
    if values.peek().is_some() && !only_chunked(values) {
        let error = "a transfer coding other than chunked";
        return Err(SendError::BadResponse(error.into()));
    }
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS && !t.upgrade {
        let error = "101 Switching Protocols without an upgrade";
        return Err(SendError::BadResponse(error.into()));
    }
    let conn = (resp.status() != http::StatusCode::SWITCHING_PROTOCOLS).then(|| Reusable {
        conn,
        backend: x.backend.clone(),
        worker_and_generation: (worker_number(x.worker), t.addrs_generation),
        sni: t.sni.clone(),
    });
    Ok(PooledBody::wrap(resp, (conn, None), x.timeouts.response))
}

/// A worker's number in a `u32` ([`Reusable`]); workers are a handful, numbered from 0.
fn worker_number(worker: WorkerId) -> u32 {
    u32::try_from(worker.0).unwrap_or(u32::MAX)
}

/// Sends on an HTTP/2 stream. A request the backend refused unprocessed, or that never got onto
/// the connection (it was closing), comes back as [`SendError::Unprocessed`].
async fn send_on_h2(
    x: Exchange<'_>,
    t: &Target,
    (mut conn, ticket): (http2::SendRequest<UpBody>, StreamTicket),
    mut req: Request<UpBody>,
    reused: bool,
) -> Result<Response<PooledBody>, SendError> {
    let resendable = Resendable::prepare(&mut req, t.head_held);
    match tokio::time::timeout(x.timeouts.response, conn.try_send_request(req)).await {
        Err(_) => Err(SendError::Timeout),
        Ok(Err(mut failed)) => {
            if let Some(req) = failed.take_message() {
                return Err(SendError::Unprocessed(Some(Box::new(req))));
            }
            let error = failed.into_error();
            if refused::is_refused(&error) {
                if let Some(again) = resendable.take_back().await {
                    return Err(SendError::Unprocessed(again.map(Box::new)));
                }
            }
            let stale = reused && !refused::is_stream_reset(&error);
            Err(classify(error, stale))
        }
        Ok(Ok(resp)) => {
            x.backend.metrics.upstream_connection(x.worker, reused);
            Ok(PooledBody::wrap(
                resp,
                (None, Some(ticket)),
                x.timeouts.response,
            ))
        }
    }
}

fn h2_form(req: Request<UpBody>, backend: &Backend, wire: Wire) -> Request<UpBody> {
    connector::to_h2_form(req, wire == Wire::Tls, &backend.authority)
}

impl Target {
    /// The name to present (plain wires present none; the backend's host stands in).
    fn server_name<'a>(&'a self, backend: &'a Backend) -> &'a str {
        self.sni.as_deref().unwrap_or(&backend.spec.host)
    }
}

/// The request's target: on TLS the server name is the request's host when it is a name and
/// the route lets the request choose, else the backend's host.
fn target(req: &Request<UpBody>, x: Exchange<'_>, wire: Wire) -> Target {
    let upgrade = req.headers().contains_key(header::UPGRADE);
    if wire != Wire::Tls {
        return Target {
            wire,
            sni: None,
            sni_by_client: false,
            upgrade,
            head_held: false,
            addrs_generation: x.backend.addrs_generation(),
        };
    }
    let from_request = x
        .sni_from_request
        .then(|| req.headers().get(header::HOST))
        .flatten()
        .and_then(|h| h.to_str().ok())
        .map(|h| strip_port(h).trim_end_matches('.'))
        .filter(|h| !h.is_empty() && !h.starts_with('[') && h.parse::<std::net::IpAddr>().is_err());
    match from_request {
        // Allocated only for a name other than the backend's own.
        Some(name) if !name.eq_ignore_ascii_case(&x.backend.spec.host) => Target {
            wire,
            sni: Some(name.to_ascii_lowercase().into()),
            sni_by_client: true,
            upgrade,
            head_held: false,
            addrs_generation: x.backend.addrs_generation(),
        },
        _ => Target {
            wire,
            sni: Some(x.backend.own_name.clone()),
            sni_by_client: false,
            upgrade,
            head_held: false,
            addrs_generation: x.backend.addrs_generation(),
        },
    }
}

fn classify(error: hyper::Error, reused: bool) -> SendError {
    if connector::is_client_body_error(&error) {
        return SendError::ClientBody(error.into());
    }
    match connector::exchange_error(&error) {
        ConnectErrorKind::BadResponse => SendError::BadResponse(error.into()),
        _ => SendError::Reset {
            error: error.into(),
            reused,
            replay: None,
        },
    }
}

mod inline_send;

#[cfg(test)]
mod tests;
