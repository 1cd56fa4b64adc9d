//! The one place where a failure becomes a response (STYLE.md: "all errors become responses in
//! exactly one layer"). Every status, body and gRPC mapping lives here, pinned by a unit test.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

/// Why the proxy answers a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("no route for this host")]
    NoHost,
    #[error("no route for this path")]
    NoPath,
    #[error("every backend of this route is down")]
    AllBackendsDown,
    /// The route has no backend at all: a discovered service not answered for yet, or one
    /// listing no instance.
    #[error("this route has no backend (none discovered yet, or none listed)")]
    NoBackends,
    /// Every usable backend already has `upstream_max_connections` open.
    #[error("every backend of this route is at its connection limit")]
    BackendBusy,
    #[error("no backend could be reached")]
    ConnectFailed,
    #[error("connecting to the backend timed out")]
    ConnectTimeout,
    #[error("the backend did not answer in time")]
    ResponseTimeout,
    #[error("the backend's answer was not valid HTTP")]
    BadResponse,
    /// An upgrade (WebSocket) the backend answered without switching protocols where a
    /// switch was the only fit answer (an HTTP/2 extended CONNECT's 2xx), or with a
    /// `Sec-WebSocket-Accept` that does not answer the key sent to it.
    #[error("the backend did not accept the protocol upgrade")]
    UpgradeRefused,
    /// The connection closed, or (HTTP/2) the backend reset the stream or sent GOAWAY, before
    /// the answer's head.
    #[error("the backend closed the connection or reset the stream before answering")]
    BackendReset,
    /// The request body was malformed (a bad chunk) or cut short by the client.
    #[error("the request body was malformed or cut short")]
    ClientBody,
    /// The request body is larger than `client_max_body_size` (nginx's 413).
    #[error("the request body is larger than client_max_body_size")]
    BodyTooLarge,
    /// The request body stopped coming for the response timeout while the backend waited for
    /// it (nginx's `client_body_timeout`).
    #[error("the request body stopped coming")]
    ClientBodyTimeout,
    #[error("method not supported by this proxy")]
    MethodNotAllowed,
    /// An HTTP/1.1 request without `Host`, or a `to_https` redirect with no host to send the
    /// client to (RFC 9112 §3.2).
    #[error("the request has no Host header")]
    MissingHost,
    /// More than one `Host` header: routing and the backend could disagree on which counts.
    #[error("the request has more than one Host header")]
    DuplicateHost,
    /// A `Host` (or `:authority`) that is not a host name or address (RFC 9112 §3.2: a 400).
    #[error("the request's Host is not a valid host")]
    InvalidHost,
    /// A `Host` that names another host than the request's target URI (absolute-form, or
    /// HTTP/2's `:authority`): routing and the backend could each go by a different one.
    #[error("the Host header names another host than the request target")]
    HostMismatch,
    /// A request target that is neither a path, an absolute URI, nor `*` for OPTIONS (an
    /// authority alone is CONNECT's form).
    #[error("the request target is not a path")]
    BadTarget,
    /// A `Transfer-Encoding` other than one `chunked` (RFC 9112 §6.1: a coding the proxy does
    /// not decode; sent on without it, the backend would take coded bytes as the body).
    #[error("only the chunked transfer coding is supported")]
    UnsupportedTransferCoding,
    /// This instance is a cluster master (`cluster_member: master`): it serves no proxy traffic.
    #[error("this instance is a cluster master and serves no proxy traffic")]
    ClusterMaster,
    /// A path with `;` parameters, encoded separators, backslashes or dot segments: routing and
    /// a backend could read it differently.
    #[error("the request path is ambiguous (path parameters, encoded separators or dot segments)")]
    AmbiguousPath,
    /// An HTTP/3 request with a connection-specific field (RFC 9114 §4.2).
    #[error("HTTP/3 requests carry no connection-specific fields")]
    MalformedHttp3,
    /// `basic` auth: credentials missing or wrong.
    #[error("authentication required")]
    BasicAuthRequired,
    /// `jwt` auth: no token, or one that is malformed, expired, badly signed or not HS256.
    #[error("a valid token is required")]
    TokenRequired,
    /// A route with auth got its credential field (`Authorization`, `x-api-key`) more than
    /// once: the check would read one and the backend perhaps another.
    #[error("the request carries its credentials more than once")]
    DuplicateCredentials,
    /// `apikey` auth: the `x-api-key` header is missing or wrong.
    #[error("a valid x-api-key header is required")]
    ApiKeyRequired,
    /// `jwt` auth without `data`, and neither `master_key` nor `JWT_KEY` is set: refuse rather
    /// than pass traffic unchecked.
    #[error("this route's JWT auth has no secret (set its data, master_key or JWT_KEY)")]
    NoJwtSecret,
    /// `forward` auth: the auth service did not answer within its timeout.
    #[error("the auth service did not answer in time")]
    AuthServiceTimeout,
    /// `forward` auth: the auth service could not be reached or did not answer usable HTTP.
    #[error("the auth service could not be asked")]
    AuthServiceFailed,
    /// `rate_limit`: this client sent more requests per second than the route allows.
    #[error("too many requests")]
    RateLimited,
    /// `x4xx_limit`: this client drew too many 4xx responses; it must pause for a second.
    #[error("too many failed requests; pause for a second")]
    TooMany4xx,
}

/// On the proxy's own gRPC error answer (HTTP 200, the error in `grpc-status`): the status it
/// stands for, which the access log and the metrics count it as (a gRPC outage counted as 200s
/// never reached 5xx alerts, and `access_log: error` left it out).
#[derive(Clone, Copy, Debug)]
pub struct GrpcErrorFor(pub StatusCode);

/// Whether the client speaks gRPC (it needs a `grpc-status`, not an HTML page).
pub fn is_grpc(request_headers: &HeaderMap) -> bool {
    request_headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

impl ProxyError {
    pub fn status(self) -> StatusCode {
        match self {
            ProxyError::NoHost | ProxyError::NoPath => StatusCode::NOT_FOUND,
            ProxyError::AllBackendsDown
            | ProxyError::NoBackends
            | ProxyError::BackendBusy
            | ProxyError::NoJwtSecret
            | ProxyError::AuthServiceTimeout => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ConnectFailed
            | ProxyError::BadResponse
            | ProxyError::UpgradeRefused
            | ProxyError::BackendReset
            | ProxyError::AuthServiceFailed => StatusCode::BAD_GATEWAY,
            ProxyError::BasicAuthRequired | ProxyError::TokenRequired => StatusCode::UNAUTHORIZED,
            ProxyError::ApiKeyRequired => StatusCode::FORBIDDEN,
            ProxyError::RateLimited | ProxyError::TooMany4xx => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::UnsupportedTransferCoding => StatusCode::NOT_IMPLEMENTED,
            ProxyError::MissingHost
            | ProxyError::DuplicateHost
            | ProxyError::InvalidHost
            | ProxyError::HostMismatch
            | ProxyError::BadTarget
            | ProxyError::AmbiguousPath
            | ProxyError::MalformedHttp3
            | ProxyError::ClientBody
            | ProxyError::DuplicateCredentials
            | ProxyError::ClusterMaster => StatusCode::BAD_REQUEST,
        }
    }

    /// gRPC status code for clients that speak gRPC (they need trailers, not HTML).
    fn grpc_status(self) -> &'static str {
        match self {
            ProxyError::NoHost
            | ProxyError::NoPath
            | ProxyError::MethodNotAllowed
            | ProxyError::UnsupportedTransferCoding => "12",
            ProxyError::BasicAuthRequired | ProxyError::TokenRequired => "16",
            ProxyError::ApiKeyRequired => "7",
            ProxyError::RateLimited | ProxyError::TooMany4xx | ProxyError::BodyTooLarge => "8",
            ProxyError::ClientBodyTimeout => "4",
            // A 400 is the request's own fault (INVALID_ARGUMENT); a cluster master's is not.
            ProxyError::ClusterMaster => "14",
            malformed if malformed.status() == StatusCode::BAD_REQUEST => "3",
            _ => "14",
        }
    }

    /// The response for this error; `request_headers` decide whether the client speaks gRPC.
    pub fn into_response(self, request_headers: &HeaderMap) -> Response<Full<Bytes>> {
        self.response_for(is_grpc(request_headers))
    }

    /// The response for this error, for a gRPC client or not.
    pub fn response_for(self, grpc: bool) -> Response<Full<Bytes>> {
        if grpc {
            return self.grpc_response();
        }
        let status = self.status();
        let body = format!(
            "{} {}: {self}\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        match self {
            ProxyError::BasicAuthRequired => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"aralez\""),
                );
            }
            ProxyError::TokenRequired => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"aralez\""),
                );
            }
            ProxyError::MethodNotAllowed => {
                // RFC 9110 §15.5.6: a 405 says what is allowed; every method but CONNECT goes on.
                headers.insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
                );
            }
            _ => {}
        }
        match status {
            StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }

    fn grpc_response(self) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::new()));
        resp.extensions_mut().insert(GrpcErrorFor(self.status()));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static(self.grpc_status()));
        if let Ok(msg) = HeaderValue::from_str(&self.to_string()) {
            headers.insert("grpc-message", msg);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Body = Full<Bytes>;

    #[test]
    fn a_405_names_the_methods_that_go_on() {
        let resp = ProxyError::MethodNotAllowed.response_for(false);
        let allow = resp.headers().get(header::ALLOW).map(HeaderValue::as_bytes);
        assert_eq!(
            allow,
            Some(&b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"[..])
        );
    }

    #[test]
    fn status_mapping_is_pinned() {
        let table = [
            (ProxyError::NoHost, 404),
            (ProxyError::NoPath, 404),
            (ProxyError::AllBackendsDown, 503),
            (ProxyError::NoBackends, 503),
            (ProxyError::BackendBusy, 503),
            (ProxyError::ConnectFailed, 502),
            (ProxyError::BadResponse, 502),
            (ProxyError::UpgradeRefused, 502),
            (ProxyError::BackendReset, 502),
            (ProxyError::ConnectTimeout, 504),
            (ProxyError::ResponseTimeout, 504),
            (ProxyError::MethodNotAllowed, 405),
            (ProxyError::MissingHost, 400),
            (ProxyError::DuplicateHost, 400),
            (ProxyError::AmbiguousPath, 400),
            (ProxyError::ClientBody, 400),
            (ProxyError::ClientBodyTimeout, 408),
            (ProxyError::BodyTooLarge, 413),
            (ProxyError::InvalidHost, 400),
            (ProxyError::HostMismatch, 400),
            (ProxyError::BadTarget, 400),
            (ProxyError::MalformedHttp3, 400),
            (ProxyError::DuplicateCredentials, 400),
            (ProxyError::UnsupportedTransferCoding, 501),
            (ProxyError::ClusterMaster, 400),
            (ProxyError::NoJwtSecret, 503),
            (ProxyError::AuthServiceTimeout, 503),
            (ProxyError::AuthServiceFailed, 502),
            (ProxyError::BasicAuthRequired, 401),
            (ProxyError::TokenRequired, 401),
            (ProxyError::ApiKeyRequired, 403),
            (ProxyError::RateLimited, 429),
            (ProxyError::TooMany4xx, 429),
        ];
        for (err, code) in table {
            let resp: Response<Body> = err.into_response(&HeaderMap::new());
            assert_eq!(resp.status().as_u16(), code, "{err:?}");
            let retry_after = resp.headers().get(header::RETRY_AFTER);
            let expected = match code {
                503 => Some("2"),
                429 => Some("1"),
                _ => None,
            };
            assert_eq!(
                retry_after.map(|v| v.to_str().unwrap()),
                expected,
                "{err:?}"
            );
            assert_eq!(
                resp.headers().contains_key(header::WWW_AUTHENTICATE),
                code == 401,
                "{err:?}"
            );
        }
        let basic: Response<Body> = ProxyError::BasicAuthRequired.response_for(false);
        assert_eq!(
            basic.headers()[header::WWW_AUTHENTICATE],
            "Basic realm=\"aralez\""
        );
    }

    #[test]
    fn grpc_statuses_for_policies_and_malformed_requests() {
        for (err, code) in [
            (ProxyError::TokenRequired, "16"),
            (ProxyError::ApiKeyRequired, "7"),
            (ProxyError::RateLimited, "8"),
            (ProxyError::BodyTooLarge, "8"),
            (ProxyError::AuthServiceTimeout, "14"),
            // The request's own fault is INVALID_ARGUMENT; a cluster master's 400 is not.
            (ProxyError::InvalidHost, "3"),
            (ProxyError::ClientBody, "3"),
            (ProxyError::MissingHost, "3"),
            (ProxyError::DuplicateCredentials, "3"),
            (ProxyError::ClusterMaster, "14"),
            (ProxyError::UnsupportedTransferCoding, "12"),
        ] {
            let resp: Response<Body> = err.response_for(true);
            assert_eq!(resp.headers()["grpc-status"], code, "{err:?}");
        }
    }

    #[test]
    fn grpc_clients_get_a_grpc_status() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        let resp: Response<Body> = ProxyError::ConnectFailed.into_response(&h);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["grpc-status"], "14");
    }
}
