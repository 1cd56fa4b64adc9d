//! The per-request wrapper around the proxy: counts metrics, starts and finishes the access log
//! record, and, while the worker drains, asks HTTP/1 clients to close after this response.
//!
//! It only observes: the proxy's response passes through unchanged apart from `Connection: close`
//! during a drain. The response body also carries the request's [`InFlight`] guard, so the
//! connection counts as busy until that body is done.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, HOST};
use http::{Request, Response, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::idle::{Activity, InFlight};
use crate::accesslog::{self, Record};
use crate::metrics::{self, ServedBy};
use crate::proxy::{ClientConn, Proxy, RespBody};

/// The client's response body, counting bytes for the access log.
pub struct LoggedBody {
    inner: RespBody,
    record: Record,
    _in_flight: InFlight,
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

/// What every request of one client connection shares.
pub struct ConnCtx {
    pub proxy: Arc<Proxy>,
    pub client: ClientConn,
    pub draining: DrainFlag,
    /// Add `Strict-Transport-Security` to responses that lack it (TLS grade `high`).
    pub hsts: bool,
    /// Requests open on the connection, for its idle timeout.
    pub activity: Arc<Activity>,
}

/// Handles one request through the proxy, with metrics and the access log around it.
pub async fn handle(ctx: &ConnCtx, req: Request<Incoming>) -> Response<LoggedBody> {
    let in_flight = ctx.activity.begin();
    let client = &ctx.client;
    let start = Instant::now();
    let version = req.version();
    metrics::request_started(req.method(), version);
    let mut record = accesslog::begin(
        client.peer.ip(),
        req.method(),
        req.uri(),
        version,
        req.headers().get(HOST),
        start,
    );
    let mut resp = ctx.proxy.handle(client, req).await;
    let served = resp.extensions().get::<ServedBy>();
    metrics::response_ready(resp.status(), start.elapsed(), served);
    record.respond(resp.status().as_u16(), served.map(|s| &s.0));
    if ctx.hsts
        && !resp
            .headers()
            .contains_key(http::header::STRICT_TRANSPORT_SECURITY)
    {
        resp.headers_mut().insert(
            http::header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    if ctx.draining.load(Ordering::Relaxed) && version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp.map(|inner| LoggedBody {
        inner,
        record,
        _in_flight: in_flight,
    })
}

/// Per-worker drain state shared with every connection's service.
pub type DrainFlag = Arc<AtomicBool>;
