//! Listening sockets: one SO_REUSEPORT listener per worker, so the kernel spreads connections and
//! no accept lock is shared.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

/// Binds `count` listeners on `addr` with SO_REUSEPORT. With port 0 the first gets a port from the
/// OS and the others join it.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(count.max(1));
    let mut target = addr;
    for _ in 0..count.max(1) {
        let listener = bind_one(target)?;
        target = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

fn bind_one(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Kernel keep-alive probes on an accepted client socket.
#[derive(Clone, Copy, Debug)]
pub struct TcpKeepalive {
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
    pub count: u32,
}

pub fn apply_keepalive(stream: &tokio::net::TcpStream, ka: TcpKeepalive) {
    let params = socket2::TcpKeepalive::new()
        .with_time(ka.idle)
        .with_interval(ka.interval)
        .with_retries(ka.count);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&params) {
        tracing::debug!("cannot set TCP keepalive: {e}");
    }
}
