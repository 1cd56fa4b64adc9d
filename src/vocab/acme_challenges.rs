//! ACME challenges in flight. HTTP-01 (RFC 8555 §8.3): the ACME client puts each token's key
//! authorization here, and the router answers `GET /.well-known/acme-challenge/<token>` from
//! it before routing, so no route is needed and `to_https` hosts are answered too. TLS-ALPN-01
//! (RFC 8737): the client puts a name's challenge certificate here, and the TLS listener serves
//! it to a handshake that offers only ALPN `acme-tls/1` for that name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::sign::CertifiedKey;

/// Where HTTP-01 challenges are asked.
pub const PREFIX: &str = "/.well-known/acme-challenge/";
/// The ALPN protocol of TLS-ALPN-01 handshakes.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Tokens and their key authorizations; names and their challenge certificates.
#[derive(Debug, Default)]
pub struct Challenges {
    http: Mutex<HashMap<String, String>>,
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl Challenges {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.http.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn certs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CertifiedKey>>> {
        self.alpn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `cert` to TLS-ALPN-01 handshakes for `name`.
    pub fn put_cert(&self, name: &str, cert: Arc<CertifiedKey>) {
        self.certs().insert(name.to_ascii_lowercase(), cert);
    }

    pub fn remove_cert(&self, name: &str) {
        self.certs().remove(&name.to_ascii_lowercase());
    }

    /// The challenge certificate for a TLS-ALPN-01 handshake naming `name`.
    pub fn cert_for(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.certs().get(&name.to_ascii_lowercase()).cloned()
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
