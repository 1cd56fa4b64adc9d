//! Host names as written in the config (a host of upstreams.yaml, a discovered service's
//! `hostname`): what routes are keyed by, and the errors and warnings a name gets.

use super::reader::Reader;
use super::yaml::Pos;
use crate::vocab::normalise;

/// A host name as routes are keyed by it (lower case, no trailing dot or port; `DEFAULT` as
/// is), with an error for a name that is none and a warning for one that will not match as it
/// seems to; `pos` and `path` say where it was written.
pub(super) fn normalise_host(raw: &str, pos: Pos, path: &str, r: &mut Reader) -> Option<String> {
    let raw = raw.trim();
    if raw == "DEFAULT" {
        return Some(raw.to_string());
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let valid = !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'*' | b':' | b'[' | b']')
        });
    if !raw.is_ascii() {
        let why = format!("`{raw}` is not a valid host name: write a name with letters outside ASCII in its punycode form (`xn--...`), as clients send it in `Host`");
        r.error(pos, path, why);
        return None;
    }
    let empty_label = !name.starts_with('[') && name.split('.').any(str::is_empty);
    if !valid || empty_label {
        r.error(pos, path, format!("`{raw}` is not a valid host name"));
        return None;
    }
    // `::2` would be cut at its last `:` as if it had a port, and route nothing.
    if !name.starts_with('[') && name.parse::<std::net::Ipv6Addr>().is_ok() {
        let why = format!("`{raw}` is an IPv6 address: write it in brackets, `[{raw}]`, as clients send it in `Host`");
        r.error(pos, path, why);
        return None;
    }
    let warning = if name == "default" {
        Some("is a host name like any other; the host that catches every other is `DEFAULT`, in capitals".to_string())
    } else if name.contains('*') {
        Some("matches only a request whose host is that very text: host names match exactly (a certificate's name may be a wildcard, a route's may not)".to_string())
    } else {
        None
    };
    if let Some(warning) = warning {
        r.warn(pos, path, format!("host `{raw}` {warning}"));
    }
    let without_port = normalise::strip_port(name);
    if without_port.len() < name.len() {
        let message = format!(
            "host `{raw}` is `{without_port}`: requests are routed by their host without its port"
        );
        r.warn(pos, path, message);
    }
    Some(normalise::canonical_ip_literal(without_port).into_owned())
}
