//! RFC 9111 for a shared cache, as pure functions of heads: what a request may take from the
//! cache, whether a response may be stored, and for how long it is fresh. No I/O, no clock but
//! the one passed in.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

/// The `Cache-Control` directives a shared cache acts on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheControl {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    /// `must-revalidate` or `proxy-revalidate`: never served stale.
    pub must_revalidate: bool,
    /// `must-revalidate` itself, which (unlike `proxy-revalidate`) lets a shared cache reuse
    /// an answer to a request with `Authorization` (RFC 9111 §3.5).
    pub must_revalidate_written: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    /// RFC 5861.
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
}

impl CacheControl {
    /// Reads every `Cache-Control` field of `headers` (directive names in any case; a bad
    /// number makes that directive count as absent, except that a bad `max-age` is stale; a
    /// directive written twice counts as written first, as RFC 9111 §4.2.1 allows).
    pub fn of(headers: &HeaderMap) -> CacheControl {
        let mut cc = CacheControl::default();
        for value in headers.get_all(header::CACHE_CONTROL) {
            for directive in value.as_bytes().split(|b| *b == b',') {
                cc.read(directive);
            }
        }
        cc
    }

    /// One directive, `name` or `name=value` (bytes: a value that is not a number counts as
    /// 0 seconds, one too large for a number as 2^31, RFC 9111 §1.2.2).
    fn read(&mut self, directive: &[u8]) {
        let (name, arg) = match directive.iter().position(|b| *b == b'=') {
            Some(at) => (&directive[..at], Some(&directive[at + 1..])),
            None => (directive, None),
        };
        let name = name.trim_ascii();
        let seconds = || {
            arg.map(|a| {
                let a = a.trim_ascii();
                let a = a.strip_prefix(b"\"").unwrap_or(a);
                let a = a.strip_suffix(b"\"").unwrap_or(a);
                let digits = !a.is_empty() && a.iter().all(u8::is_ascii_digit);
                match std::str::from_utf8(a).ok().map(str::parse::<u64>) {
                    Some(Ok(n)) => n,
                    _ if digits => DELTA_SECONDS_OVERFLOW,
                    _ => 0,
                }
            })
        };
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        if is(b"no-store") {
            self.no_store = true;
        } else if is(b"no-cache") {
            // `no-cache="field"` names fields; a cache that cannot strip them treats it as a
            // plain `no-cache`.
            self.no_cache = true;
        } else if is(b"private") {
            self.private = true;
        } else if is(b"public") {
            self.public = true;
        } else if is(b"must-revalidate") {
            (self.must_revalidate, self.must_revalidate_written) = (true, true);
        } else if is(b"proxy-revalidate") {
            self.must_revalidate = true;
        } else if is(b"max-age") {
            self.max_age = self.max_age.or(seconds()).or(Some(0));
        } else if is(b"s-maxage") {
            self.s_maxage = self.s_maxage.or(seconds()).or(Some(0));
        } else if is(b"stale-while-revalidate") {
            self.stale_while_revalidate = self.stale_while_revalidate.or(seconds());
        } else if is(b"stale-if-error") {
            self.stale_if_error = self.stale_if_error.or(seconds());
        }
    }
}

/// What a delta-seconds value too large to hold counts as (RFC 9111 §1.2.2).
const DELTA_SECONDS_OVERFLOW: u64 = 1 << 31;

/// Whether a request may be answered from the cache, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// GET or HEAD: look for a stored response.
    Look,
    /// The client asked for a fresh answer (`no-cache`, `max-age=0`, `Pragma: no-cache`): what
    /// is stored is revalidated with the backend as a stale entry is, and what comes back kept.
    Refresh,
    /// `no-store`: neither served from nor stored.
    Skip,
    /// A method that may change the resource (POST, PUT, DELETE, PATCH, and any method not
    /// known to be safe, RFC 9111 §4.4): stored answers for its URL are dropped.
    Invalidate,
    /// The other safe methods (OPTIONS, TRACE) and CONNECT pass by the cache.
    Pass,
}

pub fn lookup(method: &Method, headers: &HeaderMap) -> Lookup {
    ask(method, headers).0
}

/// Fields that make some frameworks take a GET for another method (Rails, Laravel, Symfony,
/// Express's method-override): a `DELETE` in disguise is not answered from the cache, nor is
/// its answer kept for the URL.
static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// What a request asks of the cache, and whether it carries `Authorization` (read in one pass
/// over the request's header names: cheaper than three lookups by name).
pub fn ask(method: &Method, headers: &HeaderMap) -> (Lookup, bool) {
    if *method != Method::GET && *method != Method::HEAD {
        let safe = *method == Method::OPTIONS || *method == Method::TRACE;
        // CONNECT names no resource of the URL's.
        let pass = safe || *method == Method::CONNECT;
        return (
            if pass {
                Lookup::Pass
            } else {
                Lookup::Invalidate
            },
            false,
        );
    }
    let (mut has_cc, mut has_pragma, mut auth) = (false, false, false);
    let mut otherwise = false;
    for name in headers.keys() {
        has_cc |= name == header::CACHE_CONTROL;
        has_pragma |= name == header::PRAGMA;
        auth |= name == header::AUTHORIZATION;
        otherwise |= METHOD_OVERRIDES.iter().any(|o| name == o);
    }
    // A GET the backend may take for another method: its answer is not the URL's.
    if otherwise {
        return (Lookup::Skip, auth);
    }
    // Most requests say nothing about caching: no parsing.
    if !has_cc && !has_pragma {
        return (Lookup::Look, auth);
    }
    (directives(headers, has_cc), auth)
}

/// What a request's `Cache-Control` and `Pragma` ask of the cache.
fn directives(headers: &HeaderMap, has_cc: bool) -> Lookup {
    let cc = CacheControl::of(headers);
    if cc.no_store {
        return Lookup::Skip;
    }
    let pragma_no_cache = headers
        .get_all(header::PRAGMA)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"));
    if cc.no_cache || cc.max_age == Some(0) || (pragma_no_cache && !has_cc) {
        return Lookup::Refresh;
    }
    Lookup::Look
}

/// Statuses a cache may store with explicit freshness (RFC 9110 §15.1 "heuristically
/// cacheable", less 206, which needs range merging), and the redirects a backend gives a
/// lifetime (RFC 9111 §3 stores any final status that has one; nginx keeps them): a 302 or 307
/// with `max-age` reached the backend every time. Server errors stay out whatever they say: a
/// passing failure kept would answer for its whole lifetime.
fn storable_status(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 302 | 303 | 307 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses that get the configured `ttl` when the response gives no freshness (Aralez's rule).
fn default_ttl_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 200 | 301 | 404)
}

/// A response that may be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Storable {
    /// How long it stays fresh from the moment it was received, its `Age` already taken off.
    pub fresh_for: Duration,
    /// The upstream's `Age` (the entry's age when it arrived).
    pub initial_age: Duration,
    /// May answer a request that carries `Authorization` (RFC 9111 §3.5).
    pub shared_with_auth: bool,
    /// The request headers named by `Vary`, lower case.
    pub vary: Vec<HeaderName>,
    /// Never served stale: `must-revalidate`, `proxy-revalidate` or `no-cache`.
    pub must_revalidate: bool,
    /// How long past its freshness it may be served while one request refreshes it.
    pub stale_while_revalidate: Duration,
    /// How long past its freshness it may be served when the backend fails.
    pub stale_if_error: Duration,
}

/// Decides whether a GET's response may be stored and for how long. `req_auth`: the request
/// carried `Authorization`. `default_ttl` is the route's `cache_ttl` or main.yaml's `cache.ttl`.
pub fn storable(
    req_auth: bool,
    status: StatusCode,
    headers: &HeaderMap,
    default_ttl: Duration,
    now: fn() -> SystemTime,
) -> Option<Storable> {
    if !storable_status(status) {
        return None;
    }
    let cc = CacheControl::of(headers);
    if cc.no_store || cc.private || headers.contains_key(header::SET_COOKIE) {
        return None;
    }
    // A stream of events (SSE) is live: replayed from the cache it would be old news, and
    // coalesced, the second subscriber would wait for the first one's stream to end.
    if is_event_stream(headers) {
        return None;
    }
    // Kept without freshness when it can be revalidated: each use asks the backend first.
    let validator =
        headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED);
    if cc.no_cache && !validator {
        return None;
    }
    let shared_with_auth = cc.public || cc.s_maxage.is_some() || cc.must_revalidate_written;
    if req_auth && !shared_with_auth {
        return None;
    }
    let vary = vary_names(headers)?;
    let lifetime = match explicit_lifetime(&cc, headers) {
        Some(lifetime) => lifetime,
        None if default_ttl_status(status) => default_ttl,
        None => return None,
    };
    let lifetime = if cc.no_cache {
        Duration::ZERO
    } else {
        lifetime
    };
    let initial_age = age_of(headers, now);
    let fresh_for = lifetime.saturating_sub(initial_age);
    let secs = |s: Option<u64>| Duration::from_secs(s.unwrap_or(0));
    let (swr, sie) = (secs(cc.stale_while_revalidate), secs(cc.stale_if_error));
    // Stale on arrival, with no validator and no stale allowance: nothing to gain by keeping it.
    if fresh_for.is_zero() && !validator && swr.is_zero() && sie.is_zero() {
        return None;
    }
    // `s-maxage` implies `proxy-revalidate` (RFC 9111 §5.2.2.10): never served stale.
    let must_revalidate = cc.must_revalidate || cc.no_cache || cc.s_maxage.is_some();
    Some(Storable {
        fresh_for,
        initial_age,
        shared_with_auth,
        vary,
        must_revalidate,
        stale_while_revalidate: if must_revalidate { Duration::ZERO } else { swr },
        stale_if_error: if must_revalidate { Duration::ZERO } else { sie },
    })
}

/// Whether the answer is `text/event-stream` (server-sent events).
fn is_event_stream(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|ct| {
        let essence = ct
            .as_bytes()
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default();
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(b"text/event-stream")
    })
}

/// Whether a `304 Not Modified` is about the stored answer with `stored` head (RFC 9111 §4.3.4):
/// a strong `ETag` in it names the representation it is about, and only a stored answer with
/// that same validator is updated; without one (or with a weak one) the answer to the cache's
/// own conditional request is taken as about the entry it asked with.
pub fn selects(stored: &HeaderMap, not_modified: &HeaderMap) -> bool {
    match not_modified.get(header::ETAG) {
        Some(tag) if !tag.as_bytes().starts_with(b"W/") => stored.get(header::ETAG) == Some(tag),
        _ => true,
    }
}

/// The stored head updated by a `304 Not Modified` (RFC 9111 §4.3.4): every field the 304
/// carries replaces the stored one, except those that describe the body.
pub fn refreshed_head(stored: &HeaderMap, not_modified: &HeaderMap) -> HeaderMap {
    let mut head = stored.clone();
    let mut replaced: Vec<&HeaderName> = Vec::new();
    for (name, value) in not_modified {
        if *name == header::CONTENT_LENGTH
            || *name == header::CONTENT_ENCODING
            || *name == header::TRANSFER_ENCODING
            || *name == header::CONTENT_RANGE
        {
            continue;
        }
        if !replaced.contains(&name) {
            head.remove(name);
            replaced.push(name);
        }
        head.append(name.clone(), value.clone());
    }
    head
}

/// `s-maxage`, else `max-age`, else `Expires` less `Date`; `None` when the response gives none.
fn explicit_lifetime(cc: &CacheControl, headers: &HeaderMap) -> Option<Duration> {
    if let Some(s) = cc.s_maxage.or(cc.max_age) {
        return Some(Duration::from_secs(s));
    }
    let expires = headers.get(header::EXPIRES)?;
    // An Expires that cannot be read means "already expired" (RFC 9111 §5.3).
    let Some(expires) = expires.to_str().ok().and_then(parse_http_date) else {
        return Some(Duration::ZERO);
    };
    let date = headers
        .get(header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(parse_http_date)
        .unwrap_or_else(SystemTime::now);
    Some(expires.duration_since(date).unwrap_or(Duration::ZERO))
}

/// The response's age on arrival: `Age`, or how far `Date` lies in the past (RFC 9111 §4.2.3).
fn age_of(headers: &HeaderMap, now: fn() -> SystemTime) -> Duration {
    let age = headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or_default();
    let apparent = headers
        .get(header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(parse_http_date)
        .and_then(|date| now().duration_since(date).ok())
        .unwrap_or_default();
    age.max(apparent)
}

/// The names `Vary` lists, lower case; `None` for `Vary: *` (never matches a later request).
fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for value in headers.get_all(header::VARY) {
        let text = value.to_str().ok()?;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Some(names)
}

/// An HTTP date (IMF-fixdate and the two obsolete forms RFC 9110 still asks to read).
fn parse_http_date(text: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(text.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::headers::map_of as map;

    const TTL: Duration = Duration::from_secs(300);

    fn fresh_for(status: u16, resp: &[(&str, &str)], req: &[(&str, &str)]) -> Option<u64> {
        let status = StatusCode::from_u16(status).unwrap();
        let auth = map(req).contains_key(header::AUTHORIZATION);
        storable(auth, status, &map(resp), TTL, SystemTime::now).map(|s| s.fresh_for.as_secs())
    }

    /// RFC 9111 §4.2.1: a directive written twice counts as written first; §1.2.2: digits too
    /// many for a number count as 2^31 seconds (such an answer was not kept at all).
    #[test]
    fn the_first_of_two_directives_counts_and_an_overflow_is_2_to_the_31() {
        let cc = |v: &str| fresh_for(200, &[("cache-control", v)], &[]);
        assert_eq!(cc("max-age=1, max-age=60"), Some(1));
        assert_eq!(cc("max-age=60, max-age=1"), Some(60));
        assert_eq!(cc("s-maxage=5, s-maxage=50, max-age=9"), Some(5));
        assert_eq!(cc("max-age=18446744073709551616"), Some(1 << 31));
        assert_eq!(cc("max-age=1x"), None, "not digits: stale, as before");
    }

    /// `s-maxage` implies `proxy-revalidate` (RFC 9111 §5.2.2.10): no stale allowance holds.
    #[test]
    fn s_maxage_is_never_served_stale() {
        let map = map(&[(
            "cache-control",
            "s-maxage=1, stale-if-error=60, stale-while-revalidate=60",
        )]);
        let s = storable(false, StatusCode::OK, &map, TTL, SystemTime::now).expect("stored");
        assert!(s.must_revalidate);
        assert!(s.stale_if_error.is_zero() && s.stale_while_revalidate.is_zero());
    }

    #[test]
    fn freshness_comes_from_s_maxage_max_age_expires_then_the_ttl() {
        assert_eq!(
            fresh_for(200, &[("cache-control", "max-age=60, s-maxage=30")], &[]),
            Some(30)
        );
        assert_eq!(
            fresh_for(200, &[("cache-control", "public, Max-Age=\"60\"")], &[]),
            Some(60)
        );
        let dated = [
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
        ];
        // 60 s of freshness, but the Date is decades old: the response is stale on arrival.
        assert_eq!(fresh_for(200, &dated, &[]), None);
        assert_eq!(fresh_for(200, &[("expires", "0")], &[]), None);
        assert_eq!(fresh_for(200, &[], &[]), Some(300));
        assert_eq!(fresh_for(404, &[], &[]), Some(300));
        assert_eq!(fresh_for(410, &[], &[]), None);
        assert_eq!(
            fresh_for(410, &[("cache-control", "max-age=9")], &[]),
            Some(9)
        );
        assert_eq!(fresh_for(500, &[("cache-control", "max-age=9")], &[]), None);
        // Redirects with a lifetime of their own, and without one (no default ttl for them).
        for redirect in [302, 303, 307] {
            let given = fresh_for(redirect, &[("cache-control", "max-age=9")], &[]);
            assert_eq!(given, Some(9), "{redirect}");
            assert_eq!(fresh_for(redirect, &[], &[]), None, "{redirect}");
        }
        assert_eq!(
            fresh_for(200, &[("cache-control", "max-age=9"), ("age", "4")], &[]),
            Some(5)
        );
        assert_eq!(
            fresh_for(200, &[("cache-control", "max-age=9"), ("age", "9")], &[]),
            None
        );
    }

    #[test]
    fn what_is_never_stored() {
        for resp in [
            [("cache-control", "no-store")],
            [("cache-control", "private, max-age=60")],
            [("cache-control", "no-cache")],
            [("cache-control", "max-age=0")],
            [("set-cookie", "a=b")],
            [("vary", "*")],
        ] {
            assert_eq!(fresh_for(200, &resp, &[]), None, "{resp:?}");
        }
        // With a validator, `no-cache` and `max-age=0` answers are kept to be revalidated.
        let etag = ("etag", "\"v1\"");
        assert_eq!(
            fresh_for(200, &[("cache-control", "no-cache"), etag], &[]),
            Some(0)
        );
        assert_eq!(
            fresh_for(200, &[("cache-control", "max-age=0"), etag], &[]),
            Some(0)
        );
        let auth = [("authorization", "Basic eDp5")];
        assert_eq!(fresh_for(200, &[], &auth), None);
        assert_eq!(
            fresh_for(200, &[("cache-control", "public")], &auth),
            Some(300)
        );
        assert_eq!(
            fresh_for(200, &[("cache-control", "s-maxage=5")], &auth),
            Some(5)
        );
        let must = [("cache-control", "max-age=100, must-revalidate")];
        assert_eq!(fresh_for(200, &must, &auth), Some(100));
        // `proxy-revalidate` is not among RFC 9111 §3.5's three: one user's answer stays theirs.
        let proxy = [("cache-control", "max-age=100, proxy-revalidate")];
        assert_eq!(fresh_for(200, &proxy, &auth), None);
        assert_eq!(fresh_for(200, &proxy, &[]), Some(100));
    }

    #[test]
    fn requests_say_how_they_use_the_cache() {
        assert_eq!(lookup(&Method::GET, &map(&[])), Lookup::Look);
        assert_eq!(lookup(&Method::HEAD, &map(&[])), Lookup::Look);
        assert_eq!(
            lookup(&Method::GET, &map(&[("cache-control", "no-cache")])),
            Lookup::Refresh
        );
        assert_eq!(
            lookup(&Method::GET, &map(&[("cache-control", "max-age=0")])),
            Lookup::Refresh
        );
        assert_eq!(
            lookup(&Method::GET, &map(&[("pragma", "no-cache")])),
            Lookup::Refresh
        );
        assert_eq!(
            lookup(&Method::GET, &map(&[("cache-control", "no-store")])),
            Lookup::Skip
        );
        let with_auth = map(&[("authorization", "Basic eDp5"), ("pragma", "no-cache")]);
        assert_eq!(ask(&Method::GET, &with_auth), (Lookup::Refresh, true));
        assert_eq!(
            ask(&Method::GET, &map(&[("x-a", "1")])),
            (Lookup::Look, false)
        );
        assert_eq!(lookup(&Method::POST, &map(&[])), Lookup::Invalidate);
        assert_eq!(lookup(&Method::DELETE, &map(&[])), Lookup::Invalidate);
        assert_eq!(lookup(&Method::OPTIONS, &map(&[])), Lookup::Pass);
        // RFC 9111 §4.4: methods whose safety is unknown invalidate too.
        let purge_like = Method::from_bytes(b"FOO").expect("method");
        assert_eq!(lookup(&purge_like, &map(&[])), Lookup::Invalidate);
        assert_eq!(lookup(&Method::TRACE, &map(&[])), Lookup::Pass);
    }

    #[test]
    fn vary_names_are_collected_once() {
        let s = storable(
            false,
            StatusCode::OK,
            &map(&[
                ("vary", "Accept-Encoding, accept-language"),
                ("vary", "accept-encoding"),
            ]),
            TTL,
            SystemTime::now,
        )
        .unwrap();
        assert_eq!(
            s.vary,
            vec![header::ACCEPT_ENCODING, header::ACCEPT_LANGUAGE]
        );
    }

    #[test]
    fn stale_allowances_and_revalidation_flags() {
        let now = SystemTime::now;
        let cc = "max-age=5, stale-while-revalidate=30, stale-if-error=60";
        let s = storable(
            false,
            StatusCode::OK,
            &map(&[("cache-control", cc)]),
            TTL,
            now,
        )
        .unwrap();
        assert_eq!(s.stale_while_revalidate, Duration::from_secs(30));
        assert_eq!(s.stale_if_error, Duration::from_secs(60));
        let strict = map(&[(
            "cache-control",
            "max-age=5, must-revalidate, stale-if-error=60",
        )]);
        let s = storable(false, StatusCode::OK, &strict, TTL, now).unwrap();
        assert!(s.must_revalidate && s.stale_if_error.is_zero());
    }

    #[test]
    fn a_304_refreshes_the_head_but_not_the_body_fields() {
        let stored = map(&[
            ("etag", "\"a\""),
            ("cache-control", "max-age=1"),
            ("content-length", "5"),
            ("x-kept", "1"),
        ]);
        let not_modified = map(&[
            ("cache-control", "max-age=60"),
            ("content-length", "0"),
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        let head = refreshed_head(&stored, &not_modified);
        assert_eq!(head["cache-control"], "max-age=60");
        assert_eq!(head["content-length"], "5");
        assert_eq!(head["x-kept"], "1");
        assert!(head.contains_key("date"));
    }
}
