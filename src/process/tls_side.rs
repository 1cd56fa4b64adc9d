//! The TLS side of the proxy listeners, built at start: the acceptor over the watched
//! certificate directory (and ACME's TLS-ALPN-01 challenges), and HTTP/3 beside it on the
//! same port.

use std::sync::Arc;

use super::StartError;
use crate::config::acme_conf::Challenge;
use crate::config::MainConfig;
use crate::server;
use crate::vocab::acme_challenges::{Challenges, ACME_TLS_ALPN};

/// An HTTP/1.0 client's ALPN protocol, last in the server's preference: a client offering only
/// it was refused the handshake (no_application_protocol), which nginx accepts.
const HTTP_1_0: &[u8] = b"http/1.0";

/// HTTP/3's side (its UDP socket, the TLS listener's certificates), and `Alt-Svc` for the TLS
/// listener.
pub fn http3_side(
    socket: std::net::UdpSocket,
    previous_owner: Option<i32>,
    side: &mut server::TlsSide,
) -> server::H3Side {
    let port = socket.local_addr().map_or(0, |a| a.port());
    let alt_svc = format!("h3=\":{port}\"; ma=86400");
    // Bound already, the socket queues what comes until HTTP/3 reads it; after a live
    // upgrade it is offered once the previous instance has let go of it.
    let offered = Arc::new(std::sync::atomic::AtomicBool::new(previous_owner.is_none()));
    side.alt_svc = http::HeaderValue::from_str(&alt_svc)
        .ok()
        .map(|value| server::AltSvc {
            value,
            offered: offered.clone(),
        });
    server::H3Side {
        socket,
        resolver: side.resolver.clone(),
        hsts: side.hsts,
        previous_owner,
        offered,
    }
}

/// The TLS acceptor of the proxy listener: certificates from the watched directory, the grade's
/// suites, ALPN h2 + http/1.1. `None` when `proxy_address_tls` is not set.
pub fn tls_acceptor(
    main: &MainConfig,
    control: &tokio::runtime::Runtime,
    alpn_challenges: Option<Arc<Challenges>>,
    certificates: Option<LoadedCertificates>,
) -> Result<Option<server::TlsSide>, StartError> {
    let Some(LoadedCertificates { store, reload }) = certificates else {
        return Ok(None);
    };
    let resolver: Arc<dyn rustls::server::ResolvesServerCert> = match alpn_challenges {
        Some(challenges) => Arc::new(crate::tls::WithAcmeChallenges {
            inner: store.clone(),
            challenges,
        }),
        None => store.clone(),
    };
    let alpn: &[&[u8]] = if main
        .acme
        .as_ref()
        .is_some_and(|a| a.challenge == Challenge::TlsAlpn01)
    {
        &[b"h2", b"http/1.1", HTTP_1_0, ACME_TLS_ALPN]
    } else {
        &[b"h2", b"http/1.1", HTTP_1_0]
    };
    let resumption = crate::tls::Resumption::new()
        .map_err(|e| StartError::Config(format!("  TLS set-up: {e}\n")))?;
    store.ends_sessions_of(resumption.clone());
    let grade = main.proxy_tls_grade;
    let config = crate::tls::server_config(resolver.clone(), grade, alpn, resumption)
        .map_err(|e| StartError::Config(format!("  {e}\n")))?;
    control.spawn(crate::tls::watch(store, reload));
    Ok(Some(server::TlsSide {
        acceptor: tokio_rustls::TlsAcceptor::from(config),
        hsts: main.proxy_tls_grade == crate::config::main_conf::TlsGrade::High,
        resolver,
        alt_svc: None,
    }))
}

/// The proxy's certificates, read at start (before privileges are dropped: keys readable by
/// root only load, as nginx's master reads them), and the handle that reloads them on SIGHUP.
pub struct LoadedCertificates {
    store: Arc<crate::tls::CertStore>,
    reload: crate::tls::CertReload,
}

/// Reads the certificate directory when `proxy_address_tls` is set.
pub fn load_certificates(main: &MainConfig) -> Result<Option<LoadedCertificates>, StartError> {
    if main.proxy_address_tls.is_none() {
        return Ok(None);
    }
    let Some(dir) = &main.certificates_dir else {
        return Err(StartError::Config(
            "  proxy_address_tls needs a certificate directory: set proxy_certificates (or proxy_configs)\n".into(),
        ));
    };
    let (store, problems) = crate::tls::CertStore::open(dir);
    for problem in &problems {
        tracing::warn!("certificates: {problem}");
    }
    if store.is_empty() {
        tracing::warn!(
            "certificates: no usable pair in {}; TLS handshakes fail until one is added",
            dir.display()
        );
    } else {
        tracing::info!(
            "certificates: {} pair(s) from {}",
            store.len(),
            dir.display()
        );
    }
    Ok(Some(LoadedCertificates {
        store,
        reload: crate::tls::CertReload::new(),
    }))
}

impl LoadedCertificates {
    /// The directory's pairs.
    pub fn store(&self) -> &Arc<crate::tls::CertStore> {
        &self.store
    }

    /// What SIGHUP uses to reload them.
    pub fn reload(&self) -> crate::tls::CertReload {
        self.reload.clone()
    }

    /// Says which of the directory's files the process can no longer read, once it runs as
    /// `runuser`: the pairs loaded at start keep serving, but their renewals would not load.
    pub fn check_readable_after_privileges_drop(&self) {
        let unreadable = self.store.unreadable_files();
        if let Some(first) = unreadable.first() {
            tracing::warn!(
                "certificates: {} file(s) of {} cannot be read by the user this process runs as ({} first); the pairs read at start keep serving, but changes to them will not load",
                unreadable.len(),
                self.store.dir.display(),
                first.display()
            );
        }
    }
}
