//! Listening sockets: by default one SO_REUSEPORT listener per worker, so the kernel spreads
//! connections and no accept lock is shared; with `so_reuseport: false` one listener, bound
//! without SO_REUSEPORT (no other process can join the port), shared by the workers. Both may
//! carry TCP_FASTOPEN (`tcp_fastopen`). Options every accepted connection needs are set once on
//! its listener, which passes them on.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

/// The most response bytes an accepted connection's kernel send buffer holds that have not been
/// sent yet: past it, the socket is not writable. Without it the kernel grows a connection's
/// send buffer to `tcp_wmem`'s maximum (4 MiB by default), so a client that reads a byte at a
/// time (slow read) makes the kernel hold megabytes for it; with it, what waits is this much
/// (plus what is in flight). 128 KiB keeps a fast client's link busy between two writes.
const NOTSENT_LOWAT: u32 = 128 * 1024;

/// How the proxy's listeners are bound (main.yaml's `tcp:` block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenOptions {
    pub reuseport: bool,
    /// TCP_FASTOPEN queue length; `None`: not set.
    pub fastopen: Option<u32>,
}

impl Default for ListenOptions {
    fn default() -> ListenOptions {
        ListenOptions {
            reuseport: true,
            fastopen: None,
        }
    }
}

/// Binds `count` listeners on `addr` with SO_REUSEPORT. With port 0 the first gets a port from the
/// OS and the others join it.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    bind_listeners(addr, count, ListenOptions::default())
}

/// `count` listeners on `addr` for the workers: each its own SO_REUSEPORT socket, or (without
/// `reuseport`) duplicates of one socket, which the workers' runtimes all poll.
pub fn bind_listeners(
    addr: SocketAddr,
    count: usize,
    options: ListenOptions,
) -> io::Result<Vec<std::net::TcpListener>> {
    let count = count.max(1);
    let mut listeners = Vec::with_capacity(count);
    let mut target = addr;
    if !options.reuseport {
        let listener = bind_one(target, options)?;
        for _ in 1..count {
            listeners.push(listener.try_clone()?);
        }
        listeners.push(listener);
        return Ok(listeners);
    }
    for _ in 0..count {
        let listener = bind_one(target, options)?;
        target = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// One listening socket, built the way the proxy's are (tests read its options back).
pub fn bind_one(addr: SocketAddr, options: ListenOptions) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(options.reuseport)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_nonblocking(true)?;
    // Before listen: the first connection queued inherits them too.
    pass_on_connection_options(&socket)?;
    if let Some(queue) = options.fastopen {
        fastopen::set(&socket, queue)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Sets on a listening socket what every connection it accepts inherits from it, so that no
/// accepted connection needs a call of its own: TCP_NODELAY (answers go out as written) and
/// the bound on unsent bytes.
pub fn pass_on_connection_options(listener: &impl AsFd) -> io::Result<()> {
    let socket = socket2::SockRef::from(listener);
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_notsent_lowat(NOTSENT_LOWAT)
}

/// TCP_FASTOPEN, which neither socket2 nor nix sets on a listener: the one `setsockopt` call
/// written by hand, isolated here.
pub mod fastopen {
    use std::os::fd::{AsFd, AsRawFd};

    /// Sets the listener's TCP Fast Open queue length (connections whose data arrived with the
    /// SYN, waiting for accept). The kernel serves them only if `net.ipv4.tcp_fastopen` allows
    /// server-side Fast Open (bit 2).
    #[allow(unsafe_code)]
    pub fn set(socket: &impl AsFd, queue: u32) -> std::io::Result<()> {
        let value = libc::c_int::try_from(queue).unwrap_or(libc::c_int::MAX);
        // SAFETY: the fd is a valid socket borrowed for the call; the option value is a c_int
        // on the stack whose size is passed with it.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The listener's TCP Fast Open queue length as the kernel reports it.
    #[allow(unsafe_code)]
    pub fn get(socket: &impl AsFd) -> std::io::Result<u32> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as in `set`; `value` and `len` are valid for writes of their sizes.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN,
                std::ptr::from_mut(&mut value).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            Ok(u32::try_from(value).unwrap_or(0))
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Kernel keep-alive probes on an accepted client socket.
#[derive(Clone, Copy, Debug)]
pub struct TcpKeepalive {
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
    pub count: u32,
}

pub fn apply_keepalive(stream: &impl AsFd, ka: TcpKeepalive) {
    let params = socket2::TcpKeepalive::new()
        .with_time(ka.idle)
        .with_interval(ka.interval)
        .with_retries(ka.count);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&params) {
        tracing::debug!("cannot set TCP keepalive: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn fastopen_is_set_on_the_listening_socket() {
        let options = ListenOptions {
            reuseport: true,
            fastopen: Some(77),
        };
        let listener = bind_one(any(), options).unwrap();
        assert_eq!(fastopen::get(&listener).unwrap(), 77);
        let plain = bind_one(any(), ListenOptions::default()).unwrap();
        assert_eq!(fastopen::get(&plain).unwrap(), 0);
    }

    #[test]
    fn accepted_connections_inherit_nodelay_and_the_unsent_bytes_bound() {
        let listener = bind_one(any(), ListenOptions::default()).unwrap();
        listener.set_nonblocking(false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let lowat = socket2::SockRef::from(&accepted).tcp_notsent_lowat();
        assert_eq!(lowat.unwrap(), NOTSENT_LOWAT);
        assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is inherited too");
    }

    #[test]
    fn so_reuseport_false_shares_one_socket_and_keeps_others_out() {
        let options = ListenOptions {
            reuseport: false,
            fastopen: None,
        };
        let listeners = bind_listeners(any(), 3, options).unwrap();
        assert_eq!(listeners.len(), 3);
        let addr = listeners[0].local_addr().unwrap();
        for l in &listeners {
            assert_eq!(l.local_addr().unwrap(), addr);
            assert!(!socket2::SockRef::from(l).reuse_port().unwrap());
        }
        // Even a binder asking for SO_REUSEPORT is refused.
        let err = bind_one(addr, ListenOptions::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // With SO_REUSEPORT (the default) a second binder of this user joins.
        let shared = bind_listeners(any(), 2, ListenOptions::default()).unwrap();
        let joined = bind_one(shared[0].local_addr().unwrap(), ListenOptions::default());
        assert!(joined.is_ok());
    }
}
