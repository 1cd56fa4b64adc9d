//! The built-in static file server (SPEC §10): GET/HEAD, content types, ranges, conditional
//! requests and `index.html`; no listings, no dotfiles (however encoded), no escape from the
//! folder (symlinks that lead out of it are not followed), and nothing but regular files (no
//! FIFO, no device). It runs on the control-plane runtime, off the proxy's workers.
//!
//! Each file is opened here first (without blocking), checked as opened (a regular file, really
//! inside the folder), and handed to tower-http's `ServeFile` as `/proc/self/fd/N`: the same
//! file, whatever its name leads to by the time it is served. Checked by name and served by name
//! again, a link swapped in between served a file outside the folder, and a FIFO swapped in held
//! a thread for good.
//!
//! `ServeFile` speaks `Last-Modified`/`If-Modified-Since` only; this module adds a strong `ETag`
//! (size and modification time, as nginx's), answers `If-None-Match` with 304, `If-Match`
//! and `If-Unmodified-Since` with 412, and hands `ServeFile` a `Range` only when it asks for one
//! satisfiable byte range that `If-Range` allows (the file's date, or its tag: a download is
//! resumed either way).

use std::borrow::Cow;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use std::os::fd::AsRawFd;
use tokio::sync::watch;
use tower::ServiceExt;

use tower_http::services::ServeFile;

use crate::accesslog::{AccessLog, Record};
use crate::server::{AcceptLoop, ConnInfo, Limits};
use crate::vocab::{normalise, ClientBody};

type FileBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Serves `folder` on `listener` through the common accept helper (its limits, timeouts and
/// drain), until `shutdown` turns true and its connections have drained.
pub async fn serve(
    listener: std::net::TcpListener,
    folder: PathBuf,
    (limits, access_log): (Limits, AccessLog),
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
    let make = move |conn: ConnInfo| {
        let (folder, access_log) = (folder.clone(), access_log.clone());
        service_fn(move |req: Request<ClientBody>| {
            let folder = folder.clone();
            let client = conn.peer.ip();
            let mut record = access_log.begin(client, &conn.tls_facts, &req, Instant::now());
            // Asked through the proxy, its line and the proxy's share the request's id.
            if let Some(id) = req.headers().get("x-request-id") {
                record.request_id(id);
            }
            let head = req.method() == http::Method::HEAD;
            let asked = format!("{:?} for {client}", req.uri().path());
            Box::pin(async move {
                let answered = answer(&folder, req).await;
                Ok::<_, Infallible>(logged(answered, record, head, asked))
            })
        })
    };
    accept.run(make, shutdown).await;
}

/// `resp` with its access log line: written when its body ends (or the client leaves), as the
/// proxy's are. The file server's requests were in no log.
fn logged(
    resp: Response<FileBody>,
    mut record: Record,
    head: bool,
    asked: String,
) -> Response<FileBody> {
    record.respond(resp.status().as_u16(), None, (None, Instant::now()));
    let sends_a_file = matches!(resp.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT);
    let declared = resp.headers().get(header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let remaining = declared.filter(|_| sends_a_file && !head);
    resp.map(|inner| {
        let file = LoggedFile {
            inner,
            record,
            remaining,
            asked,
        };
        file.boxed_unsync()
    })
}

/// A file server answer's body, counting its bytes for the access log, and ending where its
/// `Content-Length` says: a file that grows while it is sent is read to its end, and the bytes
/// past the length the head declared broke the connection (and lost the answer's tail) where
/// nginx sends exactly what it declared.
struct LoggedFile {
    inner: FileBody,
    record: Record,
    remaining: Option<u64>,
    /// The file's path and the client, for the warning a file that shrank gets.
    asked: String,
}

impl http_body::Body for LoggedFile {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.remaining == Some(0) {
            return Poll::Ready(None);
        }
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(mut data) = frame.into_data() else {
                    return Poll::Ready(None);
                };
                if let Some(remaining) = &mut this.remaining {
                    data.truncate(usize::try_from(*remaining).unwrap_or(usize::MAX));
                    *remaining -= data.len() as u64;
                }
                this.record.add_bytes(data.len());
                Poll::Ready(Some(Ok(http_body::Frame::data(data))))
            }
            Poll::Ready(None) => {
                if let Some(short) = this.remaining.filter(|&r| r > 0) {
                    let asked = &this.asked;
                    tracing::warn!("file server: {asked} ended {short} bytes short of the length its answer declared (the file shrank while it was sent); the answer is cut");
                    let shrank = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was sent",
                    );
                    return Poll::Ready(Some(Err(shrank)));
                }
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.remaining {
            Some(exact) => http_body::SizeHint::with_exact(exact),
            None => self.inner.size_hint(),
        }
    }
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
    // `/100%.txt` is no path (a `%` not followed by two hex digits): the proxy and nginx
    // answer 400, and so does this server (it served the file named so).
    if normalise::has_malformed_escape(req.uri().path().as_bytes()) {
        return plain(StatusCode::BAD_REQUEST, "400 Bad Request\n");
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
    let opened = match look_up(&root, &path).await {
        Found::Refused => return plain(StatusCode::NOT_FOUND, "404 Not Found\n"),
        Found::Forbidden => return plain(StatusCode::FORBIDDEN, "403 Forbidden\n"),
        Found::Folder => return to_folder(req.uri()),
        Found::File(opened) => opened,
    };
    let tag = file_tag(&opened.meta);
    if let Some(refused) = failed_precondition(req.headers(), &opened.meta, tag.as_ref()) {
        return refused;
    }
    settle_range(req.headers_mut(), &opened.meta, tag.as_ref());
    let if_none_match = req.headers_mut().remove(header::IF_NONE_MATCH);
    if if_none_match.is_some() {
        // RFC 9110 §13.1.3: with If-None-Match, If-Modified-Since is ignored.
        req.headers_mut().remove(header::IF_MODIFIED_SINCE);
    }
    // The file opened and checked, not its name again: `/proc/self/fd/N` opens the same file
    // whatever its name leads to by now (a link swapped out of the folder, a FIFO renamed over
    // it: both got through a check made by name and an open made by name again).
    let mime = mime_guess::from_path(&opened.name).first_or_octet_stream();
    let same_file = format!("/proc/self/fd/{}", opened.file.as_raw_fd());
    let serve = ServeFile::new_with_mime(same_file, &mime);
    let mut resp = match serve.oneshot(req).await {
        Ok(resp) => resp.map(|b| b.map_err(std::io::Error::other).boxed_unsync()),
        Err(never) => match never {},
    };
    let found = opened;
    if resp.status() == StatusCode::NOT_MODIFIED {
        // `ServeFile`'s 304 to `If-Modified-Since` carries no validator: RFC 9110 §15.4.5 wants
        // the tag (and the date) a 200 would have carried.
        add_validators(&mut resp, &found.meta);
        return resp;
    }
    drop(found);
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
/// that could hide one from this check: then `None` (404). The check runs on what is
/// opened, not on the raw text.
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
    /// Not to be served (404): nothing there, a dotfile, a way out of the folder, a FIFO, a
    /// device, a name too long.
    Refused,
    /// There, but this process may not read it (403, as nginx: "Permission denied").
    Forbidden,
    /// A folder named without its trailing `/`: a 307 to it, as nginx's 301 (a folder without
    /// an `index.html` is then a 404: no listings).
    Folder,
    /// A regular file inside the folder, opened.
    File(Box<Opened>),
}

/// A file opened for a request, and checked after the open: a regular file, inside the folder.
struct Opened {
    file: std::fs::File,
    meta: std::fs::Metadata,
    /// Its name as asked (for its content type).
    name: PathBuf,
}

/// What `path` under `root` (the folder's real location, resolved for this request) leads to:
/// a regular file (named without a trailing `/`), or a folder's `index.html` (named with one).
/// The file is opened first and checked after: the open does not block (a FIFO opens at once)
/// and what the descriptor is, and where it really is (`/proc/self/fd`), decide. A FIFO or a
/// device is refused (as nginx: "is not a regular file"): opening a FIFO blocks until a writer
/// comes, and each request for one held a thread of the blocking pool the control plane shares.
async fn look_up(root: &std::path::Path, path: &str) -> Found {
    let candidate = root.join(path.trim_matches('/'));
    let (root, asked) = (root.to_path_buf(), path.to_string());
    let looked = tokio::task::spawn_blocking(move || open_checked(&root, candidate, &asked));
    looked.await.unwrap_or(Found::Refused)
}

fn open_checked(root: &std::path::Path, candidate: PathBuf, asked: &str) -> Found {
    use std::os::unix::fs::OpenOptionsExt;
    let folder = std::fs::metadata(&candidate).is_ok_and(|m| m.is_dir());
    let name = match (folder, asked.ends_with('/')) {
        (true, true) => candidate.join("index.html"),
        // Only a folder inside: a redirect would say a link out of it leads somewhere.
        (true, false) if std::fs::canonicalize(&candidate).is_ok_and(|r| r.starts_with(root)) => {
            return Found::Folder
        }
        (true, false) => return Found::Refused,
        // A file is not a folder (`/a.txt/` is not `/a.txt`).
        (false, true) => return Found::Refused,
        (false, false) => candidate,
    };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags::NONBLOCK | libc_flags::NOCTTY)
        .open(&name);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::warn!("file server: {}: {e}", name.display());
            return Found::Forbidden;
        }
        Err(_) => return Found::Refused,
    };
    let Ok(meta) = file.metadata() else {
        return Found::Refused;
    };
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // Where it really is, dotfiles again: a link named `env.txt` to `.env`, or `git` to `.git`,
    // served what the request's own name could not reach.
    let visible = |real: &std::path::Path| {
        let below = real
            .strip_prefix(root)
            .into_iter()
            .flat_map(|p| p.components());
        !below
            .into_iter()
            .any(|part| part.as_os_str().as_encoded_bytes().starts_with(b"."))
    };
    let inside = real.is_ok_and(|real| real.starts_with(root) && visible(&real));
    match meta.is_file() && inside {
        true => Found::File(Box::new(Opened { file, meta, name })),
        false => Found::Refused,
    }
}

/// `open(2)` flags: a FIFO opens without waiting for a writer; a terminal does not become the
/// process's.
mod libc_flags {
    pub const NONBLOCK: i32 = nix::fcntl::OFlag::O_NONBLOCK.bits();
    pub const NOCTTY: i32 = nix::fcntl::OFlag::O_NOCTTY.bits();
}

/// A 307 from a folder named without its `/` to the folder (its query kept).
fn to_folder(uri: &http::Uri) -> Response<FileBody> {
    let mut location = format!("{}/", uri.path());
    if let Some(query) = uri.query() {
        location.push('?');
        location.push_str(query);
    }
    let mut resp = plain(StatusCode::TEMPORARY_REDIRECT, "");
    if let Ok(location) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, location);
    }
    resp
}

/// A 412 when `If-Match` or `If-Unmodified-Since` fails (RFC 9110 §13.1.1, §13.1.4; `ServeFile`
/// ignored both). `If-Match` compares strongly: `*`, or the file's own `tag` unweakened.
fn failed_precondition(
    headers: &http::HeaderMap,
    meta: &std::fs::Metadata,
    tag: Option<&HeaderValue>,
) -> Option<Response<FileBody>> {
    let failed = match headers.get(header::IF_MATCH) {
        Some(tags) => {
            let any = tags.as_bytes().trim_ascii() == b"*";
            !any && !tag.is_some_and(|tag| lists_strongly(tags, tag))
        }
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

/// Leaves `Range` for `ServeFile` only when it asks for one satisfiable range of this file
/// (RFC 9110 §14): dropped (the whole file, 200) when `If-Range` does not match (a tag must be
/// the file's `tag`, compared strongly; a date must be the file's), when its unit is not
/// `bytes`, when it asks for several ranges, or when the file is empty; a suffix longer than the
/// file is the whole file. `ServeDir` (which served files before) answered 416 to most of these, and 206 to a stale `If-Range`.
fn settle_range(
    headers: &mut http::HeaderMap,
    meta: &std::fs::Metadata,
    tag: Option<&HeaderValue>,
) {
    let Some(range) = headers.get(header::RANGE) else {
        return;
    };
    let keep = match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) if v.as_bytes().starts_with(b"\"") => tag.is_some_and(|tag| v == tag),
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

/// `"<size>-<last-modified>"` for a successful file response (206 uses the full size): strong,
/// as nginx's, so a download resumes on it (`If-Range`) and `If-Match` can match it. The
/// response's own date and size, not the file's as first opened: the tag is the body's.
fn entity_tag<B>(resp: &Response<B>) -> Option<HeaderValue> {
    if !matches!(resp.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT) {
        return None;
    }
    let headers = resp.headers();
    let modified = headers.get(header::LAST_MODIFIED)?.to_str().ok()?;
    let size = match headers.get(header::CONTENT_RANGE) {
        Some(range) => range.to_str().ok()?.rsplit('/').next()?,
        None => headers.get(header::CONTENT_LENGTH)?.to_str().ok()?,
    };
    tag_of(size, modified)
}

/// The file's tag as [`entity_tag`] makes it, from the file as opened.
fn file_tag(meta: &std::fs::Metadata) -> Option<HeaderValue> {
    let date = httpdate::fmt_http_date(meta.modified().ok()?);
    tag_of(meta.len(), &date)
}

/// A file's tag from its size and its `Last-Modified` text.
fn tag_of(size: impl std::fmt::Display, date: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("\"{size}-{:x}\"", fold_date(date))).ok()
}

/// Whether a list of tags (`If-Match`) names `tag` itself: strong comparison, a weak one never.
fn lists_strongly(tags: &HeaderValue, tag: &HeaderValue) -> bool {
    let tag = tag.as_bytes();
    tags.as_bytes()
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii() == tag)
}

/// The `ETag` and `Last-Modified` a 200 for the file would carry, on a 304.
fn add_validators<B>(resp: &mut Response<B>, meta: &std::fs::Metadata) {
    let Ok(modified) = meta.modified() else {
        return;
    };
    let headers = resp.headers_mut();
    if let Some(tag) = file_tag(meta) {
        headers.insert(header::ETAG, tag);
    }
    if let Ok(date) = HeaderValue::from_str(&httpdate::fmt_http_date(modified)) {
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
    // A HEAD gets the length its GET would; a 304 says none (it would be the file's).
    if status != StatusCode::NOT_MODIFIED {
        let length = HeaderValue::from(text.len());
        resp.headers_mut().insert(header::CONTENT_LENGTH, length);
    }
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
