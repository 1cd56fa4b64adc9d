//! The per-request wrapper around the router on the proxy listeners: counts metrics, starts and
//! finishes the access log record, and adds HSTS on TLS listeners of grade `high`. Who the
//! request is from (real client address, `X-Request-Id`) is decided first ([`real_client`]);
//! the id goes back with the response, in its body until the head is written ([`LateId`]).
//!
//! It only observes: the router's response passes through unchanged apart from HSTS and the id.
//! An upgrade's record is handed to its tunnel, which writes it when it ends.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{HeaderValue, ALT_SVC, STRICT_TRANSPORT_SECURITY};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::real_client::{self, RequestIds, TrustedProxies};
use super::AltSvc;
use crate::accesslog::{AccessLog, Record};
use crate::metrics::Metrics;
use crate::proxy::upgrade::TunnelEnd;
use crate::proxy::RespBody;
use crate::routing::Router;
use crate::upstream::{served_by, FailedAt};
use crate::vocab::error::GrpcErrorFor;
use crate::vocab::late_id::LateId;
use crate::vocab::tried::TriedBackend;
use crate::vocab::{CacheStatus, ClientBody, ClientConn, TlsFacts, WorkerId};

/// The client's response body, counting bytes for the access log, with the request id for the
/// head.
pub struct LoggedBody {
    inner: RespBody,
    record: Record,
    request_id: Option<HeaderValue>,
}

impl LateId for LoggedBody {
    fn take_request_id(&mut self) -> Option<HeaderValue> {
        self.request_id.take()
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = <RespBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.record.add_bytes(data.len());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts the request as its client's leaving (499) if it is dropped before its answer, which
/// its server does when the client goes away; the record logs it so too ([`Record`]), with the
/// backend the request was with then (`tried`, which the dropped exchange filled first).
struct Unanswered<'a> {
    metrics: &'a Metrics,
    worker: WorkerId,
    record: &'a mut Record,
    tried: &'a TriedBackend<'a>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.metrics.client_left(self.worker);
        if let Some(backend) = self.tried.take() {
            self.record.left_with(backend);
        }
        self.record.tried(self.tried.failures());
    }
}

/// Where requests that never reach the router are counted and logged: those hyper refuses
/// itself, answering a malformed head with 400 and an oversized one with 431 or 414.
#[derive(Clone)]
pub struct Refusals {
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
    pub worker: WorkerId,
}

impl Refusals {
    /// A request from `client` (over TLS as `tls` says) was refused with `status` and an
    /// answer of `body_bytes`.
    pub fn refused(&self, client: IpAddr, tls: &TlsFacts, status: StatusCode, body_bytes: u64) {
        self.metrics.request_refused(self.worker, status);
        self.access_log
            .refused(client, tls, status.as_u16(), body_bytes);
    }

    /// What an HTTP/2 connection from `client` tells of the request heads h2 refuses itself
    /// (a 431, or a malformed head's reset as 400): logged and counted as hyper's HTTP/1
    /// refusals are. Made once per HTTP/2 connection.
    pub fn h2_note(&self, client: IpAddr, tls: TlsFacts) -> h2::refusals::Note {
        let refusals = self.clone();
        Box::new(move |status| {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            refusals.refused(client, &tls, status, 0);
        })
    }
}

/// What every request of one client connection shares.
pub struct ConnCtx {
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
    pub client: ClientConn,
    /// Add `Strict-Transport-Security` to responses that lack it (TLS grade `high`).
    pub hsts: bool,
    /// `Alt-Svc` for every response (the TLS listener, when HTTP/3 is on), beside a backend's own.
    pub alt_svc: Option<AltSvc>,
    pub trusted: Arc<TrustedProxies>,
    /// The worker's request id generator.
    pub request_ids: Arc<RequestIds>,
}

/// [`handle`] as a hyper service answers: its future, not another one around it (each level
/// of `async fn` moves the whole state machine below it once more).
pub fn answer(
    ctx: Arc<ConnCtx>,
    req: Request<ClientBody>,
) -> impl Future<Output = Result<Response<LoggedBody>, Infallible>> {
    handle(ctx, req).map(Ok)
}

/// Handles one request through the router, with metrics and the access log around it. Its
/// body is an `async` block, not an `async fn`: that would keep the request twice in its state.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments and their moved-to locals both in its state"
)]
pub fn handle(
    ctx: Arc<ConnCtx>,
    mut req: Request<ClientBody>,
) -> impl Future<Output = Response<LoggedBody>> {
    async move {
        let (client, request_id) =
            real_client::identify(&ctx.trusted, &ctx.request_ids, &ctx.client, req.headers());
        let client = &*client;
        let start = Instant::now();
        let version = req.version();
        let connect = req.method() == Method::CONNECT;
        ctx.metrics
            .request_started(client.worker, req.method(), version);
        let mut record = ctx
            .access_log
            .begin(client.client_ip, &client.tls_facts, &req, start);
        record.request_id(&request_id.value);
        if let Some(counter) = record.count_body(&req) {
            req.extensions_mut().insert(counter);
        }
        let tried = TriedBackend::new(&request_id.value);
        let unanswered = Unanswered {
            metrics: &ctx.metrics,
            worker: client.worker,
            record: &mut record,
            tried: &tried,
        };
        let to_set = request_id.to_set();
        let mut resp = ctx.router.handle(client, req, to_set, Some(&tried)).await;
        std::mem::forget(unanswered);
        let served = served_by(&resp);
        let status = match served {
            Some(_) => resp.status(),
            None => logged_status(&resp),
        };
        let now = Instant::now();
        let label = served.map(|s| &s.0.label);
        ctx.metrics
            .response_ready(client.worker, status, now - start, label.map(|l| &**l));
        // The backend an exchange failed with, for the log only: it sent no answer.
        let failed_at = || resp.extensions().get::<FailedAt>().map(|f| &f.0.label);
        let logged = label.or_else(failed_at);
        record.respond(status.as_u16(), logged, (served.map(|s| s.1), now));
        record.tried(tried.failures());
        if let Some(cache) = resp.extensions().get::<CacheStatus>() {
            record.cache_status(cache.0);
        }
        let status = resp.status();
        let tunnel = status == StatusCode::SWITCHING_PROTOCOLS || (connect && status.is_success());
        if tunnel {
            if let Some(end) = resp.extensions_mut().remove::<TunnelEnd>() {
                let mut line = std::mem::take(&mut record);
                end.on_end(move |to_client, from_client| {
                    line.tunnel_ended(to_client, from_client);
                });
            }
        }
        if ctx.hsts && !resp.headers().contains_key(STRICT_TRANSPORT_SECURITY) {
            resp.headers_mut().insert(
                STRICT_TRANSPORT_SECURITY,
                HeaderValue::from_static("max-age=31536000"),
            );
        }
        if let Some(alt_svc) = &ctx.alt_svc {
            let offered = alt_svc.offered.load(std::sync::atomic::Ordering::Relaxed);
            // Beside a backend's own (the backend knows nothing of this listener's UDP port:
            // in its place, clients were sent where nothing serves HTTP/3).
            let ours = &alt_svc.value;
            if offered && !resp.headers().get_all(ALT_SVC).iter().any(|v| v == ours) {
                resp.headers_mut().append(ALT_SVC, ours.clone());
            }
        }
        let request_id = Some(request_id.value);
        resp.map(|inner| LoggedBody {
            inner,
            record,
            request_id,
        })
    }
}

/// The status the proxy's own answer is logged and counted as: a gRPC error's stands for one
/// (its HTTP status is 200).
fn logged_status(resp: &Response<RespBody>) -> StatusCode {
    let grpc_error = resp.extensions().get::<GrpcErrorFor>();
    grpc_error.map_or(resp.status(), |error| error.0)
}
