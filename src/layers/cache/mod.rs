//! The response cache (RFC 9111, shared cache): a fresh stored response answers GET and HEAD
//! without the backend; a miss fetches, streams the answer to the client and keeps a copy when
//! the rules allow ([`rules`]); concurrent misses for one key make one backend request
//! ([`store`]). A stale entry is revalidated with the backend (`If-None-Match` /
//! `If-Modified-Since`; a 304 refreshes it), served to other clients meanwhile within its
//! `stale-while-revalidate`, and served when the backend fails within `stale-if-error`
//! (RFC 5861). Clients' own validators and byte ranges are answered from stored objects
//! ([`respond`]). Every answer of a cached route says what happened in `X-Cache-Status`
//! (nginx's words: HIT, MISS, EXPIRED, REVALIDATED, UPDATING, STALE, BYPASS).
//!
//! It sits outside compression, so what it keeps is what the client was sent (the compressed
//! variant, keyed by `Accept-Encoding` through the `Vary` that compression adds). Routes with
//! an `authorization` policy and `cache: false` routes are never cached. Behind memory the store
//! may keep a disk tier (`hybrid`) or a Redis tier (`redis://`).

mod disk;
mod entry;
mod keep;
mod remote;
mod respond;
pub mod rules;
pub mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::Either as FutEither;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::config::settings::RouteSettings;
use crate::proxy::RespBody;
use crate::upstream::keep_served_by;
use crate::vocab::{normalise, ProxyError};
use entry::{Entry, SentHeaders};
use keep::{finish, Keep};
pub use respond::X_CACHE_STATUS;
use rules::{Lookup, Storable};
use store::{CacheStore, Flight, FlightGuard, Found};

pub use store::CacheStore as Store;

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
    /// The request's host as routed (normalised), if it named one.
    host: Option<&'a str>,
    /// The worker serving the request (its Redis connection slot).
    slot: usize,
}

impl<'a> CacheLayer<'a> {
    pub fn new(
        cache: Option<&'a RouteCache>,
        (tls, host): (bool, Option<&'a str>),
        slot: usize,
    ) -> Self {
        CacheLayer {
            cache,
            tls,
            host,
            slot,
        }
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
    B: http_body::Body + Send + 'a,
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
        let (mut lookup, auth) = rules::ask(req.method(), req.headers());
        // A GET or HEAD with a body: what the backend does with it is not in the key, and its
        // answer must not be served for the URL.
        if matches!(lookup, Lookup::Look | Lookup::Refresh) && has_a_body(&req) {
            lookup = Lookup::Skip;
        }
        let key = match (lookup, self.layer.host) {
            (Lookup::Pass, _) | (_, None) => None,
            (_, Some(host)) => Some(key_of(self.layer.tls, host, &req)),
        };
        let Some(key) = key else {
            return FutEither::Left(self.inner.call(req));
        };
        if lookup == Lookup::Invalidate {
            // Once the backend has answered, and only if it did not refuse (RFC 9111 §4.4): on
            // arrival, a GET in the meantime stored the old answer again for its whole lifetime
            // (the body is read before a backend is chosen), and a request that never reached a
            // backend (cut short, refused) evicted entries at will.
            let slot = self.layer.slot;
            let answering = self.inner.call(req);
            return FutEither::Right(Box::pin(async move {
                let answer = answering.await;
                if answer
                    .as_ref()
                    .is_ok_and(|resp| resp.status().as_u16() < 400)
                {
                    cache.store.invalidate(&key, slot);
                }
                answer
            }));
        }
        // The ready service goes to the request; its clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let ask = Ask {
            cache,
            key,
            lookup,
            auth,
            slot: self.layer.slot,
        };
        FutEither::Right(Box::pin(answer(ask, req, inner)))
    }
}

/// The cache key: scheme, host (normalised as for routing: lower case, no port) and path with
/// query; then, when the client wrote its host otherwise (a port, capitals, a trailing dot),
/// that spelling. The backend sees the host as written (`Host`, `X-Forwarded-Host`) and may
/// build links or redirects from it: under the routed host alone, `Host: site:1337` put its
/// links in the entry every client of `site` was then served.
fn key_of<B>(https: bool, host: &str, req: &Request<B>) -> String {
    let scheme = if https { "https://" } else { "http://" };
    let uri = req.uri();
    let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let written = match req.headers().get(http::header::HOST) {
        Some(value) => value.as_bytes(),
        None => uri.authority().map_or(&b""[..], |a| a.as_str().as_bytes()),
    };
    if written == host.as_bytes() || written.is_empty() {
        return [scheme, host, target].concat();
    }
    let written = String::from_utf8_lossy(written);
    [scheme, host, target, store::SPELLED, &written].concat()
}

/// The key of `target` (path and query) on `host` over `https` or not.
pub fn key_for(https: bool, host: &[u8], target: &str) -> Option<String> {
    let scheme = if https { "https://" } else { "http://" };
    let mut buf = [0u8; normalise::MAX_HOST];
    let host = normalise::host(host, &mut buf)?;
    Some([scheme, host, target].concat())
}

/// Whether `req` carries a body: one that has not ended, unless `Content-Length: 0` says it is
/// empty (an HTTP/2 request may end its stream only after the head, with an empty DATA frame).
fn has_a_body<B: http_body::Body>(req: &Request<B>) -> bool {
    !req.body().is_end_stream()
        && req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .is_none_or(|len| len.as_bytes() != b"0")
}

/// How many fetches a request waits for at most: the URL's, then, when that stored another
/// variant than its own, its own variant's, or, when its fetch was abandoned (the leading
/// client left before the backend answered), the fetch of the waiter that took its place.
const FLIGHT_ROUNDS: usize = 3;

/// The flight of `variant` (a request's values of the fields `Vary` names) of the URL `key`.
fn variant_flight(key: &str, variant: &str) -> String {
    [key, "\0vary\0", variant].concat()
}

/// What a cacheable request asks of the cache.
struct Ask<'a> {
    cache: &'a RouteCache,
    key: String,
    lookup: Lookup,
    /// The request carries `Authorization`.
    auth: bool,
    slot: usize,
}

async fn answer<S, B>(ask: Ask<'_>, mut req: Request<B>, mut inner: S) -> Answer
where
    S: Service<Request<B>, Response = Response<RespBody>, Error = ProxyError>,
{
    let Ask {
        cache,
        key,
        mut lookup,
        auth,
        slot,
    } = ask;
    let store = &cache.store;
    let usable = |e: &Arc<Entry>| !auth || e.shared_with_auth;
    let mut stale = None;
    let mut guard = None;
    let mut uncacheable = false;
    // What concurrent misses wait on together: the URL, or, once its answers are known to vary,
    // this request's variant of it.
    let mut flight = None;
    // A client's `no-cache` or `max-age=0` (a browser's reload) revalidates what is stored
    // (SPEC §14), as a stale entry is: it was fetched whole again.
    if matches!(lookup, Lookup::Look | Lookup::Refresh) {
        match store.lookup(&key, req.headers(), slot).await {
            Ok(Found::Stored(e)) if usable(&e) => {
                // The clock is read only when there is an entry to judge.
                let now = Instant::now();
                if lookup == Lookup::Look && e.is_fresh(now) {
                    return Ok(served(store, &e, req.headers(), now, "HIT"));
                }
                stale = Some(e);
            }
            Ok(Found::Uncacheable) => uncacheable = true,
            Ok(Found::OtherVariant(variant)) => flight = Some(variant_flight(&key, &variant)),
            Ok(_) => {}
            // The shared tier is down or slow: straight to the backend, nothing waited for.
            Err(_) => lookup = Lookup::Skip,
        }
    }
    // A follower whose wait ended with another variant stored (the same URL, another value of
    // a field its `Vary` names) joins its own variant's fetch: every client of a second variant
    // went to the backend at once. Every wait together within the one coalescing wait.
    // A refresh (the client's `no-cache`) waits for a fetch under way too: fifty reloads were
    // fifty backend requests. It takes only what a fetch begun after it arrived stored (what
    // one begun before may predate the change the client reloads to see): it waits for such a
    // fetch to end, then joins or leads the next one.
    let mut rounds = 0;
    let mut waited_from = None;
    let coalesces = matches!(lookup, Lookup::Look | Lookup::Refresh);
    let arrived = (lookup == Lookup::Refresh).then(Instant::now);
    while coalesces && !uncacheable && rounds < FLIGHT_ROUNDS {
        rounds += 1;
        match store.join_flight(flight.as_deref().unwrap_or(&key)) {
            Flight::Lead(g) => {
                guard = Some(g);
                break;
            }
            Flight::Follow(rx) => {
                let now = Instant::now();
                let updating = stale.as_ref().filter(|e| e.may_serve_while_updating(now));
                if let Some(e) = updating.filter(|_| lookup == Lookup::Look) {
                    return Ok(served(store, e, req.headers(), now, "UPDATING"));
                }
                let from = *waited_from.get_or_insert(now);
                let left = (from + store::COALESCE_WAIT).saturating_duration_since(now);
                let began = rx.began;
                // Boxed: a timer is large, and only followers need one.
                let abandoned = Box::pin(store::wait_for(rx, left)).await;
                let before_it = arrived.is_some_and(|arrived| began < arrived);
                if before_it && rounds < FLIGHT_ROUNDS {
                    // The fetch it needs is the next: its wait starts anew (counted from the
                    // first, a fetch over 2.5 s left none, and every refresh fetched alone).
                    waited_from = None;
                    continue;
                }
                let now = Instant::now();
                let new_enough =
                    |e: &Entry| arrived.is_none_or(|_| !before_it && e.stored_at >= began);
                match store.lookup(&key, req.headers(), slot).await {
                    Ok(Found::Stored(e)) if usable(&e) && e.is_fresh(now) && new_enough(&e) => {
                        return Ok(served(store, &e, req.headers(), now, "HIT"))
                    }
                    Ok(Found::Stored(e)) => stale = Some(e).filter(usable),
                    Ok(Found::Uncacheable) => uncacheable = true,
                    Ok(Found::OtherVariant(variant)) => {
                        let own = variant_flight(&key, &variant);
                        // Its own variant's fetch ended with nothing kept: no other to wait on.
                        if flight.as_ref() != Some(&own) {
                            flight = Some(own);
                            continue;
                        }
                    }
                    // The leading client left before the backend answered: one of its
                    // followers leads in its place, the others wait for that one.
                    Ok(Found::Nothing) if abandoned => continue,
                    Ok(Found::Nothing) | Err(_) => {}
                }
                break;
            }
        }
    }
    store.counters.misses.fetch_add(1, Ordering::Relaxed);
    // A HEAD that missed is asked as a GET, so that its answer can be kept (nginx's
    // `proxy_cache_convert_head`); the client gets the head alone.
    let head = req.method() == Method::HEAD && lookup != Lookup::Skip && !uncacheable;
    if head {
        *req.method_mut() = Method::GET;
    }
    let keep = match lookup {
        Lookup::Skip => Keep::No,
        _ if req.method() != Method::GET => Keep::No,
        _ if uncacheable => Keep::Unvaried,
        // What an answer may vary on, copied before the request goes on (no index: cheaper
        // than cloning the map).
        _ => Keep::Entry(SentHeaders::of(req.headers())),
    };
    let Some(stale) = stale else {
        let word = if lookup == Lookup::Skip {
            "BYPASS"
        } else {
            "MISS"
        };
        let asked = match keep {
            Keep::Entry(_) => respond::ClientValidators::take(req.headers_mut()),
            _ => None,
        };
        let resp = inner.call(req).await;
        answered(&mut guard);
        let resp = finish(cache, (key, slot), auth, keep, resp?, word, guard);
        if asked.is_some_and(|asked| asked.match_answer(&resp)) {
            // Its body only fills the entry.
            return Ok(respond::as_not_modified(Box::pin(head_only(resp)).await));
        }
        return Ok(if head {
            Box::pin(head_only(resp)).await
        } else {
            resp
        });
    };
    // A stale entry: ask the backend whether it still holds, answer the client from the entry.
    let client = req.headers().clone();
    ask_with_validators(&mut req, &stale);
    let asked_sie = rules::CacheControl::of(&client)
        .stale_if_error
        .map(Duration::from_secs);
    let result = inner.call(req).await;
    answered(&mut guard);
    let now = Instant::now();
    match result {
        Ok(resp) if resp.status() == StatusCode::NOT_MODIFIED => {
            match revalidated(cache, &key, slot, auth, &stale, resp.headers()) {
                Some(fresh) => Ok(served(store, &fresh, &client, now, "REVALIDATED")),
                // It names another representation: the entry goes, and this once it is served
                // as the stale copy it is.
                None => Ok(served(store, &stale, &client, now, "STALE")),
            }
        }
        Ok(resp) if resp.status().is_server_error() && stale.may_serve_on_error(now, asked_sie) => {
            Ok(served(store, &stale, &client, now, "STALE"))
        }
        Err(_) if stale.may_serve_on_error(now, asked_sie) => {
            Ok(served(store, &stale, &client, now, "STALE"))
        }
        result => {
            let resp = finish(cache, (key, slot), auth, keep, result?, "EXPIRED", guard);
            Ok(if head {
                Box::pin(head_only(resp)).await
            } else {
                resp
            })
        }
    }
}

/// The backend has answered (or failed) the fetch `guard` leads, if it leads one: its end no
/// longer hands the fetch to a follower.
fn answered(guard: &mut Option<FlightGuard>) {
    if let Some(guard) = guard {
        guard.answered();
    }
}

/// The answer to a HEAD that was asked as a GET: its body is read here while a copy is being
/// kept (bounded by `item_max_size`, past which the copy is given up), then dropped.
async fn head_only(resp: Response<RespBody>) -> Response<RespBody> {
    let (mut parts, mut body) = resp.into_parts();
    if let Either::Left(Either::Right(tee)) = &mut body {
        while tee.keeping() {
            match tee.frame().await {
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
    keep_served_by(&mut parts, &body);
    Response::from_parts(parts, Either::Right(Full::new(Bytes::new())))
}

/// The conditional request that revalidates `stale`: the client's own validators give way to
/// the entry's (the client's are answered from the entry afterwards).
fn ask_with_validators<B>(req: &mut Request<B>, stale: &Entry) {
    let headers = req.headers_mut();
    headers.remove(header::IF_NONE_MATCH);
    headers.remove(header::IF_MODIFIED_SINCE);
    if let Some(etag) = stale.headers.get(header::ETAG) {
        headers.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(date) = stale.headers.get(header::LAST_MODIFIED) {
        headers.insert(header::IF_MODIFIED_SINCE, date.clone());
    }
}

/// The entry after the backend said `304 Not Modified`: its head refreshed, stored again; `None`
/// (the entry dropped) when the 304 names another representation ([`rules::selects`]).
fn revalidated(
    cache: &RouteCache,
    key: &str,
    slot: usize,
    auth: bool,
    stale: &Entry,
    not_modified: &HeaderMap,
) -> Option<Arc<Entry>> {
    if !rules::selects(&stale.headers, not_modified) {
        cache.store.invalidate(key, slot);
        return None;
    }
    let head = rules::refreshed_head(&stale.headers, not_modified);
    let storable = rules::storable(auth, stale.status, &head, cache.ttl, SystemTime::now);
    let Some(storable) = storable else {
        cache.store.invalidate(key, slot);
        let mut gone = Entry::new(
            stale.status,
            head,
            stale.body.clone(),
            stale.vary.clone(),
            &NOW_STALE,
        );
        gone.must_revalidate = true;
        return Some(Arc::new(gone));
    };
    let entry = Arc::new(Entry::new(
        stale.status,
        head,
        stale.body.clone(),
        stale.vary.clone(),
        &storable,
    ));
    cache.store.insert_arc(key, entry.clone(), slot);
    Some(entry)
}

/// Freshness of an answer that may no longer be stored: none.
const NOW_STALE: Storable = Storable {
    fresh_for: Duration::ZERO,
    initial_age: Duration::ZERO,
    shared_with_auth: false,
    vary: Vec::new(),
    must_revalidate: true,
    stale_while_revalidate: Duration::ZERO,
    stale_if_error: Duration::ZERO,
};

/// An answer from the cache, counted as a hit.
fn served(
    store: &CacheStore,
    entry: &Entry,
    req: &HeaderMap,
    now: Instant,
    word: &'static str,
) -> Response<RespBody> {
    store.counters.hits.fetch_add(1, Ordering::Relaxed);
    respond::from_entry(entry, req, now, word)
}
