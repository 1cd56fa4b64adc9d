//! The listening addresses main.yaml names (the proxy's plain and TLS listeners, the admin API's
//! two, the file server's) must each be a listener of its own. The proxy binds one socket per
//! worker with `SO_REUSEPORT`, so a second listener on its address binds without an error and
//! the kernel shares the connections out between the two: plain HTTP answered by the TLS
//! listener, the proxy's clients by the admin API. Port 0 (any free port) never clashes.

use std::net::SocketAddr;

use super::reader::Reader;
use super::yaml::Pos;

/// The keys that name a listening address.
pub const KEYS: &[&str] = &[
    "proxy_address_http",
    "proxy_address_tls",
    "config_address",
    "config_tls_address",
    "file_server_address",
];

/// Where each key of [`KEYS`] was found, in the order of the file.
#[derive(Default)]
pub struct Positions(Vec<(&'static str, Pos)>);

impl Positions {
    pub fn note(&mut self, key: &str, pos: Pos) {
        if let Some(known) = KEYS.iter().find(|k| **k == key) {
            self.0.push((known, pos));
        }
    }
}

/// Reports each listener whose address another one, earlier in the file, already takes; false
/// if there is one. `address_of` gives what a key was read as (`None` if it was not).
pub fn each_its_own(
    at: &Positions,
    address_of: impl Fn(&str) -> Option<SocketAddr>,
    r: &mut Reader,
) -> bool {
    let named: Vec<_> =
        at.0.iter()
            .filter_map(|(key, pos)| address_of(key).map(|addr| (*key, *pos, addr)))
            .collect();
    let mut ok = true;
    for (later, (key, pos, addr)) in named.iter().enumerate() {
        let taken = named[..later].iter().find(|(_, _, a)| overlap(*a, *addr));
        if let Some((earlier, earlier_pos, _)) = taken {
            let why = format!(
                "`{addr}` is also `{earlier}`'s (line {}): each listener needs its own port, or they share its connections",
                earlier_pos.line
            );
            r.error(*pos, key, why);
            ok = false;
        }
    }
    ok
}

/// Whether two listeners would take each other's connections: the same port (not 0), and the
/// same address or either one every address.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::overlap;

    fn addr(text: &str) -> std::net::SocketAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn the_same_port_clashes_on_the_same_or_every_address_only() {
        assert!(overlap(addr("127.0.0.1:6193"), addr("127.0.0.1:6193")));
        assert!(overlap(addr("0.0.0.0:6193"), addr("127.0.0.1:6193")));
        assert!(overlap(addr("10.0.0.1:6193"), addr("[::]:6193")));
        assert!(!overlap(addr("127.0.0.1:6193"), addr("127.0.0.2:6193")));
        assert!(!overlap(addr("127.0.0.1:6193"), addr("127.0.0.1:6194")));
        assert!(!overlap(addr("127.0.0.1:0"), addr("127.0.0.1:0")));
    }
}
