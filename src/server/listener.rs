//! Listening sockets: by default one SO_REUSEPORT listener per worker, so the kernel spreads
//! connections and no accept lock is shared; with `so_reuseport: false` one listener, bound
//! without SO_REUSEPORT (no other process can join the port), shared by the workers. Both may
//! carry TCP_FASTOPEN (`tcp_fastopen`), and both defer accepts to a connection's first bytes
//! unless told not to (`tcp_defer_accept`). Options every accepted connection needs are set once
//! on its listener, which passes them on.

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
    /// TCP_DEFER_ACCEPT: a connection is handed over when its first bytes arrive, not at the
    /// end of its handshake ([`DEFER_ACCEPT_SECONDS`]).
    pub defer_accept: bool,
}

/// How long the kernel holds a connection whose client has sent nothing yet before handing it
/// over anyway (it then answers the client's next ACK, at about this many seconds, with the
/// connection; the header timeout runs from there). HTTP, TLS and the PROXY header all start
/// with the client, so an ordinary connection is handed over with its first bytes, and the
/// first read finds them: no wait for epoll, no read that fails. nginx's `deferred` and
/// HAProxy's `defer-accept` set the same option; both are off unless asked for.
pub const DEFER_ACCEPT_SECONDS: u32 = 1;

impl Default for ListenOptions {
    fn default() -> ListenOptions {
        ListenOptions {
            reuseport: true,
            fastopen: None,
            defer_accept: true,
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
    set_defer_accept(&socket, options.defer_accept)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Turns TCP_DEFER_ACCEPT on ([`DEFER_ACCEPT_SECONDS`]) or off on a listening socket; it takes
/// effect for connections that arrive from then on, so a listener received in a live upgrade
/// follows the new process's configuration.
pub fn set_defer_accept(listener: &impl AsFd, on: bool) -> io::Result<()> {
    let seconds = if on { DEFER_ACCEPT_SECONDS } else { 0 };
    tcp_option::set(listener, libc::TCP_DEFER_ACCEPT, seconds)
}

/// Sets on a listening socket what every connection it accepts inherits from it, so that no
/// accepted connection needs a call of its own: TCP_NODELAY (answers go out as written) and
/// the bound on unsent bytes.
pub fn pass_on_connection_options(listener: &impl AsFd) -> io::Result<()> {
    let socket = socket2::SockRef::from(listener);
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_notsent_lowat(NOTSENT_LOWAT)
}

/// TCP_FASTOPEN, which neither socket2 nor nix sets on a listener.
pub mod fastopen {
    use std::os::fd::AsFd;

    /// Sets the listener's TCP Fast Open queue length (connections whose data arrived with the
    /// SYN, waiting for accept). The kernel serves them only if `net.ipv4.tcp_fastopen` allows
    /// server-side Fast Open (bit 2).
    pub fn set(socket: &impl AsFd, queue: u32) -> std::io::Result<()> {
        super::tcp_option::set(socket, libc::TCP_FASTOPEN, queue)
    }

    /// The listener's TCP Fast Open queue length as the kernel reports it.
    pub fn get(socket: &impl AsFd) -> std::io::Result<u32> {
        super::tcp_option::get(socket, libc::TCP_FASTOPEN)
    }
}

/// An integer option at the TCP level of a socket: the `setsockopt` and `getsockopt` calls
/// written by hand, isolated here.
pub mod tcp_option {
    use std::os::fd::{AsFd, AsRawFd};

    /// Sets `option` to `value` (saturated to a C int).
    #[allow(unsafe_code)]
    pub fn set(socket: &impl AsFd, option: libc::c_int, value: u32) -> std::io::Result<()> {
        let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
        // SAFETY: the fd is a valid socket borrowed for the call; the option value is a c_int
        // on the stack whose size is passed with it.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_TCP,
                option,
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

    /// `option`'s value as the kernel reports it (0 for a negative one).
    #[allow(unsafe_code)]
    pub fn get(socket: &impl AsFd, option: libc::c_int) -> std::io::Result<u32> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as in `set`; `value` and `len` are valid for writes of their sizes.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_TCP,
                option,
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
    use std::io::{Read as _, Write as _};
    use std::time::{Duration, Instant};

    use super::*;

    fn any() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn fastopen_is_set_on_the_listening_socket() {
        let options = ListenOptions {
            fastopen: Some(77),
            ..ListenOptions::default()
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
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // A first byte: the listener defers the accept until one comes.
        client.write_all(b"G").unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let lowat = socket2::SockRef::from(&accepted).tcp_notsent_lowat();
        assert_eq!(lowat.unwrap(), NOTSENT_LOWAT);
        assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is inherited too");
    }

    /// The next connection `listener` (non-blocking) hands over, waiting at most `patience`.
    fn accept_within(
        listener: &std::net::TcpListener,
        patience: Duration,
    ) -> Option<std::net::TcpStream> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((accepted, _)) => return Some(accepted),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        None
    }

    /// A client that connects and sends nothing, then one that connects and sends a byte:
    /// which of the two `listener` hands over first, and the other.
    fn silent_then_speaking(
        listener: &std::net::TcpListener,
    ) -> (
        SocketAddr,
        SocketAddr,
        std::net::TcpStream,
        std::net::TcpStream,
    ) {
        let addr = listener.local_addr().unwrap();
        let silent = std::net::TcpStream::connect(addr).unwrap();
        let mut speaking = std::net::TcpStream::connect(addr).unwrap();
        speaking.write_all(b"G").unwrap();
        let first = accept_within(listener, Duration::from_secs(10)).expect("a connection");
        (
            silent.local_addr().unwrap(),
            speaking.local_addr().unwrap(),
            first,
            silent,
        )
    }

    #[test]
    fn by_default_a_connection_is_handed_over_with_its_first_bytes() {
        let listener = bind_one(any(), ListenOptions::default()).unwrap();
        let deferred = tcp_option::get(&listener, libc::TCP_DEFER_ACCEPT).unwrap();
        assert_eq!(deferred, DEFER_ACCEPT_SECONDS);
        let (silent, speaking, first, _keep) = silent_then_speaking(&listener);
        assert_eq!(
            first.peer_addr().unwrap(),
            speaking,
            "the client that spoke comes first"
        );
        // Its byte is there already: the first read does not wait.
        first.set_nonblocking(true).unwrap();
        assert_eq!((&first).read(&mut [0u8; 4]).unwrap(), 1);
        // The silent one is handed over too, once the kernel stops waiting for it (about
        // DEFER_ACCEPT_SECONDS: its header timeout runs from there).
        let later = accept_within(&listener, Duration::from_secs(10)).expect("the silent one");
        assert_eq!(later.peer_addr().unwrap(), silent);
    }

    #[test]
    fn without_defer_accept_connections_come_in_the_order_they_connected() {
        let options = ListenOptions {
            defer_accept: false,
            ..ListenOptions::default()
        };
        let listener = bind_one(any(), options).unwrap();
        assert_eq!(
            tcp_option::get(&listener, libc::TCP_DEFER_ACCEPT).unwrap(),
            0
        );
        let (silent, _, first, _keep) = silent_then_speaking(&listener);
        assert_eq!(first.peer_addr().unwrap(), silent);
    }

    #[test]
    fn so_reuseport_false_shares_one_socket_and_keeps_others_out() {
        let options = ListenOptions {
            reuseport: false,
            ..ListenOptions::default()
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
