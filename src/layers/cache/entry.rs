//! One stored answer ([`Entry`]): its head, body, the `Vary` values it was stored for, and its
//! freshness and stale allowances; what every tier keeps and every answer is made from.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use tokio::time::Instant;

use super::rules::Storable;

/// One stored response.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The request's values of the headers `Vary` names, in `Vary`'s order.
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
    pub shared_with_auth: bool,
    pub stored_at: Instant,
    pub initial_age: Duration,
    pub fresh_for: Duration,
    /// Never served stale (`must-revalidate`, `no-cache`).
    pub must_revalidate: bool,
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
}

impl Entry {
    /// A stored answer with `storable`'s freshness, stored now.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        vary: Vec<(HeaderName, Option<HeaderValue>)>,
        storable: &Storable,
    ) -> Entry {
        Entry {
            status,
            headers,
            body,
            vary,
            shared_with_auth: storable.shared_with_auth,
            stored_at: Instant::now(),
            initial_age: storable.initial_age,
            fresh_for: storable.fresh_for,
            must_revalidate: storable.must_revalidate,
            stale_while_revalidate: storable.stale_while_revalidate,
            stale_if_error: storable.stale_if_error,
        }
    }

    /// How far past its freshness the entry is.
    pub fn staleness(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.stored_at)
            .saturating_sub(self.fresh_for)
    }

    /// May be served while one request refreshes it (RFC 5861 `stale-while-revalidate`).
    pub fn may_serve_while_updating(&self, now: Instant) -> bool {
        !self.must_revalidate && self.staleness(now) <= self.stale_while_revalidate
    }

    /// May be served when the backend fails (RFC 5861 `stale-if-error`, from the stored answer
    /// or the request).
    pub fn may_serve_on_error(&self, now: Instant, asked: Option<Duration>) -> bool {
        let allowance = self.stale_if_error.max(asked.unwrap_or_default());
        !self.must_revalidate && self.staleness(now) <= allowance
    }

    pub fn age(&self, now: Instant) -> Duration {
        self.initial_age + now.saturating_duration_since(self.stored_at)
    }

    pub fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored_at) < self.fresh_for
    }

    /// The request carries the same values of the `Vary` headers as the one stored.
    pub fn matches(&self, req: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| vary_value(req, name) == *value)
    }

    /// The request's values of the fields this entry's `Vary` names, as text: what tells one
    /// variant's fetch from another's ([`super::store::Found::OtherVariant`]).
    pub fn variant_of(&self, req: &HeaderMap) -> String {
        let mut variant = String::new();
        for (name, _) in &self.vary {
            variant.push_str(name.as_str());
            variant.push('=');
            if let Some(value) = vary_value(req, name) {
                variant.push_str(&String::from_utf8_lossy(value.as_bytes()));
            }
            variant.push('\n');
        }
        variant
    }

    pub fn weight(&self) -> u64 {
        let head: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 32)
            .sum();
        (self.body.len() + head + 256) as u64
    }
}

/// A request's value of a header `Vary` names: all its fields joined, as one value.
pub fn vary_value(req: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    joined(req.get_all(name).iter())
}

/// Several fields of one name as one value (`a, b`), the way `Vary` compares them.
fn joined<'a>(mut values: impl Iterator<Item = &'a HeaderValue>) -> Option<HeaderValue> {
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(first.clone());
    };
    let mut all = first.as_bytes().to_vec();
    for v in std::iter::once(second).chain(values) {
        all.extend_from_slice(b", ");
        all.extend_from_slice(v.as_bytes());
    }
    HeaderValue::from_bytes(&all).ok()
}

/// The request's headers as it was sent on, for the `Vary` values of the answer that comes back
/// (a list, not a map: copying it is a fraction of cloning a `HeaderMap`, and it is read once).
#[derive(Default)]
pub struct SentHeaders(Vec<(HeaderName, HeaderValue)>);

impl SentHeaders {
    pub fn of(headers: &HeaderMap) -> SentHeaders {
        SentHeaders(
            headers
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
        )
    }

    /// The request's value of `name`, its fields joined.
    pub fn vary_value(&self, name: &HeaderName) -> Option<HeaderValue> {
        joined(self.0.iter().filter(|(n, _)| n == name).map(|(_, v)| v))
    }
}
