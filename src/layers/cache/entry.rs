//! One stored answer ([`Entry`]): its head, body, the `Vary` values it was stored for, and its
//! freshness and stale allowances; what every tier keeps and every answer is made from.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use tokio::time::Instant;

use super::rules::Storable;
use crate::vocab::qvalue;

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
    as_compared(name, joined(req.get_all(name).iter()))
}

/// The value `Vary` compares for `name`: `Accept-Encoding` as the codings it accepts and
/// refuses (every spelling of one choice one variant: `gzip, deflate`, `deflate, gzip` and
/// `gzip, x1` each had an entry of their own, and junk values pushed the browsers' out),
/// any other field as written.
fn as_compared(name: &HeaderName, value: Option<HeaderValue>) -> Option<HeaderValue> {
    match value {
        Some(value) if name == header::ACCEPT_ENCODING => Some(accepted_codings(&value)),
        other => other,
    }
}

/// The content codings registered with IANA (RFC 9110 §8.4.1), and `*`: a coding outside them
/// is one no backend answers with, and is left out of the comparison.
const CODINGS: [&str; 14] = [
    "*",
    "aes128gcm",
    "br",
    "compress",
    "dcb",
    "dcz",
    "deflate",
    "exi",
    "gzip",
    "identity",
    "pack200-gzip",
    "x-compress",
    "x-gzip",
    "zstd",
];

/// `Accept-Encoding` as the sorted codings it accepts, and those it refuses (`q=0`) marked
/// `-`: two requests alike here accept the same answers (RFC 9110 §12.5.3), whatever their
/// order, spacing, case, weights or unknown codings.
fn accepted_codings(value: &HeaderValue) -> HeaderValue {
    // Not text: compression reads no coding in it, and neither does this.
    let Ok(text) = value.to_str() else {
        return HeaderValue::from_static("");
    };
    // (refused, coding): no string made a coding.
    let mut said: Vec<(bool, &'static str)> = Vec::new();
    for item in text.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let Some(known) = CODINGS.iter().find(|c| c.eq_ignore_ascii_case(coding)) else {
            continue;
        };
        // Read as compression reads it: an item whose weight is malformed is not there.
        let Some(q) = qvalue::quality(parts) else {
            continue;
        };
        said.push((q == 0, known));
    }
    said.sort_unstable();
    said.dedup();
    let mut compared = String::new();
    for (refused, coding) in said {
        if !compared.is_empty() {
            compared.push(',');
        }
        if refused {
            compared.push('-');
        }
        compared.push_str(coding);
    }
    HeaderValue::from_str(&compared).unwrap_or_else(|_| HeaderValue::from_static(""))
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

    /// The request's value of `name`, its fields joined, as `Vary` compares it.
    pub fn vary_value(&self, name: &HeaderName) -> Option<HeaderValue> {
        let value = joined(self.0.iter().filter(|(n, _)| n == name).map(|(_, v)| v));
        as_compared(name, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compared(value: &'static str) -> HeaderValue {
        let mut req = HeaderMap::new();
        req.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(value));
        vary_value(&req, &header::ACCEPT_ENCODING).expect("a value")
    }

    /// Every spelling of one choice of codings is one variant; a different choice is another.
    #[test]
    fn accept_encoding_is_compared_by_the_codings_it_accepts() {
        let gzip_deflate = compared("gzip, deflate");
        for same in [
            "deflate, gzip",
            "GZIP,deflate",
            "gzip;q=0.5, deflate, x1",
            "gzip, deflate, x$9",
        ] {
            assert_eq!(compared(same), gzip_deflate, "{same}");
        }
        assert_eq!(compared("gzip, x1"), compared("gzip"));
        assert_ne!(compared("gzip"), gzip_deflate);
        assert_ne!(
            compared("gzip, br;q=0"),
            compared("gzip"),
            "a refusal counts"
        );
        assert_ne!(compared("gzip, identity;q=0"), compared("gzip"));
        assert_eq!(
            compared("x1").as_bytes(),
            b"",
            "junk alone accepts what no coding at all does"
        );
        // A weight compression cannot read leaves the item out, as compression does.
        assert_eq!(
            compared("gzip;q=0.0001, br;q=-0, zstd;q=1e-9"),
            compared("")
        );
        assert_ne!(compared("gzip;q=0.0001"), compared("gzip"));
        // Other fields are compared as written.
        let mut req = HeaderMap::new();
        req.insert(header::ACCEPT_LANGUAGE, HeaderValue::from_static("fr, en"));
        let lang = vary_value(&req, &header::ACCEPT_LANGUAGE).expect("a value");
        assert_eq!(lang, "fr, en");
    }
}
