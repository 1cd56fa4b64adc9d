//! `compress` (upstreams.yaml, host or path): compresses backends' responses with gzip, brotli
//! or zstd, whichever the client's `Accept-Encoding` prefers (q-values, `*`, `identity`, `q=0`;
//! on a tie zstd, then br, then gzip).
//!
//! A response is compressed only when all of these hold, else it passes untouched:
//! - the body comes from the backend (the proxy's own short answers are never compressed);
//! - its status allows a body and is not 206 (not 1xx, 204, 206, 304), it has no
//!   `Content-Encoding` and no `Content-Range`, and no `Cache-Control: no-transform`;
//! - its `Content-Type` is one of the route's types (never gRPC, which has its own framing);
//! - its length is unknown or at least the route's `min_size`.
//!
//! Such a response gets `Vary: Accept-Encoding` (appended, even when this client took identity,
//! so caches keep the variants apart). When compressed it also gets `Content-Encoding`, loses
//! `Content-Length` and `Accept-Ranges`, and a strong `ETag` becomes weak (`W/`), as nginx does.
//! The body is compressed as it streams (`proxy::encode`), never held whole; a route without
//! `compress` pays one branch. A `HEAD` answer gets the headers its GET would (RFC 9110
//! §9.3.2, and nginx's gzip), without a body.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::Either as FutEither;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Either;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::config::upstreams::CompressRule;
use crate::proxy::encode::{Coding, Encoded};
use crate::proxy::RespBody;
use crate::vocab::headers::has_token;
use crate::vocab::qvalue;
use crate::vocab::ProxyError;

/// One entry of a route's `types`.
#[derive(Debug, PartialEq, Eq)]
enum MediaRange {
    /// `*/*`
    Any,
    /// `text/*`: the type, lower case.
    Type(Box<str>),
    /// `text/html`, lower case.
    Exact(Box<str>),
}

/// A route's compiled `compress` setting.
#[derive(Debug)]
pub struct Compress {
    min_size: u64,
    types: Box<[MediaRange]>,
}

impl Compress {
    pub fn compile(rule: &CompressRule) -> Compress {
        let types = rule
            .types
            .iter()
            .map(|t| match t.split_once('/') {
                Some(("*", "*")) => MediaRange::Any,
                Some((ty, "*")) => MediaRange::Type(ty.into()),
                _ => MediaRange::Exact(t.as_str().into()),
            })
            .collect();
        Compress {
            min_size: rule.min_size,
            types,
        }
    }

    /// Whether `content_type` (a header value, parameters and all) is one of the route's types.
    fn takes_type(&self, content_type: &HeaderValue) -> bool {
        let Ok(text) = content_type.to_str() else {
            return false;
        };
        let essence = text.split(';').next().unwrap_or("").trim();
        let Some((ty, _)) = essence.split_once('/') else {
            return false;
        };
        self.types.iter().any(|range| match range {
            MediaRange::Any => true,
            MediaRange::Type(t) => ty.eq_ignore_ascii_case(t),
            MediaRange::Exact(e) => essence.eq_ignore_ascii_case(e),
        })
    }

    /// Whether this response, of body length `length` when known, may be compressed (the
    /// request's side already checked).
    fn takes<B>(&self, resp: &Response<B>, length: Option<u64>) -> bool {
        let status = resp.status();
        let headers = resp.headers();
        let bodiless = status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::PARTIAL_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        if bodiless
            || headers.contains_key(header::CONTENT_ENCODING)
            || headers.contains_key(header::CONTENT_RANGE)
            || has_token(headers, &header::CACHE_CONTROL, "no-transform")
        {
            return false;
        }
        // gRPC messages carry their own compression flag.
        if crate::vocab::error::is_grpc(headers)
            || !headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|ct| self.takes_type(ct))
        {
            return false;
        }
        match length {
            Some(n) => n >= self.min_size,
            None => true,
        }
    }

    /// Turns an eligible response into the client's: `Vary`, and when `coding` is chosen the
    /// coding's headers and the compressed body (none for a `head`).
    fn apply(
        &self,
        resp: Response<RespBody>,
        coding: Option<Coding>,
        head: bool,
    ) -> Response<RespBody> {
        // A HEAD answer's own body is empty whatever the GET's would be: only its head says.
        let length = match head {
            true => length_field(resp.headers()),
            false => known_length(&resp),
        };
        if !matches!(resp.body(), Either::Left(Either::Left(Either::Left(_))))
            || !self.takes(&resp, length)
        {
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        add_vary(&mut parts.headers);
        if let (true, Some(coding)) = (head, coding) {
            mark_encoded(&mut parts.headers, coding);
            return Response::from_parts(parts, body);
        }
        let (coding, plain) = match (coding, body) {
            (Some(coding), Either::Left(Either::Left(Either::Left(plain)))) => (coding, plain),
            (_, body) => return Response::from_parts(parts, body),
        };
        let encoded = match Encoded::new(plain, coding, length) {
            Ok(encoded) => encoded,
            Err(plain) => {
                return Response::from_parts(parts, Either::Left(Either::Left(Either::Left(plain))))
            }
        };
        mark_encoded(&mut parts.headers, coding);
        Response::from_parts(parts, Either::Left(Either::Left(Either::Right(encoded))))
    }
}

/// The headers of an answer coded with `coding`: its `Content-Encoding`, no length and no
/// ranges of the plain body, and a weak `ETag`.
fn mark_encoded(headers: &mut HeaderMap, coding: Coding) {
    headers.insert(header::CONTENT_ENCODING, coding.header_value());
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::ACCEPT_RANGES);
    weaken_etag(headers);
}

/// The body's length when it is known: `Content-Length`, else what the body itself says.
fn known_length<B: http_body::Body>(resp: &Response<B>) -> Option<u64> {
    length_field(resp.headers()).or_else(|| resp.body().size_hint().exact())
}

/// What `Content-Length` says.
fn length_field(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Appends `Vary: Accept-Encoding` unless `Vary` already names it (or is `*`).
fn add_vary(headers: &mut HeaderMap) {
    if has_token(headers, &header::VARY, "accept-encoding")
        || has_token(headers, &header::VARY, "*")
    {
        return;
    }
    headers.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
}

/// A strong `ETag` names these exact bytes, which compression changes: it becomes weak.
fn weaken_etag(headers: &mut HeaderMap) {
    let Some(etag) = headers.get(header::ETAG) else {
        return;
    };
    let bytes = etag.as_bytes();
    if bytes.starts_with(b"W/") || bytes.first() != Some(&b'"') {
        return;
    }
    let mut weak = Vec::with_capacity(bytes.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(bytes);
    if let Ok(value) = HeaderValue::from_bytes(&weak) {
        headers.insert(header::ETAG, value);
    }
}

/// The coding the client prefers among those the proxy has, from its `Accept-Encoding`
/// (RFC 9110 §12.5.3). `None`: identity (no header, nothing acceptable, or identity preferred).
pub fn preferred(headers: &HeaderMap) -> Option<Coding> {
    // Thousandths; `None`: not named.
    let (mut gzip, mut br, mut zstd, mut star, mut identity) = (None, None, None, None, None);
    let values = headers.get_all(header::ACCEPT_ENCODING).iter();
    for item in values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let Some(q) = qvalue::quality(parts) else {
            continue;
        };
        let slot = if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            &mut gzip
        } else if name.eq_ignore_ascii_case("br") {
            &mut br
        } else if name.eq_ignore_ascii_case("zstd") {
            &mut zstd
        } else if name == "*" {
            &mut star
        } else if name.eq_ignore_ascii_case("identity") {
            &mut identity
        } else {
            continue;
        };
        *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
    }
    let mut best: Option<(Coding, u16)> = None;
    for (coding, q) in [
        (Coding::Zstd, zstd),
        (Coding::Brotli, br),
        (Coding::Gzip, gzip),
    ] {
        let q = q.or(star).unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((coding, q));
        }
    }
    let (coding, q) = best?;
    match identity {
        Some(id) if id > q => None,
        _ => Some(coding),
    }
}

/// Applies a route's `compress` (or nothing) to one request's answer.
#[derive(Clone, Copy)]
pub struct CompressLayer<'a> {
    compress: Option<&'a Compress>,
}

impl<'a> CompressLayer<'a> {
    pub fn new(compress: Option<&'a Compress>) -> Self {
        CompressLayer { compress }
    }
}

impl<'a, S> Layer<S> for CompressLayer<'a> {
    type Service = CompressService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        CompressService {
            compress: self.compress,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct CompressService<'a, S> {
    compress: Option<&'a Compress>,
    inner: S,
}

impl<'a, S, B> Service<Request<B>> for CompressService<'a, S>
where
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError>,
{
    type Response = Response<RespBody>;
    type Error = ProxyError;
    type Future = FutEither<Compressing<'a, S::Future>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(compress) = self.compress else {
            return FutEither::Right(self.inner.call(req));
        };
        // A ranged answer is recognised by its own 206 / `Content-Range` (a backend that ignores
        // `Range` sends a whole body, which may be compressed like any other).
        let coding = preferred(req.headers());
        let head = req.method() == Method::HEAD;
        FutEither::Left(Compressing {
            inner: self.inner.call(req),
            compress,
            coding,
            head,
        })
    }
}

pin_project! {
    /// The inner answer, compressed when it qualifies.
    pub struct Compressing<'a, F> {
        #[pin]
        inner: F,
        compress: &'a Compress,
        coding: Option<Coding>,
        head: bool,
    }
}

impl<F> Future for Compressing<'_, F>
where
    F: Future<Output = Result<Response<RespBody>, ProxyError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.inner.poll(cx));
        Poll::Ready(answer.map(|resp| this.compress.apply(resp, *this.coding, *this.head)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Compress::takes`] of an answer to a GET (its length from its head or body).
    fn takes_whole<B: http_body::Body>(c: &Compress, resp: &Response<B>) -> bool {
        c.takes(resp, known_length(resp))
    }

    fn accept(value: &str) -> Option<Coding> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).unwrap(),
        );
        preferred(&headers)
    }

    #[test]
    fn accept_encoding_negotiation() {
        use Coding::*;
        let table: &[(&str, Option<Coding>)] = &[
            ("", None),
            ("identity", None),
            ("gzip", Some(Gzip)),
            ("x-gzip", Some(Gzip)),
            ("GZIP, deflate", Some(Gzip)),
            ("deflate", None),
            ("gzip, deflate, br, zstd", Some(Zstd)),
            ("gzip, br", Some(Brotli)),
            ("gzip;q=1.0, br;q=0.5", Some(Gzip)),
            ("br;q=0.8, gzip;q=0.9, zstd;q=0.1", Some(Gzip)),
            ("zstd;q=0, br;q=0.001", Some(Brotli)),
            ("gzip;q=0", None),
            ("*", Some(Zstd)),
            ("*;q=0.5, gzip", Some(Gzip)),
            ("*, zstd;q=0, br;q=0", Some(Gzip)),
            ("*;q=0", None),
            ("gzip;q=0.5, identity", None),
            ("gzip, identity;q=0.5", Some(Gzip)),
            ("gzip;q=0.5, identity;q=0.5", Some(Gzip)),
            ("identity;q=0", None),
            // Malformed q-values drop their entry.
            ("br;q=2, gzip", Some(Gzip)),
            ("br;q=0.1234, gzip;q=0.1", Some(Gzip)),
            ("br;q=abc", None),
            ("gzip ; q=0.7 , br ; q=0.6", Some(Gzip)),
            ("gzip;level=1;q=0.2, br;q=0.1", Some(Gzip)),
            (",,, ,gzip", Some(Gzip)),
        ];
        for (value, want) in table {
            assert_eq!(accept(value), *want, "{value:?}");
        }
        assert_eq!(preferred(&HeaderMap::new()), None, "no header");
        let mut two = HeaderMap::new();
        two.append(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip;q=0.2"),
        );
        two.append(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br;q=0.4"),
        );
        assert_eq!(preferred(&two), Some(Brotli), "two headers");
    }

    #[test]
    fn q_values() {
        let table = [
            ("0", Some(0)),
            ("1", Some(1000)),
            ("1.000", Some(1000)),
            ("1.001", None),
            ("0.5", Some(500)),
            ("0.05", Some(50)),
            ("0.005", Some(5)),
            ("0.", Some(0)),
            ("2", None),
            (".5", None),
            ("0.5x", None),
            ("", None),
        ];
        for (text, want) in table {
            let param = format!("q={text}");
            let read = crate::vocab::qvalue::quality(std::iter::once(param.as_str()));
            assert_eq!(read, want, "{text:?}");
        }
    }

    fn compress(types: &[&str], min_size: u64) -> Compress {
        Compress::compile(&CompressRule {
            min_size,
            types: types.iter().map(|t| t.to_string()).collect(),
        })
    }

    #[test]
    fn content_types() {
        let c = compress(&["text/html", "application/*"], 0);
        let takes = |ct: &str| c.takes_type(&HeaderValue::from_str(ct).unwrap());
        assert!(takes("text/html"));
        assert!(takes("Text/HTML; charset=utf-8"));
        assert!(takes("application/json"));
        assert!(!takes("text/plain"));
        assert!(!takes("text/htmlx"));
        assert!(!takes("html"));
        let any = compress(&["*/*"], 0);
        assert!(any.takes_type(&HeaderValue::from_static("image/png")));
        // gRPC is refused by the response check, whatever the types say.
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc-web",
        ] {
            let resp = Response::builder()
                .header(header::CONTENT_TYPE, grpc)
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            assert!(!takes_whole(&any, &resp), "{grpc}");
        }
    }

    fn response(
        status: u16,
        headers: &[(&str, &str)],
    ) -> Response<http_body_util::Empty<bytes::Bytes>> {
        let mut builder = Response::builder().status(status);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(http_body_util::Empty::new()).unwrap()
    }

    #[test]
    fn which_responses_qualify() {
        let c = compress(&["text/html"], 100);
        let html = ("content-type", "text/html");
        let long = ("content-length", "100");
        assert!(takes_whole(&c, &response(200, &[html, long])));
        assert!(takes_whole(&c, &response(404, &[html, long])));
        // The length is unknown from headers, but the empty body says 0.
        assert!(!takes_whole(&c, &response(200, &[html])));
        assert!(!takes_whole(
            &c,
            &response(200, &[html, ("content-length", "99")])
        ));
        assert!(!takes_whole(&c, &response(200, &[long])));
        assert!(!takes_whole(
            &c,
            &response(200, &[("content-type", "image/png"), long])
        ));
        for status in [101, 204, 206, 304] {
            assert!(
                !takes_whole(&c, &response(status, &[html, long])),
                "{status}"
            );
        }
        assert!(!takes_whole(
            &c,
            &response(200, &[html, long, ("content-encoding", "gzip")])
        ));
        assert!(!takes_whole(
            &c,
            &response(200, &[html, long, ("content-encoding", "identity")])
        ));
        assert!(!takes_whole(
            &c,
            &response(200, &[html, long, ("content-range", "bytes 0-99/200")])
        ));
        assert!(!takes_whole(
            &c,
            &response(
                200,
                &[html, long, ("cache-control", "public, No-Transform")]
            )
        ));
        assert!(takes_whole(
            &c,
            &response(200, &[html, long, ("cache-control", "max-age=60")])
        ));
    }

    #[test]
    fn the_nearest_level_decides_whole() {
        let yaml = "upstreams:\n  a.com:\n    compress: {min_size: 10, types: [\"Text/*\"]}\n    paths:\n      /: {servers: [\"127.0.0.1:1\"]}\n      /off: {servers: [\"127.0.0.1:1\"], compress: off}\n      /on: {servers: [\"127.0.0.1:1\"], compress: true}\n";
        let mut issues = crate::config::Issues::default();
        let cfg = crate::config::parse_upstreams_text(yaml, "test", &mut issues).expect("valid");
        let host = &cfg.hosts[0];
        let route = |prefix: &str| {
            let path = host
                .paths
                .iter()
                .find(|p| p.prefix == prefix)
                .expect("path");
            path.settings
                .inherit(&host.settings.inherit(&cfg.globals))
                .compress
        };
        let custom = CompressRule {
            min_size: 10,
            types: vec!["text/*".to_string()],
        };
        assert_eq!(route("/"), Some(Some(custom)));
        assert_eq!(route("/off"), Some(None));
        assert_eq!(route("/on"), Some(Some(CompressRule::default())));
    }

    #[test]
    fn vary_and_etag() {
        let mut h = HeaderMap::new();
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1);
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1, "not twice");
        let mut h = HeaderMap::new();
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        add_vary(&mut h);
        let all: Vec<_> = h.get_all(header::VARY).iter().collect();
        assert_eq!(all, ["Origin", "Accept-Encoding"], "appended");
        let mut h = HeaderMap::new();
        h.insert(header::VARY, HeaderValue::from_static("*"));
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1, "* covers it");

        for (etag, want) in [("\"abc\"", "W/\"abc\""), ("W/\"abc\"", "W/\"abc\"")] {
            let mut h = HeaderMap::new();
            h.insert(header::ETAG, HeaderValue::from_static(etag));
            weaken_etag(&mut h);
            assert_eq!(h.get(header::ETAG).unwrap(), want);
        }
    }
}
