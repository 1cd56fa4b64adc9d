//! The response cache (RFC 9111, shared cache): a fresh stored response answers GET and HEAD
//! without the backend; a miss fetches, streams the answer to the client and keeps a copy when
//! the rules allow ([`rules`]); concurrent misses for one key make one backend request
//! ([`store`]). Every answer of a cached route says what happened in `X-Cache-Status` (nginx's
//! words: HIT, MISS, EXPIRED, BYPASS).
//!
//! It sits outside compression, so what it keeps is what the client was sent (the compressed
//! variant, keyed by `Accept-Encoding` through the `Vary` that compression adds). Routes with
//! an `authorization` policy and `cache: false` routes are never cached. Not built yet:
//! revalidation (If-None-Match / If-Modified-Since), ranges served from stored objects,
//! stale-while-revalidate / stale-if-error, the disk and Redis tiers, purge.

pub mod rules;
pub mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::Either as FutEither;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::config::settings::RouteSettings;
use crate::proxy::tee::{Tee, TeeSink};
use crate::proxy::RespBody;
use crate::vocab::{request_host, ProxyError};
use rules::{Lookup, Storable};
use store::{CacheStore, Entry, Flight, FlightGuard};

pub use store::CacheStore as Store;

/// `X-Cache-Status`, nginx's name for it.
pub static X_CACHE_STATUS: HeaderName = HeaderName::from_static("x-cache-status");

/// A route's cache settings, compiled with the snapshot.
#[derive(Debug)]
pub struct RouteCache {
    store: Arc<CacheStore>,
    /// Freshness of 200/301/404 answers that give none: `cache_ttl`, else main.yaml's `ttl`.
    ttl: Duration,
}

impl RouteCache {
    /// `None` when there is no cache, the route says `cache: false`, or the route has an
    /// authorization policy (its answers are per client).
    pub fn compile(
        settings: &RouteSettings,
        store: Option<&Arc<CacheStore>>,
    ) -> Option<RouteCache> {
        let store = store?;
        if settings.cache == Some(false) || settings.authorization.is_some() {
            return None;
        }
        Some(RouteCache {
            store: store.clone(),
            ttl: settings.cache_ttl.unwrap_or(store.default_ttl),
        })
    }
}

#[derive(Clone, Copy)]
pub struct CacheLayer<'a> {
    cache: Option<&'a RouteCache>,
    tls: bool,
}

impl<'a> CacheLayer<'a> {
    pub fn new(cache: Option<&'a RouteCache>, tls: bool) -> Self {
        CacheLayer { cache, tls }
    }
}

impl<'a, S> Layer<S> for CacheLayer<'a> {
    type Service = CacheService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        CacheService {
            layer: *self,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct CacheService<'a, S> {
    layer: CacheLayer<'a>,
    inner: S,
}

type Answer = Result<Response<RespBody>, ProxyError>;
type Cached<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

impl<'a, S, B> Service<Request<B>> for CacheService<'a, S>
where
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError> + Clone + Send + 'a,
    S::Future: Send + 'a,
    B: Send + 'a,
{
    type Response = Response<RespBody>;
    type Error = ProxyError;
    type Future = FutEither<S::Future, Cached<'a>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(cache) = self.layer.cache else {
            return FutEither::Left(self.inner.call(req));
        };
        let lookup = rules::lookup(req.method(), req.headers());
        let key = match lookup {
            Lookup::Pass => None,
            _ => key_of(&req, self.layer.tls),
        };
        let Some(key) = key else {
            return FutEither::Left(self.inner.call(req));
        };
        if lookup == Lookup::Invalidate {
            cache.store.invalidate(&key);
            return FutEither::Left(self.inner.call(req));
        }
        // The ready service goes to the request; its clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        FutEither::Right(Box::pin(answer(cache, key, lookup, req, inner)))
    }
}

/// The cache key: scheme, host (lower case) and path with query, as routed.
fn key_of<B>(req: &Request<B>, tls: bool) -> Option<String> {
    let host = request_host(req.headers(), req.uri())?;
    let host = host.to_str().ok()?;
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let scheme = if tls { "https://" } else { "http://" };
    let mut key = String::with_capacity(scheme.len() + host.len() + target.len());
    key.push_str(scheme);
    key.extend(host.chars().map(|c| c.to_ascii_lowercase()));
    key.push_str(target);
    Some(key)
}

async fn answer<S, B>(
    cache: &RouteCache,
    key: String,
    lookup: Lookup,
    req: Request<B>,
    mut inner: S,
) -> Answer
where
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError>,
{
    let store = &cache.store;
    let auth = req.headers().contains_key(header::AUTHORIZATION);
    let usable = |e: &Entry| !auth || e.shared_with_auth;
    let mut status = match lookup {
        Lookup::Skip => "BYPASS",
        _ => "MISS",
    };
    let mut guard = None;
    if lookup == Lookup::Look {
        let now = Instant::now();
        match store.find(&key, req.headers()) {
            Some(e) if usable(&e) && e.is_fresh(now) => return Ok(hit(store, &e, now)),
            Some(_) => status = "EXPIRED",
            None => {}
        }
        if req.method() == Method::GET {
            match store.join_flight(&key) {
                Flight::Lead(g) => guard = Some(g),
                Flight::Follow(rx) => {
                    store::wait_for(rx, store::COALESCE_WAIT).await;
                    let now = Instant::now();
                    if let Some(e) = store.find(&key, req.headers()) {
                        if usable(&e) && e.is_fresh(now) {
                            return Ok(hit(store, &e, now));
                        }
                    }
                }
            }
        }
    }
    store
        .counters
        .misses
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let keep = lookup != Lookup::Skip && req.method() == Method::GET;
    let req_headers = keep.then(|| req.headers().clone());
    let mut resp = inner.call(req).await?;
    resp.headers_mut()
        .insert(X_CACHE_STATUS.clone(), HeaderValue::from_static(status));
    let Some(req_headers) = req_headers else {
        return Ok(resp);
    };
    let now = SystemTime::now();
    let Some(storable) =
        rules::storable(&req_headers, resp.status(), resp.headers(), cache.ttl, now)
    else {
        return Ok(resp);
    };
    Ok(keep_copy(store, key, &req_headers, storable, resp, guard))
}

/// Wraps the response's body so that a copy is stored once it has passed in full.
fn keep_copy(
    store: &Arc<CacheStore>,
    key: String,
    req_headers: &HeaderMap,
    storable: Storable,
    resp: Response<RespBody>,
    guard: Option<FlightGuard>,
) -> Response<RespBody> {
    let (parts, body) = resp.into_parts();
    let Either::Left(Either::Left(streamed)) = body else {
        return Response::from_parts(parts, body);
    };
    let mut headers = parts.headers.clone();
    headers.remove(header::AGE);
    headers.remove(&X_CACHE_STATUS);
    let vary = storable
        .vary
        .iter()
        .map(|name| (name.clone(), store::vary_value(req_headers, name)))
        .collect();
    let keeper = Keeper {
        store: store.clone(),
        key,
        status: parts.status,
        headers,
        vary,
        storable,
        _guard: guard,
    };
    let limit = store.item_max_size;
    let body = Either::Left(Either::Right(Tee::new(streamed, Box::new(keeper), limit)));
    Response::from_parts(parts, body)
}

/// What becomes an entry once the body has passed; holds the key's fetch until then.
struct Keeper {
    store: Arc<CacheStore>,
    key: String,
    status: http::StatusCode,
    headers: HeaderMap,
    vary: Vec<(HeaderName, Option<HeaderValue>)>,
    storable: Storable,
    _guard: Option<FlightGuard>,
}

impl TeeSink for Keeper {
    fn complete(self: Box<Self>, body: Bytes) {
        let entry = Entry {
            status: self.status,
            headers: self.headers,
            body,
            vary: self.vary,
            shared_with_auth: self.storable.shared_with_auth,
            stored_at: Instant::now(),
            initial_age: self.storable.initial_age,
            fresh_for: self.storable.fresh_for,
        };
        self.store.insert(&self.key, entry);
        // The guard drops after the entry is in: waiting requests find it.
    }
}

/// The stored answer, with its `Age`.
fn hit(store: &CacheStore, entry: &Entry, now: Instant) -> Response<RespBody> {
    store
        .counters
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut resp = Response::new(Either::Right(Full::new(entry.body.clone())));
    *resp.status_mut() = entry.status;
    let headers = resp.headers_mut();
    *headers = entry.headers.clone();
    headers.insert(header::AGE, HeaderValue::from(entry.age(now).as_secs()));
    headers.insert(X_CACHE_STATUS.clone(), HeaderValue::from_static("HIT"));
    resp
}
