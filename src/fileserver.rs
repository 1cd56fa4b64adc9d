//! The built-in static file server (SPEC §10): GET/HEAD, content types, ranges, conditional
//! requests and `index.html` through tower-http's `ServeDir`; no listings, no dotfiles (however
//! encoded), no escape from the folder (symlinks that lead out of it are not followed), and
//! nothing but regular files (no FIFO, no device). It runs on the control-plane runtime, off the
//! proxy's workers.
//!
//! `ServeDir` speaks `Last-Modified`/`If-Modified-Since` only; this module adds a weak `ETag`
//! (size and modification time, as nginx does), answers `If-None-Match` with 304, `If-Match`
//! and `If-Unmodified-Since` with 412, and hands `ServeDir` a `Range` only when it asks for one
//! satisfiable byte range that `If-Range` allows.

use std::borrow::Cow;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use tokio::sync::watch;
use tower::ServiceExt;
use tower_http::services::ServeDir;

use crate::server::{AcceptLoop, ConnInfo, Limits};
use crate::vocab::{normalise, ClientBody};

type FileBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Serves `folder` on `listener` through the common accept helper (its limits, timeouts and
/// drain), until `shutdown` turns true and its connections have drained.
pub async fn serve(
    listener: std::net::TcpListener,
    folder: PathBuf,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    let folder: Arc<std::path::Path> = folder.into();
    let accept = AcceptLoop {
        name: "file server",
        listener,
        tls: None,
        limits,
        open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        parked: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        proxy_protocol: false,
        per_client: None,
        refusals: None,
    };
    let make = move |_: ConnInfo| {
        let folder = folder.clone();
        service_fn(move |req: Request<ClientBody>| {
            let folder = folder.clone();
            Box::pin(async move { Ok::<_, Infallible>(answer(&folder, req).await) })
        })
    };
    accept.run(make, shutdown).await;
}

/// Answers `req` from `folder`, resolved for this request: the folder may be a symbolic link
/// that a deployment switches to another release ("current -> releases/42"), and the checks
/// and the file served must both be of the one it leads to now. Resolved once at start, the
/// checks looked in the old release while `ServeDir` served the new one, where a link out of
/// the folder was then followed.
async fn answer(folder: &std::path::Path, req: Request<ClientBody>) -> Response<FileBody> {
    if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
        let mut refused = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        // RFC 9110 §15.5.6: a 405 says what is allowed.
        let allow = http::HeaderValue::from_static("GET, HEAD");
        refused.headers_mut().insert(http::header::ALLOW, allow);
        return refused;
    }
    let mut req = req;
    // The path as routing reads it (dot segments resolved, `//` merged): `ServeDir` refused
    // `/a/../b` and redirected `//sub` to `//sub/`, another host to a browser.
    if let Cow::Owned(canonical) = normalise::path(req.uri().path()) {
        if set_path(&mut req, &canonical).is_err() {
            return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
        }
    }
    let Some(path) = visible_path(req.uri().path()) else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let Ok(root) = tokio::fs::canonicalize(folder).await else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let found = look_up(&root, &path).await;
    match &found {
        Found::Refused => return plain(StatusCode::NOT_FOUND, "404 Not Found\n"),
        Found::File(meta) => {
            if let Some(refused) = failed_precondition(req.headers(), meta) {
                return refused;
            }
            settle_range(req.headers_mut(), meta);
        }
        Found::Other => {}
    }
    let if_none_match = req.headers_mut().remove(header::IF_NONE_MATCH);
    if if_none_match.is_some() {
        // RFC 9110 §13.1.3: with If-None-Match, If-Modified-Since is ignored.
        req.headers_mut().remove(header::IF_MODIFIED_SINCE);
    }
    let dir = ServeDir::new(&root).append_index_html_on_directories(true);
    let mut resp = match dir.oneshot(req).await {
        Ok(resp) => resp.map(|b| b.map_err(std::io::Error::other).boxed_unsync()),
        Err(never) => match never {},
    };
    if resp.status() == StatusCode::NOT_MODIFIED {
        // `ServeDir`'s 304 to `If-Modified-Since` carries no validator: RFC 9110 §15.4.5 wants
        // the tag (and the date) a 200 would have carried.
        if let Found::File(meta) = &found {
            add_validators(&mut resp, meta);
        }
        return resp;
    }
    let Some(etag) = entity_tag(&resp) else {
        return resp;
    };
    if if_none_match.is_some_and(|v| crate::vocab::headers::etag_matches(&v, &etag)) {
        let mut not_modified = plain(StatusCode::NOT_MODIFIED, "");
        for name in [header::LAST_MODIFIED, header::CACHE_CONTROL] {
            if let Some(v) = resp.headers().get(&name) {
                not_modified.headers_mut().insert(name, v.clone());
            }
        }
        not_modified.headers_mut().insert(header::ETAG, etag);
        return not_modified;
    }
    resp.headers_mut().insert(header::ETAG, etag);
    resp
}

/// The request's path, fully percent-decoded and normalised, unless it names a dotfile or a
/// dot-directory in any segment, or carries an encoded separator (`%2F`, `%5C`) or a backslash
/// that could hide one from this check: then `None` (404). The check runs on what `ServeDir`
/// will open, not on the raw text.
fn visible_path(raw: &str) -> Option<String> {
    let lower = raw.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || raw.contains('\\') {
        return None;
    }
    // Not UTF-8 once decoded: there is nothing to serve.
    let decoded = String::from_utf8(normalise::percent_decode(raw)).ok()?;
    if decoded.contains('\\') {
        return None;
    }
    let path = normalise::remove_dot_segments(&decoded);
    let hidden = path.split('/').any(|segment| segment.starts_with('.'));
    (!hidden).then_some(path)
}

/// Puts `path` in place of `req`'s path, its query kept.
fn set_path<B>(req: &mut Request<B>, path: &str) -> Result<(), http::Error> {
    let target = match req.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    *req.uri_mut() = http::Uri::builder().path_and_query(target).build()?;
    Ok(())
}

/// What a request path leads to.
enum Found {
    /// Not to be served (404).
    Refused,
    /// A regular file, with what the conditions and ranges are checked against.
    File(std::fs::Metadata),
    /// Nothing (`ServeDir` answers 404), or a folder (its `index.html`, a regular file if any).
    Other,
}

/// What `path` under `root` (the folder's real location, resolved for this request) leads to.
/// It must resolve (through symlinks) inside `root`, to
/// a regular file (named without a trailing `/`) or a folder whose `index.html`, if any, is
/// one. A FIFO or a device is
/// refused (as nginx: "is not a regular file"): opening a FIFO blocks until a writer comes, and
/// each request for one held a thread of the blocking pool the control plane shares (reloads
/// and the admin API stalled once it was full).
async fn look_up(root: &std::path::Path, path: &str) -> Found {
    let candidate = root.join(path.trim_matches('/'));
    let Ok(real) = tokio::fs::canonicalize(&candidate).await else {
        return Found::Other;
    };
    if !real.starts_with(root) {
        return Found::Refused;
    }
    match tokio::fs::metadata(&real).await {
        Ok(meta) if meta.is_dir() => match tokio::fs::metadata(real.join("index.html")).await {
            Ok(index) if !index.is_file() => Found::Refused,
            // `/sub/` is its index.html: preconditions and ranges are the file's (`If-Match`
            // was ignored on a folder).
            Ok(index) if path.ends_with('/') => Found::File(index),
            _ => Found::Other,
        },
        // A file is not a folder (`ServeDir` served `/a.txt/` as `/a.txt`).
        Ok(meta) if meta.is_file() && path.ends_with('/') => Found::Refused,
        Ok(meta) if meta.is_file() => Found::File(meta),
        Ok(_) => Found::Refused,
        Err(_) => Found::Other,
    }
}

/// A 412 when `If-Match` or `If-Unmodified-Since` fails (RFC 9110 §13.1.1, §13.1.4; `ServeDir`
/// ignored both). The file's tags are weak, and `If-Match` compares strongly: only `*` matches.
fn failed_precondition(
    headers: &http::HeaderMap,
    meta: &std::fs::Metadata,
) -> Option<Response<FileBody>> {
    let failed = match headers.get(header::IF_MATCH) {
        Some(tags) => tags.as_bytes().trim_ascii() != b"*",
        None => headers
            .get(header::IF_UNMODIFIED_SINCE)
            .and_then(|date| httpdate::parse_http_date(date.to_str().ok()?).ok())
            .is_some_and(|date| modified_secs(meta).is_some_and(|m| m > date)),
    };
    failed.then(|| plain(StatusCode::PRECONDITION_FAILED, "412 Precondition Failed\n"))
}

/// When the file last changed, to the second (as `Last-Modified` says it).
fn modified_secs(meta: &std::fs::Metadata) -> Option<std::time::SystemTime> {
    let since = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs()))
}

/// Leaves `Range` for `ServeDir` only when it asks for one satisfiable range of this file
/// (RFC 9110 §14): dropped (the whole file, 200) when `If-Range` does not match (a tag never
/// does, ours being weak; a date must be the file's), when its unit is not `bytes`, when it
/// asks for several ranges, or when the file is empty; a suffix longer than the file is the
/// whole file. `ServeDir` answered 416 to most of these, and 206 to a stale `If-Range`.
fn settle_range(headers: &mut http::HeaderMap, meta: &std::fs::Metadata) {
    let Some(range) = headers.get(header::RANGE) else {
        return;
    };
    let keep = match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) => httpdate::parse_http_date(v.to_str().unwrap_or(""))
            .is_ok_and(|date| modified_secs(meta) == Some(date)),
    };
    let spec = range.to_str().ok().and_then(|r| r.split_once('='));
    let settled = match spec {
        Some((unit, set)) if keep && unit.trim().eq_ignore_ascii_case("bytes") => {
            let set = set.trim();
            let len = meta.len();
            match set.strip_prefix('-').map(str::parse::<u64>) {
                _ if set.contains(',') || len == 0 => None,
                Some(Ok(suffix)) if suffix > len => Some(format!("bytes=-{len}")),
                _ => Some(format!("bytes={set}")),
            }
        }
        _ => None,
    };
    match settled.and_then(|r| HeaderValue::from_str(&r).ok()) {
        Some(range) => drop(headers.insert(header::RANGE, range)),
        None => drop(headers.remove(header::RANGE)),
    }
}

/// `W/"<size>-<last-modified>"` for a successful file response (206 uses the full size).
fn entity_tag<B>(resp: &Response<B>) -> Option<HeaderValue> {
    if !matches!(resp.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT) {
        return None;
    }
    let headers = resp.headers();
    let modified = headers.get(header::LAST_MODIFIED)?.to_str().ok()?;
    let modified = fold_date(modified);
    let size = match headers.get(header::CONTENT_RANGE) {
        Some(range) => range.to_str().ok()?.rsplit('/').next()?.to_string(),
        None => headers
            .get(header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .to_string(),
    };
    HeaderValue::from_str(&format!("W/\"{size}-{modified:x}\"")).ok()
}

/// The `ETag` and `Last-Modified` a 200 for the file would carry, on a 304.
fn add_validators<B>(resp: &mut Response<B>, meta: &std::fs::Metadata) {
    let Ok(modified) = meta.modified() else {
        return;
    };
    let date = httpdate::fmt_http_date(modified);
    let tag = format!("W/\"{}-{:x}\"", meta.len(), fold_date(&date));
    let headers = resp.headers_mut();
    if let Ok(tag) = HeaderValue::from_str(&tag) {
        headers.insert(header::ETAG, tag);
    }
    if let Ok(date) = HeaderValue::from_str(&date) {
        headers.insert(header::LAST_MODIFIED, date);
    }
}

/// A stable number for an HTTP date (FNV-1a of its text; only equality matters in a tag).
fn fold_date(date: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in date.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn plain(status: StatusCode, text: &'static str) -> Response<FileBody> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_and_encoded_paths_are_refused() {
        for raw in [
            "/.env",
            "/sub/.git/config",
            "/sub%2F.env",
            "/sub%2f.git%2Fconfig",
            "/%2e%65nv",
            "/sub/%2Egit/config",
            "/a%5C..%5C.env",
            "/a\\.env",
            "/x/../.env",
        ] {
            assert_eq!(visible_path(raw), None, "{raw}");
        }
        assert_eq!(visible_path("/a/b.txt").as_deref(), Some("/a/b.txt"));
        assert_eq!(visible_path("/a%20b.txt").as_deref(), Some("/a b.txt"));
        assert_eq!(
            visible_path("/x/../index.html").as_deref(),
            Some("/index.html")
        );
    }
}
