//! Who a request is from, decided once per request before routing: the real client address
//! (`trusted_proxies` + `X-Forwarded-For`) and the request id (`X-Request-Id`).
//!
//! - A peer in `trusted_proxies` speaks for its clients: the client address is read from
//!   `X-Forwarded-For`, walking from the right and skipping trusted addresses (nginx's
//!   `real_ip_recursive on`); from any other peer the header is not believed. Without
//!   `trusted_proxies` nothing is parsed. The header sent upstream is left to forwarding (it
//!   appends the peer, as always).
//! - A trusted peer's one `X-Forwarded-Proto` (`https` or `http`) says whether its client came
//!   over TLS: `to_https`, the cache key, forward auth and the `X-Forwarded-Proto` sent upstream
//!   follow it, so a TLS-terminating balancer in front meets no redirect loop.
//! - `X-Request-Id` from a trusted peer is kept when it is sane (1 to [`MAX_REQUEST_ID`]
//!   visible ASCII characters); otherwise a new one replaces it. Either way forwarding sets it
//!   on the request to the backend; the caller returns it on the response and logs it.
//!
//! Ids are 32 hex digits: a random 64-bit prefix drawn when a worker starts, then that
//! worker's counter (offset by a random key and scrambled by a bijective mix, so ids do not
//! tell how many requests came before), so ids are unique across workers and restarts without
//! a shared lock.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};

use crate::config::net_conf::Cidr;
pub use crate::vocab::headers::X_REQUEST_ID;
use crate::vocab::headers::{X_FORWARDED_FOR, X_FORWARDED_PROTO};
use crate::vocab::ClientConn;

/// The longest `X-Request-Id` kept from a trusted peer.
pub const MAX_REQUEST_ID: usize = 200;

/// The peers whose forwarding headers are believed (`trusted_proxies`), built once at start.
#[derive(Debug, Default)]
pub struct TrustedProxies(Box<[Cidr]>);

impl TrustedProxies {
    pub fn new(cidrs: &[Cidr]) -> TrustedProxies {
        TrustedProxies(cidrs.into())
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// The client behind trusted `peer`: the right-most address of `X-Forwarded-For` that is
    /// not trusted; the left-most one when all are; the last good one before an entry that is
    /// not an address (what is left of it cannot be believed).
    pub fn client_behind(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        for value in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            let Ok(text) = value.to_str() else {
                return client;
            };
            for element in text.rsplit(',') {
                let element = element.trim_matches([' ', '\t']);
                if element.is_empty() {
                    continue;
                }
                let Some(ip) = parse_element(element) else {
                    return client;
                };
                client = ip;
                if !self.trusts(ip) {
                    return client;
                }
            }
        }
        client
    }
}

/// An `X-Forwarded-For` element: an IP, or `IP:port` / `[IPv6]:port` as some proxies write.
fn parse_element(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner.parse().ok();
    }
    text.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

/// One worker's request ids.
#[derive(Debug)]
pub struct RequestIds {
    /// The prefix, already in hex: each id writes only its own half.
    prefix: [u8; 16],
    key: u64,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> RequestIds {
        RequestIds::new()
    }
}

impl RequestIds {
    /// A generator with a fresh random prefix.
    pub fn new() -> RequestIds {
        let mut seed = [0u8; 16];
        let (prefix, key) = match aws_lc_rs::rand::fill(&mut seed) {
            Ok(()) => {
                let (a, b) = seed.split_at(8);
                let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
                (word(a), word(b))
            }
            // Unique enough for log correlation if the system's RNG fails.
            Err(_) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let t = now.as_nanos() as u64;
                (t ^ (u64::from(std::process::id()) << 40), mix(t))
            }
        };
        RequestIds {
            prefix: hex(prefix),
            key,
            next: AtomicU64::new(0),
        }
    }

    /// The next id.
    pub fn next_id(&self) -> HeaderValue {
        let counter = self.next.fetch_add(1, Ordering::Relaxed);
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.prefix);
        out[16..].copy_from_slice(&hex(mix(counter.wrapping_add(self.key))));
        // One allocation, shared by every later clone (request, response, access log).
        let mut id = HeaderValue::from_maybe_shared(Bytes::from_owner(out))
            .unwrap_or_else(|_| HeaderValue::from_static("-"));
        // Never indexed by HPACK: a value seen once would only churn the h2 header table.
        id.set_sensitive(true);
        id
    }
}

/// `word`'s 16 hex digits, most significant first.
fn hex(word: u64) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (j, digit) in out.iter_mut().enumerate() {
        *digit = HEX[((word >> (60 - 4 * j)) & 0xf) as usize];
    }
    out
}

/// SplitMix64's finaliser: a bijection on u64, so distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether a received request id may be kept: 1 to [`MAX_REQUEST_ID`] visible ASCII characters.
pub fn is_sane(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_REQUEST_ID && bytes.iter().all(u8::is_ascii_graphic)
}

/// A request's id.
#[derive(Debug, Clone)]
pub struct RequestId {
    pub value: HeaderValue,
    /// Kept from a trusted peer: the request carries it. Otherwise it is made here, and
    /// forwarding sets it on the request, replacing any the client sent.
    pub kept: bool,
}

impl RequestId {
    /// The id, when the request does not carry it yet.
    pub fn to_set(&self) -> Option<&HeaderValue> {
        (!self.kept).then_some(&self.value)
    }
}

/// Decides the request's client and id: `conn` itself, or a copy naming the client behind a
/// trusted peer; the id kept from `headers` or made.
pub fn identify<'a>(
    trusted: &TrustedProxies,
    ids: &RequestIds,
    conn: &'a ClientConn,
    headers: &HeaderMap,
) -> (Cow<'a, ClientConn>, RequestId) {
    let mut kept = None;
    if conn.trusted {
        let mut values = headers.get_all(&X_REQUEST_ID).iter();
        if let (Some(first), None) = (values.next(), values.next()) {
            kept = is_sane(first).then(|| first.clone());
        }
    }
    let id = match kept {
        Some(value) => RequestId { value, kept: true },
        None => RequestId {
            value: ids.next_id(),
            kept: false,
        },
    };
    if !conn.trusted {
        return (Cow::Borrowed(conn), id);
    }
    let client_ip = trusted.client_behind(conn.peer.ip(), headers);
    let tls = scheme_behind(headers).unwrap_or(conn.tls);
    if client_ip == conn.client_ip && tls == conn.tls {
        return (Cow::Borrowed(conn), id);
    }
    let mut behind = conn.clone();
    behind.client_ip = client_ip;
    behind.tls = tls;
    (Cow::Owned(behind), id)
}

/// Whether the client behind a trusted peer reached it over TLS, as one `X-Forwarded-Proto`
/// of `https` or `http` says; `None` when the field is absent, repeated or anything else.
fn scheme_behind(headers: &HeaderMap) -> Option<bool> {
    let mut values = headers.get_all(&X_FORWARDED_PROTO).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let value = value.as_bytes();
    if value.eq_ignore_ascii_case(b"https") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"http") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        let cidrs: Vec<Cidr> = list.iter().map(|c| Cidr::parse(c).unwrap()).collect();
        TrustedProxies::new(&cidrs)
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_client_is_the_first_untrusted_address_from_the_right() {
        let t = trusted(&["10.0.0.0/8", "2001:db8::/32"]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let cases: &[(&[&str], &str)] = &[
            (&[], "10.0.0.1"),
            (&["203.0.113.5"], "203.0.113.5"),
            (&["198.51.100.1, 203.0.113.5, 10.1.1.1"], "203.0.113.5"),
            (&["198.51.100.1", "203.0.113.5,10.1.1.1"], "203.0.113.5"),
            (&["10.9.9.9, 10.1.1.1"], "10.9.9.9"),
            (&["spoofed, 10.1.1.1"], "10.1.1.1"),
            (&["203.0.113.5, garbage"], "10.0.0.1"),
            (&["[2001:db9::7]:443, 2001:db8::1"], "2001:db9::7"),
            (&["203.0.113.5:1234"], "203.0.113.5"),
            (&["203.0.113.5, , 10.1.1.1"], "203.0.113.5"),
        ];
        for (values, want) in cases {
            let got = t.client_behind(peer, &xff(values));
            assert_eq!(got, want.parse::<IpAddr>().unwrap(), "{values:?}");
        }
    }

    fn conn(peer: &str, is_trusted: bool) -> ClientConn {
        let mut c = ClientConn::new(peer.parse().unwrap(), false, Default::default());
        c.trusted = is_trusted;
        c
    }

    #[test]
    fn request_ids_are_kept_only_from_trusted_peers() {
        let t = trusted(&["10.0.0.0/8"]);
        let ids = RequestIds::new();
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static("abc-123"));
        h.insert(
            X_FORWARDED_FOR.clone(),
            HeaderValue::from_static("203.0.113.9"),
        );
        let from_lb = conn("10.0.0.1:5000", true);
        let (client, id) = identify(&t, &ids, &from_lb, &h);
        assert_eq!(id.value, "abc-123");
        assert!(id.kept && id.to_set().is_none());
        assert_eq!(client.client_ip, "203.0.113.9".parse::<IpAddr>().unwrap());
        let outsider = conn("192.0.2.1:5000", false);
        let (client, id) = identify(&t, &ids, &outsider, &h);
        assert_ne!(id.value, "abc-123");
        assert_eq!(id.to_set(), Some(&id.value));
        assert_eq!(client.client_ip, "192.0.2.1".parse::<IpAddr>().unwrap());
        // Insane or repeated values from a trusted peer are replaced too.
        for bad in ["", "a b", "\u{7f}", "x".repeat(MAX_REQUEST_ID + 1).as_str()] {
            let mut sent = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(bad) {
                sent.insert(X_REQUEST_ID.clone(), v);
            }
            let (_, id) = identify(&t, &ids, &from_lb, &sent);
            assert_eq!(id.value.len(), 32, "{bad:?}");
            assert!(!id.kept, "{bad:?}");
        }
        let mut twice = HeaderMap::new();
        twice.append(X_REQUEST_ID.clone(), HeaderValue::from_static("a"));
        twice.append(X_REQUEST_ID.clone(), HeaderValue::from_static("b"));
        let (_, id) = identify(&t, &ids, &from_lb, &twice);
        assert_eq!(id.value.len(), 32);
        assert!(!id.kept);
    }

    #[test]
    fn a_trusted_peers_one_forwarded_proto_says_whether_its_client_came_over_tls() {
        let t = trusted(&["10.0.0.0/8"]);
        let ids = RequestIds::new();
        let proto = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(X_FORWARDED_PROTO.clone(), HeaderValue::from_str(v).unwrap());
            }
            h
        };
        let from_lb = conn("10.0.0.1:5000", true);
        let tls_of = |c: &ClientConn, values: &[&str]| identify(&t, &ids, c, &proto(values)).0.tls;
        assert!(tls_of(&from_lb, &["https"]));
        assert!(tls_of(&from_lb, &["HTTPS"]));
        assert!(!tls_of(&from_lb, &[]));
        assert!(!tls_of(&from_lb, &["ftp"]));
        assert!(
            !tls_of(&from_lb, &["https", "https"]),
            "repeated: not believed"
        );
        let mut over_tls = from_lb.clone();
        over_tls.tls = true;
        assert!(!tls_of(&over_tls, &["http"]));
        assert!(tls_of(&over_tls, &[]));
        let stranger = conn("192.0.2.1:5000", false);
        assert!(
            !tls_of(&stranger, &["https"]),
            "an untrusted peer's is not believed"
        );
    }

    #[test]
    fn ids_are_hex_and_distinct() {
        let (a, b) = (RequestIds::new(), RequestIds::new());
        let ids = [a.next_id(), a.next_id(), b.next_id()];
        for id in &ids {
            assert_eq!(id.len(), 32);
            assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit));
        }
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        // One worker's ids share the prefix; the rest does not count up visibly.
        assert_eq!(ids[0].as_bytes()[..16], ids[1].as_bytes()[..16]);
        assert!(!ids[1].as_bytes().ends_with(b"0000001"));
    }

    #[test]
    fn hex_digits_run_most_significant_first() {
        assert_eq!(&hex(0x0123_4567_89ab_cdef), b"0123456789abcdef");
        assert_eq!(&hex(u64::MAX), b"ffffffffffffffff");
    }
}
