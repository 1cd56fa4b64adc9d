//! ACME HTTP-01 challenges in flight (RFC 8555 §8.3): the ACME client puts each token's key
//! authorization here, and the router answers `GET /.well-known/acme-challenge/<token>` from
//! it before routing, so no route is needed and `to_https` hosts are answered too.

use std::collections::HashMap;
use std::sync::Mutex;

/// Where HTTP-01 challenges are asked.
pub const PREFIX: &str = "/.well-known/acme-challenge/";

/// Tokens and their key authorizations.
#[derive(Debug, Default)]
pub struct Challenges(Mutex<HashMap<String, String>>);

impl Challenges {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn put(&self, token: &str, key_authorization: &str) {
        self.map()
            .insert(token.to_string(), key_authorization.to_string());
    }

    pub fn remove(&self, token: &str) {
        self.map().remove(token);
    }

    /// The answer to a request for `path`, when it asks for a token in flight.
    pub fn answer(&self, path: &str) -> Option<String> {
        let token = path.strip_prefix(PREFIX)?;
        self.map().get(token).cloned()
    }
}
