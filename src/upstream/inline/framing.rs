//! How an inline exchange's response body is delimited (RFC 9112 §6.3) and whether its
//! connection may carry another request: decided from the fields the head reader notes as it
//! builds the answer's map ([`FramingFields`]).

use http::header::{self, HeaderName};
use http::{StatusCode, Version};

use super::InlineError;
use crate::vocab::headers::lists_token;

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
            let state = State::Length(0);
            return Ok(Framing { state, keep_alive });
        }
        let state = match (fields.last_coding_chunked, fields.content_length) {
            (Some(chunked), length) => {
                // Both headers: a message that smuggling is made of; answer it, keep nothing
                // after it.
                if length != ContentLength::Absent {
                    keep_alive = false;
                }
                if chunked {
                    State::ChunkSize
                } else {
                    State::UntilClose
                }
            }
            (None, ContentLength::Is(length)) => State::Length(length),
            (None, ContentLength::Invalid(what)) => return Err(InlineError::Invalid(what)),
            (None, ContentLength::Absent) => State::UntilClose,
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
    /// With `Transfer-Encoding`: whether the last coding of its last value is `chunked`.
    last_coding_chunked: Option<bool>,
    content_length: ContentLength,
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
            last_coding_chunked: None,
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
            self.last_coding_chunked = Some(last_coding_is_chunked(value));
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

fn last_coding_is_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framing of an answer with `fields` (name, value), as the head reader notes them.
    fn framing(
        version: Version,
        status: u16,
        fields: &[(&str, &str)],
    ) -> Result<Framing, &'static str> {
        let mut noted = FramingFields::new(version);
        for (name, value) in fields {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a field name");
            noted.note(&name, value.as_bytes());
        }
        let status = StatusCode::from_u16(status).expect("a status");
        Framing::of(status, &noted, false).map_err(|e| match e {
            InlineError::Invalid(what) => what,
            _ => "another error",
        })
    }

    /// A head's version, status and fields, and the framing they make.
    type Case<'a> = (
        Version,
        u16,
        Vec<(&'a str, &'a str)>,
        Result<Framing, &'static str>,
    );

    fn kept(state: State) -> Result<Framing, &'static str> {
        Ok(Framing {
            state,
            keep_alive: true,
        })
    }

    fn closed(state: State) -> Result<Framing, &'static str> {
        Ok(Framing {
            state,
            keep_alive: false,
        })
    }

    /// RFC 9112 §6.3 from the noted fields: the last coding of the last `Transfer-Encoding`
    /// decides chunked; both lengths or no length close; `Content-Length` values must agree and
    /// be decimal, unless `Transfer-Encoding` or a bodiless status makes them moot; `close` (1.1)
    /// and `keep-alive` (1.0) may sit anywhere in any `Connection` value, in any case.
    #[test]
    fn framing_follows_every_field_of_the_head() {
        let h11 = Version::HTTP_11;
        let cases: Vec<Case<'_>> = vec![
            (
                h11,
                200,
                vec![("content-length", "5")],
                kept(State::Length(5)),
            ),
            (
                h11,
                200,
                vec![("Content-Length", "5, 5"), ("content-length", "5")],
                kept(State::Length(5)),
            ),
            (
                h11,
                200,
                vec![("content-length", "5"), ("content-length", "6")],
                Err("differing Content-Length values"),
            ),
            (
                h11,
                200,
                vec![("content-length", "5, 6")],
                Err("differing Content-Length values"),
            ),
            (
                h11,
                200,
                vec![("content-length", "+5")],
                Err("Content-Length"),
            ),
            (
                h11,
                200,
                vec![("content-length", "5, x"), ("content-length", "6")],
                Err("Content-Length"),
            ),
            (
                h11,
                200,
                vec![("content-length", "x")],
                Err("Content-Length"),
            ),
            (
                h11,
                204,
                vec![("content-length", "x")],
                kept(State::Length(0)),
            ),
            (
                h11,
                304,
                vec![("transfer-encoding", "chunked")],
                kept(State::Length(0)),
            ),
            (
                h11,
                200,
                vec![("transfer-encoding", "gzip, chunked")],
                kept(State::ChunkSize),
            ),
            (
                h11,
                200,
                vec![("transfer-encoding", "chunked, gzip")],
                closed(State::UntilClose),
            ),
            (
                h11,
                200,
                vec![
                    ("transfer-encoding", "gzip"),
                    ("transfer-encoding", " Chunked "),
                ],
                kept(State::ChunkSize),
            ),
            (
                h11,
                200,
                vec![
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "gzip"),
                ],
                closed(State::UntilClose),
            ),
            (
                h11,
                200,
                vec![("content-length", "x"), ("transfer-encoding", "chunked")],
                closed(State::ChunkSize),
            ),
            (
                h11,
                200,
                vec![("transfer-encoding", "chunked"), ("content-length", "3")],
                closed(State::ChunkSize),
            ),
            (h11, 200, vec![], closed(State::UntilClose)),
            (
                h11,
                200,
                vec![("connection", "keep-alive"), ("content-length", "1")],
                kept(State::Length(1)),
            ),
            (
                h11,
                200,
                vec![("connection", "keep-alive, Close"), ("content-length", "1")],
                closed(State::Length(1)),
            ),
            (
                h11,
                200,
                vec![
                    ("connection", "x"),
                    ("connection", "CLOSE"),
                    ("content-length", "1"),
                ],
                closed(State::Length(1)),
            ),
            (
                h11,
                200,
                vec![("connection", "closed"), ("content-length", "1")],
                kept(State::Length(1)),
            ),
            (
                Version::HTTP_10,
                200,
                vec![("content-length", "1")],
                closed(State::Length(1)),
            ),
            (
                Version::HTTP_10,
                200,
                vec![("connection", "Keep-Alive"), ("content-length", "1")],
                kept(State::Length(1)),
            ),
            (
                Version::HTTP_10,
                200,
                vec![
                    ("connection", "close"),
                    ("connection", "te, keep-alive"),
                    ("content-length", "1"),
                ],
                kept(State::Length(1)),
            ),
        ];
        for (version, status, fields, want) in cases {
            assert_eq!(
                framing(version, status, &fields),
                want,
                "{version:?} {status} {fields:?}"
            );
        }
    }

    /// A HEAD answer has no body whatever its fields say, an invalid length included.
    #[test]
    fn headless_answers_have_no_body() {
        let mut noted = FramingFields::new(Version::HTTP_11);
        noted.note(&header::CONTENT_LENGTH, b"nonsense");
        let got = Framing::of(StatusCode::OK, &noted, true).map_err(|_| "error");
        assert_eq!(got, kept(State::Length(0)));
    }
}
