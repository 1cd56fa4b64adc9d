//! One HTTP/1.1 request to a URL outside the request path: a cluster master's push to a
//! worker's admin API, an ACME DNS provider's API. Resolves, connects, speaks TLS for
//! `https://` (the certificate checked against the trust store when asked), sends with
//! `Connection: close`, and reads at most a bounded answer; the whole exchange has a deadline.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::{connector, tls};

/// Where requests go: a base URL's scheme, authority and path (`https://host:port/base`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    https: bool,
    /// `host:port`, the port always written (where to connect).
    authority: String,
    /// The `Host` header: the URL's own authority (no default port added).
    host_header: String,
    /// The base path, without a trailing `/` (empty for the root).
    base_path: String,
}

impl Target {
    /// Reads `http://host[:port][/base]` or `https://...`; no scheme means `http://`.
    pub fn parse(url: &str) -> Result<Target, String> {
        let url = url.trim();
        let (https, rest) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some((scheme, _)) => return Err(format!("`{scheme}://` is not http or https")),
            None => (false, url),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!("`{url}` names no host"));
        }
        let host_header = authority.to_string();
        let port = if https { 443 } else { 80 };
        let authority = if has_port(authority) {
            authority.to_string()
        } else {
            format!("{authority}:{port}")
        };
        Ok(Target {
            https,
            authority,
            host_header,
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    /// The host name (or address) without the port and brackets.
    fn host(&self) -> &str {
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// What requests to this target carry as `Host` (and what a signature signs).
    pub fn host_header(&self) -> &str {
        &self.host_header
    }

    /// `path` under the base path.
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.base_path)
    }
}

fn has_port(authority: &str) -> bool {
    match authority.rsplit_once(':') {
        Some((host, port)) => {
            port.bytes().all(|b| b.is_ascii_digit()) && (!host.contains(':') || host.ends_with(']'))
        }
        None => false,
    }
}

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }
}

/// Sends `req` (its URI a path, already under [`Target::path`]) to `target`, with `Host` and
/// `Connection: close` set here. `verify`: check an `https://` target's certificate.
pub async fn send(
    target: &Target,
    mut req: Request<Full<Bytes>>,
    verify: bool,
    deadline: Duration,
    max_answer: usize,
) -> Result<Answer, String> {
    let headers = req.headers_mut();
    let host = HeaderValue::from_str(&target.host_header).map_err(|e| e.to_string())?;
    headers.insert(header::HOST, host);
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let exchange = async {
        let addrs: Vec<_> = tokio::net::lookup_host(&target.authority)
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", target.authority))?
            .collect();
        let tcp = connector::tcp(&addrs, target.host(), deadline)
            .await
            .map_err(|e| e.to_string())?;
        if target.https {
            let (stream, _) = tls::handshake(tcp, target.host(), false, verify)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            exchange(stream, req, max_answer).await
        } else {
            exchange(tcp, req, max_answer).await
        }
    };
    match tokio::time::timeout(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {deadline:?}")),
    }
}

/// One HTTP/1.1 exchange on `stream`; the status and up to `max_answer` bytes of the body.
async fn exchange<S>(
    stream: S,
    req: Request<Full<Bytes>>,
    max_answer: usize,
) -> Result<Answer, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driving = tokio::spawn(conn);
    let resp = match sender.send_request(req).await {
        Ok(resp) => resp,
        Err(e) => {
            driving.abort();
            return Err(e.to_string());
        }
    };
    let status = resp.status();
    let body = Limited::new(resp.into_body(), max_answer).collect().await;
    driving.abort();
    let body = body.map_err(|e| format!("the answer: {e}"))?.to_bytes();
    Ok(Answer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = Target::parse("https://api.cloudflare.com/client/v4/").expect("valid");
        assert_eq!(
            (t.https, t.authority.as_str(), t.host()),
            (true, "api.cloudflare.com:443", "api.cloudflare.com")
        );
        assert_eq!(t.path("/zones"), "/client/v4/zones");
        assert_eq!(t.host_header(), "api.cloudflare.com");
        let t = Target::parse("127.0.0.1:8080").expect("valid");
        assert_eq!((t.https, t.authority.as_str()), (false, "127.0.0.1:8080"));
        assert_eq!(t.path("/x"), "/x");
        let t = Target::parse("http://[::1]/v2").expect("valid");
        assert_eq!((t.authority.as_str(), t.host()), ("[::1]:80", "::1"));
        assert!(Target::parse("ftp://x").is_err());
        assert!(Target::parse("https:///x").is_err());
    }
}
