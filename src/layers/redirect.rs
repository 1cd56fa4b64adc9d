//! Redirects (SPEC §7.3), first in the stack: `to_https` on a plain connection answers 301 (308
//! for methods other than GET/HEAD) to `https://<host>[:<tls port>]<path>?<query>`; `redirect_to`
//! answers 301 to the URL followed by the request's path and query. A redirected request never
//! reaches auth, limits or a backend.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{ready, Either, Ready};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use tower::{Layer, Service};

use super::LocalBody;
use crate::vocab::normalise::strip_port;
use crate::vocab::ProxyError;

/// The TLS listener's port for `to_https` URLs, known once the listener is bound (0 until then,
/// and 443, are left out of the URL). Built at start and shared by every compiled rule.
#[derive(Debug, Default)]
pub struct TlsPort(AtomicU16);

impl TlsPort {
    pub fn set(&self, port: u16) {
        self.0.store(port, Ordering::Relaxed);
    }

    fn url_suffix(&self) -> String {
        match self.0.load(Ordering::Relaxed) {
            0 | 443 => String::new(),
            p => format!(":{p}"),
        }
    }
}

/// A route's compiled redirect rule.
#[derive(Debug, Clone)]
pub struct Redirect {
    pub to_https: bool,
    /// `redirect_to` without a trailing slash.
    pub redirect_to: Option<String>,
    /// The rule of a path one slash short of a route's prefix (`/secret` for `/secret/`): a 301
    /// to the request's path with `/` added ([`Redirect::add_slash`]).
    add_slash: bool,
    tls_port: Arc<TlsPort>,
}

impl Redirect {
    /// The rule of a route, if it has one.
    pub fn compile(
        to_https: Option<bool>,
        redirect_to: Option<&str>,
        tls_port: &Arc<TlsPort>,
    ) -> Option<Redirect> {
        let to_https = to_https.unwrap_or(false);
        (to_https || redirect_to.is_some()).then(|| Redirect {
            to_https,
            redirect_to: redirect_to.map(|u| u.trim_end_matches('/').to_string()),
            add_slash: false,
            tls_port: tls_port.clone(),
        })
    }

    /// The rule of a path one slash short of a route written with a trailing slash: a request
    /// for `/secret` where `/secret/` is a route (and `/secret` none) is sent there with a 301,
    /// as nginx answers a `location /secret/`, not to the route of `/`, whose backend may serve
    /// `/secret` as `/secret/` without `/secret/`'s policies.
    pub fn add_slash(tls_port: &Arc<TlsPort>) -> Redirect {
        Redirect {
            to_https: false,
            redirect_to: None,
            add_slash: true,
            tls_port: tls_port.clone(),
        }
    }

    /// Where a request should go instead, if anywhere. A plain request to a `to_https` route
    /// with no host to redirect to is refused (400), never served in plain text.
    fn target<B>(
        &self,
        req: &Request<B>,
        tls: bool,
    ) -> Result<Option<(StatusCode, String)>, ProxyError> {
        let path_and_query = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if path_and_query == "*" {
            // `OPTIONS *` asks about the server, not a resource: there is nowhere to send it.
            return Ok(None);
        }
        if self.add_slash {
            let uri = req.uri();
            // One leading slash, whatever the client wrote: `//secret/` in a Location is
            // another host's (`http://secret/`), as a browser reads a protocol-relative URL.
            let path = uri.path().trim_start_matches(['/', '\\']);
            let location = match uri.query() {
                Some(query) => format!("/{path}/?{query}"),
                None => format!("/{path}/"),
            };
            return Ok(Some((StatusCode::MOVED_PERMANENTLY, location)));
        }
        if let Some(base) = &self.redirect_to {
            return Ok(Some((
                StatusCode::MOVED_PERMANENTLY,
                format!("{base}{path_and_query}"),
            )));
        }
        if !self.to_https || tls {
            return Ok(None);
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .filter(|h| !strip_port(h).is_empty())
            .ok_or(ProxyError::MissingHost)?;
        let host = strip_port(host);
        let port = self.tls_port.url_suffix();
        let status = if matches!(*req.method(), Method::GET | Method::HEAD) {
            StatusCode::MOVED_PERMANENTLY
        } else {
            StatusCode::PERMANENT_REDIRECT
        };
        Ok(Some((
            status,
            format!("https://{host}{port}{path_and_query}"),
        )))
    }
}

/// Applies a route's redirect (or nothing) to one connection's requests.
#[derive(Clone, Copy)]
pub struct RedirectLayer<'a> {
    rule: Option<&'a Redirect>,
    tls: bool,
}

impl<'a> RedirectLayer<'a> {
    pub fn new(rule: Option<&'a Redirect>, tls: bool) -> Self {
        RedirectLayer { rule, tls }
    }
}

impl<'a, S> Layer<S> for RedirectLayer<'a> {
    type Service = RedirectService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        RedirectService {
            rule: self.rule,
            tls: self.tls,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct RedirectService<'a, S> {
    rule: Option<&'a Redirect>,
    tls: bool,
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for RedirectService<'_, S>
where
    S: Service<Request<B>, Response = Response<RB>, Error = ProxyError>,
    RB: LocalBody,
{
    type Response = Response<RB>;
    type Error = ProxyError;
    type Future = Either<Ready<Result<Response<RB>, ProxyError>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let target = match self.rule.map(|r| r.target(&req, self.tls)) {
            Some(Err(refused)) => return Either::Left(ready(Err(refused))),
            Some(Ok(target)) => target,
            None => None,
        };
        let Some((status, location)) = target else {
            return Either::Right(self.inner.call(req));
        };
        let Ok(location) = HeaderValue::from_str(&location) else {
            return Either::Right(self.inner.call(req));
        };
        let mut resp = Response::new(RB::local(Bytes::new()));
        *resp.status_mut() = status;
        resp.headers_mut().insert(header::LOCATION, location);
        Either::Left(ready(Ok(resp)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(
        rule: &Redirect,
        method: Method,
        uri: &str,
        host: &str,
        tls: bool,
    ) -> Option<(u16, String)> {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", host)
            .body(())
            .unwrap();
        rule.target(&req, tls)
            .unwrap()
            .map(|(s, l)| (s.as_u16(), l))
    }

    #[test]
    fn locations_and_statuses() {
        let port = Arc::new(TlsPort::default());
        let https = Redirect::compile(Some(true), None, &port).unwrap();
        // The TLS port is not known yet: 443 is implied and left out.
        assert_eq!(
            target(&https, Method::GET, "/a?b=1", "ex.com:8080", false),
            Some((301, "https://ex.com/a?b=1".into()))
        );
        assert_eq!(
            target(&https, Method::POST, "/a", "ex.com", false),
            Some((308, "https://ex.com/a".into()))
        );
        assert_eq!(
            target(&https, Method::GET, "/a", "ex.com", true),
            None,
            "already TLS"
        );
        assert_eq!(
            target(&https, Method::GET, "/", "[::1]:80", false),
            Some((301, "https://[::1]/".into()))
        );
        port.set(8443);
        assert_eq!(
            target(&https, Method::GET, "/a", "ex.com", false),
            Some((301, "https://ex.com:8443/a".into()))
        );
        let moved = Redirect::compile(None, Some("https://www.example.com/"), &port).unwrap();
        assert_eq!(
            target(&moved, Method::GET, "/x?y", "old.com", true),
            Some((301, "https://www.example.com/x?y".into()))
        );
        for rule in [&https, &moved] {
            assert_eq!(
                target(rule, Method::OPTIONS, "*", "ex.com", false),
                None,
                "OPTIONS *"
            );
        }
        assert!(Redirect::compile(Some(false), None, &port).is_none());
        let no_host = Request::builder().uri("/a").body(()).unwrap();
        assert_eq!(https.target(&no_host, false), Err(ProxyError::MissingHost));
    }
}
