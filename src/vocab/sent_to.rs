//! Which backend a request was sent to, for a request that ends before its answer: the access
//! log line of a client that left (499) names the backend it was waiting on, as nginx logs
//! `$upstream_addr` then. Made only when the access log is on ([`SentTo`] rides on the request);
//! the balancer notes each backend it sends the request to.

use std::sync::{Arc, Mutex};

/// The last backend (its label) a request was sent to.
#[derive(Clone, Debug, Default)]
pub struct SentTo(Arc<Mutex<Option<Arc<str>>>>);

impl SentTo {
    /// The request goes to the backend labelled `label` now.
    pub fn note(&self, label: &Arc<str>) {
        if let Ok(mut sent) = self.0.lock() {
            *sent = Some(label.clone());
        }
    }

    /// The backend the request went to last, if any.
    pub fn last(&self) -> Option<Arc<str>> {
        self.0.lock().ok().and_then(|sent| sent.clone())
    }
}
