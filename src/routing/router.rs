//! The request path's entry: load the serving snapshot once, find the route, run the request
//! through the route's policies (`layers::apply`) and on to forwarding. Every [`ProxyError`]
//! from any step becomes the client's response here, the one place that does so (a gRPC client
//! gets a `grpc-status`), and refusals by a rate limit are counted.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures_util::future;
use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{Either, Full};

use super::{Lookup, Route, Snapshot};
use crate::metrics::Metrics;
use crate::proxy::upgrade::is_extended_connect;
use crate::proxy::{Forwarder, RespBody};
use crate::upstream::{served_by, FailedAt};
use crate::vocab::acme_challenges::Challenges;
use crate::vocab::body_cap::{self, CapHit};
use crate::vocab::error::{is_grpc, GrpcErrorFor};
use crate::vocab::headers::{decimal_length, only_chunked, X_REQUEST_ID};
use crate::vocab::normalise;
use crate::vocab::request_body::FramedByHyper;
use crate::vocab::tried::TriedBackend;
use crate::vocab::{ClientBody, ClientConn, ProxyError};

/// Routes requests with the snapshot in force; shared by every connection of every worker.
pub struct Router {
    snapshot: Arc<ArcSwap<Snapshot>>,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
    /// `cluster_member: master`: every request gets a 400 (as Aralez's master).
    cluster_master: bool,
    /// ACME HTTP-01 challenges in flight, answered before routing.
    acme: Option<Arc<Challenges>>,
    /// `client_max_body_size`: a body declared larger is a 413 before routing; one of no
    /// declared length fails with a 413 once past it ([`body_cap`]).
    max_body: Option<u64>,
}

impl Router {
    pub fn new(
        snapshot: Arc<ArcSwap<Snapshot>>,
        forwarder: Forwarder,
        metrics: Arc<Metrics>,
    ) -> Router {
        Router {
            snapshot,
            forwarder,
            metrics,
            cluster_master: false,
            acme: None,
            max_body: None,
        }
    }

    /// The same router holding request bodies to `client_max_body_size`.
    pub fn with_body_limit(mut self, max_body: Option<u64>) -> Router {
        self.max_body = max_body;
        self
    }

    /// The same router answering the ACME HTTP-01 challenges in `acme`.
    pub fn with_acme_challenges(mut self, acme: Option<Arc<Challenges>>) -> Router {
        self.acme = acme;
        self
    }

    /// The same router for a cluster master: no proxy traffic.
    pub fn for_cluster_master(mut self, master: bool) -> Router {
        self.cluster_master = master;
        self
    }

    /// Handles one request end to end; never fails (errors become responses). `request_id` is
    /// the request's `X-Request-Id` when its map does not have it yet.
    ///
    /// Not an `async fn`: the route is found before the future is made, so the future holds
    /// only what forwarding needs (an `async fn` keeps its arguments twice, and the host's
    /// buffer and the snapshot's guard, in its state, moved whole at each level above it).
    pub fn handle<'a>(
        &'a self,
        conn: &'a ClientConn,
        mut req: Request<ClientBody>,
        request_id: Option<&'a HeaderValue>,
        tried: Option<&'a TriedBackend<'a>>,
    ) -> impl Future<Output = Response<RespBody>> + 'a {
        let grpc = is_grpc(req.headers());
        let Routed { route, host } = match self.route(conn, &req, grpc) {
            Ok(routed) => routed,
            Err(early) => return future::Either::Left(future::ready(early)),
        };
        let mut capped = None;
        if let Some(max) = self.max_body {
            (req, capped) = body_cap::cap(req, max);
        }
        future::Either::Right(async move {
            let forwarder = &self.forwarder;
            let answer = if route.policies.is_empty() {
                // Most routes: no layer to pass through, so nothing to box or to move the
                // request through (callgrind: 1,000 instructions a request).
                forwarder
                    .forward(
                        conn,
                        &route.backends,
                        &route.headers,
                        req,
                        (request_id, tried),
                        grpc,
                    )
                    .await
            } else {
                // The layers (forward-auth) read the id from the request.
                if let Some(id) = request_id {
                    req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
                }
                let route = &*route;
                // Boxed once: each layer wraps the inner future, and moving a pointer through
                // them is far cheaper than moving the whole forwarding state machine
                // (callgrind: -20k instructions per request against one allocation).
                let forward = tower::service_fn(move |req| {
                    let backends = &route.backends;
                    let rules = &route.headers;
                    Box::pin(forwarder.forward(conn, backends, rules, req, (None, tried), grpc))
                });
                let client = (conn, host.as_deref());
                crate::layers::apply(&route.policies, &route.backends, client, req, forward).await
            };
            // The answer moved once, as it was before the cap (a second move of it cost
            // about 60 instructions a request).
            let past_the_cap = || capped.as_ref().is_some_and(CapHit::was_hit);
            match answer {
                Ok(resp) if !past_the_cap() => resp,
                Ok(resp) => self.past_the_cap(conn, resp, grpc),
                Err(ProxyError::ClientBody) if past_the_cap() => {
                    self.refuse(conn, ProxyError::BodyTooLarge, grpc)
                }
                Err(err) => self.refuse(conn, err, grpc),
            }
        })
    }

    /// The request's route, or the answer it gets without one (a refusal, an ACME challenge's).
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned as it is, at once; boxing it would allocate for it"
    )]
    fn route(
        &self,
        conn: &ClientConn,
        req: &Request<ClientBody>,
        grpc: bool,
    ) -> Result<Routed, Response<RespBody>> {
        if self.cluster_master {
            return Err(self.refuse(conn, ProxyError::ClusterMaster, grpc));
        }
        if self.max_body.is_some_and(|max| declared_length(req) > max) {
            return Err(self.refuse(conn, ProxyError::BodyTooLarge, grpc));
        }
        let checked = check_transfer_coding(req).and_then(|()| check_head(req));
        let host = match checked {
            Ok(host) => host,
            Err(err) => return Err(self.refuse(conn, err, grpc)),
        };
        if let Some(answer) = self.acme.as_ref().and_then(|a| a.answer(req.uri().path())) {
            return Err(Response::new(Either::Right(Full::new(Bytes::from(answer)))));
        }
        let snapshot = self.snapshot.load();
        // Normalised once: the route is chosen by it and the cache keys by it.
        let mut host_buf = [0u8; normalise::MAX_HOST];
        let raw_host = host.map(HeaderValue::as_bytes);
        let raw_host = raw_host.or_else(|| req.uri().authority().map(|a| a.as_str().as_bytes()));
        let host = match raw_host.map(|raw| normalise::host(raw, &mut host_buf)) {
            Some(None) => return Err(self.refuse(conn, ProxyError::InvalidHost, grpc)),
            Some(Some(host)) => Some(host),
            None => None,
        };
        let route = match snapshot.route_normalised(host, req.uri().path()) {
            Lookup::Found(route) => route.clone(),
            Lookup::BadHost => return Err(self.refuse(conn, ProxyError::InvalidHost, grpc)),
            Lookup::NoPath => return Err(self.refuse(conn, ProxyError::NoPath, grpc)),
            Lookup::NoHost => return Err(self.refuse(conn, ProxyError::NoHost, grpc)),
        };
        // Only the layers need the host afterwards.
        let host = host.filter(|_| !route.policies.is_empty()).map(Box::from);
        Ok(Routed { route, host })
    }

    /// The answer to a request whose body went past `client_max_body_size` as it came: the
    /// exchange failed on the client's body (the proxy's own 400), which is the 413 it stands
    /// for, naming the backend as the 400 did. A backend that answered before it read that
    /// far keeps its answer.
    #[cold]
    fn past_the_cap(
        &self,
        conn: &ClientConn,
        resp: Response<RespBody>,
        grpc: bool,
    ) -> Response<RespBody> {
        let failed_on_the_body = resp
            .extensions()
            .get::<GrpcErrorFor>()
            .map_or(resp.status() == StatusCode::BAD_REQUEST, |e| {
                e.0 == StatusCode::BAD_REQUEST
            });
        if !failed_on_the_body || served_by(&resp).is_some() {
            return resp;
        }
        let mut refused = self.refuse(conn, ProxyError::BodyTooLarge, grpc);
        if let Some(at) = resp.extensions().get::<FailedAt>() {
            refused.extensions_mut().insert(at.clone());
        }
        refused
    }

    /// Answers with `err` (the one place a `ProxyError` becomes a response).
    fn refuse(&self, conn: &ClientConn, err: ProxyError, grpc: bool) -> Response<RespBody> {
        if matches!(err, ProxyError::RateLimited | ProxyError::TooMany4xx) {
            self.metrics.rate_limited(conn.worker);
        }
        err.response_for(grpc).map(Either::Right)
    }
}

/// A request's route, and its normalised host when the route's layers need it.
struct Routed {
    route: Arc<Route>,
    host: Option<Box<str>>,
}

/// What a request head must pass before routing: no plain CONNECT (a tunnel to anywhere) nor
/// TRACE, a
/// target of a request's form, one `Host` at most and one on HTTP/1.1, naming the target's
/// host if the target names one, a path that means one thing to every backend. Gives the
/// `Host`, if any.
pub fn check_head<B>(req: &Request<B>) -> Result<Option<&HeaderValue>, ProxyError> {
    if req.method() == Method::CONNECT && !is_extended_connect(req) {
        return Err(ProxyError::MethodNotAllowed);
    }
    if req.method() == Method::TRACE {
        // Echoed back by a backend, TRACE shows a script what the proxy added to the request
        // (cross-site tracing); nginx refuses it too.
        return Err(ProxyError::MethodNotAllowed);
    }
    check_target(req)?;
    if req.version() == Version::HTTP_3 {
        check_h3_fields(req.headers())?;
    }
    let host = one_host(req)?;
    if let (Some(host), Some(authority)) = (host, req.uri().authority()) {
        same_host(host.as_bytes(), authority.as_str().as_bytes())?;
    }
    if normalise::is_ambiguous(req.uri().path()) {
        return Err(ProxyError::AmbiguousPath);
    }
    Ok(host)
}

/// RFC 9114 §4.2: an HTTP/3 request with a connection-specific field, or a `TE` other than
/// `trailers`, is malformed (h2 refuses the same over HTTP/2; h3 passes them on).
fn check_h3_fields(headers: &http::HeaderMap) -> Result<(), ProxyError> {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    let connection_specific = [CONNECTION, TRANSFER_ENCODING, UPGRADE]
        .iter()
        .any(|name| headers.contains_key(name))
        || headers.contains_key("keep-alive")
        || headers.contains_key("proxy-connection");
    let te_other = headers
        .get_all(TE)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if connection_specific || te_other {
        Err(ProxyError::MalformedHttp3)
    } else {
        Ok(())
    }
}

/// The body length `req` declares (0 for none; a length its parser took is digits).
fn declared_length(req: &Request<ClientBody>) -> u64 {
    let length = req.headers().get(http::header::CONTENT_LENGTH);
    length
        .and_then(|v| decimal_length(v.as_bytes()))
        .unwrap_or(0)
}

/// RFC 9112 §6.1: a request's body is framed by one `chunked` and nothing else. hyper reads
/// `gzip, chunked` as chunked (and refuses a coding after `chunked`), and the coding before it
/// would be dropped on the way to the backend with the field. Only hyper's HTTP/1 requests can
/// have the field (aralez's own HTTP/1.1 reader leaves them to hyper; HTTP/2 refuses it).
fn check_transfer_coding(req: &Request<ClientBody>) -> Result<(), ProxyError> {
    let from_hyper = matches!(req.body(), ClientBody::Hyper(_))
        || req.extensions().get::<FramedByHyper>().is_some();
    if !from_hyper || req.version() > Version::HTTP_11 {
        return Ok(());
    }
    let codings = req.headers().get_all(http::header::TRANSFER_ENCODING);
    let mut values = codings.iter().map(HeaderValue::as_bytes).peekable();
    if values.peek().is_none() || only_chunked(values) {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedTransferCoding)
    }
}

/// RFC 9112 §3.2: a path (origin-form), an absolute URI, or `*` for OPTIONS. `GET x` parses
/// as a lone authority, CONNECT's form, and was sent on as `GET /`.
fn check_target<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let uri = req.uri();
    let path = uri.path();
    let form_ok = if uri.authority().is_some() {
        uri.scheme().is_some()
    } else if path == "*" {
        req.method() == Method::OPTIONS
    } else {
        path.starts_with('/')
    };
    // RFC 9113 §8.3.1 (and RFC 9114 §4.3.1): `:path` starts with `/`, or is `*` for OPTIONS;
    // `*` or `?x` for a GET would reach an HTTP/1.1 backend as a request line no HTTP/1.1
    // client could send through.
    let pseudo_path_ok = || {
        let sent = uri.path_and_query().map_or("", |p| p.as_str());
        sent.starts_with('/') || (sent == "*" && req.method() == Method::OPTIONS)
    };
    if form_ok && (req.version() < Version::HTTP_2 || pseudo_path_ok()) {
        Ok(())
    } else {
        Err(ProxyError::BadTarget)
    }
}

/// A `Host` beside a target that names a host (absolute-form, HTTP/2's `:authority`) must
/// name the same one (RFC 9113 §8.3.1; HAProxy refuses the mismatch too). Rare over HTTP/1.1,
/// and HTTP/2 clients seldom send `Host`.
fn same_host(host: &[u8], authority: &[u8]) -> Result<(), ProxyError> {
    let (mut a, mut b) = ([0u8; normalise::MAX_HOST], [0u8; normalise::MAX_HOST]);
    match (
        normalise::host(host, &mut a),
        normalise::host(authority, &mut b),
    ) {
        (Some(host), Some(authority)) if host == authority => Ok(()),
        (None, _) | (_, None) => Err(ProxyError::InvalidHost),
        _ => Err(ProxyError::HostMismatch),
    }
}

/// The request's one `Host`, if any. RFC 9112 §3.2: an HTTP/1.1 request carries exactly one;
/// no request may carry two (the route would be chosen by one and the backend could read the
/// other).
fn one_host<B>(req: &Request<B>) -> Result<Option<&HeaderValue>, ProxyError> {
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::DuplicateHost);
    }
    if first.is_none() && req.version() == Version::HTTP_11 {
        return Err(ProxyError::MissingHost);
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str, hosts: &[&str]) -> Result<(), ProxyError> {
        let mut builder = Request::builder().method(method).uri(target);
        for host in hosts {
            builder = builder.header(http::header::HOST, *host);
        }
        let req = builder.body(()).unwrap();
        check_head(&req).map(drop)
    }

    #[test]
    fn targets_of_a_requests_form_pass_others_do_not() {
        assert_eq!(head("GET", "/a?b", &["a"]), Ok(()));
        assert_eq!(head("GET", "http://a/x", &["a"]), Ok(()));
        assert_eq!(head("OPTIONS", "*", &["a"]), Ok(()));
        // A lone authority is CONNECT's form; `*` is OPTIONS's only.
        assert_eq!(head("GET", "x", &["a"]), Err(ProxyError::BadTarget));
        assert_eq!(head("GET", "a:80", &["a"]), Err(ProxyError::BadTarget));
        assert_eq!(head("GET", "*", &["a"]), Err(ProxyError::BadTarget));
        assert_eq!(
            head("CONNECT", "a:443", &["a"]),
            Err(ProxyError::MethodNotAllowed)
        );
    }

    #[test]
    fn http3_requests_with_connection_specific_fields_are_malformed() {
        let h3 = |name: &str, value: &str, version| {
            let req = Request::builder()
                .version(version)
                .uri("https://a/x")
                .header("host", "a")
                .header(name, value)
                .body(())
                .unwrap();
            check_head(&req).map(drop)
        };
        let malformed = Err(ProxyError::MalformedHttp3);
        for (name, value) in [
            ("connection", "keep-alive"),
            ("keep-alive", "5"),
            ("proxy-connection", "x"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
        ] {
            assert_eq!(h3(name, value, Version::HTTP_3), malformed, "{name}");
        }
        assert_eq!(h3("te", "trailers", Version::HTTP_3), Ok(()));
        assert_eq!(h3("x-other", "1", Version::HTTP_3), Ok(()));
        // HTTP/1.1 carries them by design (and hop-by-hop removal drops them).
        assert_eq!(h3("connection", "keep-alive", Version::HTTP_11), Ok(()));
    }

    #[test]
    fn a_host_beside_a_target_that_names_one_must_name_the_same() {
        assert_eq!(
            head("GET", "http://A.example:80/x", &["a.example."]),
            Ok(())
        );
        assert_eq!(head("GET", "https://[::1]/x", &["[::1]:443"]), Ok(()));
        assert_eq!(
            head("GET", "http://admin.example/x", &["public.example"]),
            Err(ProxyError::HostMismatch)
        );
        assert_eq!(
            head("GET", "http://a/x", &["a b"]),
            Err(ProxyError::InvalidHost)
        );
        assert_eq!(
            head("GET", "/x", &["a", "a"]),
            Err(ProxyError::DuplicateHost)
        );
        assert_eq!(head("GET", "/x", &[]), Err(ProxyError::MissingHost));
    }
}
