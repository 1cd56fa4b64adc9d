//! TLS: certificate store, server configs per grade (SPEC §7.2), and the directory watcher
//! ([`watch`]).
//!
//! rustls offers TLS 1.2 and 1.3 with AEAD suites only, so nothing weaker than TLS 1.2 is ever
//! offered whatever the grade.

mod index;
mod pem_text;
pub mod store;
mod watch;

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::{CipherSuite, ServerConfig};

use crate::config::main_conf::TlsGrade;
use crate::vocab::acme_challenges::{Challenges, ACME_TLS_ALPN};
pub use store::CertStore;
pub use watch::{watch, CertReload};

/// Why a TLS server config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0}")]
    Pair(#[from] store::PairError),
}

/// The crypto provider for a grade: `high` keeps TLS 1.3 and, for TLS 1.2, ECDHE with AES-256-GCM
/// or ChaCha20 only.
pub fn provider(grade: TlsGrade) -> CryptoProvider {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if grade == TlsGrade::High {
        provider.cipher_suites.retain(|suite| {
            let s = suite.suite();
            matches!(
                s,
                CipherSuite::TLS13_AES_256_GCM_SHA384
                    | CipherSuite::TLS13_AES_128_GCM_SHA256
                    | CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
                    | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
                    | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
                    | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                    | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            )
        });
    }
    provider
}

/// A server config resolving certificates through `resolver`, offering `alpn`, with session
/// tickets on so returning clients skip the full handshake: two after a full handshake and one
/// after a resumption (which replaces the ticket used), as nginx and HAProxy send through OpenSSL.
/// The tickets wait for the connection's first answer (or HTTP/2 SETTINGS) and leave in its
/// write, not in a write of their own (`vendor/rustls/PATCHED.md`, part 3).
pub fn server_config(
    resolver: Arc<dyn ResolvesServerCert>,
    grade: TlsGrade,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider(grade)))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.send_tls13_tickets_after_resumption = Some(1);
    config.defer_tls13_tickets = true;
    Ok(Arc::new(config))
}

/// A config serving one certificate/key pair (the admin API's `config_tls_*`).
pub fn single_pair_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let dir = cert.parent().unwrap_or(Path::new("."));
    let stem = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string()
    };
    let pair = if key.parent() == Some(dir) && stem(cert) == stem(key) {
        store::load_pair(dir, &stem(cert))?
    } else {
        store::load_pair_files(cert, key)?
    };
    server_config(
        Arc::new(OneCert(pair.key)),
        TlsGrade::Medium,
        &[b"h2", b"http/1.1"],
    )
}

/// Always the same certificate, whatever the SNI.
#[derive(Debug)]
struct OneCert(Arc<rustls::sign::CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Certificates from `inner`, except for a handshake that offers ALPN `acme-tls/1`, which gets
/// the TLS-ALPN-01 challenge certificate of its name (RFC 8737), or none.
#[derive(Debug)]
pub struct WithAcmeChallenges {
    pub inner: Arc<dyn ResolvesServerCert>,
    pub challenges: Arc<Challenges>,
}

impl ResolvesServerCert for WithAcmeChallenges {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let acme = hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN));
        if acme {
            return self.challenges.cert_for(hello.server_name()?);
        }
        self.inner.resolve(hello)
    }
}

#[cfg(test)]
mod tests;
