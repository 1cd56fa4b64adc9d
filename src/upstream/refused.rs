//! Requests an HTTP/2 backend refused before processing any of them: refused with REFUSED_STREAM,
//! left above the last stream id of a GOAWAY (the connection recycled), or never handed to a
//! connection that was closing. RFC 9113 §8.7 lets any such request go again, whatever its
//! method; [`Resendable`] keeps what that takes (a copy of the head, the body's frames through
//! [`crate::vocab::request_body::KeptBody`]) while the request is on its way.

use http::request::Parts;
use http::Request;
use http_body_util::Either;

use super::connector::UpBody;
use crate::vocab::request_body::{KeptHome, RequestBody};

/// How often a refused request goes again to the same backend before the refusal is its answer.
pub const RESENDS: usize = 3;

/// What sending a request again takes, kept while it is on an HTTP/2 stream.
pub struct Resendable {
    /// `None` when the caller holds a copy of the head itself (a bodyless replayable request):
    /// one copy a request is enough.
    head: Option<Parts>,
    body: Option<KeptHome>,
}

impl Resendable {
    /// Has `req`'s body keep the frames it passes on, and keeps a copy of its head unless
    /// `head_held` (the caller has one) and it has no body to go with it.
    pub fn prepare(req: &mut Request<UpBody>, head_held: bool) -> Resendable {
        let body = match req.body_mut() {
            Either::Left(body) => body.keep_for_replay(),
            Either::Right(_) => None,
        };
        let head = (!head_held || body.is_some()).then(|| copy_head(req));
        Resendable { head, body }
    }

    /// The request again, once hyper's client has given its body back: `Some(None)` when it
    /// is to be made from the caller's copy of the head; `None` if the body was too large to
    /// keep whole, or does not come back.
    pub async fn take_back(self) -> Option<Option<Request<UpBody>>> {
        let body = match self.body {
            None => Either::Right(http_body_util::Empty::new()),
            Some(home) => {
                let kept = home.take_back().await?;
                Either::Left(RequestBody::replaying(kept))
            }
        };
        Some(self.head.map(|head| Request::from_parts(head, body)))
    }
}

/// A bodyless request made again from a copy of its head.
pub fn bodyless(head: &Parts) -> Request<UpBody> {
    let mut req = Request::new(Either::Right(http_body_util::Empty::new()));
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = head.uri.clone();
    *req.version_mut() = head.version;
    *req.headers_mut() = head.headers.clone();
    req
}

/// Whether hyper's client failed because the backend refused the stream unprocessed (the h2
/// crate reports streams above a GOAWAY's last stream id as refused too).
pub fn is_refused(error: &hyper::Error) -> bool {
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<h2::Error>());
    h2.is_some_and(|e| e.is_remote() && e.reason() == Some(h2::Reason::REFUSED_STREAM))
}

/// Whether the backend reset this one stream (RST_STREAM) on a connection that lives on: it
/// was not a stale connection, and the request may well have been processed, so it is not
/// tried again on the same backend as a stale keep-alive connection's would be (SPEC §5: at
/// most one try per backend).
pub fn is_stream_reset(error: &hyper::Error) -> bool {
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<h2::Error>());
    h2.is_some_and(|e| e.is_remote() && e.is_reset())
}

/// A copy of a request's head, field by field (cheaper than the request builder).
pub fn copy_head(req: &Request<UpBody>) -> Parts {
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = req.method().clone();
    head.uri = req.uri().clone();
    head.version = req.version();
    head.headers = req.headers().clone();
    head
}
