//! A request body the admin API answered without reading to its end, read and dropped (a
//! bounded amount, for a bounded time) before the answer goes. Over HTTP/2 an answer sent
//! first ends the stream with `RST_STREAM(NO_ERROR)` (RFC 9113 §8.1 allows it), which Debian
//! 12's curl (7.88) reports as a framing error instead of the 403 it was (half the time, a
//! deploy script with a rotated key saw no "missing or wrong key"). nginx reads and discards
//! such a body.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::vocab::request_body::BoxError;
use crate::vocab::ClientBody;

/// The most of a body read only to be dropped: the time bound is the one that counts (a body
/// of a few MiB, a config past the 8 MiB `POST /conf` takes, comes in milliseconds over
/// loopback; at 64 KiB those were still reset).
const MOST_DISCARDED: usize = 64 * 1024 * 1024;
/// How long the rest of a body is waited for.
const DISCARD_WITHIN: Duration = Duration::from_secs(2);

type Slot = Arc<Mutex<Option<ClientBody>>>;

/// Where a request's body lands when its handler drops it unfinished.
pub struct Leftover(Slot);

impl Leftover {
    /// `req` with its body watched.
    pub fn watch(req: Request<ClientBody>) -> (Request<ClientBody>, Leftover) {
        let slot = Slot::default();
        let req = req.map(|body| {
            let watched = Watched {
                inner: Some(body),
                slot: slot.clone(),
            };
            ClientBody::Stream(watched.boxed_unsync())
        });
        (req, Leftover(slot))
    }

    /// Reads what the handler left of the body, up to [`MOST_DISCARDED`] bytes within
    /// [`DISCARD_WITHIN`] (a larger or slower one is reset as before).
    pub async fn discard(self) {
        let left = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut body) = left else {
            return;
        };
        let reading = async move {
            let mut read = 0;
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, Bytes::len);
                if read > MOST_DISCARDED {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(DISCARD_WITHIN, reading).await;
    }
}

/// A body that, dropped before its end, leaves itself in its [`Leftover`].
struct Watched {
    inner: Option<ClientBody>,
    slot: Slot,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take().filter(|b| !b.is_end_stream()) {
            *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(body);
        }
    }
}
