//! Writing a response head, and deciding how its body is delimited, the way hyper's HTTP/1
//! server does (RFC 9112 §6): no body for HEAD, 204 and 304; a body of known length gets
//! `Content-Length`, one of unknown length is chunked; an empty body says `content-length: 0`
//! where it may. Field names go out in lower case, as hyper writes them, with a `date` when the
//! response has none (formatted once a second per connection).

use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use crate::vocab::headers::{decimal_length, lists_token, X_REQUEST_ID};

/// What a head is given room for: its status and `date` lines, and each field on average.
const HEAD_ROOM: usize = 96;
const FIELD_ROOM: usize = 48;

/// How long the body that follows a head is, as the service's body says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The body is already at its end.
    Empty,
    Known(u64),
    Unknown,
}

/// How the body goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (0: nothing is sent, the body is dropped).
    Length(u64),
    /// Chunked; the trailers that end the body (already fit to cross, `vocab::trailers`)
    /// follow its last chunk, whether the head declared them in `Trailer` or not: an HTTP/2
    /// backend's gRPC or checksum trailers come undeclared (RFC 9110 §6.6.2 only asks a
    /// sender to declare them), and only declared ones went out.
    Chunked,
}

/// What the head said about the exchange.
pub struct Written {
    pub framing: Framing,
    /// The response says `Connection: close`.
    pub close: bool,
}

/// Why a response cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("a response with an informational status ({0}) cannot be sent")]
    Informational(StatusCode),
    #[error("the response has differing Content-Length values")]
    ContentLength,
}

/// Writes the head of `parts` into `out` (cleared first) for a request of `method`, with
/// `request_id` as its `X-Request-Id` (in place of any the fields have); with `closing` (the
/// connection ends after this answer) the head says `Connection: close`, so the client does not
/// send its next request on it.
pub fn encode(
    out: &mut Vec<u8>,
    (parts, request_id): (&http::response::Parts, Option<&HeaderValue>),
    shape: Shape,
    method: &Method,
    closing: bool,
    date: &mut CachedDate,
) -> Result<Written, HeadError> {
    let status = parts.status;
    if status.is_informational() {
        return Err(HeadError::Informational(status));
    }
    let no_content = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let head = method == Method::HEAD;
    let may_have_body = !head && !no_content;
    out.clear();
    // Room for a typical head at once (the buffer is kept for the connection's next answers).
    out.reserve(HEAD_ROOM + parts.headers.len() * FIELD_ROOM);
    status_line(out, status);
    let mut length_written: Option<u64> = None;
    let mut close = false;
    let mut has_date = false;
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH {
            // A HEAD answer keeps the length a GET would have had, checked as that GET's
            // would be: one decimal value, however many times it is given.
            let kept = matches!(shape, Shape::Unknown) || (head && matches!(shape, Shape::Empty));
            if !kept {
                continue;
            }
            let declared = decimal_length(value.as_bytes()).ok_or(HeadError::ContentLength)?;
            match length_written {
                Some(previous) if previous != declared => return Err(HeadError::ContentLength),
                Some(_) => continue,
                None => length_written = Some(declared),
            }
        } else if name == header::TRANSFER_ENCODING {
            // The framing is this module's choice.
            continue;
        } else if name == header::CONNECTION {
            close |= lists_token(value.as_bytes(), b"close");
        } else if name == header::DATE {
            has_date = true;
        } else if request_id.is_some() && name == X_REQUEST_ID {
            continue;
        }
        write_field(out, name, value.as_bytes());
    }
    if let Some(id) = request_id {
        write_field(out, &X_REQUEST_ID, id.as_bytes());
    }
    let framing = match (length_written, shape) {
        (Some(declared), Shape::Unknown) => Framing::Length(declared),
        (Some(_), _) => Framing::Length(0),
        (None, Shape::Unknown) if may_have_body => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        (None, Shape::Unknown) => Framing::Length(0),
        (None, Shape::Known(len)) if !no_content && len > 0 => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
            out.extend_from_slice(b"\r\n");
            Framing::Length(len)
        }
        (None, _) => {
            if !head && !no_content {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            Framing::Length(0)
        }
    };
    if closing && !close {
        out.extend_from_slice(b"connection: close\r\n");
        close = true;
    }
    if !has_date {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date.now());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let framing = if may_have_body {
        framing
    } else {
        Framing::Length(0)
    };
    Ok(Written { framing, close })
}

/// The status line; a status with no registered reason gets an empty one (RFC 9112 §4).
fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn write_field(out: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body: the last chunk and the trailer fields of `fields`.
pub fn last_chunk(out: &mut Vec<u8>, fields: Option<&http::HeaderMap>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in fields.into_iter().flatten() {
        write_field(out, name, value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// The `date` value, formatted again only when the second changes.
pub struct CachedDate {
    second: u64,
    text: [u8; 29],
}

impl CachedDate {
    pub fn new() -> CachedDate {
        CachedDate {
            second: u64::MAX,
            text: [b' '; 29],
        }
    }

    /// `Tue, 15 Nov 1994 08:12:31 GMT` for now.
    pub fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if second != self.second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
                self.second = second;
            }
        }
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(parts: &http::response::Parts, request_id: Option<&HeaderValue>) -> String {
        let mut out = Vec::new();
        let mut date = CachedDate::new();
        let shape = Shape::Known(2);
        encode(
            &mut out,
            (parts, request_id),
            shape,
            &Method::GET,
            false,
            &mut date,
        )
        .expect("a head");
        String::from_utf8(out).expect("ASCII head")
    }

    /// The id the body carried replaces the one the backend sent, once; without one the map's
    /// fields go out as they are.
    #[test]
    fn the_request_id_is_written_once_in_place_of_the_fields() {
        let (parts, ()) = http::Response::builder()
            .header("x-request-id", "from-backend")
            .header("server", "b")
            .body(())
            .expect("response")
            .into_parts();
        let id = HeaderValue::from_static("0011");
        let with_id = head(&parts, Some(&id));
        assert!(
            with_id.starts_with("HTTP/1.1 200 OK\r\nserver: b\r\nx-request-id: 0011\r\n"),
            "{with_id}"
        );
        assert_eq!(with_id.matches("x-request-id").count(), 1, "{with_id}");
        let without = head(&parts, None);
        assert!(
            without.starts_with("HTTP/1.1 200 OK\r\nx-request-id: from-backend\r\nserver: b\r\n"),
            "{without}"
        );
    }

    /// A status with no registered reason gets an empty one, not a placeholder word.
    #[test]
    fn a_status_without_a_reason_has_an_empty_one() {
        let mut out = Vec::new();
        status_line(&mut out, StatusCode::from_u16(299).expect("a status"));
        assert_eq!(out, b"HTTP/1.1 299 \r\n");
        out.clear();
        status_line(&mut out, StatusCode::NOT_FOUND);
        assert_eq!(out, b"HTTP/1.1 404 Not Found\r\n");
    }
}
