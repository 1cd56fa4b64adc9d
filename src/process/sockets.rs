//! Every listening socket the process needs, bound or inherited before privileges are dropped:
//! the proxy's listeners (SO_REUSEPORT, or one shared socket: `tcp.so_reuseport`), the admin
//! API's, the file server's, and `upgrade_sock`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::upgrade::{self, Offer, Sockets, UpgradeError, UpgradeSock};
use super::StartError;
use crate::config::MainConfig;
use crate::server;

/// The sockets of a starting process.
pub struct Bound {
    pub proxy: ProxySockets,
    pub admin: crate::admin::AdminBound,
    pub files: Option<(TcpListener, PathBuf)>,
    pub upgrade_sock: Option<UpgradeSock>,
    /// Duplicates of every listener, handed to a new process on a live upgrade.
    pub offer: Offer,
}

/// The proxy's listeners, which its workers and HTTP/3 serve.
pub struct ProxySockets {
    pub http: Vec<TcpListener>,
    /// The TLS listeners (one per worker), when `proxy_address_tls` is set.
    pub tls: Vec<TcpListener>,
    /// HTTP/3's UDP socket (`http3: true`), on the TLS listener's address, and the process it
    /// came from on a live upgrade: that one reads the socket until it exits, and two readers
    /// would split each connection's packets between them.
    pub quic: Option<(std::net::UdpSocket, Option<i32>)>,
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
                // Unless another instance holds the ports still (an `upgrade_sock` that differs):
                // a fresh bind would share them with it through SO_REUSEPORT.
                if let Some(why) = super::single::another_instance(main) {
                    return Err(StartError::AlreadyRunning(why));
                }
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
    let mut http = inherited.take_at(upgrade::HTTP, Some(main.proxy_address_http));
    defer_accepts(main, &http)?;
    if http.is_empty() {
        http = bind_proxy(main, main.proxy_address_http, main.threads)?;
    } else if http.len() != main.threads {
        tracing::warn!(
            "live upgrade: {} inherited listeners, threads is {}; running {} workers (one per listener)",
            http.len(),
            main.threads,
            http.len()
        );
    }
    let mut tls = inherited.take_at(upgrade::TLS, main.proxy_address_tls);
    defer_accepts(main, &tls)?;
    // A TLS listener on a port of the kernel's choosing (0) may move, so that HTTP/3 has the
    // same port; a configured or inherited one never does.
    let mut movable_tls = None;
    if let (Some(addr), true) = (main.proxy_address_tls, tls.is_empty()) {
        tls = bind_proxy(main, addr, http.len())?;
        movable_tls = Some(addr).filter(|a| a.port() == 0);
    }
    let files = file_server(main, &mut inherited)?;
    let (quic, quic_owner) = quic_beside_tls(main, &mut tls, movable_tls, &mut inherited)?;
    let admin = crate::admin::bind(
        main,
        crate::admin::Inherited {
            plain: inherited.take_at(upgrade::ADMIN, main.config_address).pop(),
            tls: inherited
                .take_at(upgrade::ADMIN_TLS, main.config_tls_address)
                .pop(),
        },
    )?;
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
    let offer = offer(
        &http,
        &tls,
        files.as_ref().map(|(l, _)| l),
        quic.as_ref(),
        &admin.listeners,
    )?;
    Ok(Bound {
        proxy: ProxySockets {
            http,
            tls,
            quic: quic.map(|socket| (socket, quic_owner)),
        },
        admin,
        files,
        upgrade_sock,
        offer,
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
    let listener = match inherited.take_at(upgrade::FILES, Some(addr)).pop() {
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

/// `count` proxy listeners on `addr`, with the `tcp:` block's options.
fn bind_proxy(
    main: &MainConfig,
    addr: SocketAddr,
    count: usize,
) -> Result<Vec<TcpListener>, StartError> {
    server::bind_listeners(addr, count, listen_options(main))
        .map_err(|source| bind_error(addr, source))
}

/// How many times a TLS listener on port 0 moves because HTTP/3 found its number taken for UDP.
const QUIC_PORT_ATTEMPTS: u32 = 8;

/// HTTP/3's UDP socket on the TLS listener's port. When another UDP socket holds the number the
/// kernel gave the TLS listener (`movable`: bound on port 0), the TLS listeners are bound
/// afresh on another one, a few times at most.
fn quic_beside_tls(
    main: &MainConfig,
    tls: &mut Vec<TcpListener>,
    movable: Option<SocketAddr>,
    inherited: &mut Sockets,
) -> Result<(Option<std::net::UdpSocket>, Option<i32>), StartError> {
    let mut moves = 0;
    loop {
        match (quic_socket(main, tls, inherited), movable) {
            (Err(StartError::BindUdp { source, .. }), Some(addr))
                if source.kind() == std::io::ErrorKind::AddrInUse && moves < QUIC_PORT_ATTEMPTS =>
            {
                moves += 1;
                tracing::debug!(
                    "HTTP/3: UDP port taken; moving the TLS listener from port 0's pick"
                );
                *tls = bind_proxy(main, addr, tls.len())?;
            }
            (other, _) => return other,
        }
    }
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
    let tls_addr = tls.first().and_then(|l| l.local_addr().ok());
    if let Some(socket) = inherited.take_udp_at(upgrade::QUIC, tls_addr) {
        return Ok((Some(socket), inherited.from_pid()));
    }
    let Some(addr) = tls.first().and_then(|l| l.local_addr().ok()) else {
        return Ok((None, None));
    };
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|source| StartError::BindUdp { addr, source })?;
    Ok((Some(socket), None))
}

fn offer(
    http: &[TcpListener],
    tls: &[TcpListener],
    files: Option<&TcpListener>,
    quic: Option<&std::net::UdpSocket>,
    admin: &crate::admin::AdminListeners,
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
    for (listener, tls) in admin.to_hand_over() {
        let name = if tls {
            upgrade::ADMIN_TLS
        } else {
            upgrade::ADMIN
        };
        sockets.add(name, listener).map_err(dup_error)?;
    }
    Ok(Arc::new(Mutex::new(Some(sockets))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn main_with_http3() -> (tempfile::TempDir, MainConfig) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("main.yaml");
        let yaml = format!(
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"main.yaml\"\nproxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nhttp3: true\n",
            dir.path().display()
        );
        std::fs::write(&path, yaml).expect("write main.yaml");
        let mut issues = crate::config::Issues::default();
        let main = crate::config::load_main(&path, &mut issues);
        let main = main.unwrap_or_else(|| panic!("main.yaml loads: {issues:?}"));
        assert!(main.http3);
        (dir, main)
    }

    /// A TCP listener on a port whose number a UDP socket holds, as the kernel's pick for the
    /// TLS listener can be when another process (or test) has that UDP port.
    fn tcp_on_a_taken_udp_port() -> (UdpSocket, TcpListener) {
        for _ in 0..100 {
            let udp = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
            let port = udp.local_addr().expect("udp addr").port();
            if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)) {
                return (udp, tcp);
            }
        }
        panic!("no port free for TCP with its UDP number taken in 100 tries");
    }

    fn port_of(listeners: &[TcpListener]) -> u16 {
        listeners[0].local_addr().expect("tcp addr").port()
    }

    /// HTTP/3's main.yaml, and a TLS listener on a port whose UDP number, `taken`, is held by
    /// `_holder` for as long as this lives.
    struct TakenPort {
        main: MainConfig,
        tls: Vec<TcpListener>,
        taken: u16,
        _holder: UdpSocket,
        _dir: tempfile::TempDir,
    }

    fn taken_port() -> TakenPort {
        let (dir, main) = main_with_http3();
        let (holder, listener) = tcp_on_a_taken_udp_port();
        let taken = holder.local_addr().expect("udp addr").port();
        TakenPort {
            main,
            tls: vec![listener],
            taken,
            _holder: holder,
            _dir: dir,
        }
    }

    #[test]
    fn a_tls_listener_on_port_0_moves_when_http3_finds_its_number_taken() {
        // Held whole: its UDP socket keeps the number taken.
        let mut at = taken_port();
        let movable = at.main.proxy_address_tls;
        let (quic, owner) =
            quic_beside_tls(&at.main, &mut at.tls, movable, &mut Sockets::default())
                .expect("HTTP/3 gets a port");
        let (tls, taken) = (&at.tls, at.taken);
        let quic_port = quic
            .expect("a QUIC socket")
            .local_addr()
            .expect("addr")
            .port();
        assert_ne!(port_of(tls), taken, "the TLS listener moved");
        assert_eq!(quic_port, port_of(tls), "HTTP/3 shares the TLS port");
        assert_eq!(owner, None);
    }

    #[test]
    fn a_configured_tls_port_never_moves_for_http3() {
        let mut at = taken_port();
        let result = quic_beside_tls(&at.main, &mut at.tls, None, &mut Sockets::default());
        let (tls, taken) = (&at.tls, at.taken);
        match result {
            Err(StartError::BindUdp { addr, source }) => {
                assert_eq!(addr.port(), taken, "the error names the taken port");
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            other => panic!("expected a bind error, got {:?}", other.map(|_| ())),
        }
        assert_eq!(port_of(tls), taken, "the TLS listener stays");
    }
}
