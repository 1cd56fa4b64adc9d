//! Header rules of forwarding (SPEC §6.2): hop-by-hop removal and the X-Forwarded-* family.

use std::net::IpAddr;

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes hop-by-hop headers: `Connection` and every header it names, `Keep-Alive`,
/// `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and `TE` unless it is exactly `trailers`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if let Some(connection) = headers.remove(header::CONNECTION) {
        let mut extra = headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect::<Vec<_>>();
        extra.push(connection);
        headers.remove(header::CONNECTION);
        for value in extra {
            for name in value.to_str().unwrap_or("").split(',') {
                let name = name.trim();
                if !name.is_empty() && !name.eq_ignore_ascii_case("trailers") {
                    headers.remove(name);
                }
            }
        }
    }
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(header::TRANSFER_ENCODING);
    headers.remove(header::UPGRADE);
    if let Some(te) = headers.get(header::TE) {
        if !te.as_bytes().eq_ignore_ascii_case(b"trailers") {
            headers.remove(header::TE);
        }
    }
}

/// Appends the client IP (no port) to `X-Forwarded-For`, joining any existing values with `, `.
pub fn append_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    let mut ip_buf = [0u8; 45];
    let ip = format_ip(client, &mut ip_buf);
    let existing: Vec<HeaderValue> = match headers.remove(&X_FORWARDED_FOR) {
        None => {
            if let Ok(v) = HeaderValue::from_bytes(ip) {
                headers.insert(X_FORWARDED_FOR.clone(), v);
            }
            return;
        }
        Some(first) => {
            let mut all = vec![first];
            all.extend(headers.get_all(&X_FORWARDED_FOR).iter().cloned());
            all
        }
    };
    let len: usize = existing.iter().map(|v| v.len() + 2).sum::<usize>() + ip.len();
    let mut joined = BytesMut::with_capacity(len);
    for v in &existing {
        joined.put_slice(v.as_bytes());
        joined.put_slice(b", ");
    }
    joined.put_slice(ip);
    if let Ok(v) = HeaderValue::from_maybe_shared(joined.freeze()) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

fn format_ip(ip: IpAddr, buf: &mut [u8; 45]) -> &[u8] {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cursor, "{ip}");
    let n = cursor.position() as usize;
    &buf[..n]
}

/// Sets `X-Forwarded-Proto` and `X-Forwarded-Host` (the client's host as it sent it).
pub fn set_forwarded_proto_host(headers: &mut HeaderMap, tls: bool, host: Option<HeaderValue>) {
    let proto = if tls { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let cases: &[(&[(&str, &str)], &[&str], &[&str])] = &[
            (
                &[
                    ("connection", "keep-alive, X-Custom"),
                    ("x-custom", "1"),
                    ("x-kept", "2"),
                ],
                &["x-kept"],
                &["connection", "x-custom"],
            ),
            (
                &[
                    ("keep-alive", "timeout=5"),
                    ("proxy-connection", "keep-alive"),
                ],
                &[],
                &["keep-alive", "proxy-connection"],
            ),
            (
                &[("transfer-encoding", "chunked"), ("upgrade", "websocket")],
                &[],
                &["transfer-encoding", "upgrade"],
            ),
            (&[("te", "trailers")], &["te"], &[]),
            (&[("te", "gzip")], &[], &["te"]),
            (
                &[("connection", "close"), ("host", "a")],
                &["host"],
                &["connection"],
            ),
        ];
        for (input, kept, gone) in cases {
            let mut m = map(input);
            remove_hop_by_hop(&mut m);
            for k in *kept {
                assert!(m.contains_key(*k), "{k} should stay in {input:?}");
            }
            for k in *gone {
                assert!(!m.contains_key(*k), "{k} should go from {input:?}");
            }
        }
    }

    #[test]
    fn forwarded_for_appends_without_port() {
        let mut m = HeaderMap::new();
        append_forwarded_for(&mut m, "10.0.0.1".parse().unwrap());
        assert_eq!(m["x-forwarded-for"], "10.0.0.1");
        append_forwarded_for(&mut m, "::1".parse().unwrap());
        assert_eq!(m["x-forwarded-for"], "10.0.0.1, ::1");
        let mut m = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        append_forwarded_for(&mut m, "3.3.3.3".parse().unwrap());
        assert_eq!(m.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(m["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3");
    }
}
