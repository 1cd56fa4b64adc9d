//! What the backends' side tells of a request ([`TriedBackend`]): its id, for the warnings of
//! exchanges that fail (to find its access log line), and the backend it was with when it was
//! dropped: a request whose client left while its backend had not answered is logged with that
//! backend, as nginx logs `$upstream_addr` on a 499. Written only when an exchange is dropped
//! unfinished ([`WithBackend`]), so a request that gets its answer pays nothing but the guard.
//! And the backends exchanges failed with, and why, for the access log's `tried` (nginx's
//! `$upstream_addr` lists each backend a request went to): written only when one fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http::HeaderValue;

/// The request's id, and where a dropped exchange leaves its backend's label.
pub struct TriedBackend<'a> {
    request_id: &'a HeaderValue,
    left_with: Mutex<Option<Arc<str>>>,
    /// Each backend an exchange failed with, and why (empty: no allocation).
    failed: Mutex<Vec<(Arc<str>, &'static str)>>,
    /// `failed` has one: a request none failed for asks one load, not the lock.
    any_failed: AtomicBool,
}

impl<'a> TriedBackend<'a> {
    pub fn new(request_id: &'a HeaderValue) -> TriedBackend<'a> {
        TriedBackend {
            request_id,
            left_with: Mutex::new(None),
            failed: Mutex::new(Vec::new()),
            any_failed: AtomicBool::new(false),
        }
    }

    /// An exchange with the backend `label` failed, for `why` (metrics' `reason`).
    #[cold]
    pub fn failed_with(&self, label: &Arc<str>, why: &'static str) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.push((label.clone(), why));
        self.any_failed.store(true, Ordering::Relaxed);
    }

    /// The failed exchanges, as the access log's `tried` says them (`a (connect), b (reset)`);
    /// `None` when none failed.
    #[inline]
    pub fn failures(&self) -> Option<Box<str>> {
        if !self.any_failed.load(Ordering::Relaxed) {
            return None;
        }
        self.said_failures()
    }

    #[cold]
    fn said_failures(&self) -> Option<Box<str>> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_empty() {
            return None;
        }
        let said: Vec<String> = failed
            .iter()
            .map(|(label, why)| format!("{label} ({why})"))
            .collect();
        Some(said.join(", ").into_boxed_str())
    }

    /// The request's id as the log says it (`-` if it is no text).
    pub fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or("-")
    }

    fn note(&self, label: &Arc<str>) {
        let mut tried = self.left_with.lock().unwrap_or_else(|p| p.into_inner());
        *tried = Some(label.clone());
    }

    /// The backend an exchange was dropped with, if one was.
    pub fn take(&self) -> Option<Arc<str>> {
        self.left_with
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// One exchange with the backend `label`: dropped before [`WithBackend::done`], it leaves the
/// label in `tried`.
pub struct WithBackend<'a> {
    tried: Option<&'a TriedBackend<'a>>,
    label: &'a Arc<str>,
}

impl<'a> WithBackend<'a> {
    pub fn new(tried: Option<&'a TriedBackend<'a>>, label: &'a Arc<str>) -> WithBackend<'a> {
        WithBackend { tried, label }
    }

    /// The exchange finished (answered or failed): nothing to leave.
    pub fn done(self) {
        std::mem::forget(self);
    }
}

impl Drop for WithBackend<'_> {
    #[cold]
    fn drop(&mut self) {
        if let Some(tried) = self.tried {
            tried.note(self.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_exchanges_are_said_in_order() {
        let id = HeaderValue::from_static("r-1");
        let tried = TriedBackend::new(&id);
        assert_eq!(tried.failures(), None);
        let (a, b): (Arc<str>, Arc<str>) = ("10.0.0.1:80".into(), "[::1]:80".into());
        tried.failed_with(&a, "connect");
        tried.failed_with(&b, "reset");
        assert_eq!(
            tried.failures().as_deref(),
            Some("10.0.0.1:80 (connect), [::1]:80 (reset)")
        );
    }

    #[test]
    fn only_an_exchange_dropped_unfinished_leaves_its_backend() {
        let id = HeaderValue::from_static("r-1");
        let tried = TriedBackend::new(&id);
        assert_eq!(tried.request_id(), "r-1");
        let (a, b): (Arc<str>, Arc<str>) = ("10.0.0.1:80".into(), "10.0.0.2:80".into());
        WithBackend::new(Some(&tried), &a).done();
        assert_eq!(tried.take(), None);
        drop(WithBackend::new(Some(&tried), &b));
        assert_eq!(tried.take().as_deref(), Some("10.0.0.2:80"));
        assert_eq!(tried.take(), None, "taken once");
        drop(WithBackend::new(None, &a));
    }
}
