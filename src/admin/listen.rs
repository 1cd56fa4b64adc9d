//! The admin API's sockets: its plain and TLS listeners, bound at start (before privileges
//! are dropped) or taken over from the running instance in a live upgrade, and the TLS one's
//! certificate.

use std::sync::Arc;

/// Why the admin API could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("config_tls_address needs config_tls_certificate and config_tls_key_file")]
    MissingTlsFiles,
    #[error("admin TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// The admin API's listeners (plain and TLS, when configured), the TLS one with its
/// certificate loaded: bound at start like the proxy's, before privileges are dropped.
pub struct AdminListeners(
    pub(super) Vec<(std::net::TcpListener, Option<tokio_rustls::TlsAcceptor>)>,
);

/// The admin API's bound listeners, and its TLS certificate to read again on SIGHUP.
pub struct AdminBound {
    pub listeners: AdminListeners,
    pub certificate: Option<Arc<crate::tls::OnePair>>,
}

impl AdminListeners {
    /// Each listener, and whether it is the TLS one: what a live upgrade hands over.
    pub fn to_hand_over(&self) -> impl Iterator<Item = (&std::net::TcpListener, bool)> {
        self.0.iter().map(|(l, tls)| (l, tls.is_some()))
    }

    /// The first listener's URL (`http://127.0.0.1:8081`), as its start logs it.
    pub fn first_url(&self) -> Option<String> {
        let (listener, tls) = self.0.first()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        Some(format!("{scheme}://{}", listener.local_addr().ok()?))
    }
}

/// Listeners received from the running instance in a live upgrade. Each is used instead of
/// binding anew when it is on the address configured now: a second socket bound beside it with
/// SO_REUSEPORT has its own accept queue, and the connections queued on the old one's are reset
/// when the old process closes it; the kernel also refuses that bind outright when the old
/// socket belongs to another user.
#[derive(Default)]
pub struct Inherited {
    pub plain: Option<std::net::TcpListener>,
    pub tls: Option<std::net::TcpListener>,
}

/// Binds the admin addresses (or takes the inherited listeners on them) and loads the TLS
/// one's certificate.
pub fn bind(
    main: &crate::config::MainConfig,
    inherited: Inherited,
) -> Result<AdminBound, AdminError> {
    let mut listeners = Vec::new();
    let mut certificate = None;
    if let Some(addr) = main.config_address {
        listeners.push((take_or_bind(main, addr, inherited.plain)?, None));
    }
    if let Some(addr) = main.config_tls_address {
        let (Some(cert), Some(key)) = (&main.config_tls_certificate, &main.config_tls_key_file)
        else {
            return Err(AdminError::MissingTlsFiles);
        };
        let (config, pair) = crate::tls::single_pair_config(cert, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        listeners.push((take_or_bind(main, addr, inherited.tls)?, Some(acceptor)));
        certificate = Some(pair);
    }
    Ok(AdminBound {
        listeners: AdminListeners(listeners),
        certificate,
    })
}

/// `inherited` when it listens on `addr`, else a listener bound on `addr`.
fn take_or_bind(
    main: &crate::config::MainConfig,
    addr: std::net::SocketAddr,
    inherited: Option<std::net::TcpListener>,
) -> Result<std::net::TcpListener, AdminError> {
    let bind_error = |source| AdminError::Bind { addr, source };
    let on_addr = |l: &std::net::TcpListener| {
        l.local_addr()
            .is_ok_and(|local| local == addr || (addr.port() == 0 && local.ip() == addr.ip()))
    };
    if let Some(listener) = inherited.filter(on_addr) {
        crate::server::listener::set_defer_accept(&listener, main.tcp.defer_accept)
            .map_err(bind_error)?;
        return Ok(listener);
    }
    // SO_REUSEPORT, like the proxy's listeners: during a live upgrade from a build that does not
    // hand the admin listeners over, the new process binds the same address while the old one
    // drains.
    let options = crate::server::ListenOptions {
        defer_accept: main.tcp.defer_accept,
        ..Default::default()
    };
    crate::server::bind_listeners(addr, 1, options)
        .and_then(|mut l| l.pop().ok_or_else(|| std::io::Error::other("no listener")))
        .map_err(bind_error)
}
