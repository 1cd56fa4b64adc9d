//! Keeping a fetched answer: whether it may be stored, and a copy of its body taken as it
//! streams to the client, stored once it has passed in full; an answer that may not be stored
//! marks its key uncacheable.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use super::entry::{Entry, SentHeaders};
use super::respond::{self, X_CACHE_STATUS};
use super::rules::{self, Storable};
use super::store::{CacheStore, FlightGuard};
use super::RouteCache;
use crate::proxy::tee::{Tee, TeeSink};
use crate::proxy::RespBody;

/// The largest body whose fill other requests for the key wait for ([`finish`]).
const COALESCED_BODY_MAX: u64 = 256 * 1024;

/// What a fetched answer may become.
pub(super) enum Keep {
    /// Nothing: a bypass, or a method whose answers are not kept.
    No,
    /// An entry, with the request's headers for the values of its `Vary`.
    Entry(SentHeaders),
    /// The key was marked uncacheable and the request's headers were not copied: the answer is
    /// kept only if it can be now and varies on nothing (else the mark goes, for the next one).
    Unvaried,
}

/// Labels a fetched answer and, when it may be stored, keeps a copy as it streams; an answer
/// that may not be stored marks its key uncacheable.
pub(super) fn finish(
    cache: &RouteCache,
    (key, slot): (String, usize),
    auth: bool,
    keep: Keep,
    mut resp: Response<RespBody>,
    word: &'static str,
    guard: Option<FlightGuard>,
) -> Response<RespBody> {
    respond::mark(&mut resp, word);
    if matches!(keep, Keep::No) {
        return resp;
    }
    let store = &cache.store;
    let (status, headers) = (resp.status(), resp.headers());
    let storable = rules::storable(auth, status, headers, cache.ttl, SystemTime::now);
    // Requests for the same key wait for the entry only while it fills at the backend's pace.
    // A large body fills as fast as this request's client reads it (one slow reader would hold
    // every follower for the whole coalescing wait): they go to the backend themselves.
    let guard = guard.filter(|_| !fills_at_the_clients_pace(headers));
    match (keep, storable) {
        (Keep::Entry(sent), Some(storable)) => {
            keep_copy(store, (key, slot), &sent, storable, resp, guard)
        }
        (Keep::Unvaried, Some(storable)) if storable.vary.is_empty() => {
            let none = SentHeaders::default();
            keep_copy(store, (key, slot), &none, storable, resp, guard)
        }
        (Keep::Unvaried, Some(_)) => {
            store.unmark(&key);
            resp
        }
        // Not the key's fault: a request with credentials, a part or a 304 (what the client
        // asked), or a backend in trouble.
        (Keep::Entry(_), None) if !auth && says_uncacheable(status) => {
            store.mark_uncacheable(&key);
            resp
        }
        _ => resp,
    }
}

/// A body larger than the socket buffers take at once: written, and so copied into the
/// cache, only as fast as the client reads it.
fn fills_at_the_clients_pace(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|len| len.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|len| len > COALESCED_BODY_MAX)
}

/// An answer that could not be stored says the key's answers cannot be.
fn says_uncacheable(status: StatusCode) -> bool {
    !(status.is_server_error()
        || status == StatusCode::PARTIAL_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// Wraps the response's body so that a copy is stored once it has passed in full.
fn keep_copy(
    store: &Arc<CacheStore>,
    (key, slot): (String, usize),
    sent: &SentHeaders,
    storable: Storable,
    resp: Response<RespBody>,
    guard: Option<FlightGuard>,
) -> Response<RespBody> {
    let (parts, body) = resp.into_parts();
    // A 204 gets an empty body of its own, never read from the backend: kept as it is.
    let bodiless = matches!(&body, Either::Right(full) if http_body::Body::is_end_stream(full));
    let streamed = match body {
        Either::Left(Either::Left(streamed)) => Some(streamed),
        _ if bodiless => None,
        body => return Response::from_parts(parts, body),
    };
    let mut headers = parts.headers.clone();
    headers.remove(header::AGE);
    headers.remove(&X_CACHE_STATUS);
    let vary = storable
        .vary
        .iter()
        .map(|name| (name.clone(), sent.vary_value(name)))
        .collect();
    let keeper = Keeper {
        store: store.clone(),
        key,
        slot,
        status: parts.status,
        headers,
        vary,
        storable,
        _guard: guard,
    };
    let Some(streamed) = streamed else {
        Box::new(keeper).complete(Bytes::new());
        return Response::from_parts(parts, Either::Right(Full::new(Bytes::new())));
    };
    let limit = store.item_max_size;
    let body = Either::Left(Either::Right(Tee::new(streamed, Box::new(keeper), limit)));
    Response::from_parts(parts, body)
}

/// What becomes an entry once the body has passed; holds the key's fetch until then.
struct Keeper {
    store: Arc<CacheStore>,
    key: String,
    slot: usize,
    status: http::StatusCode,
    headers: HeaderMap,
    vary: Vec<(HeaderName, Option<HeaderValue>)>,
    storable: Storable,
    _guard: Option<FlightGuard>,
}

impl TeeSink for Keeper {
    fn complete(self: Box<Self>, body: Bytes) {
        let entry = Entry::new(self.status, self.headers, body, self.vary, &self.storable);
        self.store.insert(&self.key, entry, self.slot);
        // The guard drops after the entry is in: waiting requests find it.
    }
}
