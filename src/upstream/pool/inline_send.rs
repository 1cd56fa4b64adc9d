//! Sending on the plain connections a request's own task drives ([`crate::upstream::inline`]):
//! the framing of what can go that way, an idle pooled connection tried before a new one, and
//! the inline client's failures in the pool's terms.

use std::future::Future;

use http::request::Parts;
use http::{header, Request, Response};
use http_body::Body;

use super::{connect_error, Exchange, SendError, UpBody};
use crate::upstream::inline::{BodyLength, InlineConn, InlineError, SendFailure};
use crate::upstream::pooled_body::{PoolHome, PooledBody};

/// How the body of a request its task can send on a plain connection itself is framed: by its
/// one `Content-Length`, else chunked unless it is empty. Not for an upgrade, nor a request
/// waiting for `100 Continue` (hyper's client handles both).
pub(super) fn inline_body_length(req: &Request<UpBody>) -> Option<BodyLength> {
    // One pass over the fields: comparing names is cheaper than hashing them for each lookup.
    let mut length = None;
    for (name, value) in req.headers() {
        if name == header::CONTENT_LENGTH {
            if length.is_some() {
                return None;
            }
            length = Some(value);
        } else if name == header::UPGRADE
            || name == header::EXPECT
            || name == header::TRANSFER_ENCODING
        {
            return None;
        }
    }
    match length {
        None if req.body().is_end_stream() => Some(BodyLength::Known(0)),
        None => Some(BodyLength::Chunked),
        Some(length) => length.to_str().ok()?.parse().ok().map(BodyLength::Known),
    }
}

/// Sends a request on an idle plain connection (one the backend closed while idle, or that
/// breaks before a byte of the request is written, is passed over), else on a new one,
/// driving the exchange from this task ([`crate::upstream::inline`]). Not an `async fn`, as [`super::send`]: the
/// request is taken apart before the future is made, which keeps the parts only.
pub(super) fn send_inline<'a>(
    x: Exchange<'a>,
    req: Request<UpBody>,
    length: BodyLength,
    replayable: bool,
) -> impl Future<Output = Result<Response<PooledBody>, SendError>> + 'a {
    let (head, body) = req.into_parts();
    async move {
        let backend = x.backend;
        let mut body = body;
        let mut looked_again = false;
        loop {
            while let Some(conn) = backend.slot(x.worker).take_inline() {
                match send_on_inline(x, conn, &head, (body, length), true).await {
                    Ok(resp) => return Ok(resp),
                    Err((error, Some(unsent))) => {
                        tracing::debug!(backend = %backend.label, "pooled connection unusable ({error:?}); trying another");
                        body = unsent;
                    }
                    Err((error, None)) => {
                        return Err(with_replay(error, replayable.then_some(head)))
                    }
                }
            }
            if std::mem::replace(&mut looked_again, true) {
                break;
            }
            // None idle, but answers already in may be queued behind this request, each about
            // to bring its connection back. tokio runs a yielding task again only after polling
            // for I/O and running what that woke: look once more then, before opening one.
            tokio::task::yield_now().await;
        }
        let conn = match backend.connect_inline(x.timeouts.connect).await {
            Ok(conn) => conn,
            Err(error) => return Err(connect_error(error, Request::from_parts(head, body))),
        };
        send_on_inline(x, conn, &head, (body, length), false)
            .await
            .map_err(|(error, _)| with_replay(error, replayable.then_some(head)))
    }
}

/// A reset carries the head to replay, if the request has one (the inline client only borrowed
/// it; for hyper's client it is a copy); other errors are never replayed.
pub(super) fn with_replay(error: SendError, head: Option<Parts>) -> SendError {
    match error {
        SendError::Reset { error, reused, .. } => SendError::Reset {
            error,
            reused,
            replay: head.map(Box::new),
        },
        other => other,
    }
}

/// One exchange on an inline connection; a failure before any of the request went out gives
/// the body back. Not an `async fn`: the exchange is started before the future is made, which
/// keeps it and the little it needs afterwards.
fn send_on_inline<'a>(
    x: Exchange<'a>,
    mut conn: Box<InlineConn>,
    head: &'a http::request::Parts,
    (body, length): (UpBody, BodyLength),
    reused: bool,
) -> impl Future<Output = Result<Response<PooledBody>, (SendError, Option<UpBody>)>> + 'a {
    let home = PoolHome {
        backend: x.backend.clone(),
        worker: x.worker,
    };
    conn.respond_within(x.timeouts.response);
    let sending = conn.send((head, x.deferred), body, length, home);
    async move {
        match sending.await {
            Ok(resp) => {
                x.backend.metrics.upstream_connection(x.worker, reused);
                Ok(resp.map(PooledBody::inline))
            }
            Err(SendFailure {
                error: InlineError::TimedOut,
                ..
            }) => Err((SendError::Timeout, None)),
            Err(SendFailure {
                error: InlineError::ClientStalled,
                ..
            }) => Err((SendError::ClientStalled, None)),
            Err(SendFailure { error, .. }) if error.is_bad_response() => {
                Err((SendError::BadResponse(error.into()), None))
            }
            Err(SendFailure {
                error: InlineError::RequestBody(error),
                ..
            }) => Err((SendError::ClientBody(error), None)),
            Err(SendFailure { error, unsent }) => {
                let error = error.into();
                let reset = SendError::Reset {
                    error,
                    reused,
                    replay: None,
                };
                Err((reset, unsent))
            }
        }
    }
}
