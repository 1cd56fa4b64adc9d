//! The request's `X-Request-Id` on its way back: carried beside the response head, in the
//! response body, until the server writing the head adds it. aralez's own HTTP/1.1 side writes it
//! straight after the response's own fields (any the response has of that name go unwritten);
//! hyper's servers and HTTP/3 take it out and insert it into the map first. Where the head is
//! written from the map anyway, that is the insert there was before; on HTTP/1.1 it saves
//! hashing the field into a map only to read it back out (callgrind: the insert was about 230
//! instructions an answer, the name check per field and the write take back about 90).

use http::header::HeaderValue;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::Full;

/// A response body that may carry the request id its head still needs.
pub trait LateId {
    /// Takes the id out, if the body has one.
    fn take_request_id(&mut self) -> Option<HeaderValue> {
        None
    }
}

/// The admin API's answers: no id.
impl LateId for Full<bytes::Bytes> {}

/// The file server's bodies and test services': no id.
impl<E> LateId for UnsyncBoxBody<bytes::Bytes, E> {}
