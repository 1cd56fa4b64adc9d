//! Parsers for the small value formats inside the config: addresses, header lines, auth rules.
//!
//! Each returns a plain `Result<_, String>` whose error is the reason an operator reads after
//! `file:line:column: key:`. They know nothing about positions; the readers add those.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderName, HeaderValue, Uri};

use super::reader::shorten;

/// How to talk to a backend, when the config pins it with a scheme prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http://`: plain HTTP/1.1.
    Http,
    /// `https://`: TLS.
    Https,
    /// `h2c://`: HTTP/2 with prior knowledge, no TLS.
    H2c,
}

/// A backend entry: `host:port`, `[v6]:port`, optionally prefixed with a scheme.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerSpec {
    pub scheme: Option<Scheme>,
    /// Host name or IP literal, without brackets.
    pub host: String,
    pub port: u16,
}

impl ServerSpec {
    /// `host:port` as it goes into a `Host`-style authority (v6 literals bracketed).
    pub fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    /// The literal IP address, when the host is one.
    pub fn ip_addr(&self) -> Option<SocketAddr> {
        self.host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, self.port))
    }
}

impl std::fmt::Display for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = match self.scheme {
            None => "",
            Some(Scheme::Http) => "http://",
            Some(Scheme::Https) => "https://",
            Some(Scheme::H2c) => "h2c://",
        };
        write!(f, "{prefix}{}", self.authority())
    }
}

/// Parses a backend entry.
pub fn parse_server(text: &str) -> Result<ServerSpec, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty server entry (expected host:port)".to_string());
    }
    let shown = shorten(text);
    let (scheme, rest) = if let Some(rest) = text.strip_prefix("http://") {
        (Some(Scheme::Http), rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        (Some(Scheme::Https), rest)
    } else if let Some(rest) = text.strip_prefix("h2c://") {
        (Some(Scheme::H2c), rest)
    } else if let Some((prefix, _)) = text.split_once("://") {
        return Err(format!(
            "`{shown}`: unknown scheme `{}://` (use http://, https://, h2c:// or none)",
            shorten(prefix)
        ));
    } else {
        (None, text)
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        let malformed_scheme = rest
            .split_once(":/")
            .is_some_and(|(p, _)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()));
        return Err(if malformed_scheme {
            format!("`{shown}`: malformed scheme (use http://, https://, h2c:// or none)")
        } else {
            format!("`{shown}`: a server is host:port, without a path")
        });
    }
    let (host, port) = split_host_port(rest)?;
    let port = parse_port(port, rest, 1)?;
    if host.parse::<IpAddr>().is_err() && !is_dns_name(host) {
        return Err(format!(
            "`{}` is neither an IP address nor a valid host name",
            shorten(host)
        ));
    }
    // All digits and dots, yet not an address (`300.1.1.1`, `10.0.0`): a typo, which would
    // otherwise be looked up in DNS as a name, fail, and leave the route without a backend.
    if host.parse::<IpAddr>().is_err() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "`{}` looks like an IPv4 address but is not one",
            shorten(host)
        ));
    }
    Ok(ServerSpec {
        scheme,
        host: host.to_string(),
        port,
    })
}

/// Why a server entry with a comma or a space is none: several addresses (each word one),
/// nginx's server parameters (`weight=3`, `max_fails=2`, `backup`), or a text that is no
/// address at all.
fn in_one_text(text: &str, shown: &str) -> String {
    let words: Vec<&str> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    let address = |w: &&str| w.contains(':') && !w.contains('=');
    if words.len() > 1 && words.iter().all(address) {
        return format!(
            "`{shown}` is several addresses in one text: list them, e.g. [\"a:80\", \"b:80\"]"
        );
    }
    let nginx = [
        "weight=",
        "max_fails=",
        "fail_timeout=",
        "max_conns=",
        "backup",
        "down",
        "resolve",
    ];
    if words
        .iter()
        .skip(1)
        .any(|w| nginx.iter().any(|p| w.starts_with(p)))
    {
        return format!("`{shown}`: nginx's server parameters (`weight=`, `max_fails=`, `backup`, ...) are not read here: write the address alone, and list it twice to give it twice the share");
    }
    format!("`{shown}` is not an address (expected host:port, with no spaces)")
}

fn split_host_port(text: &str) -> Result<(&str, &str), String> {
    let shown = shorten(text);
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{shown}`: `[` of an IPv6 address is never closed"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("`{shown}` has no port (expected [v6]:port)"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("`{}` is not a valid IPv6 address", shorten(host)));
        }
        return Ok((host, port));
    }
    // Said before the IPv6 guess, which two of them set off as well.
    if text.contains(',') || text.contains(char::is_whitespace) {
        return Err(in_one_text(text, &shown));
    }
    if let Some((_, after)) = text.split_once('@') {
        let rest = shorten(after);
        return Err(format!(
            "credentials are never sent to a backend: write the address alone (`{rest}`)"
        ));
    }
    match text.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => Err(unbracketed_v6(text)),
        Some(("", _)) => Err(format!("`{shown}` has no host (expected host:port)")),
        Some((host, port)) => Ok((host, port)),
        None => Err(format!("`{shown}` has no port (expected host:port)")),
    }
}

/// The message for an IPv6 address written without brackets, guessing the intended port.
fn unbracketed_v6(text: &str) -> String {
    let shown = shorten(text);
    let example = match text.rsplit_once(':') {
        Some((host, port))
            if host.parse::<std::net::Ipv6Addr>().is_ok()
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            format!("[{host}]:{port}")
        }
        _ => format!("[{shown}]:80"),
    };
    format!("`{shown}`: write IPv6 addresses in brackets, with the port after them, e.g. {example}")
}

/// A port number within `min..=65535`.
fn parse_port(port: &str, whole: &str, min: u32) -> Result<u16, String> {
    let whole = shorten(whole);
    let digits = port.bytes().all(|b| b.is_ascii_digit());
    match port.parse::<u32>() {
        _ if port.is_empty() => Err(format!("`{whole}` has no port number after `:`")),
        _ if !digits => Err(format!(
            "`{whole}`: port `{}` is not a number",
            shorten(port)
        )),
        Ok(0) if min > 0 => Err(format!("`{whole}`: port 0 is not a valid port")),
        Ok(p) if p <= 65535 => Ok(p as u16),
        Ok(p) => Err(format!("`{whole}`: port {p} is out of range ({min}-65535)")),
        Err(_) => Err(format!(
            "`{whole}`: port {port} is out of range ({min}-65535)"
        )),
    }
}

fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Parses a listen address `IP:port` (`[v6]:port` for IPv6). Port 0 is allowed (the OS picks).
/// Checks a `redis://host:port[/db]` URL as the Redis client will read it at start (a port
/// out of range, a database that is no number), so `check-config` refuses what start would.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    use redis::IntoConnectionInfo as _;
    let authority = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next());
    if authority.is_none_or(str::is_empty) {
        return Err(format!("`{url}` is not redis://host:port[/db]"));
    }
    url.into_connection_info()
        .map_err(|e| format!("`{url}` is not a Redis URL the client can use ({e})"))?;
    match redis_db(url) {
        Some(db) if db.parse::<u32>().is_err() => {
            Err(format!("`{url}`: the database `{db}` is not a number"))
        }
        _ => Ok(()),
    }
}

/// The database a `redis://host:port/db` URL names, if it names one.
pub fn redis_db(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let (_, db) = rest.split_once('/')?;
    let db = db.split(['?', '#']).next().unwrap_or_default();
    (!db.is_empty()).then_some(db)
}

pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let shown = shorten(text);
    if text.is_empty() {
        return Err("empty address (expected IP:port, e.g. 0.0.0.0:80)".to_string());
    }
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => return Err(unbracketed_v6(text)),
        Ok(IpAddr::V4(_)) => {
            return Err(format!(
                "`{shown}` has no port (expected IP:port, e.g. {shown}:80)"
            ))
        }
        Err(_) => {}
    }
    let (host, port) = if text.starts_with('[') {
        split_host_port(text)?
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => return Err(unbracketed_v6(text)),
            Some((host, port)) => (host, port),
            None => {
                return Err(format!(
                    "`{shown}` has no port (expected IP:port, e.g. 0.0.0.0:80)"
                ))
            }
        }
    };
    parse_port(port, text, 0)?;
    Err(format!(
        "`{}` is not an IP address (a listen address must be an IP literal, e.g. 0.0.0.0:80)",
        shorten(host)
    ))
}

/// Parses a header line `Name:Value` (spaces around either part are trimmed).
pub fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("`{}` has no `:` (expected \"Name:Value\")", shorten(text)))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{}` has an empty header name", shorten(text)));
    }
    let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        let bad = name
            .chars()
            .find(|c| !c.is_ascii_alphanumeric() && !"!#$%&'*+-.^_`|~".contains(*c));
        match bad {
            Some(' ') => format!(
                "`{}` is not a valid header name (it contains a space)",
                shorten(name)
            ),
            Some(c) => format!(
                "`{}` is not a valid header name (`{}` is not allowed)",
                shorten(name),
                c.escape_default()
            ),
            None => format!("`{}` is not a valid header name", shorten(name)),
        }
    })?;
    let value = value.trim();
    let header_value = HeaderValue::from_str(value).map_err(|_| {
        match value.chars().find(|c| c.is_ascii_control() && *c != '\t') {
            Some(c) => format!(
                "the value of `{name}` contains a control character (`{}`)",
                c.escape_default()
            ),
            None => format!("the value of `{name}` is not a valid header value"),
        }
    })?;
    Ok((header_name, header_value))
}

/// An authentication rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRule {
    /// `user:password`.
    Basic { user: String, password: String },
    /// Value the `x-api-key` header must carry.
    ApiKey(String),
    /// HS256 secret; `None` means the master key.
    Jwt(Option<String>),
    /// URL of the auth service.
    Forward(Uri),
}

pub const AUTH_TYPES: &[&str] = &["basic", "apikey", "jwt", "forward"];

/// Why an auth rule was refused, and which part of it is at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// The `type` is unknown.
    Type(String),
    /// The type needs `data` and there is none.
    MissingData(String),
    /// The `data` does not suit the type.
    Data(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::Type(m) | AuthError::MissingData(m) | AuthError::Data(m) => f.write_str(m),
        }
    }
}

/// Builds an auth rule from its `type` and `data`/`creds`.
pub fn parse_auth(kind: &str, data: Option<&str>) -> Result<AuthRule, AuthError> {
    let data = data.map(str::trim).filter(|d| !d.is_empty());
    let need = |what: &str| {
        AuthError::MissingData(format!(
            "auth type `{}` needs `data` ({what})",
            shorten(kind)
        ))
    };
    match kind.trim().to_ascii_lowercase().as_str() {
        "basic" => {
            let data = data.ok_or_else(|| need("user:password"))?;
            let (user, password) = data.split_once(':').ok_or_else(|| {
                AuthError::Data("basic auth `data` must be `user:password`".to_string())
            })?;
            if user.is_empty() || password.is_empty() {
                let empty = if user.is_empty() { "user" } else { "password" };
                return Err(AuthError::Data(format!(
                    "basic auth `data` has an empty {empty}: any client could send it (expected `user:password`)"
                )));
            }
            Ok(AuthRule::Basic {
                user: user.to_string(),
                password: password.to_string(),
            })
        }
        "apikey" => Ok(AuthRule::ApiKey(
            data.ok_or_else(|| need("the API key"))?.to_string(),
        )),
        "jwt" => Ok(AuthRule::Jwt(data.map(str::to_string))),
        "forward" => {
            let data = data.ok_or_else(|| need("the auth service URL"))?;
            let bad = || {
                AuthError::Data(format!(
                    "`{}` is not an http:// or https:// URL",
                    shorten(data)
                ))
            };
            let uri: Uri = data.parse().map_err(|_| bad())?;
            if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                // Not echoed: a password in a log line and a check-config report.
                let why = "the URL carries credentials, which would be sent as the `Host` field and authenticate nothing: the auth service gets the client's `Authorization` and `Cookie`";
                return Err(AuthError::Data(why.to_string()));
            }
            if uri.port_u16() == Some(0) {
                let why = format!("`{}`: port 0 is no port to connect to", shorten(data));
                return Err(AuthError::Data(why));
            }
            match uri.scheme_str() {
                Some("http") | Some("https") if uri.authority().is_some() => {
                    Ok(AuthRule::Forward(uri))
                }
                _ => Err(bad()),
            }
        }
        other => Err(AuthError::Type(
            match super::issues::did_you_mean(other, AUTH_TYPES) {
                Some(near) => format!(
                    "unknown auth type `{}`, did you mean `{near}`?",
                    shorten(other)
                ),
                None => format!(
                    "unknown auth type `{}` (expected one of: basic, apikey, jwt, forward)",
                    shorten(other)
                ),
            },
        )),
    }
}

/// Whether an authority's port, if it gives one, is a port: 1 to 65535 in digits (`http` reads
/// one out of range as none at all, and takes `+80` for 80).
pub fn port_in_range(authority: &http::uri::Authority) -> bool {
    let text = authority.as_str();
    let after_host = match text.rfind(']') {
        Some(end) => &text[end + 1..],
        None => text.rsplit_once('@').map_or(text, |(_, host)| host),
    };
    match after_host.rsplit_once(':') {
        Some((_, port)) if !port.is_empty() => {
            let digits = port.bytes().all(|b| b.is_ascii_digit());
            digits && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port is 1 to 65535 in digits; a user and password are no port, nor is an IPv6
    /// address.
    #[test]
    fn ports_in_range() {
        let fits = |text: &str| port_in_range(&text.parse::<http::uri::Authority>().unwrap());
        for ok in [
            "h",
            "h:443",
            "h:",
            "u:pw@h",
            "u:pw@h:8443",
            "[::1]",
            "[::1]:65535",
        ] {
            assert!(fits(ok), "{ok}");
        }
        for bad in ["h:0", "h:65536", "h:+80", "u:pw@h:99999", "[::1]:70000"] {
            assert!(!fits(bad), "{bad}");
        }
    }

    #[test]
    fn several_addresses_or_credentials_in_one_entry_are_said_as_such() {
        for several in [
            "127.0.0.1:32002, 127.0.0.1:32003",
            "127.0.0.1:1 127.0.0.2:1",
        ] {
            let said = parse_server(several).unwrap_err();
            assert!(said.contains("several addresses in one text"), "{said}");
        }
        let said = parse_server("127.0.0.1:25010 weight=3").unwrap_err();
        assert!(said.contains("nginx's server parameters"), "{said}");
        assert!(said.contains("list it twice"), "{said}");
        let said = parse_server("not an address").unwrap_err();
        assert!(said.contains("is not an address"), "{said}");
        let said = parse_server("http://user:pw@127.0.0.1:32001").unwrap_err();
        assert!(said.contains("credentials are never sent"), "{said}");
        assert!(!said.contains("pw"), "the password is not repeated: {said}");
    }

    #[test]
    fn servers() {
        let s = parse_server("127.0.0.1:8000").unwrap();
        assert_eq!(
            (s.scheme, s.host.as_str(), s.port),
            (None, "127.0.0.1", 8000)
        );
        let s = parse_server("h2c://[::1]:9000").unwrap();
        assert_eq!(
            (s.scheme, s.host.as_str(), s.port),
            (Some(Scheme::H2c), "::1", 9000)
        );
        assert_eq!(s.authority(), "[::1]:9000");
        assert_eq!(parse_server("backend.svc:80").unwrap().host, "backend.svc");
        for bad in [
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:70000",
            "x:y",
            "::1:80",
            "ftp://a:1",
            "a b:1",
            "[::1:80",
        ] {
            assert!(parse_server(bad).is_err(), "{bad} should be refused");
        }
        let reason = |text: &str| parse_server(text).unwrap_err();
        assert!(reason(":80").contains("no host"));
        assert!(reason("").contains("empty"));
        assert!(reason("a:+80").contains("not a number"));
        assert!(reason("::1:8080").contains("[::1]:8080"));
        assert!(reason("http:/a:1").contains("malformed scheme"));
        assert!(reason("a.local:80/api").contains("without a path"));
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("0.0.0.0:80").unwrap().port(), 80);
        assert!(parse_listen("[::]:443").is_ok());
        assert!(parse_listen("0.0.0.0").unwrap_err().contains("no port"));
        assert!(parse_listen("0.0.0.0:99999")
            .unwrap_err()
            .contains("out of range"));
        assert!(parse_listen("localhost:80")
            .unwrap_err()
            .contains("IP literal"));
        assert!(parse_listen("::1:80").unwrap_err().contains("[::1]:80"));
        assert!(parse_listen("[::1]").unwrap_err().contains("no port"));
        assert!(parse_listen("1.2.3.4:+80")
            .unwrap_err()
            .contains("not a number"));
        assert_eq!(parse_listen("127.0.0.1:0").unwrap().port(), 0);
    }

    #[test]
    fn headers() {
        let (n, v) = parse_header("X-Frame-Options: DENY").unwrap();
        assert_eq!(
            (n.as_str(), v.to_str().unwrap()),
            ("x-frame-options", "DENY")
        );
        let (_, v) = parse_header("Access-Control-Allow-Origin:*").unwrap();
        assert_eq!(v, "*");
        assert!(parse_header("NoColon").unwrap_err().contains("no `:`"));
        assert!(parse_header("Bad Name:1")
            .unwrap_err()
            .contains("not a valid header name"));
        assert!(parse_header("X-A:a\u{7f}b").is_err());
    }

    #[test]
    fn auth_rules() {
        assert!(matches!(
            parse_auth("basic", Some("u:p")),
            Ok(AuthRule::Basic { .. })
        ));
        assert!(parse_auth("basic", Some("nocolon")).is_err());
        for typo in ["300.1.1.1:80", "10.0.0:80", "1.2.3.4.5:80"] {
            let refused = parse_server(typo).unwrap_err();
            assert!(
                refused.contains("looks like an IPv4 address"),
                "{typo}: {refused}"
            );
        }
        for empty in [":", "admin:", ":secret"] {
            let refused = parse_auth("basic", Some(empty));
            assert!(
                matches!(refused, Err(AuthError::Data(m)) if m.contains("has an empty")),
                "{empty}"
            );
        }
        assert!(parse_auth("apikey", None)
            .unwrap_err()
            .to_string()
            .contains("needs `data`"));
        assert_eq!(parse_auth("jwt", None), Ok(AuthRule::Jwt(None)));
        assert!(parse_auth("forward", Some("auth.local/check")).is_err());
        assert!(parse_auth("forward", Some("http://auth.local/check")).is_ok());
        assert!(parse_auth("forward", Some("http://127.0.0.1:0/check")).is_err());
        assert!(parse_auth("jwk", None)
            .unwrap_err()
            .to_string()
            .contains("did you mean `jwt`"));
    }
}
