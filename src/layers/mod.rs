//! Traffic policies (SPEC §5, §8): one tower `Layer` + `Service` per concern, each in its own
//! file, composed in [`apply`], the one place that shows their order.
//!
//! Policies are compiled once per route when a snapshot is built ([`Policies`]); a request only
//! reads them. The stack is put together per request from the matched route: every layer is a
//! pair of references, built on the stack, so a route without policies pays a few branches and
//! no allocation. Layers never write error pages: they return a [`ProxyError`], which
//! `proxy::error` turns into a response.
//!
//! Header injection (`server_headers`, `client_headers`) stays in the forwarding step
//! (`proxy::prepare_headers`, `proxy::finish_response`): configured headers must be applied after
//! the X-Forwarded-* rewrite and hop-by-hop removal so that they win, which only forwarding knows.

pub mod auth;
pub mod forward_auth;
pub mod jwt;
mod jwt_cache;
pub mod limiter;
pub mod rate_limit;
pub mod redirect;
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
use crate::proxy::{ClientConn, ProxyError, RespBody};
use crate::routing::{Route, Snapshot};
use crate::upstream::Backend;

pub use auth::{Auth, AuthLayer};
pub use limiter::Rate;
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use redirect::{Redirect, RedirectLayer};
pub use sticky::{Pinned, Sticky, StickyLayer};
pub use x4xx::{X4xxLayer, X4xxLimit};

/// A route's policies, compiled when the snapshot is built.
#[derive(Debug, Default)]
pub struct Policies {
    pub redirect: Option<Redirect>,
    pub auth: Option<Auth>,
    pub rate_limit: Option<RateLimit>,
    pub x4xx_limit: Option<X4xxLimit>,
    pub sticky: Option<Sticky>,
}

impl Policies {
    /// Compiles a route's settings. `own` are the path's own settings (before inheriting): a
    /// path that sets its own limit counts separately from the rest of its host.
    pub fn compile(
        settings: &RouteSettings,
        own: &RouteSettings,
        host: &str,
        prefix: &str,
        backends: &[Arc<Backend>],
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
            redirect: Redirect::compile(settings.to_https, settings.redirect_to.as_deref()),
            auth: settings.authorization.as_ref().map(Auth::compile),
            rate_limit: settings
                .rate_limit
                .and_then(Rate::per_second)
                .map(|rate| RateLimit::new(rate, scope(own.rate_limit.is_some()))),
            x4xx_limit: settings
                .x4xx_limit
                .and_then(Rate::per_second)
                .map(|rate| X4xxLimit::new(rate, scope(own.x4xx_limit.is_some()))),
            sticky: settings
                .sticky_sessions
                .flatten()
                .map(|max_age| Sticky::compile(max_age, backends)),
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

/// Runs `req` through the route's policies, in SPEC §8 order, then `forward`.
///
/// Redirects (`to_https`, `redirect_to`) come first, so a redirected request meets no other
/// policy. (A plain function
/// returning a named future rather than an `async fn`: the compiler can then see it is `Send`.)
pub fn apply<'a, B, S>(
    route: &'a Route,
    conn: &'a ClientConn,
    req: Request<B>,
    forward: S,
) -> impl Future<Output = Result<Response<RespBody>, ProxyError>> + Send + 'a
where
    B: Send + 'a,
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError> + Clone + Send + 'a,
    S::Future: Send,
{
    let policies = &route.policies;
    let client_ip = conn.peer.ip();
    ServiceBuilder::new()
        .layer(RedirectLayer::new(policies.redirect.as_ref(), conn.tls))
        .layer(AuthLayer::new(policies.auth.as_ref(), conn))
        .layer(RateLimitLayer::new(policies.rate_limit.as_ref(), client_ip))
        .layer(X4xxLayer::new(policies.x4xx_limit.as_ref(), client_ip))
        .layer(StickyLayer::new(policies.sticky.as_ref(), route, conn.tls))
        .service(forward)
        .oneshot(req)
}

/// Installs the secrets policies derive from (`JWT_KEY` overrides `master_key`): the JWT master
/// key and the sticky-cookie key. Must run before the first snapshot is compiled; later calls
/// change nothing.
pub fn install_keys(main: &crate::config::MainConfig) {
    let env_key = std::env::var("JWT_KEY").ok().filter(|k| !k.is_empty());
    let master = env_key.or_else(|| main.master_key.clone());
    sticky::install_master_key(master.clone());
    jwt::install_master_key(master);
}

/// The process-wide part of the policies, started once from the control runtime: the JWT master
/// key (`JWT_KEY` overrides `master_key`) and the active health checks.
pub fn start(
    runtime: &tokio::runtime::Runtime,
    main: &crate::config::MainConfig,
    snapshot: Arc<arc_swap::ArcSwap<Snapshot>>,
) {
    install_keys(main);
    crate::upstream::health::spawn(runtime, main, snapshot);
}
