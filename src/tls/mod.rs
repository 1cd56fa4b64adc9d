//! TLS: certificate store, server configs per grade (SPEC §7.2), and the directory watcher
//! ([`watch`]).
//!
//! rustls offers TLS 1.2 and 1.3 with AEAD suites only, so nothing weaker than TLS 1.2 is ever
//! offered whatever the grade.

mod index;
mod pem_text;
mod resumption;
pub mod store;
mod watch;

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::{CipherSuite, ServerConfig};

use crate::config::main_conf::TlsGrade;
use crate::vocab::acme_challenges::{Challenges, ACME_TLS_ALPN};
pub use resumption::Resumption;
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
    resumption: Arc<Resumption>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider(grade)))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.ticketer = resumption.clone();
    config.session_storage = resumption;
    config.send_tls13_tickets_after_resumption = Some(1);
    config.defer_tls13_tickets = true;
    Ok(Arc::new(config))
}

/// A config serving one certificate/key pair (the admin API's `config_tls_*`), and the pair,
/// to read again on SIGHUP.
pub fn single_pair_config(
    cert: &Path,
    key: &Path,
) -> Result<(Arc<ServerConfig>, Arc<OnePair>), TlsError> {
    let pair = Arc::new(OnePair::load(cert, key)?);
    let alpn: &[&[u8]] = &[b"h2", b"http/1.1"];
    let config = server_config(pair.clone(), TlsGrade::Medium, alpn, Resumption::new()?)?;
    Ok((config, pair))
}

/// One certificate, whatever the SNI, read from its two files at start and again on
/// [`OnePair::reload`] (SIGHUP, as certbot's deploy hook sends after a renewal).
#[derive(Debug)]
pub struct OnePair {
    files: (std::path::PathBuf, std::path::PathBuf),
    serving: arc_swap::ArcSwap<rustls::sign::CertifiedKey>,
}

impl OnePair {
    fn load(cert: &Path, key: &Path) -> Result<OnePair, store::PairError> {
        let pair = store::load_pair_files(cert, key)?;
        Ok(OnePair {
            files: (cert.to_path_buf(), key.to_path_buf()),
            serving: arc_swap::ArcSwap::new(pair.key),
        })
    }

    /// Reads the two files again. A pair that does not load leaves the one serving in place;
    /// whether the certificate changed.
    pub fn reload(&self) -> Result<bool, store::PairError> {
        let pair = store::load_pair_files(&self.files.0, &self.files.1)?;
        let changed = pair.key.cert != self.serving.load().cert;
        self.serving.store(pair.key);
        Ok(changed)
    }
}

impl ResolvesServerCert for OnePair {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.serving.load_full())
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
