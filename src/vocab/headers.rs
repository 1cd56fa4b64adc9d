//! Header rules of forwarding (SPEC §6.2): the X-Forwarded-* family, field names and values as
//! parsed, tokens of lists (hop-by-hop fields are [`super::hop_by_hop`]'s).

use std::net::IpAddr;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// The request's id: kept from a trusted peer or made by the server, sent upstream (and to a
/// forward-auth service), returned and logged.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// `Remote-*` and `X-Auth-*`: the identity a forward-auth service vouches for; spelled with `_`
/// too: CGI, WSGI and PHP read `Remote_User` as `REMOTE_USER`, the same variable as
/// `Remote-User`, so a client's own would pass for the auth service's.
pub fn is_identity_field(name: &str) -> bool {
    let n = name.as_bytes();
    let starts = |prefix: &[u8]| {
        n.len() >= prefix.len()
            && n.iter()
                .zip(prefix)
                .all(|(&b, &p)| b == p || (p == b'-' && b == b'_'))
    };
    starts(b"remote-") || starts(b"x-auth-")
}

/// Room for the fields forwarding adds to a request (`X-Forwarded-For`, `-Proto`, `-Host`,
/// `X-Request-Id`), beyond those the client sent: a map built with it does not grow, and rehash
/// every field, on the way to the backend (callgrind: two such growths were 1,200 instructions
/// of a plain request).
pub const ADDED_TO_REQUESTS: usize = 4;
/// Room for the fields the proxy adds to an answer (`X-Request-Id`, `Strict-Transport-Security`,
/// `Alt-Svc`), beyond those the backend sent.
pub const ADDED_TO_ANSWERS: usize = 3;
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Whether a comma-separated header lists `token` (any case, parameters ignored).
pub fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| lists_token(v.as_bytes(), token.as_bytes()))
}

/// One value of [`has_token`], read as bytes: the tokens are ASCII, and splitting bytes costs
/// less than checking the value is UTF-8 and splitting it by `char`s (this runs on every
/// backend response's `Connection`). An empty token is never listed.
pub fn lists_token(value: &[u8], token: &[u8]) -> bool {
    // A value with no byte like the token's first (in either case) cannot list it: one pass
    // answers the usual `Connection: keep-alive` asked about `close` (splitting it cost about
    // 230 instructions an answer, callgrind).
    let Some(first) = token.first().map(|b| b | 0x20) else {
        return false;
    };
    // A value as long as the token lists it only by being it: the usual `Connection: close`
    // asked about `close` (the splitting below cost about 200 instructions a request).
    if value.len() == token.len() {
        return value.eq_ignore_ascii_case(token);
    }
    if !value
        .iter()
        .fold(false, |seen, &b| seen | (b | 0x20 == first))
    {
        return false;
    }
    value.split(|&b| b == b',').any(|item| {
        let item = item
            .split(|&b| b == b'=' || b == b';')
            .next()
            .unwrap_or(b"");
        item.trim_ascii().eq_ignore_ascii_case(token)
    })
}

/// Whether `Transfer-Encoding` field values are one `chunked` and nothing else: the one
/// transfer coding the proxy decodes (RFC 9112 §6.1). Another coding, alone or before
/// `chunked`, would be lost with the field on the way on, and its coded bytes taken for the
/// body; nginx refuses them too.
pub fn only_chunked<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    // Empty list elements do not count (RFC 9110 §5.6.1: `, chunked` is `chunked`).
    let mut codings = values
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    match (codings.next(), codings.next()) {
        (Some(one), None) => one.eq_ignore_ascii_case(b"chunked"),
        _ => false,
    }
}

/// A `Content-Length` value (or one item of a list of them): decimal digits only, at most 19
/// (which always fit in a `u64`).
pub fn decimal_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// The client IP as an `X-Forwarded-For` element, formatted once per connection.
pub fn client_ip_value(ip: IpAddr) -> HeaderValue {
    let value = match ip {
        // Once per connection: `Display` through `core::fmt` cost about 1,400 instructions.
        IpAddr::V4(v4) => {
            let mut out = [0u8; 15];
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out[len] = b'.';
                    len += 1;
                }
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(octet).as_bytes();
                out[len..len + digits.len()].copy_from_slice(digits);
                len += digits.len();
            }
            HeaderValue::from_bytes(&out[..len])
        }
        IpAddr::V6(_) => HeaderValue::from_str(&ip.to_string()),
    };
    value.unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Appends the client IP (no port) to `X-Forwarded-For`, joining any existing values with `, `.
pub fn append_forwarded_for(headers: &mut HeaderMap, client_ip: &HeaderValue) {
    let mut existing = match headers.entry(&X_FORWARDED_FOR) {
        header::Entry::Vacant(slot) => {
            slot.insert(client_ip.clone());
            return;
        }
        header::Entry::Occupied(slot) => slot.remove_entry_mult().1.collect::<Vec<_>>(),
    };
    let len: usize = existing.iter().map(|v| v.len() + 2).sum::<usize>() + client_ip.len();
    let mut joined = BytesMut::with_capacity(len);
    for v in existing.drain(..) {
        joined.put_slice(v.as_bytes());
        joined.put_slice(b", ");
    }
    joined.put_slice(client_ip.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(joined.freeze()) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

/// `X-Forwarded-Proto`'s value for a client connection with or without TLS.
pub fn forwarded_proto(tls: bool) -> &'static HeaderValue {
    static HTTPS: HeaderValue = HeaderValue::from_static("https");
    static HTTP: HeaderValue = HeaderValue::from_static("http");
    if tls {
        &HTTPS
    } else {
        &HTTP
    }
}

/// Sets `X-Forwarded-Proto` and `X-Forwarded-Host` (the client's host as it sent it).
pub fn set_forwarded_proto_host(headers: &mut HeaderMap, tls: bool, host: Option<HeaderValue>) {
    headers.insert(X_FORWARDED_PROTO.clone(), forwarded_proto(tls).clone());
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
}

/// Weak comparison (RFC 9110 §8.8.3.2) of `etag` against an `If-None-Match` list, or `*`.
pub fn etag_matches(list: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(list) = list.to_str() else {
        return false;
    };
    let ours = etag.to_str().unwrap_or("").trim_start_matches("W/");
    list.split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == ours)
}

/// A field name from a message head: the names nearly every request and answer carry, spelled
/// as clients and servers send them (Title-Case or lower case), are matched whole; any other
/// spelling or name goes through `HeaderName::from_bytes` (which lower-cases it byte by byte
/// first: about 120 instructions a name, against a few here).
pub fn field_name(bytes: &[u8]) -> Result<HeaderName, header::InvalidHeaderName> {
    Ok(match bytes {
        b"Host" | b"host" => header::HOST,
        b"Date" | b"date" => header::DATE,
        b"Server" | b"server" => header::SERVER,
        b"Accept" | b"accept" => header::ACCEPT,
        b"Cookie" | b"cookie" => header::COOKIE,
        b"Connection" | b"connection" => header::CONNECTION,
        b"User-Agent" | b"user-agent" => header::USER_AGENT,
        b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
        b"Content-Length" | b"content-length" => header::CONTENT_LENGTH,
        b"Accept-Encoding" | b"accept-encoding" => header::ACCEPT_ENCODING,
        b"Accept-Language" | b"accept-language" => header::ACCEPT_LANGUAGE,
        b"Authorization" | b"authorization" => header::AUTHORIZATION,
        b"Cache-Control" | b"cache-control" => header::CACHE_CONTROL,
        b"Last-Modified" | b"last-modified" => header::LAST_MODIFIED,
        b"ETag" | b"etag" => header::ETAG,
        b"Transfer-Encoding" | b"transfer-encoding" => header::TRANSFER_ENCODING,
        _ => return HeaderName::from_bytes(bytes),
    })
}

/// A field value httparse has parsed out of a head. httparse admits exactly the bytes
/// `HeaderValue` does (HTAB, visible ASCII and obs-text, no other control byte:
/// `every_byte_httparse_admits_in_a_value_is_one_header_value_admits` shows it), so the second
/// pass over the bytes that `HeaderValue::from_maybe_shared` would make is skipped (callgrind:
/// about 1,000 instructions a plain request, its fields and its answer's).
pub fn value_parsed_by_httparse(bytes: Bytes) -> HeaderValue {
    valid_value(bytes)
}

/// A header value of bytes known to be valid in one: parsed by httparse, or copied from a
/// `HeaderValue`.
#[allow(unsafe_code)]
fn valid_value(bytes: Bytes) -> HeaderValue {
    // SAFETY: not a memory-safety condition: `from_maybe_shared_unchecked` only trusts that the
    // bytes are valid in a header value, which the callers above ensure (for httparse, the test
    // `every_byte_httparse_admits_in_a_value_is_one_header_value_admits` pins it). Debug builds
    // check again, and panic if not.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// A header map from (name, value) pairs, for unit tests here and in the layers.
#[cfg(test)]
pub(crate) fn map_of(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut m = HeaderMap::new();
    for (k, v) in pairs {
        m.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether httparse parses a head whose one field has `value`, as a request or an answer.
    fn httparse_admits(value: &[u8], request: bool) -> bool {
        let parser = httparse::ParserConfig::default();
        let mut fields = [httparse::EMPTY_HEADER; 4];
        let start: &[u8] = if request {
            b"GET / HTTP/1.1\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\n"
        };
        let head = [start, b"X: ", value, b"\r\n\r\n"].concat();
        let parsed = if request {
            parser.parse_request(&mut httparse::Request::new(&mut fields), &head)
        } else {
            parser.parse_response(&mut httparse::Response::new(&mut fields), &head)
        };
        matches!(parsed, Ok(httparse::Status::Complete(_)))
    }

    #[test]
    fn only_chunked_reads_lists_with_empty_elements() {
        let fields = |v: &[&'static str]| v.iter().map(|f| f.as_bytes()).collect::<Vec<_>>();
        for ok in [
            &["chunked"][..],
            &[" Chunked "],
            &[",chunked"],
            &["chunked, "],
            &["", "chunked"],
        ] {
            assert!(only_chunked(fields(ok).into_iter()), "{ok:?}");
        }
        for refused in [
            &["gzip, chunked"][..],
            &["chunked, chunked"],
            &["chunked", "chunked"],
            &[","],
            &["xchunked"],
        ] {
            assert!(!only_chunked(fields(refused).into_iter()), "{refused:?}");
        }
    }

    #[test]
    fn every_byte_httparse_admits_in_a_value_is_one_header_value_admits() {
        let mut admitted = 0;
        for byte in 0..=255u8 {
            let value = [b'a', byte, b'a'];
            let by_http = HeaderValue::from_bytes(&value).is_ok();
            for request in [true, false] {
                let by_httparse = httparse_admits(&value, request);
                assert_eq!(by_httparse, by_http, "byte {byte:#04x}, request {request}");
            }
            if by_http {
                admitted += 1;
                let parsed = value_parsed_by_httparse(Bytes::copy_from_slice(&value));
                assert_eq!(parsed, HeaderValue::from_bytes(&value).unwrap());
            }
        }
        // HTAB, 0x20-0x7e and 0x80-0xff.
        assert_eq!(admitted, 1 + 95 + 128);
    }

    #[test]
    fn field_names_matched_whole_are_those_from_bytes_gives() {
        let names = [
            "Host",
            "Date",
            "Server",
            "Accept",
            "Cookie",
            "Connection",
            "User-Agent",
            "Content-Type",
            "Content-Length",
            "Accept-Encoding",
            "Accept-Language",
            "Authorization",
            "Cache-Control",
            "Last-Modified",
            "ETag",
            "Transfer-Encoding",
        ];
        for name in names {
            for spelled in [
                name.to_string(),
                name.to_ascii_lowercase(),
                name.to_ascii_uppercase(),
            ] {
                let slow = HeaderName::from_bytes(spelled.as_bytes()).unwrap();
                assert_eq!(field_name(spelled.as_bytes()).unwrap(), slow, "{spelled}");
            }
        }
        assert_eq!(field_name(b"X-Thing").unwrap().as_str(), "x-thing");
        assert!(field_name(b"bad name").is_err());
        assert!(field_name(b"").is_err());
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        map_of(pairs)
    }

    #[test]
    fn a_token_is_found_in_any_value_any_case_without_its_parameters() {
        let h = map(&[
            ("connection", "Keep-Alive"),
            ("cache-control", "max-age=60, No-Transform"),
            ("vary", "Accept; q=1"),
            ("vary", " Origin ,  *"),
        ]);
        assert!(has_token(&h, &header::CONNECTION, "keep-alive"));
        assert!(!has_token(&h, &header::CONNECTION, "close"));
        assert!(has_token(&h, &header::CACHE_CONTROL, "no-transform"));
        assert!(has_token(&h, &header::CACHE_CONTROL, "max-age"));
        assert!(!has_token(&h, &header::CACHE_CONTROL, "60"));
        assert!(has_token(&h, &header::VARY, "accept"));
        assert!(has_token(&h, &header::VARY, "*"));
        assert!(has_token(&h, &header::VARY, "origin"));
        assert!(!has_token(&h, &header::VARY, "orig"));
        assert!(!has_token(&h, &header::UPGRADE, "websocket"));
        // Whichever case the token's first letter has in the value.
        let h = map(&[("connection", "Upgrade, CLOSE"), ("te", "trailers")]);
        assert!(has_token(&h, &header::CONNECTION, "close"));
        assert!(has_token(&h, &header::CONNECTION, "UPGRADE"));
        assert!(!has_token(&h, &header::CONNECTION, "keep-alive"));
        assert!(has_token(&h, &header::TE, "Trailers"));
        assert!(!lists_token(b"a,,b", b""));
        // A value as long as the token: only the token itself, in any case.
        assert!(lists_token(b"Close", b"close"));
        assert!(!lists_token(b"clone", b"close"));
        assert!(!lists_token(b"c,los", b"close"));
        assert!(!lists_token(b"", b"close"));
    }

    #[test]
    fn client_ips_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.20.3",
            "192.168.100.9",
            "::1",
            "fe80::2:ff",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(client_ip_value(ip), ip.to_string().as_str(), "{ip}");
        }
    }

    #[test]
    fn forwarded_for_appends_without_port() {
        let mut m = HeaderMap::new();
        append_forwarded_for(&mut m, &client_ip_value("10.0.0.1".parse().unwrap()));
        assert_eq!(m["x-forwarded-for"], "10.0.0.1");
        append_forwarded_for(&mut m, &client_ip_value("::1".parse().unwrap()));
        assert_eq!(m["x-forwarded-for"], "10.0.0.1, ::1");
        let mut m = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        append_forwarded_for(&mut m, &client_ip_value("3.3.3.3".parse().unwrap()));
        assert_eq!(m.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(m["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3");
    }
}
