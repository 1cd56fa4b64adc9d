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
    #[error("no backend could be reached")]
    ConnectFailed,
    #[error("connecting to the backend timed out")]
    ConnectTimeout,
    #[error("the backend did not answer in time")]
    ResponseTimeout,
    #[error("the backend's answer was not valid HTTP")]
    BadResponse,
    #[error("the backend closed the connection before answering")]
    BackendReset,
    #[error("method not supported by this proxy")]
    MethodNotAllowed,
    /// The route asks for authentication this build cannot check: refuse rather than pass it.
    #[error("this route requires authentication that this build does not enforce")]
    AuthNotEnforced,
}

impl ProxyError {
    pub fn status(self) -> StatusCode {
        match self {
            ProxyError::NoHost | ProxyError::NoPath => StatusCode::NOT_FOUND,
            ProxyError::AllBackendsDown | ProxyError::AuthNotEnforced => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::ConnectFailed | ProxyError::BadResponse | ProxyError::BackendReset => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// gRPC status code for clients that speak gRPC (they need trailers, not HTML).
    fn grpc_status(self) -> &'static str {
        match self {
            ProxyError::NoHost | ProxyError::NoPath | ProxyError::MethodNotAllowed => "12",
            _ => "14",
        }
    }

    /// The response for this error; `request_headers` decide whether the client speaks gRPC.
    pub fn into_response(self, request_headers: &HeaderMap) -> Response<Full<Bytes>> {
        let is_grpc = request_headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"));
        if is_grpc {
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
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        }
        resp
    }

    fn grpc_response(self) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::new()));
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
    fn status_mapping_is_pinned() {
        let table = [
            (ProxyError::NoHost, 404),
            (ProxyError::NoPath, 404),
            (ProxyError::AllBackendsDown, 503),
            (ProxyError::ConnectFailed, 502),
            (ProxyError::BadResponse, 502),
            (ProxyError::BackendReset, 502),
            (ProxyError::ConnectTimeout, 504),
            (ProxyError::ResponseTimeout, 504),
            (ProxyError::MethodNotAllowed, 405),
            (ProxyError::AuthNotEnforced, 503),
        ];
        for (err, code) in table {
            let resp: Response<Body> = err.into_response(&HeaderMap::new());
            assert_eq!(resp.status().as_u16(), code, "{err:?}");
            assert_eq!(
                resp.headers().contains_key(header::RETRY_AFTER),
                code == 503
            );
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
