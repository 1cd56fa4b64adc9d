//! The listeners main.yaml names (the proxy's plain and TLS listeners, the admin API's two, the
//! file server's, HTTP/3 beside TLS): each on a port of its own, each with what it needs.
//!
//! The proxy binds one socket per worker with `SO_REUSEPORT`, so a second listener on its
//! address binds without an error and the kernel shares the connections out between the two:
//! plain HTTP answered by the TLS listener, the proxy's clients by the admin API. Port 0 (any
//! free port) never clashes. What a listener needs and lacks is an error at its key; what is
//! named for a listener that is not there is a warning at its own.

use std::net::SocketAddr;

use super::reader::Reader;
use super::yaml::KeyPositions;

/// What main.yaml gives the listeners besides their addresses, as read.
pub struct Given {
    /// `proxy_certificates` or `proxy_configs`.
    pub certificates_dir: bool,
    pub config_tls_certificate: bool,
    pub config_tls_key_file: bool,
    pub file_server_folder: bool,
    /// `http3: true`, and whether this binary has HTTP/3.
    pub http3: bool,
    pub http3_built: bool,
}

/// Every check of this module; false if one found an error (each reported). `address_of` gives
/// the address a listener's key was read as, and `None` for any other key.
pub fn check(
    at: &KeyPositions<'_>,
    address_of: impl Fn(&str) -> Option<SocketAddr>,
    given: &Given,
    r: &mut Reader,
) -> bool {
    let own_ports = each_its_own(at, &address_of, r);
    let needs = needs_met(at, &address_of, given, r);
    unused(at, &address_of, given, r);
    own_ports && needs
}

/// Each listener has what it needs: an error at its key where it lacks something.
fn needs_met(
    at: &KeyPositions<'_>,
    address_of: impl Fn(&str) -> Option<SocketAddr>,
    given: &Given,
    r: &mut Reader,
) -> bool {
    let tls = address_of("proxy_address_tls").is_some();
    let admin_tls = given.config_tls_certificate && given.config_tls_key_file;
    let lacking = [
        (
            "proxy_address_tls",
            tls && !given.certificates_dir,
            "the TLS listener needs a certificate directory: set proxy_certificates (or proxy_configs)",
        ),
        (
            "config_tls_address",
            address_of("config_tls_address").is_some() && !admin_tls,
            "the admin API's TLS listener needs config_tls_certificate and config_tls_key_file",
        ),
        (
            "http3",
            given.http3 && !given.http3_built,
            "this binary was built without the `http3` feature (Cargo.toml)",
        ),
        (
            "http3",
            given.http3 && given.http3_built && !tls,
            "HTTP/3 is served on the UDP port of proxy_address_tls: set it",
        ),
    ];
    let mut ok = true;
    for (key, lacks, why) in lacking {
        if let (true, Some(pos)) = (lacks, at.of(key)) {
            r.error(pos, key, why);
            ok = false;
        }
    }
    ok
}

/// What is named for a listener that is not there: a warning at its key, as it does nothing.
fn unused(
    at: &KeyPositions<'_>,
    address_of: impl Fn(&str) -> Option<SocketAddr>,
    given: &Given,
    r: &mut Reader,
) {
    let files = address_of("file_server_address").is_some();
    let admin_tls = address_of("config_tls_address").is_some();
    let unused = [
        (
            "file_server_address",
            files && !given.file_server_folder,
            "nothing is served without file_server_folder (the folder to serve)",
        ),
        (
            "file_server_folder",
            given.file_server_folder && !files,
            "not served without file_server_address",
        ),
        (
            "config_tls_certificate",
            given.config_tls_certificate && !admin_tls,
            "not used without config_tls_address",
        ),
        (
            "config_tls_key_file",
            given.config_tls_key_file && !admin_tls,
            "not used without config_tls_address",
        ),
    ];
    for (key, is_unused, why) in unused {
        if let (true, Some(pos)) = (is_unused, at.of(key)) {
            r.warn(pos, key, why);
        }
    }
}

/// Reports each listener whose address another one, earlier in the file, already takes; false
/// if there is one.
fn each_its_own(
    at: &KeyPositions<'_>,
    address_of: impl Fn(&str) -> Option<SocketAddr>,
    r: &mut Reader,
) -> bool {
    let named: Vec<_> = at
        .in_order()
        .filter_map(|(key, pos)| address_of(key).map(|addr| (key, pos, addr)))
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
