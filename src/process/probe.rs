//! `aralez healthcheck`: the container's HEALTHCHECK (a `scratch` image has no curl). Asks
//! the proxy listener of main.yaml (or `--url`) for a response over HTTP/1.1 and says whether one
//! came within the deadline. Any HTTP status counts: a 404 still means the proxy serves; no
//! answer, a refused connection or a non-HTTP reply does not. Blocking std I/O, no runtime.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::{self, Issues};

/// Why the probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Config(String),
    #[error("`{0}` is not an http://host:port[/path] URL")]
    Url(String),
    #[error("cannot reach {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr} did not answer within {limit:?}")]
    Timeout { addr: String, limit: Duration },
    #[error("{addr} answered something that is not HTTP: {first:?}")]
    NotHttp { addr: String, first: String },
}

/// Probes `url`, or the `proxy_address_http` of the main.yaml at `conf`. Returns the status line.
pub fn probe(conf: &Path, url: Option<&str>, limit: Duration) -> Result<String, ProbeError> {
    let (addr, host, path) = match url {
        Some(url) => parse_url(url)?,
        None => {
            let mut issues = Issues::default();
            let main = config::load_main(conf, &mut issues).ok_or_else(|| {
                let errors: Vec<String> = issues.errors().map(|i| i.to_string()).collect();
                ProbeError::Config(errors.join("; "))
            })?;
            let addr = local_side(main.proxy_address_http);
            (addr.to_string(), "localhost".to_string(), "/".to_string())
        }
    };
    ask(&addr, &host, &path, limit)
}

/// A wildcard listen address is probed on the loopback of its family.
fn local_side(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

fn parse_url(url: &str) -> Result<(String, String, String), ProbeError> {
    let bad = || ProbeError::Url(url.to_string());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || path.contains([' ', '\r', '\n']) {
        return Err(bad());
    }
    let addr = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((addr, authority.to_string(), path.to_string()))
}

fn ask(addr: &str, host: &str, path: &str, limit: Duration) -> Result<String, ProbeError> {
    let deadline = Instant::now() + limit;
    let connect_error = |source| ProbeError::Connect {
        addr: addr.to_string(),
        source,
    };
    let target = addr
        .to_socket_addrs()
        .map_err(connect_error)?
        .next()
        .ok_or_else(|| connect_error(std::io::ErrorKind::NotFound.into()))?;
    let mut stream = TcpStream::connect_timeout(&target, limit).map_err(connect_error)?;
    let timeout = || ProbeError::Timeout {
        addr: addr.to_string(),
        limit,
    };
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    stream.set_write_timeout(left()).map_err(connect_error)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: aralez-healthcheck\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|_| timeout())?;
    // The status line is all that is read (at most 256 bytes).
    let mut head = [0u8; 256];
    let mut filled = 0;
    while !head[..filled].contains(&b'\n') && filled < head.len() {
        stream
            .set_read_timeout(Some(left().ok_or_else(timeout)?))
            .map_err(connect_error)?;
        match stream.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timeout())
            }
            Err(e) => return Err(connect_error(e)),
        }
    }
    let first = String::from_utf8_lossy(&head[..filled]);
    let line = first.lines().next().unwrap_or_default().to_string();
    let is_http = line.starts_with("HTTP/1.")
        && line
            .as_bytes()
            .get(9..12)
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if is_http {
        Ok(line)
    } else {
        Err(ProbeError::NotHttp {
            addr: addr.to_string(),
            first: line,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_wildcards() {
        assert_eq!(
            parse_url("http://127.0.0.1:8080/healthz").unwrap(),
            (
                "127.0.0.1:8080".into(),
                "127.0.0.1:8080".into(),
                "/healthz".into()
            )
        );
        assert_eq!(parse_url("http://x.test").unwrap().0, "x.test:80");
        assert!(parse_url("https://x.test/").is_err());
        assert!(parse_url("http:///a").is_err());
        assert_eq!(
            local_side("0.0.0.0:6193".parse().unwrap()),
            "127.0.0.1:6193".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            local_side("[::]:80".parse().unwrap()),
            "[::1]:80".parse::<SocketAddr>().unwrap()
        );
    }
}
