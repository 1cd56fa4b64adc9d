//! How an inline exchange's response body is delimited (RFC 9112 §6.3) and whether its
//! connection may carry another request: decided from the fields the head reader notes as it
//! builds the answer's map ([`FramingFields`]).

use http::header::{self, HeaderName};
use http::{StatusCode, Version};

use super::InlineError;
use crate::vocab::headers::{lists_token, only_chunked};

/// How a response's body is delimited, and whether its connection may carry another request
/// afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub(super) state: State,
    pub(super) keep_alive: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// This many bytes are left.
    Length(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Inside a chunk, this many bytes left.
    ChunkData(u64),
    /// After a chunk's data: its CRLF.
    ChunkEnd,
    /// After the last chunk: trailer fields, then an empty line.
    Trailers,
    /// Until the backend closes the connection.
    UntilClose,
    Done,
}

impl Framing {
    /// The framing of a final response (RFC 9112 §6.3), from what its fields said.
    pub fn of(
        status: StatusCode,
        fields: &FramingFields,
        headless: bool,
    ) -> Result<Framing, InlineError> {
        let mut keep_alive = fields.keeps_alive();
        if headless || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            // A HEAD answer's length goes to the client (the length a GET would have had):
            // checked as a GET's would be.
            if let (true, ContentLength::Invalid(what)) = (headless, fields.content_length) {
                return Err(InlineError::Invalid(what));
            }
            let state = State::Length(0);
            return Ok(Framing { state, keep_alive });
        }
        let state = match (fields.coding, fields.content_length) {
            (Coding::Chunked, length) => {
                // Both headers: a message that smuggling is made of; answer it, keep nothing
                // after it.
                if length != ContentLength::Absent {
                    keep_alive = false;
                }
                State::ChunkSize
            }
            (Coding::Other, _) => {
                return Err(InlineError::Invalid("a transfer coding other than chunked"))
            }
            (Coding::None, ContentLength::Is(length)) => State::Length(length),
            (Coding::None, ContentLength::Invalid(what)) => return Err(InlineError::Invalid(what)),
            (Coding::None, ContentLength::Absent) => State::UntilClose,
        };
        if state == State::UntilClose {
            keep_alive = false;
        }
        Ok(Framing { state, keep_alive })
    }
}

/// What a response head's fields say about its framing, noted field by field as the head is
/// read (looking them up in the finished map again cost three hashes and lookups an answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramingFields {
    /// An HTTP/1.1 head (else HTTP/1.0).
    http11: bool,
    /// A `Connection` value lists the option that decides whether the connection is kept:
    /// `close` in HTTP/1.1, `keep-alive` in HTTP/1.0.
    listed: bool,
    /// What `Transfer-Encoding` said.
    coding: Coding,
    content_length: ContentLength,
}

/// The `Transfer-Encoding` fields seen so far: none, one `chunked` (the only coding decoded,
/// [`only_chunked`]), or anything else (refused: nginx's "upstream sent unknown
/// Transfer-Encoding").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    None,
    Chunked,
    Other,
}

/// The `Content-Length` fields seen so far: every value (and every item of a list) must be the
/// same decimal number. What is wrong waits until the framing is decided: a `Transfer-Encoding`,
/// or an answer without a body, makes it moot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContentLength {
    Absent,
    Is(u64),
    Invalid(&'static str),
}

impl FramingFields {
    /// Nothing noted yet, for a head of `version`.
    pub fn new(version: Version) -> FramingFields {
        FramingFields {
            http11: version == Version::HTTP_11,
            listed: false,
            coding: Coding::None,
            content_length: ContentLength::Absent,
        }
    }

    /// Notes one field of the head.
    #[inline]
    pub fn note(&mut self, name: &HeaderName, value: &[u8]) {
        if *name == header::CONNECTION {
            let deciding: &[u8] = if self.http11 { b"close" } else { b"keep-alive" };
            self.listed |= lists_token(value, deciding);
        } else if *name == header::TRANSFER_ENCODING {
            self.coding = match self.coding {
                Coding::None if only_chunked(std::iter::once(value)) => Coding::Chunked,
                _ => Coding::Other,
            };
        } else if *name == header::CONTENT_LENGTH {
            self.content_length = self.content_length.and(value);
        }
    }

    /// Whether the connection may carry another exchange, as far as `Connection` goes.
    fn keeps_alive(&self) -> bool {
        if self.http11 {
            !self.listed
        } else {
            self.listed
        }
    }
}

impl ContentLength {
    fn and(self, value: &[u8]) -> ContentLength {
        if let ContentLength::Invalid(_) = self {
            return self;
        }
        let mut found = self;
        for item in value.split(|&b| b == b',') {
            let Some(n) = crate::vocab::headers::decimal_length(item.trim_ascii()) else {
                return ContentLength::Invalid("Content-Length");
            };
            found = match found {
                ContentLength::Absent => ContentLength::Is(n),
                ContentLength::Is(f) if f == n => found,
                ContentLength::Is(_) => {
                    return ContentLength::Invalid("differing Content-Length values")
                }
                ContentLength::Invalid(_) => return found,
            };
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framing of an answer with `fields` (`name: value` lines, the value as it stands
    /// after the colon and one space), as the head reader notes them.
    fn framing(version: Version, status: u16, fields: &str) -> Result<Framing, &'static str> {
        let mut noted = FramingFields::new(version);
        for line in fields.split('\n').filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(": ").expect("a `name: value` line");
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a field name");
            noted.note(&name, value.as_bytes());
        }
        let status = StatusCode::from_u16(status).expect("a status");
        Framing::of(status, &noted, false).map_err(|e| match e {
            InlineError::Invalid(what) => what,
            _ => "another error",
        })
    }

    const KEPT: bool = true;
    const CLOSED: bool = false;

    fn is(state: State, keep_alive: bool) -> Result<Framing, &'static str> {
        Ok(Framing { state, keep_alive })
    }

    /// RFC 9112 §6.3 from the noted fields: one `Transfer-Encoding: chunked` is chunked, any
    /// other coding is refused (the proxy decodes none); both lengths or no length close;
    /// `Content-Length` values must agree and be decimal, unless `Transfer-Encoding` or a
    /// bodiless status makes them moot; `close` (1.1) and `keep-alive` (1.0) may sit anywhere in
    /// any `Connection` value, in any case.
    #[test]
    fn framing_follows_every_field_of_the_head() {
        use State::{ChunkSize, Length, UntilClose};
        let (h10, h11) = (Version::HTTP_10, Version::HTTP_11);
        let differing = Err("differing Content-Length values");
        let coded = Err("a transfer coding other than chunked");
        #[rustfmt::skip]
        let cases = [
            (h11, 200, "content-length: 5", is(Length(5), KEPT)),
            (h11, 200, "Content-Length: 5, 5\ncontent-length: 5", is(Length(5), KEPT)),
            (h11, 200, "content-length: 5\ncontent-length: 6", differing),
            (h11, 200, "content-length: 5, 6", differing),
            (h11, 200, "content-length: +5", Err("Content-Length")),
            (h11, 200, "content-length: 5, x\ncontent-length: 6", Err("Content-Length")),
            (h11, 200, "content-length: x", Err("Content-Length")),
            (h11, 204, "content-length: x", is(Length(0), KEPT)),
            (h11, 304, "transfer-encoding: chunked", is(Length(0), KEPT)),
            (h11, 200, "transfer-encoding:  Chunked ", is(ChunkSize, KEPT)),
            (h11, 200, "transfer-encoding: gzip, chunked", coded),
            (h11, 200, "transfer-encoding: chunked, gzip", coded),
            (h11, 200, "transfer-encoding: gzip\ntransfer-encoding:  Chunked ", coded),
            (h11, 200, "transfer-encoding: chunked\ntransfer-encoding: gzip", coded),
            (h11, 200, "transfer-encoding: chunked\ntransfer-encoding: chunked", coded),
            (h11, 200, "transfer-encoding: gzip", coded),
            (h11, 204, "transfer-encoding: gzip", is(Length(0), KEPT)),
            (h11, 200, "content-length: x\ntransfer-encoding: chunked", is(ChunkSize, CLOSED)),
            (h11, 200, "transfer-encoding: chunked\ncontent-length: 3", is(ChunkSize, CLOSED)),
            (h11, 200, "", is(UntilClose, CLOSED)),
            (h11, 200, "connection: keep-alive\ncontent-length: 1", is(Length(1), KEPT)),
            (h11, 200, "connection: keep-alive, Close\ncontent-length: 1", is(Length(1), CLOSED)),
            (h11, 200, "connection: x\nconnection: CLOSE\ncontent-length: 1", is(Length(1), CLOSED)),
            (h11, 200, "connection: closed\ncontent-length: 1", is(Length(1), KEPT)),
            (h10, 200, "content-length: 1", is(Length(1), CLOSED)),
            (h10, 200, "connection: Keep-Alive\ncontent-length: 1", is(Length(1), KEPT)),
            (h10, 200, "connection: close\nconnection: te, keep-alive\ncontent-length: 1", is(Length(1), KEPT)),
        ];
        for (version, status, fields, want) in cases {
            let got = framing(version, status, fields);
            assert_eq!(got, want, "{version:?} {status} {fields:?}");
        }
    }

    /// A HEAD answer has no body whatever length it gives; a length that is none is refused,
    /// as a GET's would be (it goes on to the client).
    #[test]
    fn headless_answers_have_no_body() {
        let mut noted = FramingFields::new(Version::HTTP_11);
        noted.note(&header::CONTENT_LENGTH, b"5");
        let got = Framing::of(StatusCode::OK, &noted, true).map_err(|_| "error");
        assert_eq!(got, is(State::Length(0), KEPT));
        noted.note(&header::CONTENT_LENGTH, b"nonsense");
        let got = Framing::of(StatusCode::OK, &noted, true).map_err(|_| "error");
        assert_eq!(got, Err("error"));
    }
}
