//! Traffic policies (SPEC §5, §8): one tower `Layer` + `Service` per concern, each in its own
//! file, composed in [`apply`], the one place that shows their order.
//!
//! Policies are compiled once per route when a snapshot is built ([`Policies`]), from the route's
//! settings and the process's [`PolicyState`] (keys, the TLS port, the limiter tables: built
//! once at start and passed in); a request only reads them. The stack is put together per
//! request from the matched route: every layer is a pair of references, built on the stack. A
//! route without policies skips the stack altogether ([`Policies::is_empty`]: the router
//! forwards its requests directly). Layers never write error pages: they return a
//! [`ProxyError`], which `vocab::error` turns into a response.
//!
//! Header injection (`server_headers`, `client_headers`) stays in the forwarding step
//! (`proxy::HeaderRules`): configured headers must be applied after the X-Forwarded-* rewrite and
//! hop-by-hop removal so that they win, which only forwarding knows.

pub mod auth;
pub mod cache;
pub mod compress;
pub mod forward_auth;
pub mod jwt;
mod jwt_cache;
pub mod keys;
pub mod limiter;
pub mod rate_limit;
pub mod redirect;
pub mod shared_limits;
pub mod sticky;
pub mod x4xx;

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::config::upstreams::RouteSettings;
use crate::proxy::RespBody;
use crate::upstream::{Backend, BackendSet};
use crate::vocab::{ClientConn, ProxyError};

pub use auth::{Auth, AuthLayer};
pub use cache::{CacheLayer, RouteCache};
pub use compress::{Compress, CompressLayer};
pub use keys::Keys;
pub use limiter::Rate;
use limiter::{Strikes, Table, Tat};
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use redirect::{Redirect, RedirectLayer, TlsPort};
pub use sticky::{Sticky, StickyLayer};
pub use x4xx::{X4xxLayer, X4xxLimit};

/// What policies share across routes and snapshots, built once at start: the keys, the TLS
/// port for `to_https`, and the rate-limit and 4xx tables (so limits hold across workers and
/// survive reloads). A second proxy in the same process builds its own.
#[derive(Debug)]
pub struct PolicyState {
    pub keys: Keys,
    pub tls_port: Arc<TlsPort>,
    requests: Arc<Table<Tat>>,
    strikes: Arc<Table<Strikes>>,
    /// The response cache (main.yaml's `cache:`), when there is one.
    pub cache: Option<Arc<cache::Store>>,
    /// `limits_store`: limits counted across instances, when named.
    pub shared_limits: Option<Arc<shared_limits::SharedLimits>>,
}

impl PolicyState {
    pub fn new(keys: Keys) -> PolicyState {
        PolicyState {
            keys,
            tls_port: Arc::new(TlsPort::default()),
            requests: Arc::new(Table::new()),
            strikes: Arc::new(Table::new()),
            cache: None,
            shared_limits: None,
        }
    }

    /// The same state with a response cache.
    pub fn with_cache(mut self, cache: Option<Arc<cache::Store>>) -> PolicyState {
        self.cache = cache;
        self
    }

    /// The same state with limits counted in the Redis at `url` (`limits_store`), with a
    /// connection for each of `workers`.
    pub fn with_limits_store(
        mut self,
        url: Option<&str>,
        workers: usize,
    ) -> Result<PolicyState, redis::RedisError> {
        if let Some(url) = url {
            let (requests, strikes) = (self.requests.clone(), self.strikes.clone());
            let shared = shared_limits::SharedLimits::new(url, workers, requests, strikes)?;
            self.shared_limits = Some(Arc::new(shared));
        }
        Ok(self)
    }
}

/// A route's policies, compiled when the snapshot is built.
#[derive(Debug, Default)]
pub struct Policies {
    pub redirect: Option<Redirect>,
    pub auth: Option<Auth>,
    pub rate_limit: Option<RateLimit>,
    pub x4xx_limit: Option<X4xxLimit>,
    pub sticky: Option<Sticky>,
    pub compress: Option<Compress>,
    pub cache: Option<RouteCache>,
}

impl Policies {
    /// A redirect and nothing else.
    pub fn only_redirect(redirect: Redirect) -> Policies {
        Policies {
            redirect: Some(redirect),
            ..Policies::default()
        }
    }

    /// Whether the route has none: its requests go straight to forwarding.
    pub fn is_empty(&self) -> bool {
        matches!(
            self,
            Policies {
                redirect: None,
                auth: None,
                rate_limit: None,
                x4xx_limit: None,
                sticky: None,
                compress: None,
                cache: None,
            }
        )
    }

    /// Compiles a route's settings. `own` are the path's own settings (before inheriting): a
    /// path that sets its own limit counts separately from the rest of its host.
    pub fn compile(
        settings: &RouteSettings,
        own: &RouteSettings,
        host: &str,
        prefix: &str,
        backends: &[Arc<Backend>],
        state: &PolicyState,
    ) -> Policies {
        let scope = |path_level: bool| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            host.hash(&mut h);
            if path_level {
                prefix.hash(&mut h);
            }
            h.finish()
        };
        Policies {
            redirect: Redirect::compile(
                settings.to_https,
                settings.redirect_to.as_deref(),
                &state.tls_port,
            ),
            auth: settings
                .authorization
                .as_ref()
                .map(|rule| Auth::compile(rule, &state.keys)),
            rate_limit: settings.rate_limit.and_then(Rate::per_second).map(|rate| {
                let scope = scope(own.rate_limit.is_some());
                RateLimit::new(rate, scope, state.requests.clone())
                    .shared(state.shared_limits.clone())
            }),
            x4xx_limit: settings.x4xx_limit.and_then(Rate::per_second).map(|rate| {
                let scope = scope(own.x4xx_limit.is_some());
                X4xxLimit::new(rate, scope, state.strikes.clone())
                    .shared(state.shared_limits.clone())
            }),
            sticky: settings
                .sticky_sessions
                .flatten()
                .map(|max_age| Sticky::compile(max_age, backends, &state.keys, prefix)),
            compress: settings
                .compress
                .as_ref()
                .and_then(Option::as_ref)
                .map(Compress::compile),
            cache: RouteCache::compile(settings, state.cache.as_ref()),
        }
    }
}

/// Bodies a layer can answer with itself (the auth service's answer, relayed).
pub trait LocalBody {
    fn local(bytes: Bytes) -> Self;
}

impl LocalBody for RespBody {
    fn local(bytes: Bytes) -> Self {
        Either::Right(Full::new(bytes))
    }
}

impl LocalBody for Full<Bytes> {
    fn local(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

/// Runs `req` through a route's policies, then `forward`.
///
/// Redirects (`to_https`, `redirect_to`) come first, so a redirected request meets no other
/// policy. The 4xx limit and the rate limit come before auth (as nginx's `limit_req` runs
/// before `auth_basic` and `auth_request`): refused credentials count toward both, so a client
/// guessing passwords is blocked (429) like any other, and a forward-auth service is asked no
/// more often than the rate limit lets requests through. The cache comes after
/// every policy that can refuse (a hit still counts toward limits) and outside compression, so
/// it keeps what the client was sent. Compression comes last, next to forwarding: it only ever
/// touches what the backend sent. (A plain function returning a named future rather than an `async fn`: the compiler
/// can then see it is `Send`.)
pub fn apply<'a, B, S>(
    policies: &'a Policies,
    backends: &'a BackendSet,
    (conn, host): (&'a ClientConn, Option<&'a str>),
    req: Request<B>,
    forward: S,
) -> impl Future<Output = Result<Response<RespBody>, ProxyError>> + Send + 'a
where
    B: http_body::Body + Send + 'a,
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError> + Clone + Send + 'a,
    S::Future: Send,
{
    let client_ip = conn.client_ip;
    ServiceBuilder::new()
        .layer(RedirectLayer::new(policies.redirect.as_ref(), conn.tls))
        .layer(X4xxLayer::new(policies.x4xx_limit.as_ref(), client_ip))
        .layer(RateLimitLayer::new(
            policies.rate_limit.as_ref(),
            client_ip,
            conn.worker.0,
        ))
        .layer(AuthLayer::new(policies.auth.as_ref(), conn))
        .layer(StickyLayer::new(
            policies.sticky.as_ref(),
            backends,
            conn.tls,
        ))
        .layer(CacheLayer::new(
            policies.cache.as_ref(),
            (conn.tls, host),
            conn.worker.0,
        ))
        .layer(CompressLayer::new(policies.compress.as_ref()))
        .service(forward)
        .oneshot(req)
}
