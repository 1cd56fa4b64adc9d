//! The built-in static file server (SPEC §10): GET/HEAD, content types, ranges, conditional
//! requests and `index.html` through tower-http's `ServeDir`; no listings, no dotfiles, no escape
//! from the folder. It runs on the control-plane runtime, off the proxy's workers.
//!
//! `ServeDir` speaks `Last-Modified`/`If-Modified-Since` only; this module adds a weak `ETag`
//! (size and modification time, as nginx does) and answers `If-None-Match` with 304.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::sync::watch;
use tower::ServiceExt;
use tower_http::services::ServeDir;

use crate::server::{AcceptLoop, ConnInfo, Limits};
use crate::vocab::normalise;

type FileBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Serves `folder` on `listener` through the common accept helper (its limits, timeouts and
/// drain), until `shutdown` turns true and its connections have drained.
pub async fn serve(
    listener: std::net::TcpListener,
    folder: PathBuf,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    let dir = ServeDir::new(folder).append_index_html_on_directories(true);
    let accept = AcceptLoop {
        name: "file server",
        listener,
        tls: None,
        limits,
        open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    };
    let make = move |_: ConnInfo| {
        let dir = dir.clone();
        service_fn(move |req: Request<Incoming>| {
            let dir = dir.clone();
            async move { Ok::<_, Infallible>(answer(dir, req).await) }
        })
    };
    accept.run(make, shutdown).await;
}

async fn answer(dir: ServeDir, req: Request<Incoming>) -> Response<FileBody> {
    if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
    }
    let path = normalise::path(req.uri().path());
    if path.split('/').any(|segment| segment.starts_with('.')) {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    }
    let mut req = req;
    let if_none_match = req.headers_mut().remove(header::IF_NONE_MATCH);
    if if_none_match.is_some() {
        // RFC 9110 §13.1.3: with If-None-Match, If-Modified-Since is ignored.
        req.headers_mut().remove(header::IF_MODIFIED_SINCE);
    }
    let mut resp = match dir.oneshot(req).await {
        Ok(resp) => resp.map(|b| b.map_err(std::io::Error::other).boxed_unsync()),
        Err(never) => match never {},
    };
    let Some(etag) = entity_tag(&resp) else {
        return resp;
    };
    if if_none_match.is_some_and(|v| etag_matches(&v, &etag)) {
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

/// A stable number for an HTTP date (FNV-1a of its text; only equality matters in a tag).
fn fold_date(date: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in date.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Weak comparison (RFC 9110 §8.8.3.2) against a comma-separated list, or `*`.
fn etag_matches(list: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(list) = list.to_str() else {
        return false;
    };
    let ours = etag.to_str().unwrap_or("").trim_start_matches("W/");
    list.split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == ours)
}

fn plain(status: StatusCode, text: &'static str) -> Response<FileBody> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}
