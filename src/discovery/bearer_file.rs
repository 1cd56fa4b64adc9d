//! The Kubernetes API token, read from `kubernetes.tokenpath` as a layer under kube's client:
//! `Authorization: Bearer <token>` on each request, the file read again at most once a minute
//! (service-account tokens rotate) and whenever it could not be read. Its text is trimmed (a
//! token written with `echo` ends in a newline, which kube's own reading put in the header and
//! failed every request with "invalid bearer token"), and a missing file is not an error at
//! start (kube's refused to build a client, and discovery stayed off for good): requests go
//! without a token, the API server's 401 is logged, and the file is looked for again.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{header, HeaderValue, Request};
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::config::file_bytes::read_regular;

/// How long a token read is used before the file is read again.
const REREAD_AFTER: Duration = Duration::from_secs(60);
/// The largest token file read (service-account tokens are a few KiB).
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The token read last, and when.
#[derive(Default)]
struct Read {
    bearer: Option<HeaderValue>,
    at: Option<Instant>,
}

#[derive(Clone)]
pub struct BearerFileLayer {
    path: Arc<PathBuf>,
    read: Arc<Mutex<Read>>,
}

impl BearerFileLayer {
    pub fn new(path: PathBuf) -> BearerFileLayer {
        BearerFileLayer {
            path: Arc::new(path),
            read: Arc::default(),
        }
    }

    /// The `Authorization` value, read again when stale or missing.
    fn bearer(&self) -> Option<HeaderValue> {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = read.at.is_some_and(|at| at.elapsed() < REREAD_AFTER);
        if !(fresh && read.bearer.is_some()) {
            read.bearer = bearer_of(&read_regular(&self.path, MAX_TOKEN_BYTES).ok()?);
            read.at = Some(Instant::now());
        }
        read.bearer.clone()
    }
}

/// `Bearer <token>` from a token file's bytes, trimmed; `None` when empty or not a header value.
fn bearer_of(bytes: &[u8]) -> Option<HeaderValue> {
    let token = std::str::from_utf8(bytes).ok()?.trim();
    if token.is_empty() {
        return None;
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

impl<S> Layer<S> for BearerFileLayer {
    type Service = BearerFile<S>;

    fn layer(&self, inner: S) -> BearerFile<S> {
        BearerFile {
            inner,
            token: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct BearerFile<S> {
    inner: S,
    token: BearerFileLayer,
}

impl<S, B> Service<Request<B>> for BearerFile<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if let Some(bearer) = self.token.bearer() {
            req.headers_mut().insert(header::AUTHORIZATION, bearer);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_trimmed_and_an_empty_one_is_none() {
        let bearer = bearer_of(b"abc.def\n").expect("a token");
        assert_eq!(bearer, "Bearer abc.def");
        assert!(bearer.is_sensitive());
        assert!(bearer_of(b" \n").is_none());
        assert!(bearer_of(b"a\nb").is_none());
    }

    /// A file missing at first is looked for again at the next request.
    #[tokio::test(start_paused = true)]
    async fn a_missing_file_is_read_once_it_appears() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("token");
        let layer = BearerFileLayer::new(path.clone());
        assert!(layer.bearer().is_none());
        std::fs::write(&path, "t1\n").expect("written");
        assert_eq!(layer.bearer().expect("read"), "Bearer t1");
        std::fs::write(&path, "t2").expect("written");
        assert_eq!(layer.bearer().expect("cached"), "Bearer t1");
        tokio::time::advance(REREAD_AFTER).await;
        assert_eq!(layer.bearer().expect("read again"), "Bearer t2");
    }
}
