//! Hop-by-hop fields (SPEC §6.2): which fields of a message belong to one connection only and
//! never cross the proxy, taken out of a request's map ([`remove_hop_by_hop_from_request`]), of
//! any map ([`remove_hop_by_hop`]), or of a backend's answer as its head is read
//! ([`AnswerHopByHop`]). The same pass over a request's fields joins its `Cookie` crumbs.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
/// A header named by `Connection: close` goes too (RFC 9110 §7.6.1), however unlikely.
pub static CLOSE: HeaderName = HeaderName::from_static("close");

/// Removes hop-by-hop headers: `Connection` and every header it names, `Keep-Alive`,
/// `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, `HTTP2-Settings` (it only ever belongs to
/// an `h2c` upgrade, which is refused), and `TE` but for `trailers` (left as one lowercase
/// `trailers` when any of its elements says it).
///
/// One pass over the fields finds what is present, so the common case (none of them, or only
/// `Connection: keep-alive` or `close`) costs one name match a field and, for `Connection`, a
/// removal or two (parsing a lone `keep-alive` as a list cost about 480 instructions an answer,
/// callgrind).
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    sweep(headers, false);
}

/// What a `Connection` value that is only `close` or only `keep-alive` (in any case) says:
/// `Some(true)` for `close`, `Some(false)` for `keep-alive`. `None` for anything else (a list,
/// or names of fields), which only the whole map's rules can read. The one test of the usual
/// value, for requests and answers, as they are read and when a map is swept.
pub fn lone_close_or_keep_alive(value: &[u8]) -> Option<bool> {
    if value.eq_ignore_ascii_case(b"close") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"keep-alive") {
        Some(false)
    } else {
        None
    }
}

/// Which of the fields the proxy sets on every request a list of names has: the
/// `X-Forwarded-*` family and `X-Request-Id`. When a request has none and no route rule sets
/// one, the proxy writes them itself after the request's own ([`super::forwarded`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProxyFields {
    /// `X-Forwarded-For`, `-Proto` or `-Host`.
    pub forwarded: bool,
    pub request_id: bool,
    /// A field only a proxy in front has a say in ([`PROXY_CLAIMS`]): removed from an
    /// untrusted client's request.
    pub claims: bool,
    /// The request's `Connection` named fields of its own, now removed with it: any field may
    /// be gone, `Host` too (never set by [`ProxyFields::among`]).
    pub connection_named: bool,
}

impl ProxyFields {
    /// The proxy's fields among `names`.
    pub fn among<'a>(names: impl IntoIterator<Item = &'a HeaderName>) -> ProxyFields {
        let mut fields = ProxyFields::default();
        for name in names {
            fields.note(hop_by_hop(name));
        }
        fields
    }

    fn note(&mut self, kind: HopByHop) {
        match kind {
            HopByHop::Forwarded => self.forwarded = true,
            HopByHop::RequestId => self.request_id = true,
            HopByHop::Claim => self.claims = true,
            _ => {}
        }
    }
}

/// `TE` passes only as `trailers` (RFC 9110 §10.1.4; RFC 9113 §8.2.2 allows nothing else over
/// HTTP/2): one lowercase `trailers` if any element of any value says `trailers` (`trailers,
/// gzip` is cut down to it: SPEC §6.2's "TE except trailers"), since HTTP/2 backends' clients
/// refuse any other spelling; dropped otherwise.
fn keep_te_trailers_only(headers: &mut HeaderMap) {
    let (mut count, mut exact, mut trailers) = (0, true, false);
    for value in headers.get_all(header::TE) {
        let bytes = value.as_bytes();
        exact &= bytes == b"trailers";
        trailers |= bytes
            .split(|b| *b == b',')
            .any(|element| element.trim_ascii().eq_ignore_ascii_case(b"trailers"));
        count += 1;
    }
    if count == 0 || (count == 1 && exact) {
        return;
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    } else {
        headers.remove(header::TE);
    }
}

/// [`remove_hop_by_hop`], telling also which of the proxy's own fields the request has (the
/// same pass sees every name; one that `Connection` lists counts too) and whether `Connection`
/// named any field.
pub fn remove_hop_by_hop_from_request(headers: &mut HeaderMap) -> ProxyFields {
    sweep(headers, true)
}

/// [`remove_hop_by_hop`]'s pass; `TE` stays as `trailers` in a request (`te_allowed`) and goes
/// from an answer, where it means nothing (RFC 9110 §10.1.4 is a request field).
fn sweep(headers: &mut HeaderMap, te_allowed: bool) -> ProxyFields {
    let (mut connection, mut lists_names, mut fixed, mut te) = (false, false, false, false);
    let (mut coded, mut cookies) = (false, 0u32);
    let (mut says_close, mut close_field, mut shadows) = (false, false, false);
    let mut proxy_fields = ProxyFields::default();
    for (name, value) in headers.iter() {
        match hop_by_hop(name) {
            HopByHop::Connection => {
                connection = true;
                match lone_close_or_keep_alive(value.as_bytes()) {
                    Some(close) => says_close |= close,
                    None => lists_names = true,
                }
            }
            HopByHop::Te => te = true,
            HopByHop::Fixed => fixed = true,
            HopByHop::TransferEncoding => (fixed, coded) = (true, true),
            HopByHop::Close => close_field = true,
            kind @ (HopByHop::Forwarded | HopByHop::RequestId | HopByHop::Claim) => {
                proxy_fields.note(kind)
            }
            HopByHop::Cookie => cookies += 1,
            HopByHop::Shadow => shadows = te_allowed,
            HopByHop::No => {}
        }
    }
    if cookies > 1 {
        join_cookies(headers);
    }
    if shadows {
        remove_where(headers, |name| matches!(kind_of(name), HopByHop::Shadow));
    }
    if lists_names {
        proxy_fields.connection_named = true;
        remove_connection_listed(headers);
    } else if connection {
        headers.remove(header::CONNECTION);
        if says_close && close_field {
            headers.remove(&CLOSE);
        }
    }
    if fixed {
        headers.remove(&KEEP_ALIVE);
        headers.remove(&PROXY_CONNECTION);
        headers.remove(&HTTP2_SETTINGS);
        headers.remove(header::TRANSFER_ENCODING);
        headers.remove(header::UPGRADE);
    }
    if coded {
        headers.remove(header::CONTENT_LENGTH);
    }
    if te && te_allowed {
        keep_te_trailers_only(headers);
    } else if te {
        headers.remove(header::TE);
    }
    proxy_fields
}

/// What [`remove_hop_by_hop`] does about a field name.
enum HopByHop {
    Connection,
    Te,
    /// Always removed.
    Fixed,
    /// Always removed, and `Content-Length` with it: the message was framed by it, and a
    /// length beside it is not the body's (RFC 9112 §6.3; sent on, a client would wait for
    /// bytes that never come).
    TransferEncoding,
    /// A field named `close`: removed only when `Connection: close` names it (noting it here
    /// saves a hash and a lookup on every `Connection: close` message, which nearly never has one).
    Close,
    /// `X-Forwarded-For`, `-Proto` or `-Host`: kept, and reported.
    Forwarded,
    /// `X-Request-Id`: kept, and reported.
    RequestId,
    /// One of [`PROXY_CLAIMS`], any other `X-Forwarded-*`, or a claim spelled with `_`: kept,
    /// and reported.
    Claim,
    /// A field the proxy sets itself (`X-Forwarded-For`, `-Proto`, `-Host`, `X-Request-Id`)
    /// spelled with `_`: CGI, WSGI, PHP and Rack read it as the proxy's own and join the two
    /// (`HTTP_X_FORWARDED_HOST: evil.test, a.test`), so it is removed from every request, as
    /// nginx drops names with `_` by default (`underscores_in_headers off`).
    Shadow,
    /// `Cookie`: kept; several are joined into one ([`join_cookies`]).
    Cookie,
    No,
}

/// One match on the name's text.
fn hop_by_hop(name: &HeaderName) -> HopByHop {
    kind_of(name.as_str())
}

fn kind_of(name: &str) -> HopByHop {
    match name {
        "connection" => HopByHop::Connection,
        "te" => HopByHop::Te,
        "close" => HopByHop::Close,
        "x-forwarded-for" | "x-forwarded-proto" | "x-forwarded-host" => HopByHop::Forwarded,
        "x-request-id" => HopByHop::RequestId,
        "forwarded"
        | "x-real-ip"
        | "x-host"
        | "x-original-url"
        | "x-rewrite-url"
        | "x-original-host"
        | "x-original-uri"
        | "x-override-url"
        | "x-envoy-original-path"
        | "x-client-ip"
        | "true-client-ip" => HopByHop::Claim,
        "cookie" => HopByHop::Cookie,
        "transfer-encoding" => HopByHop::TransferEncoding,
        "upgrade" | "keep-alive" | "proxy-connection" | "http2-settings" => HopByHop::Fixed,
        // Every claim begins with `x`, `f` or `t`; most names do not, and pay one byte's test.
        other if other.starts_with(['x', 'f', 't']) => claim_kind(other),
        _ => HopByHop::No,
    }
}

/// The fields the proxy sets on every request itself.
const OWN_FIELDS: [&str; 4] = [
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-request-id",
];

/// What a name beginning with `x`, `f` or `t` that no exact arm took is: any other
/// `X-Forwarded-*` claims what a proxy in front would say (`X-Forwarded-Uri`, `-Client-Cert`);
/// with `_` for some of its `-`, one of the proxy's own fields is a [`HopByHop::Shadow`] and a
/// claim is a claim.
fn claim_kind(name: &str) -> HopByHop {
    if name.starts_with("x-forwarded-") {
        return HopByHop::Claim;
    }
    if !name.contains('_') {
        return HopByHop::No;
    }
    if OWN_FIELDS
        .iter()
        .any(|own| spelled_with_underscores(name, own))
    {
        HopByHop::Shadow
    } else if name.starts_with("x_forwarded_")
        || name.starts_with("x_forwarded-")
        || PROXY_CLAIMS
            .iter()
            .any(|claim| spelled_with_underscores(name, claim.as_str()))
    {
        HopByHop::Claim
    } else {
        HopByHop::No
    }
}

/// Whether `name` is `field` with `_` for some of its `-`: CGI, WSGI and PHP read `X_Real_IP`
/// as `X-Real-IP` (`HTTP_X_REAL_IP`), so that spelling says as much.
fn spelled_with_underscores(name: &str, field: &str) -> bool {
    field.len() == name.len()
        && field
            .bytes()
            .zip(name.bytes())
            .all(|(f, n)| f == n || (f == b'-' && n == b'_'))
}

/// Fields a client may not set for itself when it is not a trusted proxy: what a proxy in front
/// says of the request (RFC 7239's `Forwarded`, `X-Real-IP`, `X-Client-IP`, `True-Client-IP`,
/// and every `X-Forwarded-*` but the three the proxy sets) and the target or host overrides
/// some frameworks obey (`X-Original-URL`, `X-Rewrite-URL`, `X-Host`, `X-Original-Host`, ...).
/// A backend that builds links or checks access from them would take a client's word for it,
/// and a cached answer built so would be served to everyone.
pub static PROXY_CLAIMS: [HeaderName; 11] = [
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-host"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-original-host"),
    HeaderName::from_static("x-original-uri"),
    HeaderName::from_static("x-override-url"),
    HeaderName::from_static("x-envoy-original-path"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("true-client-ip"),
];

/// Removes every claim from `headers` ([`HopByHop::Claim`]: [`PROXY_CLAIMS`], any other
/// `X-Forwarded-*`, in either spelling).
pub fn remove_proxy_claims(headers: &mut HeaderMap) {
    remove_where(headers, |name| matches!(kind_of(name), HopByHop::Claim));
}

/// Removes the fields whose names `unwanted` picks (rare: collected first).
fn remove_where(headers: &mut HeaderMap, unwanted: impl Fn(&str) -> bool) {
    let picked: Vec<HeaderName> = headers
        .keys()
        .filter(|n| unwanted(n.as_str()))
        .cloned()
        .collect();
    for name in picked {
        headers.remove(name);
    }
}

/// Several `Cookie` fields become one, joined with `; ` (RFC 9113 §8.2.3: an HTTP/2 client may
/// send each crumb as a field of its own, and they MUST be joined before an HTTP/1.1
/// connection). Read as a list, `a=1, b=2` is one cookie `a` worth `1, b=2` to most servers,
/// and one that reads the first field only loses the rest. None or one: left as it is.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for crumb in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

fn remove_connection_listed(headers: &mut HeaderMap) {
    // Names listed in `Connection`, parsed before removal; a few fit on the stack.
    let mut listed: [Option<HeaderName>; 4] = Default::default();
    let mut overflow: Vec<HeaderName> = Vec::new();
    let mut count = 0;
    let mut named_by_text = [false; NAMED_BY_TEXT.len()];
    for value in headers.get_all(header::CONNECTION) {
        for token in value.to_str().unwrap_or("").split(',') {
            let token = token.trim();
            if token.is_empty() || GONE_ANYWAY.iter().any(|t| token.eq_ignore_ascii_case(t)) {
                continue;
            }
            if let Some(i) = NAMED_BY_TEXT
                .iter()
                .position(|t| token.eq_ignore_ascii_case(t))
            {
                named_by_text[i] = true;
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                match listed.get_mut(count) {
                    Some(slot) => *slot = Some(name),
                    None => overflow.push(name),
                }
                count += 1;
            }
        }
    }
    headers.remove(header::CONNECTION);
    for name in listed.into_iter().flatten().chain(overflow) {
        headers.remove(name);
    }
    for (name, seen) in NAMED_BY_TEXT.iter().zip(named_by_text) {
        if seen {
            headers.remove(*name);
        }
    }
}

/// Common `Connection` options whose headers the sweep takes care of itself: they go with the
/// fixed hop-by-hop ones whenever present, and `TE` stays as `trailers` in a request, however
/// `Connection` names it (a client sending `TE` must also send `Connection: TE`, RFC 9110
/// §10.1.4; taken as a listed field, `trailers` was lost for every client that does).
const GONE_ANYWAY: [&str; 3] = ["keep-alive", "upgrade", "te"];

/// Common `Connection` options matched by text, not parsed into a `HeaderName` (which would
/// allocate): a header of that name still goes (RFC 9110 §7.6.1).
const NAMED_BY_TEXT: [&str; 2] = ["close", "trailers"];

/// A backend answer's hop-by-hop fields, taken out as its head is read: most are dropped
/// before they go into the map (the usual `Connection: keep-alive` and the fixed ones), which
/// spares inserting them, looking for them in the map and removing them (callgrind: the
/// sweep of the built map cost about 570 instructions an answer, this about 220). The rare fields whose fate depends on others (a `Connection` that
/// names fields, `TE`, a field named `close`) go in, and [`AnswerHopByHop::finish`] sweeps
/// the map as [`remove_hop_by_hop`] would have swept the whole answer.
#[derive(Debug, Default)]
pub struct AnswerHopByHop {
    sweep: bool,
    /// A dropped `Transfer-Encoding` framed the answer: a `Content-Length` goes too.
    coded: bool,
    /// A dropped `Connection` said `close`: a field named `close` goes too.
    dropped_close: bool,
}

impl AnswerHopByHop {
    /// Whether the field goes into the answer's map.
    pub fn keeps(&mut self, name: &HeaderName, value: &[u8]) -> bool {
        match hop_by_hop(name) {
            HopByHop::No
            | HopByHop::Forwarded
            | HopByHop::RequestId
            | HopByHop::Claim
            | HopByHop::Shadow
            | HopByHop::Cookie => true,
            HopByHop::Fixed => false,
            HopByHop::TransferEncoding => {
                self.coded = true;
                false
            }
            HopByHop::Connection => match lone_close_or_keep_alive(value) {
                Some(close) => {
                    self.dropped_close |= close;
                    false
                }
                None => {
                    self.sweep = true;
                    true
                }
            },
            // Connection-specific, and a request field: nothing in an answer.
            HopByHop::Te => false,
            HopByHop::Close => {
                self.sweep = true;
                true
            }
        }
    }

    /// Takes out of the built map what could not be dropped field by field.
    pub fn finish(self, headers: &mut HeaderMap) {
        if self.coded {
            headers.remove(header::CONTENT_LENGTH);
        }
        if self.sweep {
            remove_hop_by_hop(headers);
            if self.dropped_close {
                headers.remove(&CLOSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::headers::map_of as map;

    #[test]
    fn proxy_claims_are_reported_and_removed_on_demand() {
        let mut headers = HeaderMap::new();
        headers.insert("x-app", HeaderValue::from_static("1"));
        assert!(!remove_hop_by_hop_from_request(&mut headers).claims);
        headers.insert("x_real_ip", HeaderValue::from_static("6.6.6.6"));
        headers.insert("x_app", HeaderValue::from_static("1"));
        assert!(
            remove_hop_by_hop_from_request(&mut headers).claims,
            "x_real_ip"
        );
        headers.insert("forwarded", HeaderValue::from_static("host=evil.test"));
        headers.insert("x-original-url", HeaderValue::from_static("/admin"));
        headers.insert("x_forwarded-port", HeaderValue::from_static("1"));
        assert!(remove_hop_by_hop_from_request(&mut headers).claims);
        remove_proxy_claims(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-app", "x_app"]);
    }

    /// Every `X-Forwarded-*` but the proxy's own three is a claim, as are the other client-IP
    /// and target overrides backends obey; the proxy's own fields spelled with `_` go from every
    /// request (a CGI-style backend joins them with the proxy's), never from an answer.
    #[test]
    fn other_forwarded_fields_are_claims_and_underscored_own_fields_go() {
        let mut headers = HeaderMap::new();
        for name in [
            "x-forwarded-uri",
            "x-forwarded-client-cert",
            "x-forwarded-foo",
            "x_forwarded_path",
            "true-client-ip",
            "x-original-host",
            "x-envoy-original-path",
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
        }
        headers.insert("x-forwarded-host", HeaderValue::from_static("a.test"));
        headers.insert("x_forwarded_host", HeaderValue::from_static("evil.test"));
        headers.insert("x-forwarded_for", HeaderValue::from_static("6.6.6.6"));
        headers.insert("x_request_id", HeaderValue::from_static("forged"));
        headers.insert("x_app", HeaderValue::from_static("1"));
        let fields = remove_hop_by_hop_from_request(&mut headers);
        assert!(fields.claims && fields.forwarded);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        for gone in ["x_forwarded_host", "x-forwarded_for", "x_request_id"] {
            assert!(!left.contains(&gone), "{gone} left: {left:?}");
        }
        remove_proxy_claims(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-forwarded-host", "x_app"]);
        let mut answer = HeaderMap::new();
        answer.insert("x_forwarded_host", HeaderValue::from_static("kept"));
        remove_hop_by_hop(&mut answer);
        assert!(answer.contains_key("x_forwarded_host"), "an answer's own");
    }

    /// The map an answer with `fields` gets when they are read one by one.
    fn read_as_answer(fields: &[(&str, &str)]) -> HeaderMap {
        let mut answer = AnswerHopByHop::default();
        let mut read = HeaderMap::new();
        for (name, value) in fields {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            if answer.keeps(&name, value.as_bytes()) {
                read.append(name, HeaderValue::from_str(value).unwrap());
            }
        }
        answer.finish(&mut read);
        read
    }

    #[test]
    fn te_passes_as_one_lowercase_trailers_or_not_at_all() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[("te", "trailers")], &["trailers"]),
            (&[("te", "Trailers")], &["trailers"]),
            (&[("te", "trailers"), ("te", "TRAILERS")], &["trailers"]),
            (&[("te", "trailers"), ("te", "gzip")], &["trailers"]),
            (&[("te", "trailers, deflate")], &["trailers"]),
            (&[("te", "gzip;q=0.5 , Trailers")], &["trailers"]),
            (&[("te", "gzip"), ("te", "deflate")], &[]),
            (&[("te", "trailersx")], &[]),
            (
                &[("connection", "close, TE"), ("te", "gzip, trailers")],
                &["trailers"],
            ),
            (&[("connection", "te"), ("te", "trailers")], &["trailers"]),
            (&[("connection", "TE, a"), ("te", "gzip")], &[]),
        ];
        for (input, left) in cases {
            let mut m = map(input);
            remove_hop_by_hop_from_request(&mut m);
            let values: Vec<_> = m.get_all(header::TE).iter().collect();
            assert_eq!(values, *left, "{input:?}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                &[
                    ("connection", "keep-alive, X-Custom"),
                    ("x-custom", "1"),
                    ("x-kept", "2"),
                ],
                &["x-kept"],
                &["connection", "x-custom"],
            ),
            (
                &[
                    ("keep-alive", "timeout=5"),
                    ("proxy-connection", "keep-alive"),
                ],
                &[],
                &["keep-alive", "proxy-connection"],
            ),
            (
                &[("transfer-encoding", "chunked"), ("upgrade", "websocket")],
                &[],
                &["transfer-encoding", "upgrade"],
            ),
            // The length beside a transfer coding is not the body's, before it or after.
            (
                &[
                    ("content-length", "5"),
                    ("transfer-encoding", "chunked"),
                    ("a", "1"),
                ],
                &["a"],
                &["transfer-encoding", "content-length"],
            ),
            (
                &[
                    ("transfer-encoding", "gzip, chunked"),
                    ("content-length", "5"),
                ],
                &[],
                &["transfer-encoding", "content-length"],
            ),
            (&[("content-length", "5")], &["content-length"], &[]),
            (
                &[
                    ("connection", "Keep-Alive"),
                    ("keep-alive", "5"),
                    ("a", "1"),
                ],
                &["a"],
                &["connection", "keep-alive"],
            ),
            (
                &[
                    ("connection", "keep-alive"),
                    ("connection", "a"),
                    ("a", "1"),
                ],
                &[],
                &["connection", "a"],
            ),
            // A request field: nothing in an answer (a request keeps `trailers`, below).
            (&[("te", "trailers")], &[], &["te"]),
            (&[("te", "gzip")], &[], &["te"]),
            (&[("te", "trailers"), ("te", "gzip")], &[], &["te"]),
            (
                &[("connection", "close, Keep-Alive"), ("keep-alive", "1")],
                &[],
                &["keep-alive", "connection"],
            ),
            (
                &[("connection", "close"), ("host", "a")],
                &["host"],
                &["connection"],
            ),
            (
                &[("connection", "Close"), ("close", "x"), ("host", "a")],
                &["host"],
                &["connection", "close"],
            ),
            (
                &[("close", "x"), ("connection", "keep-alive")],
                &["close"],
                &["connection"],
            ),
            (&[("close", "x")], &["close"], &[]),
            (
                &[("close", "x"), ("Connection", "close"), ("a", "1")],
                &["a"],
                &["connection", "close"],
            ),
            (
                &[("connection", "close"), ("te", "trailers"), ("close", "x")],
                &[],
                &["connection", "close", "te"],
            ),
            (
                &[
                    ("connection", "keep-alive"),
                    ("connection", "close, a"),
                    ("a", "1"),
                    ("b", "2"),
                ],
                &["b"],
                &["connection", "a"],
            ),
            (
                &[("connection", "y-a, CLOSE"), ("close", "x"), ("y-a", "1")],
                &[],
                &["connection", "close", "y-a"],
            ),
        ];
        for (input, kept, gone) in cases {
            let mut m = map(input);
            remove_hop_by_hop(&mut m);
            assert_eq!(read_as_answer(input), m, "{input:?} read as an answer");
            for k in *kept {
                assert!(m.contains_key(*k), "{k} should stay in {input:?}");
            }
            for k in *gone {
                assert!(!m.contains_key(*k), "{k} should go from {input:?}");
            }
        }
    }

    /// An HTTP/2 client's cookie crumbs go on as one field; a lone one is left as it is.
    #[test]
    fn cookie_crumbs_become_one_field() {
        let mut headers = map(&[("cookie", "a=1"), ("x", "y"), ("cookie", "b=2")]);
        remove_hop_by_hop_from_request(&mut headers);
        let cookies: Vec<_> = headers.get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
        let mut headers = map(&[("cookie", "a=1, b")]);
        remove_hop_by_hop_from_request(&mut headers);
        assert_eq!(headers["cookie"], "a=1, b");
    }
}
