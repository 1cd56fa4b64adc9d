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
    head: Parts,
    body: Option<KeptHome>,
}

impl Resendable {
    /// Keeps a copy of `req`'s head and has its body keep the frames it passes on.
    pub fn prepare(req: &mut Request<UpBody>) -> Resendable {
        let body = match req.body_mut() {
            Either::Left(body) => body.keep_for_replay(),
            Either::Right(_) => None,
        };
        Resendable {
            head: copy_head(req),
            body,
        }
    }

    /// The request again, once hyper's client has given its body back; `None` if the body was
    /// too large to keep whole, or does not come back.
    pub async fn take_back(self) -> Option<Request<UpBody>> {
        let body = match self.body {
            None => Either::Right(http_body_util::Empty::new()),
            Some(home) => {
                let kept = home.take_back().await?;
                Either::Left(RequestBody::replaying(kept))
            }
        };
        Some(Request::from_parts(self.head, body))
    }
}

/// Whether hyper's client failed because the backend refused the stream unprocessed (the h2
/// crate reports streams above a GOAWAY's last stream id as refused too).
pub fn is_refused(error: &hyper::Error) -> bool {
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<h2::Error>());
    h2.is_some_and(|e| e.is_remote() && e.reason() == Some(h2::Reason::REFUSED_STREAM))
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
