//! Answers made from a stored entry: the whole object, a `304 Not Modified` when the client's
//! own validators match (`If-None-Match`, else `If-Modified-Since`), or one byte range of it
//! (`Range: bytes=...`, honouring `If-Range`; a range past the end is a 416). Several ranges in
//! one request get the whole object, which RFC 9110 §14.2 allows.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};
use tokio::time::Instant;

use super::entry::Entry;
use crate::proxy::RespBody;
use crate::vocab::headers::etag_matches;
use crate::vocab::CacheStatus;

/// `X-Cache-Status`, nginx's name for it.
pub static X_CACHE_STATUS: HeaderName = HeaderName::from_static("x-cache-status");

/// The client's answer from `entry`, labelled `word` in `X-Cache-Status`.
pub fn from_entry(
    entry: &Entry,
    req: &HeaderMap,
    now: Instant,
    word: &'static str,
) -> Response<RespBody> {
    if not_modified(entry, req) {
        let mut resp = with_head(entry, StatusCode::NOT_MODIFIED, Bytes::new(), now, word);
        let headers = resp.headers_mut();
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::CONTENT_TYPE);
        return resp;
    }
    if entry.status == StatusCode::OK {
        if let Some(range) = wanted_range(entry, req) {
            return ranged(entry, range, now, word);
        }
    }
    with_head(entry, entry.status, entry.body.clone(), now, word)
}

fn with_head(
    entry: &Entry,
    status: StatusCode,
    body: Bytes,
    now: Instant,
    word: &'static str,
) -> Response<RespBody> {
    let mut resp = Response::new(Either::Right(Full::new(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    *headers = entry.headers.clone();
    headers.insert(header::AGE, HeaderValue::from(entry.age(now).as_secs()));
    mark(&mut resp, word);
    resp
}

/// Says what the cache did with `resp`: `X-Cache-Status` for the client, [`CacheStatus`] for
/// the access log.
pub fn mark(resp: &mut Response<RespBody>, word: &'static str) {
    resp.headers_mut()
        .insert(X_CACHE_STATUS.clone(), HeaderValue::from_static(word));
    resp.extensions_mut().insert(CacheStatus(word));
}

/// The client's validators match the entry: its answer would not change.
fn not_modified(entry: &Entry, req: &HeaderMap) -> bool {
    validators_match(entry.status, &entry.headers, req)
}

/// The validators of `req` match an answer of `status` with `headers` (`If-None-Match`, else
/// `If-Modified-Since`): the client has it already.
fn validators_match(status: StatusCode, headers: &HeaderMap, req: &HeaderMap) -> bool {
    if !status.is_success() {
        return false;
    }
    if let Some(list) = req.get(header::IF_NONE_MATCH) {
        // With If-None-Match, If-Modified-Since is ignored (RFC 9110 §13.1.3).
        return headers
            .get(header::ETAG)
            .is_some_and(|etag| etag_matches(list, etag));
    }
    let since = req
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    let modified = headers
        .get(header::LAST_MODIFIED)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    matches!((since, modified), (Some(since), Some(modified)) if modified <= since)
}

/// A client's own validators, taken off a request that missed: the whole answer is fetched and
/// kept, and the client's `304` made from it (nginx does the same). Forwarded, they made the
/// backend answer `304`, which cannot be kept, so a key asked mostly by revalidating clients
/// never entered the cache.
pub struct ClientValidators(HeaderMap);

impl ClientValidators {
    /// The validators of `req`, removed from it; `None` when it has none.
    pub fn take(req: &mut HeaderMap) -> Option<ClientValidators> {
        let none_match = req.remove(header::IF_NONE_MATCH);
        let since = req.remove(header::IF_MODIFIED_SINCE);
        if none_match.is_none() && since.is_none() {
            return None;
        }
        let mut asked = HeaderMap::new();
        if let Some(value) = none_match {
            asked.insert(header::IF_NONE_MATCH, value);
        }
        if let Some(value) = since {
            asked.insert(header::IF_MODIFIED_SINCE, value);
        }
        Some(ClientValidators(asked))
    }

    /// Whether the client has `resp` already (a `200` its validators match).
    pub fn match_answer<B>(&self, resp: &Response<B>) -> bool {
        resp.status() == StatusCode::OK && validators_match(resp.status(), resp.headers(), &self.0)
    }
}

/// `resp` (read and dropped) as the client's `304 Not Modified`.
pub fn as_not_modified(mut resp: Response<RespBody>) -> Response<RespBody> {
    *resp.status_mut() = StatusCode::NOT_MODIFIED;
    *resp.body_mut() = Either::Right(Full::new(Bytes::new()));
    let headers = resp.headers_mut();
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::CONTENT_TYPE);
    resp
}

/// A byte range of the entry: `Some(Ok(range))` to send, `Some(Err(()))` when it starts past
/// the end, `None` for the whole object.
type Wanted = Option<Result<(usize, usize), ()>>;

fn wanted_range(entry: &Entry, req: &HeaderMap) -> Wanted {
    let spec = req.get(header::RANGE)?.to_str().ok()?.trim();
    if let Some(validator) = req.get(header::IF_RANGE) {
        // If-Range: the range only when the client's copy is this entry (strong comparison).
        let etag = entry.headers.get(header::ETAG);
        let same_tag = etag.is_some_and(|e| e == validator && !e.as_bytes().starts_with(b"W/"));
        let same_date = entry.headers.get(header::LAST_MODIFIED) == Some(validator);
        if !same_tag && !same_date {
            return None;
        }
    }
    // Range units are case-insensitive (RFC 9110 §14.1): `BYTES=2-4` is a byte range too.
    let (unit, spec) = spec.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let spec = spec.trim();
    if spec.contains(',') {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let len = entry.body.len();
    let (first, last) = match (first.trim(), last.trim()) {
        ("", suffix) => {
            let n: usize = suffix.parse().ok()?;
            if n == 0 {
                return Some(Err(()));
            }
            (len.saturating_sub(n), len.checked_sub(1)?)
        }
        (from, "") => (from.parse().ok()?, len.saturating_sub(1)),
        (from, to) => {
            let (from, to): (usize, usize) = (from.parse().ok()?, to.parse().ok()?);
            if to < from {
                return None;
            }
            (from, to.min(len.saturating_sub(1)))
        }
    };
    if first >= len {
        return Some(Err(()));
    }
    Some(Ok((first, last)))
}

fn ranged(
    entry: &Entry,
    range: Result<(usize, usize), ()>,
    now: Instant,
    word: &'static str,
) -> Response<RespBody> {
    let len = entry.body.len();
    let (status, body, content_range) = match range {
        Ok((first, last)) => (
            StatusCode::PARTIAL_CONTENT,
            entry.body.slice(first..=last),
            format!("bytes {first}-{last}/{len}"),
        ),
        Err(()) => (
            StatusCode::RANGE_NOT_SATISFIABLE,
            Bytes::new(),
            format!("bytes */{len}"),
        ),
    };
    let mut resp = with_head(entry, status, body.clone(), now, word);
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Ok(value) = HeaderValue::from_str(&content_range) {
        headers.insert(header::CONTENT_RANGE, value);
    }
    resp
}
