//! `forward` auth (SPEC §8.2): ask an auth service whether a request may pass.
//!
//! The question is a GET (HEAD for a HEAD request) to the rule's URL carrying the client's
//! `Authorization` and `Cookie` and `X-Forwarded-Method`, `-Proto`, `-Host`, `-Uri`, `-For`.
//! A 2xx answer lets the request through with the service's `Remote-*` and `X-Auth-*` headers set
//! on it (the client's own copies of those are always removed first, so a client can never
//! claim an identity). Any other answer goes back to the client as it came (status, headers,
//! body up to [`MAX_BODY`]; a longer body is left out, the status and headers still go) and the
//! backend is never called. An interim answer (a 101) is a 502, no answer within [`TIMEOUT`] 503.
//!
//! The service is asked over a fresh connection through the upstream connector, like every
//! upstream exchange: HTTP/1.1 for `http://` URLs; for `https://` ones TLS with the same client
//! as `https://` backends (SNI = the URL's host, certificate not verified, ALPN picks h2 or
//! HTTP/1.1).

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Method, Request, Response};
use http_body_util::{Either, Empty};
use tower::Service;

use super::LocalBody;
use crate::upstream::connector::{self, ConnectError, ConnectErrorKind};
use crate::upstream::{Endpoint, UpBody, Wire};
use crate::vocab::headers::{self, X_REQUEST_ID};
use crate::vocab::token_param;
use crate::vocab::{ClientConn, ProxyError};

/// How long the auth service has to answer (connect, head and body).
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest body of a refusal relayed to the client.
pub const MAX_BODY: usize = 64 * 1024;

static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A compiled `forward` rule.
#[derive(Debug)]
pub struct ForwardAuth {
    host: String,
    port: u16,
    https: bool,
    authority: HeaderValue,
    path: PathAndQuery,
    timeout: Duration,
}

/// What the auth service said.
enum Verdict {
    /// 2xx: these identity headers go to the backend.
    Allow(Vec<(HeaderName, HeaderValue)>),
    /// Anything else, relayed.
    Deny(Response<Bytes>),
}

impl ForwardAuth {
    pub fn new(uri: &Uri) -> ForwardAuth {
        let https = uri.scheme_str() == Some("https");
        let authority = uri.authority();
        let host = authority.map_or("", |a| a.host());
        ForwardAuth {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: authority
                .and_then(|a| a.port_u16())
                .unwrap_or(if https { 443 } else { 80 }),
            https,
            authority: authority
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                .unwrap_or(HeaderValue::from_static("localhost")),
            path: uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
            timeout: TIMEOUT,
        }
    }

    /// The same rule with another timeout (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> ForwardAuth {
        self.timeout = timeout;
        self
    }

    /// Asks the auth service, then either calls `inner` or answers with the service's refusal.
    pub async fn authorize<S, B, R>(
        &self,
        conn: &ClientConn,
        mut req: Request<B>,
        mut inner: S,
    ) -> Result<Response<R>, ProxyError>
    where
        S: Service<Request<B>, Response = Response<R>, Error = ProxyError>,
        R: LocalBody,
    {
        let question = self.question(conn, &req);
        let verdict = match tokio::time::timeout(self.timeout, self.ask(question)).await {
            Ok(verdict) => verdict?,
            Err(_) => {
                tracing::warn!(auth = %self.authority.to_str().unwrap_or("?"), "auth service did not answer within {:?}", self.timeout);
                return Err(ProxyError::AuthServiceTimeout);
            }
        };
        match verdict {
            Verdict::Allow(identity) => {
                remove_identity_headers(req.headers_mut());
                unlist_identity_headers(req.headers_mut());
                for (name, value) in identity {
                    req.headers_mut().append(name, value);
                }
                inner.call(req).await
            }
            Verdict::Deny(resp) => Ok(resp.map(R::local)),
        }
    }

    /// The request to the auth service for the client's `req`.
    fn question<B>(&self, conn: &ClientConn, req: &Request<B>) -> Request<UpBody> {
        let method = if req.method() == Method::HEAD {
            Method::HEAD
        } else {
            Method::GET
        };
        let mut q = Request::new(Either::Right(Empty::new()));
        *q.method_mut() = method;
        *q.uri_mut() = Uri::from(self.path.clone());
        let h = q.headers_mut();
        h.insert(header::HOST, self.authority.clone());
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        // The request id too, so the auth service's log and the backend's name one request.
        for name in [header::AUTHORIZATION, header::COOKIE, X_REQUEST_ID.clone()] {
            for value in req.headers().get_all(&name) {
                h.append(name.clone(), value.clone());
            }
        }
        // As to a backend: an HTTP/2 client's crumbs as one field.
        crate::vocab::hop_by_hop::join_cookies(h);
        if let Ok(m) = HeaderValue::from_str(req.method().as_str()) {
            h.insert(X_FORWARDED_METHOD.clone(), m);
        }
        h.insert(
            X_FORWARDED_PROTO.clone(),
            headers::forwarded_proto(conn.tls).clone(),
        );
        let client_host = req.headers().get(header::HOST).cloned().or_else(|| {
            req.uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        if let Some(host) = client_host {
            h.insert(X_FORWARDED_HOST.clone(), host);
        }
        // As the backend will get it: without the `araleztoken` parameter.
        let stripped = token_param::strip_query_param(req.uri(), token_param::QUERY_PARAM);
        let target = stripped.as_ref().unwrap_or(req.uri()).path_and_query();
        let target = target.map_or("/", PathAndQuery::as_str);
        if let Ok(uri) = HeaderValue::from_str(target) {
            h.insert(X_FORWARDED_URI.clone(), uri);
        }
        for value in req.headers().get_all(&X_FORWARDED_FOR) {
            h.append(X_FORWARDED_FOR.clone(), value.clone());
        }
        headers::append_forwarded_for(h, &conn.forwarded_for);
        q
    }

    async fn ask(&self, question: Request<UpBody>) -> Result<Verdict, ProxyError> {
        let label = self.authority.to_str().unwrap_or("?");
        let failed = |e: ConnectError| {
            tracing::warn!(auth = label, "auth service: {e}");
            if e.is_timeout() {
                ProxyError::AuthServiceTimeout
            } else {
                ProxyError::AuthServiceFailed
            }
        };
        let addrs: Vec<std::net::SocketAddr> =
            match tokio::net::lookup_host((self.host.as_str(), self.port)).await {
                Ok(found) => found.collect(),
                Err(e) => {
                    tracing::warn!(auth = label, "auth service: cannot resolve: {e}");
                    return Err(ProxyError::AuthServiceFailed);
                }
            };
        let ep = Endpoint {
            addrs: &addrs,
            host: &self.host,
            wire: if self.https { Wire::Tls } else { Wire::Http1 },
            verify_tls: false,
        };
        let resp = connector::exchange_once(ep, &self.host, question, self.timeout)
            .await
            .map_err(failed)?;
        let (mut parts, body) = resp.into_parts();
        if parts.status.is_informational() {
            // A switch of protocols (hyper's client hands a 101 on as final) answers nothing,
            // and would reach an HTTP/1.1 client as an empty reply, an HTTP/2 one as an error.
            tracing::warn!(auth = label, status = %parts.status, "auth service: an interim answer where a final one was due");
            return Err(ProxyError::AuthServiceFailed);
        }
        if parts.status.is_success() {
            let identity = parts
                .headers
                .iter()
                .filter(|(name, _)| is_identity_header(name))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            return Ok(Verdict::Allow(identity));
        }
        let body = match connector::read_body(body, MAX_BODY).await {
            Ok(body) => body,
            // Its status and headers (`WWW-Authenticate`, `Location`, `Set-Cookie`) still go.
            Err(e) if e.kind() == ConnectErrorKind::BodyTooLarge => {
                tracing::warn!(auth = label, status = %parts.status, "auth service: its refusal's body is {}: relayed without it", e);
                Bytes::new()
            }
            Err(e) => return Err(failed(e)),
        };
        crate::vocab::hop_by_hop::remove_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::CONTENT_LENGTH);
        Ok(Verdict::Deny(Response::from_parts(parts, body)))
    }
}

fn is_identity_header(name: &HeaderName) -> bool {
    crate::vocab::headers::is_identity_field(name.as_str())
}

fn remove_identity_headers(h: &mut HeaderMap) {
    let names: Vec<HeaderName> = h
        .keys()
        .filter(|n| is_identity_header(n))
        .cloned()
        .collect();
    for name in names {
        h.remove(&name);
    }
}

/// Removes identity header names from the client's `Connection` header: listed there, they would
/// be stripped as hop-by-hop on the way to the backend, after the auth service set them.
fn unlist_identity_headers(h: &mut HeaderMap) {
    let lists_identity = h.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().unwrap_or("").split(',').any(|t| {
            HeaderName::from_bytes(t.trim().as_bytes()).is_ok_and(|n| is_identity_header(&n))
        })
    });
    if !lists_identity {
        return;
    }
    let kept: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(str::trim)
        .filter(|t| {
            !t.is_empty()
                && !HeaderName::from_bytes(t.as_bytes()).is_ok_and(|n| is_identity_header(&n))
        })
        .map(str::to_string)
        .collect();
    h.remove(header::CONNECTION);
    if let Ok(value) = HeaderValue::from_str(&kept.join(", ")) {
        if !kept.is_empty() {
            h.insert(header::CONNECTION, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future::ready;
    use http_body_util::Full;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;

    fn conn() -> ClientConn {
        ClientConn::new("127.0.0.9:4000".parse().unwrap(), false, Default::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_auth_service_gives_503_after_the_timeout() {
        // Accepts, reads, never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            while s.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
        let rule = ForwardAuth::new(&format!("http://{addr}/check").parse().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let inner = tower::service_fn(move |_req: Request<()>| {
            c.fetch_add(1, Ordering::SeqCst);
            ready(Ok::<_, ProxyError>(Response::new(Full::<Bytes>::default())))
        });
        let started = tokio::time::Instant::now();
        let got = rule.authorize(&conn(), Request::new(()), inner).await;
        assert_eq!(got.unwrap_err(), ProxyError::AuthServiceTimeout);
        assert_eq!(started.elapsed(), TIMEOUT);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn question_carries_the_clients_facts() {
        let rule = ForwardAuth::new(&"http://auth.local:9000/verify?x=1".parse().unwrap());
        let req = Request::builder()
            .method("POST")
            .uri("/api/thing?q=2&araleztoken=eyJ.secret.sig")
            .header("host", "app.example")
            .header("authorization", "Bearer abc")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("x-forwarded-for", "10.0.0.1")
            .header("remote-user", "mallory")
            .body(())
            .unwrap();
        let q = rule.question(&conn(), &req);
        assert_eq!(q.method(), Method::GET);
        assert_eq!(q.uri(), "/verify?x=1");
        let h = q.headers();
        assert_eq!(h["host"], "auth.local:9000");
        assert_eq!(h["authorization"], "Bearer abc");
        // The crumbs as one field, as a backend gets them (RFC 9113 §8.2.3).
        let cookies: Vec<_> = h.get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
        assert_eq!(h["x-forwarded-method"], "POST");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "app.example");
        // Without the token, as the backend gets the target.
        assert_eq!(h["x-forwarded-uri"], "/api/thing?q=2");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.9");
        assert!(!h.contains_key("remote-user"));
        let head = Request::builder().method("HEAD").body(()).unwrap();
        assert_eq!(rule.question(&conn(), &head).method(), Method::HEAD);
    }

    #[test]
    fn connection_cannot_strip_the_identity() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("Remote-User, X-Auth-Role, x-trace"),
        );
        unlist_identity_headers(&mut h);
        assert_eq!(h["connection"], "x-trace");
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("remote-user"));
        unlist_identity_headers(&mut h);
        assert!(!h.contains_key("connection"));
    }

    #[test]
    fn identity_headers_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert("remote-user", HeaderValue::from_static("x"));
        h.insert("x-auth-groups", HeaderValue::from_static("y"));
        h.insert("x-other", HeaderValue::from_static("z"));
        remove_identity_headers(&mut h);
        assert_eq!(h.len(), 1);
    }
}
