//! The policy settings that the global, host and path levels of `upstreams.yaml` share (and
//! discovered services too): [`RouteSettings`], their keys, and how each is read.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::issues::SetAt;
use super::reader::{bool_word, join, Reader};
use super::values::{parse_auth, parse_header, AuthError, AuthRule};
use super::yaml::{Key, Node, Pos, Value};

pub type HeaderList = Vec<(HeaderName, HeaderValue)>;

/// Policy keys that global, host and path levels share; `None` means "inherit".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteSettings {
    /// `Some(None)`: explicitly off; `Some(Some(d))`: cookie lifetime.
    pub sticky_sessions: Option<Option<Duration>>,
    pub to_https: Option<bool>,
    pub rate_limit: Option<u32>,
    pub x4xx_limit: Option<u32>,
    pub server_headers: HeaderList,
    pub client_headers: HeaderList,
    pub authorization: Option<AuthRule>,
    pub healthcheck: Option<bool>,
    pub redirect_to: Option<String>,
    pub upstream_tls_verify: Option<bool>,
    /// `Some(None)`: explicitly off; `Some(Some(rule))`: responses compressed by that rule.
    pub compress: Option<Option<CompressRule>>,
    /// `cache: false` keeps a route out of main.yaml's cache.
    pub cache: Option<bool>,
    /// `cache_ttl`: replaces main.yaml's `cache.ttl` for the route (responses without freshness).
    pub cache_ttl: Option<Duration>,
    /// `acme: true` on a host: main.yaml's `acme:` gets it a certificate too.
    pub acme: Option<bool>,
}

/// `compress`: which responses of a route are compressed (`layers::compress`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressRule {
    /// Responses whose length is known and below this many bytes are sent as they are.
    pub min_size: u64,
    /// Media types (`type/subtype`, `type/*` or `*/*`), lower case.
    pub types: Vec<String>,
}

/// nginx's `gzip_min_length` is 20; below about a kilobyte compression rarely saves a packet.
pub const DEFAULT_COMPRESS_MIN_SIZE: u64 = 1024;

/// Text formats that compress well; images, video, archives and fonts other than TrueType and
/// OpenType are compressed already.
pub const DEFAULT_COMPRESS_TYPES: &[&str] = &[
    "text/html",
    "text/css",
    "text/plain",
    "text/xml",
    "text/javascript",
    "text/csv",
    "text/markdown",
    "application/javascript",
    "application/json",
    "application/ld+json",
    "application/manifest+json",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/wasm",
    "image/svg+xml",
    "image/x-icon",
    "font/ttf",
    "font/otf",
];

impl Default for CompressRule {
    fn default() -> CompressRule {
        CompressRule {
            min_size: DEFAULT_COMPRESS_MIN_SIZE,
            types: DEFAULT_COMPRESS_TYPES
                .iter()
                .map(|t| t.to_string())
                .collect(),
        }
    }
}

impl RouteSettings {
    /// `self` with anything it leaves unset taken from `parent`; header lists add up (parent first).
    pub fn inherit(&self, parent: &RouteSettings) -> RouteSettings {
        let mut server_headers = parent.server_headers.clone();
        server_headers.extend(self.server_headers.iter().cloned());
        let mut client_headers = parent.client_headers.clone();
        client_headers.extend(self.client_headers.iter().cloned());
        RouteSettings {
            sticky_sessions: self.sticky_sessions.or(parent.sticky_sessions),
            to_https: self.to_https.or(parent.to_https),
            rate_limit: self.rate_limit.or(parent.rate_limit),
            x4xx_limit: self.x4xx_limit.or(parent.x4xx_limit),
            server_headers,
            client_headers,
            authorization: self
                .authorization
                .clone()
                .or_else(|| parent.authorization.clone()),
            healthcheck: self.healthcheck.or(parent.healthcheck),
            redirect_to: self
                .redirect_to
                .clone()
                .or_else(|| parent.redirect_to.clone()),
            upstream_tls_verify: self.upstream_tls_verify.or(parent.upstream_tls_verify),
            compress: self.compress.clone().or_else(|| parent.compress.clone()),
            cache: self.cache.or(parent.cache),
            cache_ttl: self.cache_ttl.or(parent.cache_ttl),
            acme: self.acme.or(parent.acme),
        }
    }
}

pub(super) const SETTING_KEYS: &[&str] = &[
    "sticky_sessions",
    "to_https",
    "rate_limit",
    "x4xx_limit",
    "server_headers",
    "client_headers",
    "headers",
    "authorization",
    "healthcheck",
    "redirect_to",
    "upstream_tls_verify",
    "compress",
    "cache",
    "cache_ttl",
    "acme",
];
pub(super) fn read_setting(
    settings: &mut RouteSettings,
    key: &Key,
    node: &Node,
    parent: &str,
    r: &mut Reader,
) {
    let path = join(parent, &key.name);
    let p = path.as_str();
    match key.name.as_str() {
        "sticky_sessions" => settings.sticky_sessions = read_sticky(node, p, r),
        "to_https" => settings.to_https = noted_boolean("to_https", node, p, r),
        "rate_limit" => settings.rate_limit = r.uint(node, p, 0, 10_000_000).map(|n| n as u32),
        "x4xx_limit" => settings.x4xx_limit = r.uint(node, p, 0, 10_000_000).map(|n| n as u32),
        "server_headers" => settings.server_headers = read_headers(node, p, r, true),
        "client_headers" | "headers" => {
            settings
                .client_headers
                .extend(read_headers(node, p, r, false));
        }
        "authorization" => {
            if r.global_authorization && !parent.is_empty() {
                let why = "this route's own authorization applies here, not the global one (Aralez let a global authorization override every route's)";
                r.warn(key.pos, p, why);
            }
            settings.authorization = read_auth(node, p, r);
        }
        "healthcheck" => settings.healthcheck = r.boolean(node, p),
        "redirect_to" => settings.redirect_to = read_redirect(node, p, r),
        "upstream_tls_verify" => settings.upstream_tls_verify = r.boolean(node, p),
        "compress" => settings.compress = read_compress(node, p, r),
        "cache" => settings.cache = r.boolean(node, p),
        "acme" => settings.acme = noted_boolean("acme", node, p, r),
        "cache_ttl" => {
            settings.cache_ttl = r.uint(node, p, 1, 365 * 86_400).map(Duration::from_secs);
            if settings.cache_ttl.is_some() {
                note_set("cache_ttl", node, p, r);
            }
        }
        _ => {}
    }
}

fn read_sticky(node: &Node, path: &str, r: &mut Reader) -> Option<Option<Duration>> {
    let hour = Some(Some(Duration::from_secs(3600)));
    match &node.value {
        Value::Bool(true) => hour,
        Value::Bool(false) => Some(None),
        Value::Str(s) if bool_word(s) == Some(true) => hour,
        Value::Str(s) if bool_word(s) == Some(false) => Some(None),
        Value::Int(_) => r
            .uint(node, path, 0, 10 * 365 * 86_400)
            .map(|s| (s > 0).then(|| Duration::from_secs(s))),
        Value::Str(s) if s.trim().parse::<i64>().is_ok() => r
            .uint(node, path, 0, 10 * 365 * 86_400)
            .map(|s| (s > 0).then(|| Duration::from_secs(s))),
        _ => {
            r.wrong_type(node, path, "true, false or a number of seconds");
            None
        }
    }
}

/// `compress: true|false`, or a mapping `{min_size: BYTES, types: [TYPE, ...]}` (on, and what
/// it leaves out takes the defaults).
fn read_compress(node: &Node, path: &str, r: &mut Reader) -> Option<Option<CompressRule>> {
    if !matches!(node.value, Value::Map(_)) {
        let on = match &node.value {
            Value::Bool(b) => Some(*b),
            Value::Str(s) => bool_word(s),
            _ => None,
        };
        let Some(on) = on else {
            r.wrong_type(node, path, "true, false or a mapping of min_size and types");
            return None;
        };
        return Some(on.then(CompressRule::default));
    }
    let entries = r.map(node, path)?;
    let mut rule = CompressRule::default();
    let mut ok = true;
    for (key, value) in entries {
        let key_path = join(path, &key.name);
        match key.name.as_str() {
            "min_size" => match r.uint(value, &key_path, 0, u64::from(u32::MAX)) {
                Some(n) => rule.min_size = n,
                None => ok = false,
            },
            "types" => match read_media_types(value, &key_path, r) {
                Some(types) => rule.types = types,
                None => ok = false,
            },
            _ => r.unknown_key(key, &key_path, &["min_size", "types"]),
        }
    }
    ok.then_some(Some(rule))
}

/// A non-empty list of media types, lower-cased; each one checked.
fn read_media_types(node: &Node, path: &str, r: &mut Reader) -> Option<Vec<String>> {
    let items = r.string_list(node, path)?;
    if items.is_empty() {
        r.error(
            node.pos,
            path,
            "the list of types is empty (write `compress: false` to turn compression off)",
        );
        return None;
    }
    let mut types = Vec::with_capacity(items.len());
    let mut ok = true;
    for (pos, item_path, text) in items {
        match media_range(&text) {
            Ok(t) => types.push(t),
            Err(msg) => {
                r.error(pos, &item_path, msg);
                ok = false;
            }
        }
    }
    ok.then_some(types)
}

/// `type/subtype`, `type/*` or `*/*` (`*` alone too), lower-cased; parameters are not allowed.
fn media_range(text: &str) -> Result<String, String> {
    let t = text.trim().to_ascii_lowercase();
    if t == "*" {
        return Ok("*/*".to_string());
    }
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    let valid = match t.split_once('/') {
        Some(("*", "*")) => true,
        Some((ty, "*")) => token(ty),
        Some((ty, sub)) => token(ty) && token(sub),
        None => false,
    };
    if valid {
        Ok(t)
    } else {
        Err(format!(
            "`{}` is not a media type such as text/html, text/* or */* (no parameters)",
            super::reader::shorten(text)
        ))
    }
}

/// A route's header list; `to_backend` for `server_headers`, whose fields replace what the
/// proxy itself tells the backend of the request (its host, the client's address: warned of).
fn read_headers(node: &Node, path: &str, r: &mut Reader, to_backend: bool) -> HeaderList {
    let Some(items) = r.string_list(node, path) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for (pos, item_path, text) in items {
        let parsed = parse_header(&text);
        if let (Ok((name, _)), true) = (&parsed, to_backend) {
            if let Some(lost) = what_the_proxy_says(name) {
                let why = format!("`{name}` replaces what the proxy tells the backend ({lost}): the backend no longer learns it");
                r.warn(pos, &item_path, why);
            }
        }
        match parsed {
            Ok((name, _)) if is_connection_field(&name) => {
                let message = format!(
                    "`{name}` describes the connection or how the message is framed: the proxy sets \
                     it for each hop itself, and a fixed value would cut or corrupt bodies"
                );
                r.error(pos, &item_path, message);
            }
            Ok(h) => out.push(h),
            Err(msg) => r.error(pos, &item_path, msg),
        }
    }
    out
}

/// What the proxy itself puts in a field of the request it sends (SPEC §6.2), if it does.
fn what_the_proxy_says(name: &http::HeaderName) -> Option<&'static str> {
    Some(match name.as_str() {
        "host" => "the host the client asked for",
        "x-forwarded-for" | "x-real-ip" | "forwarded" => "the client's address",
        "x-forwarded-proto" => "the scheme the client used",
        "x-forwarded-host" => "the host the client asked for",
        _ => return None,
    })
}

/// A field a route's header lists may not set: framing and hop-by-hop ones (RFC 9110 §7.6.1).
fn is_connection_field(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "upgrade"
            | "te"
            | "trailer"
    )
}

fn read_auth(node: &Node, path: &str, r: &mut Reader) -> Option<AuthRule> {
    let entries = r.map(node, path)?;
    let mut kind: Option<(Pos, String)> = None;
    let mut data: Option<(Pos, String, String)> = None;
    let mut ok = true;
    for (key, value) in entries {
        let key_path = join(path, &key.name);
        match key.name.as_str() {
            "type" => match r.string(value, &key_path) {
                Some(s) => kind = Some((value.pos, s)),
                None => ok = false,
            },
            "data" | "creds" if data.is_some() => {
                let why = "`data` and `creds` are one setting (`creds` its older name), given twice: keep one";
                r.error(key.pos, &key_path, why);
                ok = false;
            }
            "data" | "creds" => match r.string(value, &key_path) {
                Some(s) => data = Some((value.pos, key_path, s)),
                None => ok = false,
            },
            _ => r.unknown_key(key, &key_path, &["type", "data", "creds"]),
        }
    }
    let Some((kind_pos, kind)) = kind else {
        if ok {
            r.error(
                node.pos,
                path,
                "authorization needs a `type` (basic, apikey, jwt or forward)",
            );
        }
        return None;
    };
    if !ok {
        return None;
    }
    match parse_auth(&kind, data.as_ref().map(|(_, _, d)| d.as_str())) {
        Ok(AuthRule::Jwt(None)) if r.issues.no_master_secret => {
            let why = "jwt without `data` checks tokens with master_key or JWT_KEY, and neither is set: every request would get a 503";
            r.error(kind_pos, path, why);
            None
        }
        Ok(rule) => Some(rule),
        Err(AuthError::Data(msg)) => {
            let (pos, key_path) = data
                .map(|(pos, key_path, _)| (pos, key_path))
                .unwrap_or((kind_pos, join(path, "data")));
            r.error(pos, &key_path, msg);
            None
        }
        Err(AuthError::MissingData(msg)) => {
            r.error(kind_pos, path, msg);
            None
        }
        Err(AuthError::Type(msg)) => {
            r.error(kind_pos, &join(path, "type"), msg);
            None
        }
    }
}

/// A boolean setting that the check across files looks at: where it is first set true is
/// noted for that check to point at.
fn noted_boolean(name: &'static str, node: &Node, path: &str, r: &mut Reader) -> Option<bool> {
    let value = r.boolean(node, path);
    if value == Some(true) {
        note_set(name, node, path, r);
    }
    value
}

/// Notes where the setting `name` is first set (true, for a boolean), for the check across
/// files to point at.
fn note_set(name: &'static str, node: &Node, path: &str, r: &mut Reader) {
    let set_at = || SetAt {
        file: r.file.clone(),
        pos: node.pos,
        key: path.to_string(),
    };
    r.issues.first_true.entry(name).or_insert_with(set_at);
}

fn read_redirect(node: &Node, path: &str, r: &mut Reader) -> Option<String> {
    let text = r.non_empty_string(node, path)?;
    if text.contains(['?', '#']) {
        let why = format!("`{text}` has a query or a fragment: the request's path and query are added to the end of redirect_to, so it must end with its path (https://www.example.com/base)");
        r.error(node.pos, path, why);
        return None;
    }
    match text.parse::<http::Uri>() {
        Ok(uri)
            if uri
                .authority()
                .is_some_and(|a| !super::values::port_in_range(a)) =>
        {
            let why = format!("`{text}`: the port is out of range (1 to 65535)");
            r.error(node.pos, path, why);
            None
        }
        Ok(uri) if uri.scheme().is_some() && uri.authority().is_some() => {
            Some(text.trim_end_matches('/').to_string())
        }
        _ => {
            r.error(
                node.pos,
                path,
                format!("`{text}` must be an absolute URL such as https://www.example.com"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::issues::Issues;
    use crate::config::yaml;

    fn sticky(text: &str) -> Option<Option<Duration>> {
        let mut issues = Issues::default();
        let doc = yaml::parse(text).expect("yaml");
        let mut r = Reader::new("upstreams.yaml".into(), &mut issues);
        read_sticky(&doc, "sticky_sessions", &mut r)
    }

    #[test]
    fn sticky_sessions_takes_every_spelling_of_a_boolean_as_to_https_does() {
        let hour = Some(Some(Duration::from_secs(3600)));
        for on in ["true", "yes", "\"yes\"", "'On'", "\"TRUE\""] {
            assert_eq!(sticky(on), hour, "{on}");
        }
        for off in ["false", "no", "\"no\"", "'off'", "0"] {
            assert_eq!(sticky(off), Some(None), "{off}");
        }
        assert_eq!(sticky("\"600\""), Some(Some(Duration::from_secs(600))));
        assert_eq!(sticky("sometimes"), None);
    }
}
