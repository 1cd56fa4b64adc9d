//! The built-in static file server (SPEC §10): GET/HEAD, content types, ranges, conditional
//! requests and `index.html` through tower-http's `ServeDir`; no listings, no dotfiles (however
//! encoded), no escape from the folder (symlinks that lead out of it are not followed), and
//! nothing but regular files (no FIFO, no device). It runs on the control-plane runtime, off the
//! proxy's workers.
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
    // Symlinks are checked against the real folder; resolved once here, off the request path.
    let root: Arc<std::path::Path> = std::fs::canonicalize(&folder)
        .unwrap_or(folder.clone())
        .into();
    let dir = ServeDir::new(folder).append_index_html_on_directories(true);
    let accept = AcceptLoop {
        name: "file server",
        listener,
        tls: None,
        limits,
        open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        parked: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        proxy_protocol: false,
    };
    let make = move |_: ConnInfo| {
        let (dir, root) = (dir.clone(), root.clone());
        service_fn(move |req: Request<ClientBody>| {
            let (dir, root) = (dir.clone(), root.clone());
            Box::pin(async move { Ok::<_, Infallible>(answer(dir, &root, req).await) })
        })
    };
    accept.run(make, shutdown).await;
}

async fn answer(
    dir: ServeDir,
    root: &std::path::Path,
    req: Request<ClientBody>,
) -> Response<FileBody> {
    if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
    }
    let Some(path) = visible_path(req.uri().path()) else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    if !servable(root, &path).await {
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
    let path = normalise::path(&decoded).into_owned();
    let hidden = path.split('/').any(|segment| segment.starts_with('.'));
    (!hidden).then_some(path)
}

/// Whether `path` under `root` may be handed to `ServeDir`: it resolves (through symlinks)
/// inside the folder's real location (resolved per request: the folder may be created or moved
/// while serving), and to a regular file or a directory whose `index.html`, if any, is one. A
/// FIFO or a device is not served (as nginx: "is not a regular file"): opening a FIFO blocks
/// until a writer comes, and each request for one held a thread of the blocking pool the
/// control plane shares (reloads and the admin API stalled once it was full). A path that does
/// not exist passes (`ServeDir` answers 404).
async fn servable(root: &std::path::Path, path: &str) -> bool {
    let candidate = root.join(path.trim_start_matches('/'));
    let Ok(real) = tokio::fs::canonicalize(&candidate).await else {
        return true;
    };
    let inside = match tokio::fs::canonicalize(root).await {
        Ok(real_root) => real.starts_with(real_root),
        Err(_) => false,
    };
    if !inside {
        return false;
    }
    match tokio::fs::metadata(&real).await {
        Ok(meta) if meta.is_dir() => match tokio::fs::metadata(real.join("index.html")).await {
            Ok(index) => index.is_file(),
            Err(_) => true,
        },
        Ok(meta) => meta.is_file(),
        Err(_) => true,
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
