//! The network keys of `main.yaml` beyond addresses: Aralez 0.95's `tcp:` block (keep-alive,
//! `so_reuseport`, `tcp_fastopen`; and aralez's own `tcp_defer_accept`), and `trusted_proxies`
//! (CIDRs whose `X-Forwarded-For` and `X-Request-Id` are believed). Reads and validates only;
//! the listeners and the request path apply them.

use std::net::IpAddr;
use std::time::Duration;

use super::reader::{shorten, Reader};
use super::yaml::{Key, Node, Value};

/// The queue length `tcp_fastopen: true` stands for.
pub const DEFAULT_FASTOPEN_QUEUE: u32 = 1024;

/// Socket settings of the proxy listeners and their accepted connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSettings {
    /// Kernel keep-alive on client connections: off unless `idle` is set.
    pub keepalive_idle: Option<Duration>,
    pub keepalive_interval: Duration,
    pub keepalive_count: u32,
    /// One SO_REUSEPORT listener per worker (true), or one listener shared by the workers and
    /// bound without SO_REUSEPORT, so no other process can join the port (false).
    pub so_reuseport: bool,
    /// TCP_FASTOPEN queue length on the listeners; `None`: not set.
    pub fastopen: Option<u32>,
    /// TCP_DEFER_ACCEPT on the listeners: connections are handed over with their first bytes.
    pub defer_accept: bool,
}

impl Default for TcpSettings {
    fn default() -> TcpSettings {
        TcpSettings {
            keepalive_idle: None,
            keepalive_interval: Duration::from_secs(10),
            keepalive_count: 5,
            so_reuseport: true,
            fastopen: None,
            defer_accept: true,
        }
    }
}

/// Keys of the `tcp:` block.
const TCP_KEYS: &[&str] = &[
    "tcp_keepalive_idle",
    "tcp_keepalive_interval",
    "tcp_keepalive_count",
    "so_reuseport",
    "tcp_fastopen",
    "tcp_defer_accept",
];

/// Whether `key` is one of the keep-alive keys also accepted at the top of main.yaml.
pub fn is_top_level_tcp_key(key: &str) -> bool {
    TCP_KEYS[..3].contains(&key)
}

/// Reads the TCP settings: the keep-alive keys given at the top of main.yaml (`top`), then the
/// `tcp:` block (`block`), which wins for a key given both ways (with a warning). `None` when a
/// value is bad (each reported).
pub fn read_tcp(
    top: &[(&Key, &Node)],
    block: Option<&Node>,
    r: &mut Reader,
) -> Option<TcpSettings> {
    let mut tcp = TcpSettings::default();
    let mut ok = true;
    let mut given = Vec::new();
    for (key, value) in top {
        ok &= read_tcp_key(&mut tcp, &key.name, &key.name, value, r);
        given.push((key.name.to_string(), key.pos));
    }
    let entries = match block {
        Some(block) => r.map(block, "tcp")?,
        None => &[][..],
    };
    for (key, value) in entries {
        let path = format!("tcp.{}", key.name);
        if !TCP_KEYS.contains(&key.name.as_str()) {
            r.unknown_key(key, &path, TCP_KEYS);
            continue;
        }
        if top.iter().any(|(k, _)| k.name == key.name) {
            r.warn(
                key.pos,
                &path,
                format!(
                    "`{}` is also given at the top of main.yaml; the `tcp:` block's value is used",
                    key.name
                ),
            );
        }
        ok &= read_tcp_key(&mut tcp, &key.name, &path, value, r);
        given.push((path, key.pos));
    }
    if ok && tcp.keepalive_idle.is_none() {
        let probes = ["tcp_keepalive_interval", "tcp_keepalive_count"];
        for (path, pos) in &given {
            let name = path.strip_prefix("tcp.").unwrap_or(path);
            if probes.contains(&name) {
                let why = "not used: keep-alive probes are off without tcp_keepalive_idle";
                r.warn(*pos, path, why);
            }
        }
    }
    ok.then_some(tcp)
}

fn read_tcp_key(
    tcp: &mut TcpSettings,
    name: &str,
    path: &str,
    value: &Node,
    r: &mut Reader,
) -> bool {
    // Linux's bound on TCP_KEEPIDLE and TCP_KEEPINTVL: above it the kernel refuses the value,
    // and the ones set after it (they were accepted here and left at the kernel's defaults).
    let seconds = |r: &mut Reader| r.uint(value, path, 1, 32_767).map(Duration::from_secs);
    match name {
        "tcp_keepalive_idle" => store(&mut tcp.keepalive_idle, seconds(r).map(Some)),
        "tcp_keepalive_interval" => store(&mut tcp.keepalive_interval, seconds(r)),
        "tcp_keepalive_count" => store(
            &mut tcp.keepalive_count,
            r.uint(value, path, 1, 100).map(|n| n as u32),
        ),
        "so_reuseport" => store(&mut tcp.so_reuseport, r.boolean(value, path)),
        "tcp_fastopen" => store(&mut tcp.fastopen, read_fastopen(value, path, r)),
        "tcp_defer_accept" => store(&mut tcp.defer_accept, r.boolean(value, path)),
        _ => true,
    }
}

fn store<T>(slot: &mut T, value: Option<T>) -> bool {
    match value {
        Some(v) => {
            *slot = v;
            true
        }
        None => false,
    }
}

/// `tcp_fastopen`: a queue length (0 = off), or true (the default length) / false.
fn read_fastopen(node: &Node, key: &str, r: &mut Reader) -> Option<Option<u32>> {
    match &node.value {
        Value::Bool(true) => Some(Some(DEFAULT_FASTOPEN_QUEUE)),
        Value::Bool(false) => Some(None),
        Value::Str(s) if matches!(s.to_ascii_lowercase().as_str(), "true" | "false") => r
            .boolean(node, key)
            .map(|on| on.then_some(DEFAULT_FASTOPEN_QUEUE)),
        _ => r
            .uint(node, key, 0, 65_535)
            .map(|n| (n > 0).then_some(n as u32)),
    }
}

/// An address block: `IP/prefix`, or a bare IP (the one address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `2001:db8::/32`, `192.0.2.7` (= /32), `::1` (= /128). Host bits
    /// set below the prefix are an error (the operator likely meant another block).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (ip_text, prefix_text) = match text.split_once('/') {
            Some((ip, prefix)) => (ip, Some(prefix)),
            None => (text, None),
        };
        let ip: IpAddr = ip_text.parse().map_err(|_| {
            format!(
                "`{}` is not an IP address or CIDR block (e.g. 10.0.0.0/8, 2001:db8::/32)",
                shorten(text)
            )
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix_text {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u8>() {
                    Ok(n) if n <= max => n,
                    _ => {
                        return Err(format!(
                            "`{}`: prefix length {p} is out of range (0-{max})",
                            shorten(text)
                        ))
                    }
                }
            }
            Some(p) => {
                return Err(format!(
                    "`{}`: prefix length `{}` is not a number",
                    shorten(text),
                    shorten(p)
                ))
            }
        };
        // `::ffff:10.0.0.0/104` is the IPv4 block 10.0.0.0/8: addresses are compared in their
        // IPv4 form (see `contains`), so the block must be too.
        let (ip, prefix) = match ip.to_canonical() {
            IpAddr::V4(v4) if ip.is_ipv6() && prefix >= 96 => (IpAddr::V4(v4), prefix - 96),
            _ => (ip, prefix),
        };
        let cidr = Cidr {
            network: ip,
            prefix,
        };
        if cidr.masked(ip) != bits(ip) {
            return Err(format!(
                "`{}` has host bits set below /{prefix} (did you mean {}/{prefix}?)",
                shorten(text),
                cidr.network_text()
            ));
        }
        Ok(cidr)
    }

    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && self.masked(ip) == bits(self.network)
    }

    fn masked(&self, ip: IpAddr) -> u128 {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let host_bits = u32::from(width - self.prefix);
        let mask = if host_bits >= 128 {
            0
        } else {
            u128::MAX << host_bits
        };
        bits(ip) & mask
    }

    fn network_text(&self) -> String {
        let masked = self.masked(self.network);
        match self.network {
            IpAddr::V4(_) => std::net::Ipv4Addr::from(masked as u32).to_string(),
            IpAddr::V6(_) => std::net::Ipv6Addr::from(masked).to_string(),
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// `trusted_proxies`: a list of CIDRs (or one string); each bad entry reported at its line.
pub fn read_trusted_proxies(node: &Node, key: &str, r: &mut Reader) -> Option<Vec<Cidr>> {
    let items = r.string_list(node, key)?;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (pos, item_key, text) in items {
        match Cidr::parse(&text) {
            Ok(cidr) => out.push(cidr),
            Err(msg) => {
                r.error(pos, &item_key, msg);
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_match() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "10.0.0.0/8",
                &["10.1.2.3", "::ffff:10.9.9.9"],
                &["11.0.0.1", "::1"],
            ),
            ("192.0.2.7", &["192.0.2.7"], &["192.0.2.8"]),
            ("0.0.0.0/0", &["1.2.3.4"], &["::1"]),
            (
                "2001:db8::/32",
                &["2001:db8:1::5"],
                &["2001:db9::1", "10.0.0.1"],
            ),
            ("::1", &["::1"], &["::2"]),
            ("::/0", &["fe80::1"], &["127.0.0.1"]),
            (
                "::ffff:10.0.0.0/104",
                &["10.1.2.3", "::ffff:10.2.3.4"],
                &["11.0.0.1"],
            ),
        ];
        for (text, inside, outside) in cases {
            let cidr = Cidr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            for ip in *inside {
                assert!(cidr.contains(ip.parse().unwrap()), "{ip} in {text}");
            }
            for ip in *outside {
                assert!(!cidr.contains(ip.parse().unwrap()), "{ip} not in {text}");
            }
        }
    }

    #[test]
    fn bad_cidrs_say_why() {
        let cases = [
            ("10.0.0.0/33", "out of range"),
            ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
            ("10.0.0.0/", "not a number"),
            ("10.0.0.0/x", "not a number"),
            ("ten", "not an IP address"),
            ("2001:db8::/129", "out of range"),
            ("10.0.0.0/-1", "not a number"),
        ];
        for (text, why) in cases {
            let err = Cidr::parse(text).expect_err(text);
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
