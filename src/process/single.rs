//! One instance per set of paths and ports: a start without `-u` is refused while another aralez
//! answers on `upgrade_sock`, the pid file names a live aralez, or a listening port is taken
//! (two processes would otherwise share it silently through SO_REUSEPORT). Ports given as 0 are
//! never taken.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::config::MainConfig;

/// Why another instance is in the way, and what to do about it.
pub fn another_instance(main: &MainConfig) -> Option<String> {
    const HOW: &str = "stop it, give this instance its own pid_file, upgrade_sock and ports, or take over with `aralez -u`";
    if UnixStream::connect(&main.upgrade_sock).is_ok() {
        return Some(format!(
            "an aralez instance answers on upgrade_sock {}: {HOW}",
            main.upgrade_sock.display()
        ));
    }
    if let Some(pid) = live_aralez_in(&main.pid_file) {
        return Some(format!(
            "pid_file {} names aralez process {pid}, still running: {HOW}",
            main.pid_file.display()
        ));
    }
    let ports = [
        Some(main.proxy_address_http),
        main.proxy_address_tls,
        main.file_server_address,
        main.config_address,
        main.config_tls_address,
    ];
    ports
        .into_iter()
        .flatten()
        .find(|addr| is_taken(*addr))
        .map(|addr| {
            format!(
                "{addr} is already in use (bind: address in use), by another program or by an \
                 aralez whose pid_file and upgrade_sock are elsewhere (a second aralez would share \
                 the port through SO_REUSEPORT): free the port, give this instance other ports, or, \
                 if it is an aralez, take over with `aralez -u`"
            )
        })
}

/// The pid in `pid_file`, when it is a running process (not this one) whose program is aralez.
fn live_aralez_in(pid_file: &Path) -> Option<u32> {
    super::pidfile::read_pid(pid_file).filter(|pid| super::pidfile::is_live_aralez(*pid))
}

/// Whether binding `addr` without SO_REUSEPORT fails because someone listens there.
fn is_taken(addr: SocketAddr) -> bool {
    addr.port() != 0
        && matches!(
            TcpListener::bind(addr),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse
        )
}
