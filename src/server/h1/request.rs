//! Reading a request head: `httparse` over the connection's buffer, the field values slices of
//! the head's own bytes. Only the common case is taken here: an HTTP/1.1 request without a
//! body, or with one of declared length. Anything else (HTTP/1.0, CONNECT, `Upgrade`,
//! `Expect`, `Transfer-Encoding`, a malformed or oversized head, an HTTP/2 preface) is
//! [`Head::Unusual`]: the connection hands it to hyper, which answers it as it always has. A
//! complete head whose `Content-Length` is above 2^63 − 1 is [`Head::Refused`], whatever else
//! it is.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Method, Request, Uri, Version};

use crate::vocab::field_offsets::{FieldAt, FieldOffsets};
use crate::vocab::headers::{
    decimal_length, field_name, lists_token, value_parsed_by_httparse, ADDED_TO_REQUESTS,
};
use crate::vocab::hop_by_hop::{lone_close_or_keep_alive, CLOSE};

use super::Refusal;

/// The most header fields taken here (hyper's default; more go to hyper, which answers 431).
const MAX_FIELDS: usize = 100;
/// The largest body length taken: a file's largest size (`off_t`), nginx's bound. hyper took
/// any 64-bit length but its own two markers, 2^64 − 2 and 2^64 − 1, which it answered 431, as
/// a head too large.
const MAX_BODY_LENGTH: u64 = i64::MAX as u64;

/// What the front of the read buffer holds.
#[allow(
    clippy::large_enum_variant,
    reason = "returned and taken apart at once; boxing would allocate for every request"
)]
pub enum Head {
    /// A complete head of the common case, taken off the buffer.
    Usual(Parsed),
    /// Not a complete head yet.
    Partial,
    /// A head this module leaves to hyper; the buffer is untouched.
    Unusual,
    /// A complete head answered without a service (it is taken off the buffer).
    Refused(Refusal),
}

/// A request head and what the connection needs to know of it.
pub struct Parsed {
    /// A lone `Connection: close` or `keep-alive` is not in its map (`close` says it).
    pub request: Request<()>,
    /// The declared body length (0: none).
    pub body_length: u64,
    /// The client asked to close after this answer (`Connection: close`).
    pub close: bool,
}

/// Where the parts of a complete head lie.
struct Located {
    len: usize,
    method: (u32, u32),
    target: (u32, u32),
    http_11: bool,
}

/// Takes a request head of the common case off the front of `buf`. The rare paths are
/// functions of their own, kept out of it: with them inline, `build` was no longer inlined
/// here, and the request it made was copied out of it (callgrind: about 250 instructions a
/// request).
pub fn parse(buf: &mut BytesMut) -> Head {
    let mut at = FieldOffsets::new();
    let located = match locate(buf, &mut at) {
        Some(Some(located)) => located,
        Some(None) => return Head::Partial,
        None => return not_parsed(buf),
    };
    let head = &buf[..located.len];
    let method = method_of(slice(head, located.method));
    let Some(method) = method.filter(|_| located.http_11) else {
        return unusual_or_refused(buf, located.len, at.as_slice());
    };
    let head = buf.split_to(located.len).freeze();
    match build(&head, method, &located, at.as_slice()) {
        Some(parsed) => Head::Usual(parsed),
        None => not_built(buf, &head, at.as_slice()),
    }
}

/// A head httparse refused: of a later HTTP version ([`later_version`]), or hyper's to answer.
#[cold]
#[inline(never)]
fn not_parsed(buf: &mut BytesMut) -> Head {
    match later_version(buf) {
        Some(LaterVersion::Minor(digit)) => {
            buf[digit] = b'1';
            parse(buf)
        }
        Some(LaterVersion::Major) => Head::Refused(Refusal::VersionNotSupported),
        None => Head::Unusual,
    }
}

/// A head taken off the buffer that is not of the common case: refused for its length, or put
/// back in front of what follows it for hyper to read (a copy, on a path that is rare and about
/// to cost far more in hyper).
#[cold]
#[inline(never)]
fn not_built(buf: &mut BytesMut, head: &Bytes, at: &[FieldAt]) -> Head {
    if length_too_large(head, at) {
        return Head::Refused(Refusal::ContentLengthTooLarge);
    }
    let mut restored = BytesMut::with_capacity(head.len() + buf.len());
    restored.extend_from_slice(head);
    restored.extend_from_slice(buf);
    *buf = restored;
    Head::Unusual
}

/// A request line of an HTTP version after 1.1 (httparse, and hyper, refused it with a 400).
enum LaterVersion {
    /// `HTTP/1.x`, x > 1, at the minor digit's offset: read as HTTP/1.1, the highest minor
    /// version this server has (RFC 9110 §2.5), as nginx and HAProxy read it.
    Minor(usize),
    /// `HTTP/2.0` or later in an HTTP/1 request line: nginx's 505. (HTTP/2's preface, `PRI *
    /// HTTP/2.0`, is not one: hyper takes it.)
    Major,
}

fn later_version(buf: &[u8]) -> Option<LaterVersion> {
    // httparse stops at the version, so the line may not have come whole yet.
    let end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let line = &buf[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let at = line.len().checked_sub(9)?;
    let [b' ', b'H', b'T', b'T', b'P', b'/', major, b'.', minor] = line[at..] else {
        return None;
    };
    if line.starts_with(b"PRI * ") || !major.is_ascii_digit() || !minor.is_ascii_digit() {
        return None;
    }
    match (major, minor) {
        (b'1', b'2'..=b'9') => Some(LaterVersion::Minor(at + 8)),
        (b'2'..=b'9', _) => Some(LaterVersion::Major),
        _ => None,
    }
}

/// A head this module does not serve: [`Head::Refused`] (and taken off the buffer) when a
/// `Content-Length` is too large, [`Head::Unusual`] otherwise.
#[cold]
#[inline(never)]
fn unusual_or_refused(buf: &mut BytesMut, len: usize, at: &[FieldAt]) -> Head {
    if length_too_large(&buf[..len], at) {
        let _ = buf.split_to(len);
        return Head::Refused(Refusal::ContentLengthTooLarge);
    }
    Head::Unusual
}

/// Whether a `Content-Length` field is all digits, as a number above [`MAX_BODY_LENGTH`].
/// Only heads not served here are searched, so the common case pays nothing for it.
fn length_too_large(head: &[u8], at: &[FieldAt]) -> bool {
    at.iter().any(|field| {
        let value = slice(head, field.value).trim_ascii();
        slice(head, field.name).eq_ignore_ascii_case(b"content-length")
            && !value.is_empty()
            && value.iter().all(u8::is_ascii_digit)
            && value
                .iter()
                .try_fold(0u64, |n, &d| {
                    n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                })
                .is_none_or(|n| n > MAX_BODY_LENGTH)
    })
}

fn slice(head: &[u8], (start, end): (u32, u32)) -> &[u8] {
    &head[start as usize..end as usize]
}

/// Parses the head at the front of `buf`: `None` when it is not of the common case,
/// `Some(None)` when more bytes are needed.
fn locate(buf: &[u8], at: &mut FieldOffsets) -> Option<Option<Located>> {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let parser = httparse::ParserConfig::default();
    let len = match parser.parse_request_with_uninit_headers(&mut req, buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Some(None),
        Err(_) => return None,
    };
    let http_11 = req.version == Some(1);
    let base = buf.as_ptr() as usize;
    let offset = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start as u32, (start + s.len()) as u32)
    };
    let method = offset(req.method?.as_bytes());
    let target = offset(req.path?.as_bytes());
    at.note(buf, req.headers);
    Some(Some(Located {
        len,
        method,
        target,
        http_11,
    }))
}

/// The method, unless it is one left to hyper (CONNECT).
fn method_of(bytes: &[u8]) -> Option<Method> {
    let method = match bytes {
        b"GET" => Method::GET,
        b"POST" => Method::POST,
        b"HEAD" => Method::HEAD,
        other => Method::from_bytes(other).ok()?,
    };
    (method != Method::CONNECT).then_some(method)
}

/// The request target as a URI. `"`, `<` and `>` in a query (or `<`, `>` in a path) are not
/// URI characters, but clients send them raw and nginx takes them: they are percent-encoded
/// (`%22`, `%3C`, `%3E`, what a backend decodes them to anyway) rather than refused with a 400.
fn uri_of(target: Bytes) -> Option<Uri> {
    match Uri::from_maybe_shared(target.clone()) {
        Ok(uri) => Some(uri),
        Err(_) if target.iter().any(|b| matches!(b, b'"' | b'<' | b'>')) => {
            let mut encoded = Vec::with_capacity(target.len() + 8);
            for &b in target.iter() {
                match b {
                    b'"' => encoded.extend_from_slice(b"%22"),
                    b'<' => encoded.extend_from_slice(b"%3C"),
                    b'>' => encoded.extend_from_slice(b"%3E"),
                    other => encoded.push(other),
                }
            }
            Uri::from_maybe_shared(Bytes::from(encoded)).ok()
        }
        Err(_) => None,
    }
}

/// The request, when the head is of the common case.
#[inline(always)]
fn build(head: &Bytes, method: Method, located: &Located, at: &[FieldAt]) -> Option<Parsed> {
    let uri = uri_of(head.slice(range(located.target)))?;
    let mut headers = HeaderMap::with_capacity(at.len() + ADDED_TO_REQUESTS);
    let mut body_length = None;
    let (mut close, mut dropped_close, mut close_field) = (false, false, false);
    for field in at {
        let name = field_name(slice(head, field.name)).ok()?;
        let value = value_parsed_by_httparse(head.slice(range(field.value)));
        if name == header::CONTENT_LENGTH {
            if body_length.is_some() {
                return None;
            }
            body_length = Some(decimal_length(value.as_bytes()).filter(|&n| n <= MAX_BODY_LENGTH)?);
        } else if name == header::CONNECTION {
            // A lone `close` or `keep-alive` concerns this connection only: it never goes
            // into the map, which spares adding it and taking it out again on the way to the
            // backend (callgrind: about 350 instructions such a request).
            if let Some(says_close) = lone_close_or_keep_alive(value.as_bytes()) {
                close |= says_close;
                dropped_close |= says_close;
                continue;
            }
            close |= lists_token(value.as_bytes(), b"close");
        } else if name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
        {
            return None;
        } else if field.name.1 - field.name.0 == 5 && name.as_str() == "close" {
            close_field = true;
        }
        headers.append(name, value);
    }
    if dropped_close && close_field {
        // A field that `Connection: close` names goes with it (RFC 9110 §7.6.1).
        headers.remove(&CLOSE);
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Some(Parsed {
        request,
        body_length: body_length.unwrap_or(0),
        close,
    })
}

fn range((start, end): (u32, u32)) -> std::ops::Range<usize> {
    start as usize..end as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(head: &str) -> Parsed {
        match parse(&mut BytesMut::from(head)) {
            Head::Usual(parsed) => parsed,
            _ => panic!("not taken here: {head:?}"),
        }
    }

    fn names(parsed: &Parsed) -> Vec<&str> {
        parsed
            .request
            .headers()
            .keys()
            .map(|n| n.as_str())
            .collect()
    }

    #[test]
    fn a_later_minor_version_is_read_as_http_1_1_whole_or_in_pieces() {
        let mut buf = BytesMut::from("GET /v HTTP/1.2");
        assert!(matches!(parse(&mut buf), Head::Partial));
        buf.extend_from_slice(b"\r\nhost: a\r\n\r\n");
        assert!(matches!(parse(&mut buf), Head::Usual(_)));
        let mut buf = BytesMut::from("GET /v HTTP/3.0");
        let refused = parse(&mut buf);
        assert!(matches!(
            refused,
            Head::Refused(Refusal::VersionNotSupported)
        ));
    }

    #[test]
    fn a_lone_close_or_keep_alive_stays_out_of_the_map() {
        #[rustfmt::skip]
        let cases: &[(&str, bool, &[&str])] = &[
            ("connection: close\r\nhost: a", true, &["host"]),
            ("Connection: CLOSE\r\nclose: x\r\nhost: a", true, &["host"]),
            ("close: x\r\nconnection: close", true, &[]),
            ("connection: keep-alive\r\nhost: a", false, &["host"]),
            ("connection: Keep-Alive\r\nclose: x", false, &["close"]),
            // Anything else stays for the proxy's hop-by-hop rules to read.
            ("connection: close, x-a\r\nx-a: 1", true, &["connection", "x-a"]),
            ("connection: x-a\r\nx-a: 1", false, &["connection", "x-a"]),
            ("connection: clone", false, &["connection"]),
        ];
        for (fields, close, kept) in cases {
            let parsed = parsed(&format!("GET / HTTP/1.1\r\n{fields}\r\n\r\n"));
            assert_eq!(parsed.close, *close, "{fields:?}");
            assert_eq!(names(&parsed), *kept, "{fields:?}");
        }
    }
}
