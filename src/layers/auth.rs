//! Authentication (SPEC §8.2): the `authorization` rule of the route (path, else host, else
//! global). `basic` and `apikey` are checked here, `jwt` in [`super::jwt`], `forward` in
//! [`super::forward_auth`]. A request that fails never reaches the layers below it.
//!
//! Every comparison of a secret is constant-time ([`ct_eq`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use futures_util::future::{ready, Either, Ready};
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response};
use tower::{Layer, Service};

use super::forward_auth::ForwardAuth;
use super::jwt::Jwt;
use super::keys::Keys;
use super::LocalBody;
use crate::config::values::AuthRule;
use crate::vocab::{ClientConn, ProxyError};

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// A route's compiled authentication rule.
#[derive(Debug)]
pub enum Auth {
    Basic(Basic),
    ApiKey(ApiKey),
    Jwt(Jwt),
    Forward(ForwardAuth),
}

impl Auth {
    pub fn compile(rule: &AuthRule, keys: &Keys) -> Auth {
        match rule {
            AuthRule::Basic { user, password } => Auth::Basic(Basic {
                expected: format!("{user}:{password}").into_bytes().into(),
            }),
            AuthRule::ApiKey(key) => Auth::ApiKey(ApiKey {
                key: key.as_bytes().into(),
            }),
            AuthRule::Jwt(secret) => Auth::Jwt(Jwt::new(secret.as_deref(), keys)),
            AuthRule::Forward(uri) => Auth::Forward(ForwardAuth::new(uri)),
        }
    }
}

/// `basic`: `Authorization: Basic base64(user:password)`.
pub struct Basic {
    expected: Box<[u8]>,
}

impl std::fmt::Debug for Basic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Basic(..)")
    }
}

impl Basic {
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .and_then(|(_, token)| decode_base64(token.trim()));
        match given {
            Some(pair) if ct_eq(&pair, &self.expected) => Ok(()),
            _ => Err(ProxyError::BasicAuthRequired),
        }
    }
}

fn decode_base64(token: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    STANDARD
        .decode(token)
        .or_else(|_| STANDARD_NO_PAD.decode(token))
        .ok()
}

/// `apikey`: the `x-api-key` header.
pub struct ApiKey {
    key: Box<[u8]>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        match headers.get(&X_API_KEY) {
            Some(v) if ct_eq(v.as_bytes(), &self.key) => Ok(()),
            _ => Err(ProxyError::ApiKeyRequired),
        }
    }
}

/// Whether `presented` (what a client sent) equals `secret`, in a time that depends only on
/// the length of what was presented: neither where the bytes differ nor the secret's length
/// shows (returning at once on a length mismatch told a client how long the key is).
pub fn ct_eq(presented: &[u8], secret: &[u8]) -> bool {
    if secret.is_empty() {
        return presented.is_empty();
    }
    let mut diff = presented.len() ^ secret.len();
    for (at, byte) in presented.iter().enumerate() {
        diff |= usize::from(byte ^ secret[at % secret.len()]);
    }
    std::hint::black_box(diff) == 0
}

/// Checks a route's rule (or nothing) before the layers below see the request.
#[derive(Clone, Copy)]
pub struct AuthLayer<'a> {
    rule: Option<&'a Auth>,
    conn: &'a ClientConn,
}

impl<'a> AuthLayer<'a> {
    pub fn new(rule: Option<&'a Auth>, conn: &'a ClientConn) -> Self {
        AuthLayer { rule, conn }
    }
}

impl<'a, S> Layer<S> for AuthLayer<'a> {
    type Service = AuthService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            rule: self.rule,
            conn: self.conn,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct AuthService<'a, S> {
    rule: Option<&'a Auth>,
    conn: &'a ClientConn,
    inner: S,
}

type Answer<R> = Result<Response<R>, ProxyError>;
/// Only forward auth, which waits on the network anyway, pays for a box.
type Asking<'a, R> = Pin<Box<dyn Future<Output = Answer<R>> + Send + 'a>>;

impl<'a, S, B, R> Service<Request<B>> for AuthService<'a, S>
where
    S: Service<Request<B>, Response = Response<R>, Error = ProxyError> + Clone + Send + 'a,
    S::Future: Send,
    B: Send + 'a,
    R: LocalBody + Send + 'a,
{
    type Response = Response<R>;
    type Error = ProxyError;
    type Future = Either<Ready<Answer<R>>, Either<S::Future, Asking<'a, R>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(rule) = self.rule else {
            return Either::Right(Either::Left(self.inner.call(req)));
        };
        let credentials = match rule {
            Auth::ApiKey(_) => &X_API_KEY,
            _ => &header::AUTHORIZATION,
        };
        if req.headers().get_all(credentials).iter().nth(1).is_some() {
            return Either::Left(ready(Err(ProxyError::DuplicateCredentials)));
        }
        let checked = match rule {
            Auth::Basic(basic) => basic.check(req.headers()),
            Auth::ApiKey(key) => key.check(req.headers()),
            Auth::Jwt(jwt) => jwt.check(&mut req),
            Auth::Forward(forward) => {
                // The inner service that was polled ready goes with the request.
                let clone = self.inner.clone();
                let ready_inner = std::mem::replace(&mut self.inner, clone);
                let asking = forward.authorize(self.conn, req, ready_inner);
                return Either::Right(Either::Right(Box::pin(asking)));
            }
        };
        match checked {
            Ok(()) => Either::Right(Either::Left(self.inner.call(req))),
            Err(err) => Either::Left(ready(Err(err))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    fn conn() -> ClientConn {
        ClientConn::new("127.0.0.1:5000".parse().unwrap(), false, Default::default())
    }

    async fn run(rule: &AuthRule, headers: &[(&str, &str)]) -> (Result<u16, ProxyError>, usize) {
        let auth = Auth::compile(rule, &Keys::for_tests(None));
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let inner = tower::service_fn(move |_req: Request<()>| {
            c.fetch_add(1, Ordering::SeqCst);
            ready(Ok::<_, ProxyError>(Response::new(Full::<Bytes>::default())))
        });
        let mut req = Request::builder().uri("/");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let conn = conn();
        let got = AuthLayer::new(Some(&auth), &conn)
            .layer(inner)
            .oneshot(req.body(()).unwrap())
            .await
            .map(|r| r.status().as_u16());
        (got, count.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn basic_right_wrong_missing() {
        let rule = AuthRule::Basic {
            user: "ann".into(),
            password: "s3cret:x".into(),
        };
        let good = base64::engine::general_purpose::STANDARD.encode("ann:s3cret:x");
        let wrong = base64::engine::general_purpose::STANDARD.encode("ann:s3cret:y");
        let cases = [
            (vec![("authorization", format!("Basic {good}"))], Ok(200), 1),
            (vec![("authorization", format!("basic {good}"))], Ok(200), 1),
            (
                vec![("authorization", format!("Basic {wrong}"))],
                Err(ProxyError::BasicAuthRequired),
                0,
            ),
            (
                vec![("authorization", format!("Bearer {good}"))],
                Err(ProxyError::BasicAuthRequired),
                0,
            ),
            (
                vec![("authorization", "Basic !!!".to_string())],
                Err(ProxyError::BasicAuthRequired),
                0,
            ),
            (vec![], Err(ProxyError::BasicAuthRequired), 0),
            // Twice: the check would read the first, a backend perhaps the second.
            (
                vec![
                    ("authorization", format!("Basic {good}")),
                    ("authorization", format!("Basic {wrong}")),
                ],
                Err(ProxyError::DuplicateCredentials),
                0,
            ),
        ];
        for (headers, expected, reached) in cases {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            assert_eq!(run(&rule, &h).await, (expected, reached), "{headers:?}");
        }
    }

    #[tokio::test]
    async fn apikey_right_wrong_missing() {
        let rule = AuthRule::ApiKey("k-123".into());
        assert_eq!(run(&rule, &[("x-api-key", "k-123")]).await, (Ok(200), 1));
        assert_eq!(
            run(&rule, &[("x-api-key", "k-123"), ("x-api-key", "k-124")]).await,
            (Err(ProxyError::DuplicateCredentials), 0)
        );
        assert_eq!(
            run(&rule, &[("x-api-key", "k-124")]).await,
            (Err(ProxyError::ApiKeyRequired), 0)
        );
        assert_eq!(
            run(&rule, &[("x-api-key", "k-1234")]).await,
            (Err(ProxyError::ApiKeyRequired), 0)
        );
        assert_eq!(run(&rule, &[]).await, (Err(ProxyError::ApiKeyRequired), 0));
    }

    #[test]
    fn constant_time_eq_is_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"", b"abc"));
        assert!(
            !ct_eq(b"abcabc", b"abc"),
            "a repeat of the secret is not it"
        );
        assert!(!ct_eq(b"abc\0", b"abc"));
    }
}
