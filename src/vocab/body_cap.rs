//! `client_max_body_size` (nginx's name and meaning) for a request body that declares no
//! length (HTTP/1.1 chunked, an HTTP/2 or HTTP/3 stream without `content-length`): [`Capped`]
//! passes the body on until it brings more than the cap, then fails, and says so in the
//! request's [`CapHit`]: the failed exchange's answer (a 400, the client's body having failed)
//! is then the 413 it stands for. The error itself does not always come back: hyper's HTTP/2
//! client resets the stream and reports the reset. (A declared length over the cap is refused
//! before any of it is read, by the router.)

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::request_body::BoxError;
use super::ClientBody;

/// A request body past `client_max_body_size` (the cap, in bytes).
#[derive(Debug, thiserror::Error)]
#[error("the request body is larger than client_max_body_size ({0} bytes)")]
pub struct BodyTooLarge(pub u64);

/// Whether a request's capped body went past its cap.
#[derive(Clone, Debug, Default)]
pub struct CapHit(Arc<AtomicBool>);

impl CapHit {
    pub fn was_hit(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `req` with its body held to `max` bytes, when it declares no length (one it declares is
/// checked against the cap before, and its parser holds it to it) and may bring any; with the
/// flag that says whether it went past.
pub fn cap(req: Request<ClientBody>, max: u64) -> (Request<ClientBody>, Option<CapHit>) {
    let declared = req.headers().contains_key(http::header::CONTENT_LENGTH);
    if declared || matches!(req.body(), ClientBody::Empty) || req.body().is_end_stream() {
        return (req, None);
    }
    let hit = CapHit::default();
    let req = req.map(|inner| {
        let capped = Capped {
            inner,
            left: max,
            max,
            hit: hit.clone(),
        };
        ClientBody::Stream(capped.boxed_unsync())
    });
    (req, Some(hit))
}

/// A body that fails once it has brought more than `max` bytes.
struct Capped {
    inner: ClientBody,
    left: u64,
    max: u64,
    hit: CapHit,
}

impl Body for Capped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            let len = data.map_or(0, |d| d.len() as u64);
            if len > self.left {
                self.hit.0.store(true, Ordering::Relaxed);
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge(self.max)))));
            }
            self.left -= len;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(pieces: &'static [&'static [u8]]) -> Request<ClientBody> {
        let frames = pieces
            .iter()
            .map(|p| Ok::<_, BoxError>(Frame::data(Bytes::from_static(p))));
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        Request::post("/")
            .body(ClientBody::Stream(body.boxed_unsync()))
            .unwrap()
    }

    #[tokio::test]
    async fn a_body_past_the_cap_fails_and_one_within_it_passes_whole() {
        let (req, hit) = cap(chunked(&[b"abc", b"def"]), 6);
        let within = req.into_body().collect().await;
        assert_eq!(within.expect("whole").to_bytes(), "abcdef");
        assert!(!hit.expect("capped").was_hit());
        let (req, hit) = cap(chunked(&[b"abc", b"defg"]), 6);
        let past = req.into_body().collect().await;
        let error = past.expect_err("past the cap");
        assert!(
            error.to_string().contains("client_max_body_size (6 bytes)"),
            "{error}"
        );
        assert!(hit.expect("capped").was_hit());
        // A declared length is the router's to check: left as it is.
        let mut declared = chunked(&[b"abcdefgh"]);
        declared.headers_mut().insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from_static("8"),
        );
        let (req, hit) = cap(declared, 6);
        assert!(hit.is_none());
        let body = req.into_body().collect().await;
        assert_eq!(body.expect("whole").to_bytes(), "abcdefgh");
    }
}
