//! A typed builder for `upstreams.yaml`, so tests state routes instead of assembling YAML text.
//!
//! ```ignore
//! let yaml = Upstreams::new()
//!     .host("DEFAULT", Host::new().path("/", Path::servers(&[&a, &b]).healthcheck(false)))
//!     .render();
//! ```
//!
//! Rendering is deterministic (keys in the order they were set, block style, two-space indents)
//! and every string value is YAML double-quoted with escapes (keys too, unless they are plain
//! identifiers). Tests whose point is the text itself
//! (error positions, parse errors, deliberately broken files) keep raw YAML.

use std::fmt::{self, Display, Write as _};

use super::Backend;

/// A YAML value as the builder renders it.
#[derive(Clone, Debug)]
pub enum Yaml {
    Str(String),
    Int(i64),
    Bool(bool),
    List(Vec<Yaml>),
    /// A mapping, keys in this order.
    Map(Vec<(String, Yaml)>),
}

impl From<&str> for Yaml {
    fn from(s: &str) -> Yaml {
        Yaml::Str(s.to_string())
    }
}

impl From<String> for Yaml {
    fn from(s: String) -> Yaml {
        Yaml::Str(s)
    }
}

impl From<bool> for Yaml {
    fn from(b: bool) -> Yaml {
        Yaml::Bool(b)
    }
}

impl From<i64> for Yaml {
    fn from(n: i64) -> Yaml {
        Yaml::Int(n)
    }
}

impl From<u64> for Yaml {
    fn from(n: u64) -> Yaml {
        Yaml::Int(i64::try_from(n).expect("integer fits in i64"))
    }
}

impl From<u32> for Yaml {
    fn from(n: u32) -> Yaml {
        Yaml::Int(n.into())
    }
}

impl From<i32> for Yaml {
    fn from(n: i32) -> Yaml {
        Yaml::Int(n.into())
    }
}

/// A list of strings.
fn strings<S: AsRef<str>>(items: &[S]) -> Yaml {
    Yaml::List(items.iter().map(|s| s.as_ref().into()).collect())
}

/// `s` as a YAML double-quoted scalar.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // YAML reads these as line breaks even inside quotes.
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` as a mapping key: plain when it is a simple identifier YAML reads as that string, else
/// double-quoted.
pub fn key(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        s.to_string()
    } else {
        quote(s)
    }
}

impl Yaml {
    /// Whether this renders on the line of its key (scalars and empty collections).
    fn inline(&self) -> bool {
        match self {
            Yaml::List(items) => items.is_empty(),
            Yaml::Map(entries) => entries.is_empty(),
            _ => true,
        }
    }

    fn scalar(&self) -> String {
        match self {
            Yaml::Str(s) => quote(s),
            Yaml::Int(n) => n.to_string(),
            Yaml::Bool(b) => b.to_string(),
            Yaml::List(_) => "[]".into(),
            Yaml::Map(_) => "{}".into(),
        }
    }

    /// Writes the entries of a mapping at `indent`.
    fn write_map(entries: &[(String, Yaml)], indent: usize, out: &mut String) {
        for (key, value) in entries {
            let _ = write!(out, "{:indent$}{}:", "", self::key(key));
            value.write_value(indent, out);
        }
    }

    /// Writes this value after `key:` (scalars on the same line, collections below).
    fn write_value(&self, indent: usize, out: &mut String) {
        if self.inline() {
            let _ = writeln!(out, " {}", self.scalar());
            return;
        }
        out.push('\n');
        match self {
            Yaml::Map(entries) => Yaml::write_map(entries, indent + 2, out),
            Yaml::List(items) => {
                for item in items {
                    let _ = write!(out, "{:w$}-", "", w = indent + 2);
                    match item {
                        Yaml::Map(entries) if !entries.is_empty() => {
                            // The first entry on the dash's line, the others aligned with it.
                            let mut first = String::new();
                            Yaml::write_map(entries, indent + 4, &mut first);
                            out.push(' ');
                            out.push_str(first.trim_start());
                        }
                        other if other.inline() => {
                            let _ = writeln!(out, " {}", other.scalar());
                        }
                        other => panic!("a list inside a list is not rendered: {other:?}"),
                    }
                }
            }
            _ => unreachable!("scalars are inline"),
        }
    }
}

/// An `authorization` mapping: `{type: kind}` or `{type: kind, data: data}`.
fn auth(kind: &str, data: Option<&str>) -> Yaml {
    let mut entries = vec![("type".to_string(), Yaml::from(kind))];
    if let Some(data) = data {
        entries.push(("data".into(), data.into()));
    }
    Yaml::Map(entries)
}

/// One route (an entry under a host's `paths`).
#[derive(Clone, Debug, Default)]
pub struct Path {
    settings: Vec<(String, Yaml)>,
}

impl Path {
    /// A route to `backends` (`servers: ["ip:port", ...]`).
    pub fn servers(backends: &[&Backend]) -> Path {
        let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
        Path::addrs(&addrs)
    }

    /// A route to these server strings as written (`"ip:port"`, `"https://host:port"`,
    /// `"h2c://..."`, `"localhost:port"`...).
    pub fn addrs<S: Display>(servers: &[S]) -> Path {
        let servers: Vec<String> = servers.iter().map(ToString::to_string).collect();
        Path::default().set("servers", strings(&servers))
    }

    /// A route without servers that only redirects (`redirect_to: url`).
    pub fn redirect(url: &str) -> Path {
        Path::default().redirect_to(url)
    }

    /// Any setting `key: value` of the route (kept in the order set; a key set twice is
    /// replaced in place).
    pub fn set(mut self, key: &str, value: impl Into<Yaml>) -> Path {
        let value = value.into();
        match self.settings.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.settings.push((key.to_string(), value)),
        }
        self
    }

    /// `healthcheck: on`.
    pub fn healthcheck(self, on: bool) -> Path {
        self.set("healthcheck", on)
    }

    /// `hc_interval: seconds` (this route's health-check interval).
    pub fn hc_interval(self, seconds: u64) -> Path {
        self.set("hc_interval", seconds)
    }

    /// `rate_limit: per_second` (requests per second per client).
    pub fn rate_limit(self, per_second: u64) -> Path {
        self.set("rate_limit", per_second)
    }

    /// `to_https: on`.
    #[allow(clippy::wrong_self_convention)] // named after the YAML key, a builder setter
    pub fn to_https(self, on: bool) -> Path {
        self.set("to_https", on)
    }

    /// `redirect_to: url`.
    pub fn redirect_to(self, url: &str) -> Path {
        self.set("redirect_to", url)
    }

    /// `authorization: {type: kind}` (e.g. `jwt`, which takes no data).
    pub fn authorization(self, kind: &str) -> Path {
        self.set(
            "authorization",
            Yaml::Map(vec![("type".into(), kind.into())]),
        )
    }

    /// `authorization: {type: kind, data: data}` (`basic`, `apikey`, `forward`...).
    pub fn authorization_data(self, kind: &str, data: &str) -> Path {
        let auth = vec![("type".into(), kind.into()), ("data".into(), data.into())];
        self.set("authorization", Yaml::Map(auth))
    }

    /// `server_headers: [...]` ("Name:value" headers added to requests to the backend).
    pub fn server_headers(self, headers: &[&str]) -> Path {
        self.set("server_headers", strings(headers))
    }

    /// `client_headers: [...]` ("Name:value" headers added to responses to the client).
    pub fn client_headers(self, headers: &[&str]) -> Path {
        self.set("client_headers", strings(headers))
    }

    /// `upstream_tls_verify: on`.
    pub fn upstream_tls_verify(self, on: bool) -> Path {
        self.set("upstream_tls_verify", on)
    }
}

/// One host (an entry under `upstreams`): host-level settings and its paths.
#[derive(Clone, Debug, Default)]
pub struct Host {
    settings: Vec<(String, Yaml)>,
    paths: Vec<(String, Path)>,
}

impl Host {
    /// A host with no paths yet.
    pub fn new() -> Host {
        Host::default()
    }

    /// Adds the route `prefix` (in order).
    pub fn path(mut self, prefix: &str, path: Path) -> Host {
        self.paths.push((prefix.to_string(), path));
        self
    }

    /// Any host-level setting `key: value` (rendered before `paths`).
    pub fn set(mut self, key: &str, value: impl Into<Yaml>) -> Host {
        self.settings.push((key.to_string(), value.into()));
        self
    }

    /// `sticky_sessions: seconds`.
    pub fn sticky_sessions(self, seconds: u64) -> Host {
        self.set("sticky_sessions", seconds)
    }

    /// `x4xx_limit: n` (4xx answers a client may get before it is refused for a while).
    pub fn x4xx_limit(self, n: u64) -> Host {
        self.set("x4xx_limit", n)
    }

    /// `authorization: {type: kind, data: data}` for every path of the host (a path's own rule
    /// overrides it).
    pub fn authorization_data(self, kind: &str, data: &str) -> Host {
        self.set("authorization", auth(kind, Some(data)))
    }

    /// `to_https: on`, for every path of the host.
    #[allow(clippy::wrong_self_convention)] // named after the YAML key, a builder setter
    pub fn to_https(self, on: bool) -> Host {
        self.set("to_https", on)
    }

    fn yaml(&self) -> Yaml {
        let mut entries = self.settings.clone();
        let paths = self
            .paths
            .iter()
            .map(|(prefix, path)| (prefix.clone(), Yaml::Map(path.settings.clone())))
            .collect();
        entries.push(("paths".into(), Yaml::Map(paths)));
        Yaml::Map(entries)
    }
}

/// One service a discovery provider maps to a route.
#[derive(Clone, Debug)]
pub struct Service {
    entries: Vec<(String, Yaml)>,
}

impl Service {
    /// `{hostname, upstream, path}`: requests for `hostname` + `path` go to the instances of
    /// `upstream`.
    pub fn new(hostname: &str, upstream: &str, path: &str) -> Service {
        Service {
            entries: vec![
                ("hostname".into(), hostname.into()),
                ("upstream".into(), upstream.into()),
                ("path".into(), path.into()),
            ],
        }
    }

    /// `client_headers: [...]` on the discovered route.
    pub fn client_headers(mut self, headers: &[&str]) -> Service {
        self.entries
            .push(("client_headers".into(), strings(headers)));
        self
    }
}

/// A discovery provider block (`provider: consul|kubernetes` and its settings).
#[derive(Clone, Debug)]
pub struct Discovery {
    provider: &'static str,
    entries: Vec<(String, Yaml)>,
    services: Vec<Service>,
}

impl Discovery {
    /// `provider: consul` with these agent URLs.
    pub fn consul(servers: &[&str]) -> Discovery {
        Discovery {
            provider: "consul",
            entries: vec![("servers".into(), strings(servers))],
            services: Vec::new(),
        }
    }

    /// `provider: kubernetes` with these API server URLs.
    pub fn kubernetes(servers: &[&str]) -> Discovery {
        Discovery {
            provider: "kubernetes",
            entries: vec![("servers".into(), strings(servers))],
            services: Vec::new(),
        }
    }

    /// `token: token` (Consul's ACL token).
    pub fn token(mut self, token: &str) -> Discovery {
        self.entries.push(("token".into(), token.into()));
        self
    }

    /// `tokenpath: path` (the file holding Kubernetes' bearer token).
    pub fn tokenpath(mut self, path: &str) -> Discovery {
        self.entries.push(("tokenpath".into(), path.into()));
        self
    }

    /// Adds a service to `services`.
    pub fn service(mut self, service: Service) -> Discovery {
        self.services.push(service);
        self
    }
}

/// A whole `upstreams.yaml`: global settings, an optional discovery provider, then hosts.
#[derive(Clone, Debug, Default)]
pub struct Upstreams {
    globals: Vec<(String, Yaml)>,
    discovery: Option<Discovery>,
    hosts: Vec<(String, Host)>,
}

impl Upstreams {
    /// An empty file (no hosts).
    pub fn new() -> Upstreams {
        Upstreams::default()
    }

    /// Adds the host `name` (`DEFAULT` catches every other host).
    pub fn host(mut self, name: &str, host: Host) -> Upstreams {
        self.hosts.push((name.to_string(), host));
        self
    }

    /// Any global setting `key: value` (rendered before `upstreams`).
    pub fn global(mut self, key: &str, value: impl Into<Yaml>) -> Upstreams {
        self.globals.push((key.to_string(), value.into()));
        self
    }

    /// Global `server_headers: [...]`, added to every request to a backend.
    pub fn server_headers(self, headers: &[&str]) -> Upstreams {
        self.global("server_headers", strings(headers))
    }

    /// The discovery provider block.
    pub fn discovery(mut self, discovery: Discovery) -> Upstreams {
        self.discovery = Some(discovery);
        self
    }

    /// The YAML text.
    pub fn render(&self) -> String {
        let mut entries = self.globals.clone();
        if let Some(d) = &self.discovery {
            entries.push(("provider".into(), d.provider.into()));
            let mut block = d.entries.clone();
            let services = d
                .services
                .iter()
                .map(|s| Yaml::Map(s.entries.clone()))
                .collect();
            block.push(("services".into(), Yaml::List(services)));
            entries.push((d.provider.into(), Yaml::Map(block)));
        }
        if !self.hosts.is_empty() || self.discovery.is_none() {
            let hosts = self
                .hosts
                .iter()
                .map(|(name, host)| (name.clone(), host.yaml()))
                .collect();
            entries.push(("upstreams".into(), Yaml::Map(hosts)));
        }
        let mut out = String::new();
        Yaml::write_map(&entries, 0, &mut out);
        out
    }
}

impl Upstreams {
    /// The hosts alone, at the top level, as a `conf.d/*.yaml` file holds them (globals and
    /// discovery are not rendered).
    pub fn render_conf_d(&self) -> String {
        let hosts: Vec<(String, Yaml)> = self
            .hosts
            .iter()
            .map(|(name, host)| (name.clone(), host.yaml()))
            .collect();
        let mut out = String::new();
        Yaml::write_map(&hosts, 0, &mut out);
        out
    }
}

impl Display for Upstreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

/// upstreams.yaml sending every host and path to `backends`, without health checks.
/// upstreams.yaml sending every path of host `name` to `backend`, without health checks.
pub fn host_route(name: &str, backend: &Backend) -> String {
    Upstreams::new()
        .host(
            name,
            Host::new().path("/", Path::servers(&[backend]).healthcheck(false)),
        )
        .render()
}

pub fn default_route(backends: &[&Backend]) -> String {
    Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::servers(backends).healthcheck(false)),
        )
        .render()
}

/// [`default_route`] to one backend pinned to HTTP/1.1 over plain TCP (`http://`): aralez's own
/// client, never the h2c that detection would pick for a test backend.
pub fn http1_route(backend: &Backend) -> String {
    default_route_to(&[format!("http://{}", backend.addr)])
}

/// upstreams.yaml sending every host and path to these addresses, without health checks.
pub fn default_route_to<S: Display>(servers: &[S]) -> String {
    Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(servers).healthcheck(false)),
        )
        .render()
}

/// upstreams.yaml with one DEFAULT route to 127.0.0.1:9 (nothing listens there), for tests that
/// need a valid file but never proxy.
pub fn unused_route() -> String {
    Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::addrs(&["127.0.0.1:9"])),
        )
        .render()
}
