//! The two heads of an inline exchange: the request head written (origin-form target, the
//! fields as they are) and the response head read with `httparse`, its field values slices of
//! one shared buffer, with the body's framing decided from it.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Response, StatusCode, Version};

use super::framing::FramingFields;
use super::{InlineError, MAX_HEADERS};
use crate::vocab::field_offsets::{FieldAt, FieldOffsets};
use crate::vocab::forwarded::Deferred;
use crate::vocab::headers::{
    field_name, value_parsed_by_httparse, ADDED_TO_ANSWERS, X_FORWARDED_FOR, X_FORWARDED_HOST,
    X_FORWARDED_PROTO, X_REQUEST_ID,
};
use crate::vocab::hop_by_hop::AnswerHopByHop;

/// How a request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// `Content-Length` (0: no body).
    Known(u64),
    Chunked,
}

/// Writes the head of a request whose body is `length` into `out` (cleared first), the
/// `deferred` fields (`X-Forwarded-*`, `X-Request-Id`) after its own.
pub fn encode_request(
    out: &mut Vec<u8>,
    head: &Parts,
    deferred: Option<&Deferred>,
    length: BodyLength,
) {
    out.clear();
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    let target = head.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_fields(out, &head.headers);
    if let Some(unwritten) = deferred.and_then(Deferred::unwritten) {
        if let Some(f) = &unwritten.forwarded {
            write_field(out, &X_FORWARDED_FOR, &f.client_ip);
            write_field(out, &X_FORWARDED_PROTO, f.proto());
            if let Some(host) = &f.host {
                write_field(out, &X_FORWARDED_HOST, host);
            }
        }
        if let Some(id) = &unwritten.request_id {
            write_field(out, &X_REQUEST_ID, id);
        }
    }
    match length {
        BodyLength::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        // A method whose requests normally carry a body says that this one is empty, as
        // hyper's client does: some servers answer 411 otherwise.
        BodyLength::Known(0)
            if expects_body(&head.method) && !head.headers.contains_key(header::CONTENT_LENGTH) =>
        {
            out.extend_from_slice(b"content-length: 0\r\n")
        }
        BodyLength::Known(_) => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes `fields` as `name: value` lines (a head's, or a chunked body's trailers).
pub fn write_fields(out: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        write_field(out, name, value);
    }
}

#[inline(always)]
fn write_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn expects_body(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// What the parser found in a complete head.
struct Found {
    len: usize,
    status: u16,
    version: Version,
}

/// Takes a final response head off the front of `buf` when it is complete (`None`: more bytes
/// are needed), with what its fields say of the body's framing; informational heads before it
/// are consumed and dropped. Its hop-by-hop fields are out of its map (they are never passed on).
pub fn parse_response(
    buf: &mut BytesMut,
) -> Result<Option<(http::response::Parts, FramingFields)>, InlineError> {
    loop {
        let mut at = FieldOffsets::new();
        let Some(found) = locate(buf, &mut at)? else {
            return Ok(None);
        };
        let head = buf.split_to(found.len).freeze();
        if (100..200).contains(&found.status) {
            if found.status == 101 {
                return Err(InlineError::Invalid(
                    "101 Switching Protocols without an upgrade",
                ));
            }
            continue;
        }
        let status =
            StatusCode::from_u16(found.status).map_err(|_| InlineError::Invalid("status code"))?;
        let framing = FramingFields::new(found.version);
        let (headers, framing) = build_fields(&head, at.as_slice(), framing)?;
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = status;
        parts.version = found.version;
        parts.headers = headers;
        return Ok(Some((parts, framing)));
    }
}

/// Parses the head at the front of `buf`, noting where each field lies.
fn locate(buf: &[u8], at: &mut FieldOffsets) -> Result<Option<Found>, InlineError> {
    // Left uninitialised: filling 100 empty fields first cost more than parsing a short head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parser = httparse::ParserConfig::default();
    let len = match parser.parse_response_with_uninit_headers(&mut resp, buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(InlineError::Invalid("too many header fields"))
        }
        Err(_) => return Err(InlineError::Invalid("malformed response head")),
    };
    let version = match resp.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let status = resp.code.unwrap_or(0);
    at.note(buf, resp.headers);
    Ok(Some(Found {
        len,
        status,
        version,
    }))
}

/// The fields of `head` but its hop-by-hop ones, their values sharing its bytes, and what they
/// say of the framing.
fn build_fields(
    head: &Bytes,
    at: &[FieldAt],
    mut framing: FramingFields,
) -> Result<(HeaderMap, FramingFields), InlineError> {
    let mut headers = HeaderMap::with_capacity(at.len() + ADDED_TO_ANSWERS);
    let mut hop_by_hop = AnswerHopByHop::default();
    for field in at {
        let (ns, ne) = field.name;
        let (vs, ve) = (field.value.0 as usize, field.value.1 as usize);
        let name = field_name(&head[ns as usize..ne as usize])
            .map_err(|_| InlineError::Invalid("header field name"))?;
        let value = &head[vs..ve];
        framing.note(&name, value);
        if hop_by_hop.keeps(&name, value) {
            headers.append(name, value_parsed_by_httparse(head.slice(vs..ve)));
        }
    }
    hop_by_hop.finish(&mut headers);
    Ok((headers, framing))
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;
    use crate::vocab::forwarded::Forwarded;

    fn get_p() -> Parts {
        let (parts, ()) = Request::get("/p?q=1")
            .header("host", "backend.test")
            .body(())
            .expect("request")
            .into_parts();
        parts
    }

    fn encoded(head: &Parts, deferred: Option<&Deferred>) -> String {
        let mut out = Vec::new();
        encode_request(&mut out, head, deferred, BodyLength::Known(0));
        String::from_utf8(out).expect("ASCII head")
    }

    /// The deferred fields follow the request's own; once inserted into the map (hyper's
    /// client had the request), a head written from that map carries them once.
    #[test]
    fn deferred_proxy_fields_are_written_once() {
        let forwarded = Forwarded {
            client_ip: HeaderValue::from_static("10.0.0.7"),
            tls: false,
            host: Some(HeaderValue::from_static("app.test")),
        };
        let id = HeaderValue::from_static("00ff");
        let deferred = Deferred::new(Some(forwarded), Some(id)).expect("fields to write");
        let mut head = get_p();
        assert_eq!(
            encoded(&head, Some(&deferred)),
            "GET /p?q=1 HTTP/1.1\r\nhost: backend.test\r\nx-forwarded-for: 10.0.0.7\r\n\
             x-forwarded-proto: http\r\nx-forwarded-host: app.test\r\nx-request-id: 00ff\r\n\r\n"
        );
        deferred.insert_into(&mut head.headers);
        let again = encoded(&head, Some(&deferred));
        assert_eq!(
            again.matches("x-forwarded-for: 10.0.0.7\r\n").count(),
            1,
            "{again}"
        );
        assert_eq!(again.matches("x-forwarded-proto: ").count(), 1, "{again}");
        assert_eq!(again.matches("x-forwarded-host: ").count(), 1, "{again}");
        assert_eq!(
            again.matches("x-request-id: 00ff\r\n").count(),
            1,
            "{again}"
        );
        let only_id = Deferred::new(None, Some(HeaderValue::from_static("a1")));
        let only_id = encoded(&get_p(), only_id.as_ref());
        assert!(
            only_id.ends_with("host: backend.test\r\nx-request-id: a1\r\n\r\n"),
            "{only_id}"
        );
        let none = encoded(&get_p(), None);
        assert!(
            !none.contains("x-forwarded") && !none.contains("x-request-id"),
            "{none}"
        );
    }
}
