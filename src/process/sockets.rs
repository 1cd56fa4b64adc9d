//! Every listening socket the process needs, bound or inherited before privileges are dropped:
//! the proxy's listeners (SO_REUSEPORT, or one shared socket: `tcp.so_reuseport`), the file
//! server's, and `upgrade_sock`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::upgrade::{self, Offer, Sockets, UpgradeError, UpgradeSock};
use super::StartError;
use crate::config::MainConfig;
use crate::server;

/// The sockets of a starting process.
pub struct Bound {
    pub http: Vec<TcpListener>,
    /// The TLS listeners (one per worker), when `proxy_address_tls` is set.
    pub tls: Vec<TcpListener>,
    pub files: Option<(TcpListener, PathBuf)>,
    pub upgrade_sock: Option<UpgradeSock>,
    /// Duplicates of every listener, handed to a new process on a live upgrade.
    pub offer: Offer,
    /// HTTP/3's UDP socket (`http3: true`), on the TLS listener's address.
    pub quic: Option<std::net::UdpSocket>,
    /// The process the QUIC socket came from on a live upgrade: it reads the socket until it
    /// exits, and two readers would split each connection's packets between them.
    pub quic_owner: Option<i32>,
}

/// Binds (or, with `upgrade`, receives from the running instance) every listener.
pub fn open(main: &MainConfig, upgrade: bool) -> Result<Bound, StartError> {
    let mut inherited = if upgrade {
        match upgrade::receive(&main.upgrade_sock) {
            Ok(sockets) => {
                tracing::info!(
                    "live upgrade: received {:?} from the running instance",
                    sockets.names()
                );
                sockets
            }
            // Nobody answers (the old process is already gone: systemd's reload that stops it
            // first): start as a fresh instance would, binding every port.
            Err(UpgradeError::Connect { path, source }) => {
                tracing::warn!(
                    "live upgrade: no running instance answers on {path} ({source}); binding the listeners afresh"
                );
                Sockets::default()
            }
            Err(e) => return Err(StartError::Upgrade(e)),
        }
    } else {
        if let Some(why) = super::single::another_instance(main) {
            return Err(StartError::AlreadyRunning(why));
        }
        Sockets::default()
    };
    let mut http = inherited.take(upgrade::HTTP);
    defer_accepts(main, &http)?;
    if http.is_empty() {
        http = server::bind_listeners(main.proxy_address_http, main.threads, listen_options(main))
            .map_err(|source| bind_error(main.proxy_address_http, source))?;
    } else if http.len() != main.threads {
        tracing::warn!(
            "live upgrade: {} inherited listeners, threads is {}; running {} workers (one per listener)",
            http.len(),
            main.threads,
            http.len()
        );
    }
    let mut tls = inherited.take(upgrade::TLS);
    defer_accepts(main, &tls)?;
    if let Some(addr) = main.proxy_address_tls {
        if tls.is_empty() {
            tls = server::bind_listeners(addr, http.len(), listen_options(main))
                .map_err(|source| bind_error(addr, source))?;
        }
    }
    let files = file_server(main, &mut inherited)?;
    let (quic, quic_owner) = quic_socket(main, &tls, &mut inherited)?;
    if !inherited.names().is_empty() {
        tracing::warn!(
            "live upgrade: unused inherited sockets {:?}",
            inherited.names()
        );
    }
    let upgrade_sock = match UpgradeSock::bind(&main.upgrade_sock) {
        Ok(sock) => Some(sock),
        Err(e) => {
            tracing::warn!("{e}; live upgrade of this process will not be possible");
            None
        }
    };
    let offer = offer(&http, &tls, files.as_ref().map(|(l, _)| l), quic.as_ref())?;
    Ok(Bound {
        http,
        tls,
        files,
        upgrade_sock,
        offer,
        quic,
        quic_owner,
    })
}

/// The `tcp:` block's listener options.
fn listen_options(main: &MainConfig) -> server::ListenOptions {
    server::ListenOptions {
        reuseport: main.tcp.so_reuseport,
        fastopen: main.tcp.fastopen,
        defer_accept: main.tcp.defer_accept,
    }
}

/// `tcp_defer_accept` on listeners received from the running instance, which may have been
/// started with another setting (or before there was one).
fn defer_accepts(main: &MainConfig, inherited: &[TcpListener]) -> Result<(), StartError> {
    for listener in inherited {
        if let Err(source) = server::listener::set_defer_accept(listener, main.tcp.defer_accept) {
            let addr = listener.local_addr().unwrap_or(main.proxy_address_http);
            return Err(bind_error(addr, source));
        }
    }
    Ok(())
}

fn bind_error(addr: SocketAddr, source: std::io::Error) -> StartError {
    StartError::Bind { addr, source }
}

fn file_server(
    main: &MainConfig,
    inherited: &mut Sockets,
) -> Result<Option<(TcpListener, PathBuf)>, StartError> {
    let (Some(folder), Some(addr)) = (&main.file_server_folder, main.file_server_address) else {
        return Ok(None);
    };
    let listener = match inherited.take(upgrade::FILES).pop() {
        Some(listener) => listener,
        None => {
            let listener = TcpListener::bind(addr).map_err(|source| bind_error(addr, source))?;
            listener
                .set_nonblocking(true)
                .map_err(|source| bind_error(addr, source))?;
            // The accept loop sets them too, but connections may queue before it starts.
            server::pass_on_connection_options(&listener)
                .map_err(|source| bind_error(addr, source))?;
            listener
        }
    };
    defer_accepts(main, std::slice::from_ref(&listener))?;
    if let Ok(local) = listener.local_addr() {
        tracing::info!(
            "file server: serving {} on http://{local}",
            folder.display()
        );
    }
    Ok(Some((listener, folder.clone())))
}

/// HTTP/3's UDP socket: inherited (with the process that still reads it), else bound on the
/// TLS listener's address (its port, when the configured one is 0).
fn quic_socket(
    main: &MainConfig,
    tls: &[TcpListener],
    inherited: &mut Sockets,
) -> Result<(Option<std::net::UdpSocket>, Option<i32>), StartError> {
    if !main.http3 {
        return Ok((None, None));
    }
    if let Some(socket) = inherited.take_udp(upgrade::QUIC) {
        return Ok((Some(socket), inherited.from_pid()));
    }
    let Some(addr) = tls.first().and_then(|l| l.local_addr().ok()) else {
        return Ok((None, None));
    };
    let socket = std::net::UdpSocket::bind(addr).map_err(|source| bind_error(addr, source))?;
    Ok((Some(socket), None))
}

fn offer(
    http: &[TcpListener],
    tls: &[TcpListener],
    files: Option<&TcpListener>,
    quic: Option<&std::net::UdpSocket>,
) -> Result<Offer, StartError> {
    let mut sockets = Sockets::default();
    let dup_error = |source| StartError::Runtime {
        what: "the upgrade hand-over (dup)",
        source,
    };
    for listener in http {
        sockets.add(upgrade::HTTP, listener).map_err(dup_error)?;
    }
    for listener in tls {
        sockets.add(upgrade::TLS, listener).map_err(dup_error)?;
    }
    if let Some(listener) = files {
        sockets.add(upgrade::FILES, listener).map_err(dup_error)?;
    }
    if let Some(socket) = quic {
        sockets.add_udp(upgrade::QUIC, socket).map_err(dup_error)?;
    }
    Ok(Arc::new(Mutex::new(Some(sockets))))
}
