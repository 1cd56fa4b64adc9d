//! systemd readiness (`Type=notify`): one datagram to `$NOTIFY_SOCKET`, nothing when unset.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to systemd's notify socket, if there is one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
                socket.send_to_addr(state.as_bytes(), &addr)
            }
            None => socket.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = sent {
        tracing::warn!("cannot notify systemd ({state}): {e}");
    }
}
