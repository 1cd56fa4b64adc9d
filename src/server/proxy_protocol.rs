//! The PROXY protocol (HAProxy's format, v1 text and v2 binary), read at the start of every
//! connection of a listener with `proxy_protocol: true`, before TLS and HTTP.
//!
//! [`parse`] is a pure function over the bytes seen so far (fuzzed: `fuzz/fuzz_targets/
//! proxy_header.rs`); [`read_header`] feeds it from the socket without taking a byte past the
//! header: it peeks, consumes only bytes known to belong to the header, and reads exactly the
//! rest once the header is complete, so TLS and HTTP find their first byte in place. A
//! connection without a valid header is refused (as HAProxy's `accept-proxy` does); what to do
//! with it (close, log) is the caller's.
//!
//! What it gives: the client address of a proxied connection (`TCP4`/`TCP6`, v2 `AF_INET`/
//! `AF_INET6`), or [`Header::Local`] when the sender speaks for itself (v1 `UNKNOWN`, v2
//! `LOCAL`, `AF_UNIX`, `AF_UNSPEC`): the socket's peer then stays the connection's peer. v2 TLVs
//! are skipped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[cfg(not(fuzzing))]
use tokio::io::AsyncReadExt;

#[cfg(not(fuzzing))]
use super::client_tcp::ClientTcp;

/// The 12 bytes every v2 header starts with.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 header, CRLF included (the specification's bound).
pub const V1_MAX: usize = 107;
/// The longest v2 address-and-TLV part accepted (the format allows 65535; senders use far less).
pub const V2_MAX_PAYLOAD: usize = 4096;
/// The fixed part of a v2 header.
const V2_FIXED: usize = 16;

/// What a PROXY header says about the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// The connection carries a client's traffic: its source and the address it reached.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// The sender's own connection (health checks) or an address family without IP addresses:
    /// keep the socket's peer.
    Local,
}

/// The outcome of parsing the bytes seen so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// The header, and how many bytes it took.
    Complete { header: Header, len: usize },
    /// A valid beginning: every byte given belongs to the header, which needs more.
    Incomplete,
}

/// Why a connection's first bytes are not a PROXY header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("no PROXY protocol header (the connection starts with something else)")]
    NotProxy,
    #[error("PROXY v1 header: {0}")]
    BadV1(&'static str),
    #[error("PROXY v1 header longer than {V1_MAX} bytes")]
    V1TooLong,
    #[error("PROXY v2 header: {0}")]
    BadV2(&'static str),
    #[error("PROXY v2 header of {0} bytes, over the {V2_MAX_PAYLOAD}-byte limit")]
    V2TooLong(usize),
}

/// Parses a PROXY header (v1 or v2) at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    const V1_PREFIX: &[u8] = b"PROXY ";
    let seen = |sig: &[u8]| buf.len().min(sig.len());
    if buf[..seen(&V2_SIGNATURE)] == V2_SIGNATURE[..seen(&V2_SIGNATURE)] {
        if buf.len() < V2_FIXED {
            return Ok(Parsed::Incomplete);
        }
        return parse_v2(buf);
    }
    if buf[..seen(V1_PREFIX)] == V1_PREFIX[..seen(V1_PREFIX)] {
        return parse_v1(buf);
    }
    Err(ProxyHeaderError::NotProxy)
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    // The CR of a full-length line is its 106th byte: the LF after it makes the 107.
    let window = &buf[..buf.len().min(V1_MAX - 1)];
    let Some(cr) = window.iter().position(|&b| b == b'\r' || b == b'\n') else {
        return if buf.len() >= V1_MAX - 1 {
            Err(ProxyHeaderError::V1TooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    if buf[cr] == b'\n' {
        return Err(ProxyHeaderError::BadV1("line ends without CR"));
    }
    match buf.get(cr + 1) {
        None => return Ok(Parsed::Incomplete),
        Some(b'\n') => {}
        _ => return Err(ProxyHeaderError::BadV1("CR not followed by LF")),
    }
    let line = std::str::from_utf8(&buf[..cr]).map_err(|_| ProxyHeaderError::BadV1("not text"))?;
    let header = v1_fields(line)?;
    Ok(Parsed::Complete {
        header,
        len: cr + 2,
    })
}

fn v1_fields(line: &str) -> Result<Header, ProxyHeaderError> {
    let mut fields = line.split(' ');
    let _proxy = fields.next();
    let family = fields
        .next()
        .ok_or(ProxyHeaderError::BadV1("no protocol"))?;
    let v6 = match family {
        // Anything may follow UNKNOWN; the addresses are not to be used.
        "UNKNOWN" => return Ok(Header::Local),
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(ProxyHeaderError::BadV1(
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    let mut next = || {
        fields
            .next()
            .ok_or(ProxyHeaderError::BadV1("missing field"))
    };
    let (src, dst, sport, dport) = (next()?, next()?, next()?, next()?);
    if fields.next().is_some() {
        return Err(ProxyHeaderError::BadV1("extra fields"));
    }
    let ip = |text: &str| -> Result<IpAddr, ProxyHeaderError> {
        let parsed = if v6 {
            text.parse::<Ipv6Addr>().map(IpAddr::V6)
        } else {
            text.parse::<Ipv4Addr>().map(IpAddr::V4)
        };
        parsed.map_err(|_| ProxyHeaderError::BadV1("bad address for its protocol"))
    };
    Ok(Header::Proxied {
        source: SocketAddr::new(ip(src)?, v1_port(sport)?),
        destination: SocketAddr::new(ip(dst)?, v1_port(dport)?),
    })
}

fn v1_port(text: &str) -> Result<u16, ProxyHeaderError> {
    let digits = !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| text.parse::<u16>().ok())
        .flatten()
        .ok_or(ProxyHeaderError::BadV1("bad port"))
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let (ver_cmd, family) = (buf[12], buf[13]);
    let payload = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Err(ProxyHeaderError::BadV2("version is not 2"));
    }
    if payload > V2_MAX_PAYLOAD {
        return Err(ProxyHeaderError::V2TooLong(payload));
    }
    let len = V2_FIXED + payload;
    let Some(body) = buf.get(V2_FIXED..len) else {
        return Ok(Parsed::Incomplete);
    };
    let header = match ver_cmd & 0x0f {
        0x0 => Header::Local,
        0x1 => v2_addresses(family, body)?,
        _ => {
            return Err(ProxyHeaderError::BadV2(
                "command is neither LOCAL nor PROXY",
            ))
        }
    };
    Ok(Parsed::Complete { header, len })
}

fn v2_addresses(family: u8, body: &[u8]) -> Result<Header, ProxyHeaderError> {
    let short = ProxyHeaderError::BadV2("addresses longer than the header");
    let (source, destination) = match family >> 4 {
        // AF_UNSPEC, AF_UNIX: no IP address to use.
        0x0 | 0x3 => return Ok(Header::Local),
        0x1 => {
            let a: &[u8; 12] = body
                .get(..12)
                .and_then(|s| s.try_into().ok())
                .ok_or(short)?;
            let ip = |at: usize| Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]);
            let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
            (
                SocketAddr::new(IpAddr::V4(ip(0)), port(8)),
                SocketAddr::new(IpAddr::V4(ip(4)), port(10)),
            )
        }
        0x2 => {
            let a: &[u8; 36] = body
                .get(..36)
                .and_then(|s| s.try_into().ok())
                .ok_or(short)?;
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[at..at + 16]);
                Ipv6Addr::from(octets)
            };
            let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
            (
                SocketAddr::new(IpAddr::V6(ip(0)), port(32)),
                SocketAddr::new(IpAddr::V6(ip(16)), port(34)),
            )
        }
        _ => return Err(ProxyHeaderError::BadV2("unknown address family")),
    };
    // TLVs (whatever follows the addresses) are skipped.
    Ok(Header::Proxied {
        source,
        destination,
    })
}

/// Why [`read_header`] gave up on a connection.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Invalid(#[from] ProxyHeaderError),
    #[error("connection closed before the PROXY header was complete")]
    Closed,
    #[error("reading the PROXY header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the PROXY header at the start of `stream`, leaving every byte after it unread. The
/// caller bounds it in time (the listener's header timeout). Not in a fuzz build, which has the
/// parser but no listeners (`lib.rs`).
#[cfg(not(fuzzing))]
pub(crate) async fn read_header(stream: &mut ClientTcp) -> Result<Header, ReadError> {
    let mut buf = vec![0u8; V2_FIXED + V2_MAX_PAYLOAD];
    let mut have = 0;
    loop {
        let peeked = stream.peek(&mut buf[have..]).await?;
        if peeked == 0 {
            return Err(ReadError::Closed);
        }
        match parse(&buf[..have + peeked])? {
            Parsed::Complete { header, len } => {
                stream.read_exact(&mut buf[have..len]).await?;
                return Ok(header);
            }
            Parsed::Incomplete => {
                // All of it belongs to the header: take it and wait for the rest.
                stream.read_exact(&mut buf[have..have + peeked]).await?;
                have += peeked;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.push(0x20 | cmd);
        out.push(family);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn proxied(src: &str, dst: &str) -> Header {
        Header::Proxied {
            source: src.parse().unwrap(),
            destination: dst.parse().unwrap(),
        }
    }

    #[test]
    fn v1_headers() {
        let cases: &[(&[u8], Header, usize)] = &[
            (
                b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET",
                proxied("192.0.2.1:56324", "198.51.100.2:443"),
                45,
            ),
            (
                b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n",
                proxied("[2001:db8::1]:1", "[2001:db8::2]:65535"),
                44,
            ),
            (b"PROXY UNKNOWN\r\n", Header::Local, 15),
            (
                b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n\x16",
                Header::Local,
                59,
            ),
        ];
        for (bytes, header, len) in cases {
            let got = parse(bytes).unwrap();
            assert_eq!(
                got,
                Parsed::Complete {
                    header: *header,
                    len: *len
                },
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn every_prefix_of_a_header_is_incomplete() {
        let mut tlv = vec![0u8; 12];
        tlv[..4].copy_from_slice(&[10, 0, 0, 1]);
        tlv.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']);
        let headers = [
            b"PROXY TCP4 10.0.0.1 10.0.0.2 1000 80\r\n".to_vec(),
            v2(1, 0x11, &tlv),
        ];
        for header in headers {
            for end in 0..header.len() {
                assert_eq!(parse(&header[..end]), Ok(Parsed::Incomplete), "{end}");
            }
            assert!(
                matches!(parse(&header), Ok(Parsed::Complete { len, .. }) if len == header.len())
            );
        }
    }

    #[test]
    fn v1_refusals() {
        let cases: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\n",
            b"\x16\x03\x01",
            b"PROXY TCP5 1.2.3.4 1.2.3.4 1 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1 1 extra\r\n",
            b"PROXY TCP4 ::1 ::1 1 1\r\n",
            b"PROXY TCP6 1.2.3.4 1.2.3.4 1 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 +1 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1 1\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1 1\rX",
            b"PROXY  TCP4 1.2.3.4 1.2.3.4 1 1\r\n",
            b"PROXY\r\n",
            // Found by fuzzing: a bare LF before a CR (its prefix without the CR was refused
            // while the whole was taken as incomplete).
            b"PROXY TCP4 192.0.2.1 198.51.1\x01\x00.2\x00\x00\x00s 563$4 H\n\r",
        ];
        for bytes in cases {
            assert!(parse(bytes).is_err(), "{}", String::from_utf8_lossy(bytes));
        }
        let long = [b"PROXY UNKNOWN ".as_slice(), &[b'x'; 100]].concat();
        assert_eq!(parse(&long), Err(ProxyHeaderError::V1TooLong));
    }

    /// Found by fuzzing: a line whose CR was the 107th byte was taken whole (108 bytes, over the
    /// limit) while its 107-byte prefix was refused.
    #[test]
    fn v1_lines_end_within_107_bytes() {
        let line =
            |body: usize| [b"PROXY UNKNOWN ".as_slice(), &vec![b'x'; body], b"\r\n"].concat();
        let longest = line(V1_MAX - 16);
        assert_eq!(longest.len(), V1_MAX);
        assert!(matches!(
            parse(&longest),
            Ok(Parsed::Complete { len: V1_MAX, .. })
        ));
        assert_eq!(parse(&longest[..V1_MAX - 1]), Ok(Parsed::Incomplete));
        let over = line(V1_MAX - 15);
        assert_eq!(parse(&over), Err(ProxyHeaderError::V1TooLong));
        assert_eq!(parse(&over[..V1_MAX]), Err(ProxyHeaderError::V1TooLong));
    }

    #[test]
    fn v2_headers() {
        let mut v4 = vec![192, 0, 2, 1, 198, 51, 100, 2];
        v4.extend_from_slice(&56324u16.to_be_bytes());
        v4.extend_from_slice(&443u16.to_be_bytes());
        let mut v6 = vec![0x20, 0x01, 0x0d, 0xb8];
        v6.extend_from_slice(&[0; 11]);
        v6.push(1);
        v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        v6.extend_from_slice(&[0; 11]);
        v6.push(2);
        v6.extend_from_slice(&[0x12, 0x34, 0x01, 0xbb]);
        let mut with_tlvs = v4.clone();
        with_tlvs.extend_from_slice(&[0x04, 0x00, 0x03, 1, 2, 3, 0x20, 0x00, 0x00]);
        let cases = [
            (
                v2(1, 0x11, &v4),
                proxied("192.0.2.1:56324", "198.51.100.2:443"),
            ),
            (
                v2(1, 0x21, &v6),
                proxied("[2001:db8::1]:4660", "[2001:db8::2]:443"),
            ),
            (
                v2(1, 0x11, &with_tlvs),
                proxied("192.0.2.1:56324", "198.51.100.2:443"),
            ),
            (v2(0, 0x00, &[]), Header::Local),
            (v2(0, 0x11, &v4), Header::Local),
            (v2(1, 0x31, &[0; 216]), Header::Local),
            (v2(1, 0x00, &[]), Header::Local),
        ];
        for (bytes, header) in cases {
            let mut stream = bytes.clone();
            stream.extend_from_slice(b"\x16\x03\x01 TLS follows");
            assert_eq!(
                parse(&stream),
                Ok(Parsed::Complete {
                    header,
                    len: bytes.len()
                })
            );
        }
    }

    #[test]
    fn v2_refusals() {
        let mut wrong_version = v2(1, 0x11, &[0; 12]);
        wrong_version[12] = 0x11;
        let cases = [
            (wrong_version, "version"),
            (v2(2, 0x11, &[0; 12]), "command"),
            (v2(1, 0x11, &[0; 11]), "addresses"),
            (v2(1, 0x21, &[0; 35]), "addresses"),
            (v2(1, 0x41, &[0; 12]), "family"),
            (v2(1, 0x11, &[0; V2_MAX_PAYLOAD + 1]), "limit"),
        ];
        for (bytes, why) in cases {
            let err = parse(&bytes).expect_err(why);
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
        // The size limit is known from the fixed part alone.
        let huge = v2(1, 0x11, &[0; V2_MAX_PAYLOAD + 1]);
        assert!(parse(&huge[..16]).is_err());
    }
}
