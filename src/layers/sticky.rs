//! Sticky sessions (SPEC §5): a `backend_id` cookie pins a client to one backend of the route.
//!
//! The cookie's value is an HMAC-SHA256 (truncated to 128 bits, hex) of the backend's identity
//! under the sticky key of [`Keys`] (derived from `master_key` or `JWT_KEY` when one is set, else
//! random per process), so it cannot be forged or guessed, and it says nothing about
//! the backend's address. A valid cookie for a backend of this route that is in rotation pins the
//! request ([`Pinned`] in the request's extensions, read by forwarding); otherwise round robin
//! picks, and the response gets a fresh cookie for the backend that answered (a backend's
//! response names it: [`ServedBy`]).
//! The cookie is appended: a backend's own `Set-Cookie` headers are kept.
//!
//! With a master key, cookies stay valid across restarts and live upgrades (and across instances
//! sharing the key); without one they last as long as the process.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use aws_lc_rs::hmac;
use futures_util::future::Either;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::auth::ct_eq;
use super::keys::Keys;
use crate::upstream::{served_by, Backend, BackendSet, Pinned, Served, ServedBy};
use crate::vocab::ProxyError;

/// Name of the cookie.
pub const COOKIE: &str = "backend_id";

/// The opaque id of a backend: 32 hex digits.
pub fn backend_id(backend: &Backend, key: &hmac::Key) -> [u8; 32] {
    // The same identity as before protocol detection existed ("Http1" unless pinned `h2c://`),
    // so cookies stay valid across a live upgrade to this version.
    let framing = if backend.spec.scheme == Some(crate::config::values::Scheme::H2c) {
        "H2c"
    } else {
        "Http1"
    };
    let identity = format!("{}|{framing}", backend.label);
    let tag = hmac::sign(key, identity.as_bytes());
    let mut out = [0u8; 32];
    for (i, byte) in tag.as_ref()[..16].iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0xf)];
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A route's compiled sticky setting: ids and ready-made `Set-Cookie` values per backend.
#[derive(Debug)]
pub struct Sticky {
    ids: Box<[[u8; 32]]>,
    cookies: Box<[HeaderValue]>,
    secure_cookies: Box<[HeaderValue]>,
}

impl Sticky {
    /// The route at `prefix` sets its cookie for that path (`/` for the usual route at `/`,
    /// as SPEC §5 says): two sticky routes of a host on different backends each keep their
    /// own, where one cookie for `/` made each route pin the client anew on every request.
    pub fn compile(
        max_age: Duration,
        backends: &[Arc<Backend>],
        keys: &Keys,
        prefix: &str,
    ) -> Sticky {
        let path = cookie_path(prefix);
        let ids: Box<[[u8; 32]]> = backends
            .iter()
            .map(|b| backend_id(b, keys.sticky()))
            .collect();
        let cookie = |id: &[u8; 32], secure: bool| {
            let id = std::str::from_utf8(id).unwrap_or("");
            let secure = if secure { "; Secure" } else { "" };
            let text = format!(
                "{COOKIE}={id}; Path={path}; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
                max_age.as_secs()
            );
            HeaderValue::from_str(&text)
                .unwrap_or(HeaderValue::from_static("backend_id=; Max-Age=0"))
        };
        Sticky {
            cookies: ids.iter().map(|id| cookie(id, false)).collect(),
            secure_cookies: ids.iter().map(|id| cookie(id, true)).collect(),
            ids,
        }
    }

    /// The backend a request's cookie names, if it is one of this route's and in rotation: a
    /// client of several sticky routes sends a `backend_id` for each path it matches, and the
    /// one naming a backend of this route counts.
    fn pinned(&self, headers: &HeaderMap, backends: &BackendSet) -> Option<usize> {
        let index = cookie_values(headers)
            .find_map(|value| self.ids.iter().position(|id| ct_eq(value, id)))?;
        backends.usable_at(index).then_some(index)
    }

    fn set_cookie(&self, index: usize, secure: bool) -> Option<&HeaderValue> {
        if secure {
            self.secure_cookies.get(index)
        } else {
            self.cookies.get(index)
        }
    }
}

/// The values of the `backend_id` cookies, in the order sent.
fn cookie_values(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers.get_all(header::COOKIE).iter().flat_map(|v| {
        v.as_bytes().split(|b| *b == b';').filter_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(COOKIE.as_bytes())?.strip_prefix(b"=")
        })
    })
}

/// A route prefix as a cookie's `Path` (RFC 6265 §5.2.4 matches it on the same segment
/// boundaries as routing); `/` for one a cookie cannot carry.
fn cookie_path(prefix: &str) -> &str {
    let fits = prefix.starts_with('/') && prefix.bytes().all(|b| b.is_ascii_graphic() && b != b';');
    if fits {
        prefix
    } else {
        "/"
    }
}

/// Pins requests of a sticky route (or does nothing).
#[derive(Clone, Copy)]
pub struct StickyLayer<'a> {
    sticky: Option<&'a Sticky>,
    backends: &'a BackendSet,
    secure: bool,
}

impl<'a> StickyLayer<'a> {
    pub fn new(sticky: Option<&'a Sticky>, backends: &'a BackendSet, secure: bool) -> Self {
        StickyLayer {
            sticky,
            backends,
            secure,
        }
    }
}

impl<'a, S> Layer<S> for StickyLayer<'a> {
    type Service = StickyService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        StickyService {
            layer: *self,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct StickyService<'a, S> {
    layer: StickyLayer<'a>,
    inner: S,
}

impl<'a, S, B, R> Service<Request<B>> for StickyService<'a, S>
where
    S: Service<Request<B>, Response = Response<R>, Error = ProxyError>,
    R: Served,
{
    type Response = Response<R>;
    type Error = ProxyError;
    type Future = Either<Cookied<'a, S::Future>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(sticky) = self.layer.sticky else {
            return Either::Right(self.inner.call(req));
        };
        let pinned = sticky.pinned(req.headers(), self.layer.backends);
        if let Some(index) = pinned {
            req.extensions_mut().insert(Pinned(index));
        }
        Either::Left(Cookied {
            inner: self.inner.call(req),
            sticky,
            backends: self.layer.backends,
            pinned,
            secure: self.layer.secure,
        })
    }
}

pin_project! {
    /// The inner answer, with a cookie for the backend that served it when that is not the pinned one.
    pub struct Cookied<'a, F> {
        #[pin]
        inner: F,
        sticky: &'a Sticky,
        backends: &'a BackendSet,
        pinned: Option<usize>,
        secure: bool,
    }
}

impl<F, R> Future for Cookied<'_, F>
where
    F: Future<Output = Result<Response<R>, ProxyError>>,
    R: Served,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut answer = std::task::ready!(this.inner.poll(cx));
        if let Ok(resp) = &mut answer {
            let served = served_by(resp).and_then(|ServedBy(b, _)| this.backends.position(b));
            // Duplicate entries of one backend share an id, so `position` finds the same index.
            if let Some(served) = served.filter(|s| *this.pinned != Some(*s)) {
                if let Some(cookie) = this.sticky.set_cookie(served, *this.secure) {
                    resp.headers_mut()
                        .append(header::SET_COOKIE, cookie.clone());
                }
            }
        }
        Poll::Ready(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_upstreams_text, Issues};
    use crate::upstream::Registry;
    use futures_util::future::ready;
    use tower::ServiceExt;

    /// Three backends and the sticky setting of a route with `sticky_sessions: 120`.
    struct Route {
        backends: BackendSet,
        sticky: Sticky,
    }

    fn route() -> Route {
        route_at("/", "[\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]")
    }

    /// A sticky route at `prefix` over `servers` (a YAML list).
    fn route_at(prefix: &str, servers: &str) -> Route {
        let yaml = format!("upstreams:\n  a.com:\n    paths:\n      {prefix}:\n        servers: {servers}\n        sticky_sessions: 120\n");
        let mut issues = Issues::default();
        let cfg = parse_upstreams_text(&yaml, "test", &mut issues).expect("valid");
        let registry = Registry::for_tests(1, Duration::from_secs(60));
        let servers = &cfg.hosts[0].paths[0].servers;
        let backends: Box<[Arc<Backend>]> =
            servers.iter().map(|s| registry.backend(s, false)).collect();
        let keys = Keys::for_tests(None);
        let sticky = Sticky::compile(Duration::from_secs(120), &backends, &keys, prefix);
        Route {
            backends: BackendSet::new(backends, Some(("x.test", prefix)), true),
            sticky,
        }
    }

    /// Sends through the layer to an inner service that answers from `serve_by` (or the pinned
    /// backend) with its own cookie; returns what the inner saw pinned and the Set-Cookie headers.
    async fn send(
        route: &Route,
        cookie: Option<String>,
        serve_by: usize,
    ) -> (Option<usize>, Vec<String>) {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s2 = seen.clone();
        let backends: Vec<Arc<Backend>> = route.backends.iter().cloned().collect();
        let inner = tower::service_fn(move |req: Request<()>| {
            let pinned = req.extensions().get::<Pinned>().map(|p| p.0);
            *s2.lock().unwrap() = pinned;
            // A body of the proxy's own: the backend is named in the extensions, as where the
            // proxy replaces a backend's body.
            let mut resp = Response::new(http_body_util::Full::new(bytes::Bytes::new()));
            resp.headers_mut()
                .append(header::SET_COOKIE, HeaderValue::from_static("app=1"));
            resp.headers_mut()
                .append(header::SET_COOKIE, HeaderValue::from_static("theme=dark"));
            let index = pinned.unwrap_or(serve_by);
            resp.extensions_mut()
                .insert(ServedBy(backends[index].clone(), std::time::Instant::now()));
            ready(Ok::<_, ProxyError>(resp))
        });
        let mut req = Request::builder();
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let resp = StickyLayer::new(Some(&route.sticky), &route.backends, false)
            .layer(inner)
            .oneshot(req.body(()).unwrap())
            .await
            .unwrap();
        let cookies = resp
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        let pinned = *seen.lock().unwrap();
        (pinned, cookies)
    }

    fn id_of(cookies: &[String]) -> String {
        let c = cookies
            .iter()
            .find(|c| c.starts_with("backend_id="))
            .expect("a sticky cookie");
        c.split(';').next().unwrap().to_string()
    }

    #[tokio::test]
    async fn cookie_pins_and_is_appended() {
        let r = &route();
        let (pinned, cookies) = send(r, None, 1).await;
        assert_eq!(pinned, None);
        assert_eq!(cookies.len(), 3, "{cookies:?}");
        assert!(
            cookies.contains(&"app=1".to_string()) && cookies.contains(&"theme=dark".to_string())
        );
        let sticky = cookies
            .iter()
            .find(|c| c.starts_with("backend_id="))
            .unwrap();
        assert!(
            sticky.ends_with("; Path=/; Max-Age=120; HttpOnly; SameSite=Lax"),
            "{sticky}"
        );
        let id = id_of(&cookies);
        assert_eq!(id.len(), "backend_id=".len() + 32);
        // The cookie pins backend 1, and an answer from it needs no new cookie.
        let (pinned, cookies) = send(r, Some(format!("x=1; {id}; y=2")), 0).await;
        assert_eq!(pinned, Some(1));
        assert_eq!(cookies, ["app=1", "theme=dark"]);
    }

    /// Two sticky routes of a host on different backends: each sets its cookie for its own
    /// path, and takes the cookie naming one of its backends among those the client sends.
    #[tokio::test]
    async fn each_route_keeps_its_own_cookie() {
        let (site, api) = (
            route(),
            route_at("/api", "[\"127.0.0.1:4\", \"127.0.0.1:5\"]"),
        );
        let (_, site_cookies) = send(&site, None, 2).await;
        let (_, api_cookies) = send(&api, None, 1).await;
        let api_cookie = api_cookies
            .iter()
            .find(|c| c.starts_with("backend_id="))
            .unwrap();
        assert!(api_cookie.contains("; Path=/api;"), "{api_cookie}");
        // A browser sends the longer path's cookie first; either order pins each route.
        let both = [
            format!("{}; {}", id_of(&site_cookies), id_of(&api_cookies)),
            format!("{}; {}", id_of(&api_cookies), id_of(&site_cookies)),
        ];
        for cookies in both {
            assert_eq!(send(&api, Some(cookies.clone()), 0).await.0, Some(1));
            assert_eq!(send(&site, Some(cookies), 0).await.0, Some(2));
        }
    }

    #[tokio::test]
    async fn forged_or_dead_cookies_do_not_pin() {
        let r = &route();
        let (_, cookies) = send(r, Some(format!("{COOKIE}={}", "0".repeat(32))), 2).await;
        assert!(
            id_of(&cookies).len() > 11,
            "a fresh cookie replaces a forged one"
        );
        let (_, cookies) = send(r, None, 2).await;
        let id = id_of(&cookies);
        for _ in 0..3 {
            r.backends.get(2).unwrap().connect_failed();
        }
        let (pinned, cookies) = send(r, Some(id.clone()), 0).await;
        assert_eq!(pinned, None, "a backend out of rotation is not pinned");
        assert_ne!(
            id_of(&cookies),
            id,
            "the client gets the new backend's cookie"
        );
    }

    #[test]
    fn ids_differ_per_backend_and_hide_the_address() {
        let r = &route();
        let key = Keys::for_tests(None);
        let ids: Vec<[u8; 32]> = r
            .backends
            .iter()
            .map(|b| backend_id(b, key.sticky()))
            .collect();
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[1], ids[2]);
        assert!(ids.iter().all(|id| id.iter().all(u8::is_ascii_hexdigit)));
    }
}
