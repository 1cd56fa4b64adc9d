//! One HTTP/3 request stream: its head and body become a `Request<ClientBody>` for the same
//! [`observe::handle`] every listener's requests go through, and the answer's head, body and
//! trailers go back on the stream as they come (flow control is QUIC's: a slow client holds
//! the body where it is, a bounded window at a time).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::StreamExt as _;
use h3::server::RequestStream;
use http::{header, HeaderMap, Method, Request, Response, Version};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use crate::server::observe::{self, ConnCtx};
use crate::vocab::headers::X_REQUEST_ID;
use crate::vocab::late_id::LateId;
use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;

type SendSide = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// How long a bodiless request's end may come after its answer.
const REQUEST_END_WITHIN: Duration = Duration::from_secs(1);
type RecvSide = RequestStream<h3_quinn::RecvStream, Bytes>;

/// Answers one request; whatever goes wrong on the stream ends only that stream. Each write of
/// the answer must find room within `send_within` (`client_send_timeout`, nginx's
/// `send_timeout`), or the stream is reset: a client that stops reading (never opens its flow
/// control window) would otherwise hold the stream, and its backend connection, for good.
pub async fn answer(
    ctx: Arc<ConnCtx>,
    head: Request<()>,
    stream: RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    send_within: Duration,
    conn: quinn::Connection,
) {
    let (mut send, recv) = stream.split();
    let (mut parts, ()) = head.into_parts();
    parts.version = Version::HTTP_3;
    let (body, unread) = request_body(&parts.method, &parts.headers, recv);
    let handled = observe::handle(ctx, Request::from_parts(parts, body));
    let Some((resp, unread)) = answered_unless_left(handled, unread, &conn).await else {
        tracing::debug!("http/3: the client left before its answer came");
        return;
    };
    // A body the backend is slow to send stops with the connection too.
    let sent = tokio::select! {
        sent = respond(&mut send, resp, send_within) => sent,
        _ = conn.closed() => Err(Unsent::Failed("the connection closed".into())),
    };
    match sent {
        Ok(()) => {}
        Err(Unsent::TimedOut) => {
            tracing::debug!("http/3: the client took nothing for {send_within:?}; stream reset");
            send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
        }
        Err(Unsent::Failed(e)) => {
            tracing::debug!("http/3: the answer did not reach the client: {e}")
        }
    }
    if let Some(unread) = unread {
        close_request_side(unread).await;
    }
}

/// The answer, unless the client leaves first: its connection closes, or it resets the stream
/// of a bodiless request (a request with a body fails as its body does). Dropped, the answer
/// cancels the backend's exchange and is logged 499, as over HTTP/1.1 and HTTP/2: a client
/// that sent requests to a slow backend and left held each one's backend connection until the
/// backend answered, up to `upstream_response_timeout`, and so could take every connection
/// `upstream_max_connections` allows, for every client. The request side comes back unless it
/// ended.
async fn answered_unless_left<F, B>(
    handled: F,
    mut unread: Option<RecvSide>,
    conn: &quinn::Connection,
) -> Option<(Response<B>, Option<RecvSide>)>
where
    F: std::future::Future<Output = Response<B>>,
{
    let mut handled = std::pin::pin!(handled);
    let mut watching = unread.is_some();
    loop {
        tokio::select! {
            resp = &mut handled => return Some((resp, unread)),
            _ = conn.closed() => return None,
            read = request_side(&mut unread), if watching => match read {
                // Its end, as expected: nothing more to watch, nor to close later.
                Ok(None) => {
                    unread = None;
                    watching = false;
                }
                // Data on a request without a body: left for the answer's end to stop.
                Ok(Some(())) => watching = false,
                Err(_reset) => return None,
            },
        }
    }
}

/// The next thing on a bodiless request's own side: its end (`None`), data, or a reset.
async fn request_side(unread: &mut Option<RecvSide>) -> Result<Option<()>, h3::error::StreamError> {
    match unread {
        Some(recv) => recv.recv_data().await.map(|data| data.map(drop)),
        None => std::future::pending().await,
    }
}

/// The request side of a bodiless request, once the answer is out: its end is waited for a
/// moment (it usually came with the head), then reading stops with H3_NO_ERROR (RFC 9114
/// §4.1). Dropped unread it would be stopped at once with a code that is no HTTP/3 code, and a
/// client still finishing its request would see an error.
async fn close_request_side(mut recv: RecvSide) {
    let ended = tokio::time::timeout(REQUEST_END_WITHIN, recv.recv_data()).await;
    if !matches!(ended, Ok(Ok(None))) {
        recv.stop_sending(h3::error::Code::H3_NO_ERROR);
    }
}

/// The client's body: none for a GET or HEAD that announces none (as HTTP/1.1 reads it: no
/// `Content-Length`, no body), else the stream's DATA frames and then its trailers. The
/// request side left unread comes back too.
fn request_body(
    method: &Method,
    headers: &HeaderMap,
    recv: RecvSide,
) -> (ClientBody, Option<RecvSide>) {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bodiless =
        length == Some(0) || (length.is_none() && matches!(*method, Method::GET | Method::HEAD));
    if bodiless {
        return (ClientBody::Empty, Some(recv));
    }
    let frames = futures_util::stream::unfold(Some(recv), |recv| async move {
        let mut recv = recv?;
        match recv.recv_data().await {
            Ok(Some(mut data)) => {
                let bytes = data.copy_to_bytes(data.remaining());
                Some((Ok(Frame::data(bytes)), Some(recv)))
            }
            Ok(None) => match recv.recv_trailers().await {
                Ok(Some(trailers)) => Some((Ok(Frame::trailers(trailers)), None)),
                Ok(None) => None,
                Err(e) => Some((Err(BoxError::from(e)), None)),
            },
            Err(e) => Some((Err(BoxError::from(e)), None)),
        }
    });
    let body = StreamBody::new(frames.boxed());
    let body = match length {
        Some(left) => Declared { inner: body, left }.boxed_unsync(),
        None => body.boxed_unsync(),
    };
    (ClientBody::Stream(body), None)
}

/// A request body with its declared `content-length`: its size is known (so a small one is
/// read whole before a backend is chosen, as over HTTP/1.1 and HTTP/2), and DATA past the
/// length, or short of it, is an error (RFC 9114 §4.1.2: malformed) rather than cut silently.
struct Declared<B> {
    inner: B,
    left: u64,
}

impl<B> http_body::Body for Declared<B>
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        let std::task::Poll::Ready(frame) = polled else {
            return std::task::Poll::Pending;
        };
        let checked = match frame {
            Some(Ok(frame)) => match frame.data_ref().map(|d| d.len() as u64) {
                Some(n) if n > self.left => Some(Err("more body than its content-length".into())),
                Some(n) => {
                    self.left -= n;
                    Some(Ok(frame))
                }
                None => Some(Ok(frame)),
            },
            None if self.left > 0 => Some(Err("body shorter than its content-length".into())),
            other => other,
        };
        std::task::Poll::Ready(checked)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// Why an answer did not go out whole.
enum Unsent {
    /// A write found no room within the send timeout.
    TimedOut,
    Failed(BoxError),
}

impl<E: Into<BoxError>> From<E> for Unsent {
    fn from(e: E) -> Unsent {
        Unsent::Failed(e.into())
    }
}

/// `write`, within `limit`.
async fn within<T, E>(
    limit: Duration,
    write: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Unsent>
where
    E: Into<BoxError>,
{
    match tokio::time::timeout(limit, write).await {
        Ok(written) => written.map_err(Unsent::from),
        Err(_) => Err(Unsent::TimedOut),
    }
}

/// Sends the head, then each frame of the body, then finishes the stream; each write within
/// `limit`.
async fn respond(
    send: &mut SendSide,
    resp: Response<observe::LoggedBody>,
    limit: Duration,
) -> Result<(), Unsent> {
    let (mut parts, mut body) = resp.into_parts();
    if let Some(id) = body.take_request_id() {
        parts.headers.insert(X_REQUEST_ID.clone(), id);
    }
    // Connection-specific fields have no place in HTTP/3 (RFC 9114 §4.2).
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        http::HeaderName::from_static("keep-alive"),
        http::HeaderName::from_static("proxy-connection"),
    ] {
        parts.headers.remove(name);
    }
    within(limit, send.send_response(Response::from_parts(parts, ()))).await?;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) => within(limit, send.send_data(data)).await?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    within(limit, send.send_trailers(trailers)).await?;
                    return Ok(());
                }
            }
        }
    }
    within(limit, send.finish()).await?;
    Ok(())
}
