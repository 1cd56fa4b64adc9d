//! `upstreams.yaml` (and `conf.d/*.yaml`): hosts, paths, backends and their policies (SPEC §3).
//!
//! Both shapes are read: v0.92's `upstreams:` wrapper and the older README's top-level hosts.
//! Global, host and path levels carry the same policy keys; what a level leaves unset it inherits.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::issues::did_you_mean;
use super::reader::{join, Reader};
use super::values::{parse_auth, parse_header, parse_server, AuthError, AuthRule, ServerSpec};
use super::yaml::{Key, Node, Pos, Value};

/// Which of the two accepted shapes a file used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Routes under `upstreams:` (Aralez v0.92).
    Current,
    /// Hosts at the top level beside the global keys (the older README).
    Legacy,
}

/// Where routes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Provider {
    #[default]
    File,
    Consul,
    Kubernetes,
}

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
        }
    }
}

/// One path prefix of a host.
#[derive(Clone, Debug, PartialEq)]
pub struct PathConfig {
    pub prefix: String,
    pub servers: Vec<ServerSpec>,
    pub settings: RouteSettings,
}

/// One host and its paths.
#[derive(Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// Normalised: lower case, no trailing dot; `DEFAULT` kept as is.
    pub name: String,
    pub settings: RouteSettings,
    pub paths: Vec<PathConfig>,
}

/// Everything upstreams.yaml (plus conf.d) says.
#[derive(Clone, Debug)]
pub struct UpstreamsConfig {
    pub shape: Shape,
    pub provider: Provider,
    pub globals: RouteSettings,
    pub hosts: Vec<HostConfig>,
    pub consul: Option<super::discovery_conf::ConsulConfig>,
    pub kubernetes: Option<super::discovery_conf::KubernetesConfig>,
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
];
const GLOBAL_ONLY_KEYS: &[&str] = &["provider", "consul", "kubernetes", "upstreams"];

fn known_at(level_keys: &[&'static str]) -> Vec<&'static str> {
    SETTING_KEYS.iter().chain(level_keys).copied().collect()
}

impl UpstreamsConfig {
    /// Reads the root of upstreams.yaml.
    pub fn read(root: &Node, r: &mut Reader) -> Option<UpstreamsConfig> {
        let entries = r.map(root, "(document)")?;
        let errors_before = r.issues.errors().count();
        let wrapper = entries.iter().find(|(k, _)| k.name == "upstreams");
        let shape = if wrapper.is_some() {
            Shape::Current
        } else {
            Shape::Legacy
        };
        let mut cfg = UpstreamsConfig {
            shape,
            provider: Provider::File,
            globals: RouteSettings::default(),
            hosts: Vec::new(),
            consul: None,
            kubernetes: None,
        };
        let global_known = known_at(GLOBAL_ONLY_KEYS);
        let mut top_level_hosts: Vec<&(Key, Node)> = Vec::new();
        for entry @ (key, value) in entries {
            let k = key.name.as_str();
            match k {
                "upstreams" => {}
                "provider" => cfg.provider = read_provider(value, r).unwrap_or_default(),
                "consul" => cfg.consul = super::discovery_conf::read_consul(value, k, r),
                "kubernetes" => {
                    cfg.kubernetes = super::discovery_conf::read_kubernetes(value, k, r)
                }
                _ if SETTING_KEYS.contains(&k) => read_setting(&mut cfg.globals, key, value, "", r),
                _ if looks_like_host(value) => top_level_hosts.push(entry),
                _ if matches!(value.value, Value::Map(_))
                    && did_you_mean(k, &global_known).is_none() =>
                {
                    r.warn(
                        key.pos,
                        k,
                        format!("unknown key `{k}` (ignored; a host needs `paths`)"),
                    )
                }
                _ => r.unknown_key(key, k, &global_known),
            }
        }
        match (wrapper, shape) {
            (Some((wkey, wnode)), _) => {
                if let Some(first) = top_level_hosts.first() {
                    r.error(
                        first.0.pos,
                        &first.0.name,
                        format!(
                            "routes are both under `upstreams:` (line {}) and at the top level (`{}`, line {}); use one shape",
                            wkey.pos.line, first.0.name, first.0.pos.line
                        ),
                    );
                }
                if let Some(hosts) = r.map(wnode, "upstreams") {
                    cfg.hosts = read_hosts(hosts, "upstreams", r);
                }
            }
            (None, _) => {
                let owned: Vec<(Key, Node)> = top_level_hosts.into_iter().cloned().collect();
                cfg.hosts = read_hosts(&owned, "", r);
            }
        }
        if r.issues.errors().count() > errors_before {
            return None;
        }
        Some(cfg)
    }

    /// Merges a conf.d file (a map of host -> host config): each host there replaces the same host here.
    pub fn merge_conf_d(&mut self, root: &Node, r: &mut Reader) -> bool {
        let Some(entries) = r.map(root, "(document)") else {
            return false;
        };
        let errors_before = r.issues.errors().count();
        let hosts = read_hosts(entries, "", r);
        if r.issues.errors().count() > errors_before {
            return false;
        }
        for host in hosts {
            match self.hosts.iter_mut().find(|h| h.name == host.name) {
                Some(slot) => *slot = host,
                None => self.hosts.push(host),
            }
        }
        true
    }
}

/// A top-level key whose value is a mapping holding `paths` is a host of the older shape.
fn looks_like_host(value: &Node) -> bool {
    matches!(&value.value, Value::Map(entries) if entries.iter().any(|(k, _)| k.name == "paths"))
}

fn read_provider(node: &Node, r: &mut Reader) -> Option<Provider> {
    let text = r.string(node, "provider")?;
    match text.to_ascii_lowercase().as_str() {
        "file" => Some(Provider::File),
        "consul" => Some(Provider::Consul),
        "kubernetes" | "k8s" => Some(Provider::Kubernetes),
        _ => {
            r.error(
                node.pos,
                "provider",
                format!("`{text}` is not one of: file, consul, kubernetes"),
            );
            None
        }
    }
}

fn read_hosts(entries: &[(Key, Node)], parent: &str, r: &mut Reader) -> Vec<HostConfig> {
    let mut hosts: Vec<(Pos, HostConfig)> = Vec::new();
    for (key, value) in entries {
        let path = join(parent, &key.name);
        let Some(name) = normalise_host_key(key, &path, r) else {
            continue;
        };
        if let Some((first, _)) = hosts.iter().find(|(_, h)| h.name == name) {
            r.error(
                key.pos,
                &path,
                format!(
                    "host `{name}` is defined twice (first on line {})",
                    first.line
                ),
            );
            continue;
        }
        if let Some(host) = read_host(name, key, value, &path, r) {
            hosts.push((key.pos, host));
        }
    }
    hosts.into_iter().map(|(_, h)| h).collect()
}

fn normalise_host_key(key: &Key, path: &str, r: &mut Reader) -> Option<String> {
    let raw = key.name.trim();
    if raw == "DEFAULT" {
        return Some(raw.to_string());
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let valid = !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'*' | b':' | b'[' | b']')
        });
    if !valid {
        r.error(key.pos, path, format!("`{raw}` is not a valid host name"));
        return None;
    }
    Some(name.to_string())
}

fn read_host(
    name: String,
    host_key: &Key,
    node: &Node,
    path: &str,
    r: &mut Reader,
) -> Option<HostConfig> {
    let entries = r.map(node, path)?;
    let mut host = HostConfig {
        name,
        settings: RouteSettings::default(),
        paths: Vec::new(),
    };
    let known = known_at(&["paths"]);
    let mut saw_paths = false;
    for (key, value) in entries {
        let key_path = join(path, &key.name);
        match key.name.as_str() {
            "paths" => {
                saw_paths = true;
                if let Some(paths) = r.map(value, &key_path) {
                    host.paths = read_paths(paths, &key_path, r);
                }
            }
            k if SETTING_KEYS.contains(&k) => read_setting(&mut host.settings, key, value, path, r),
            _ => r.unknown_key(key, &key_path, &known),
        }
    }
    if !saw_paths {
        r.error(
            host_key.pos,
            path,
            format!("host `{}` has no `paths`", host_key.name),
        );
    }
    Some(host)
}

fn read_paths(entries: &[(Key, Node)], parent: &str, r: &mut Reader) -> Vec<PathConfig> {
    let mut paths = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let path = join(parent, &key.name);
        if !key.name.starts_with('/') {
            r.error(
                key.pos,
                &path,
                format!("path `{}` must start with `/`", key.name),
            );
            continue;
        }
        if let Some(p) = read_path(key, value, &path, r) {
            paths.push(p);
        }
    }
    paths
}

fn read_path(key: &Key, node: &Node, path: &str, r: &mut Reader) -> Option<PathConfig> {
    let entries = r.map(node, path)?;
    let mut out = PathConfig {
        prefix: key.name.clone(),
        servers: Vec::new(),
        settings: RouteSettings::default(),
    };
    let known = known_at(&["servers"]);
    let mut servers_node: Option<&Node> = None;
    let mut empty_list = false;
    for (k, value) in entries {
        let key_path = join(path, &k.name);
        match k.name.as_str() {
            "servers" => {
                servers_node = Some(value);
                let (servers, listed) = read_servers(value, &key_path, r);
                out.servers = servers;
                empty_list = listed == 0;
            }
            name if SETTING_KEYS.contains(&name) => {
                read_setting(&mut out.settings, k, value, path, r)
            }
            _ => r.unknown_key(k, &key_path, &known),
        }
    }
    // A `redirect_to` already reported as invalid does not also make the servers missing.
    let redirects = entries.iter().any(|(k, _)| k.name == "redirect_to");
    match servers_node {
        None if !redirects => r.error(
            key.pos,
            path,
            format!(
                "path `{}` has no `servers` (and no `redirect_to`)",
                key.name
            ),
        ),
        Some(list) if empty_list && !redirects => r.error(
            list.pos,
            &join(path, "servers"),
            "the list of servers is empty",
        ),
        _ => {}
    }
    Some(out)
}

/// The parsed servers, and how many entries the list had (parsed or not).
fn read_servers(node: &Node, path: &str, r: &mut Reader) -> (Vec<ServerSpec>, usize) {
    let Some(items) = r.string_list(node, path) else {
        return (Vec::new(), 1);
    };
    let listed = items.len();
    let mut servers = Vec::with_capacity(items.len());
    for (pos, item_path, text) in items {
        match parse_server(&text) {
            Ok(spec) => servers.push(spec),
            Err(msg) => r.error(pos, &item_path, msg),
        }
    }
    (servers, listed)
}

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
        "to_https" => settings.to_https = r.boolean(node, p),
        "rate_limit" => settings.rate_limit = r.uint(node, p, 0, 10_000_000).map(|n| n as u32),
        "x4xx_limit" => settings.x4xx_limit = r.uint(node, p, 0, 10_000_000).map(|n| n as u32),
        "server_headers" => settings.server_headers = read_headers(node, p, r),
        "client_headers" | "headers" => settings.client_headers.extend(read_headers(node, p, r)),
        "authorization" => settings.authorization = read_auth(node, p, r),
        "healthcheck" => settings.healthcheck = r.boolean(node, p),
        "redirect_to" => settings.redirect_to = read_redirect(node, p, r),
        "upstream_tls_verify" => settings.upstream_tls_verify = r.boolean(node, p),
        _ => {}
    }
}

fn read_sticky(node: &Node, path: &str, r: &mut Reader) -> Option<Option<Duration>> {
    let hour = Some(Some(Duration::from_secs(3600)));
    match &node.value {
        Value::Bool(true) => hour,
        Value::Bool(false) => Some(None),
        Value::Str(s) if s.trim().eq_ignore_ascii_case("true") => hour,
        Value::Str(s) if s.trim().eq_ignore_ascii_case("false") => Some(None),
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

fn read_headers(node: &Node, path: &str, r: &mut Reader) -> HeaderList {
    let Some(items) = r.string_list(node, path) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for (pos, item_path, text) in items {
        match parse_header(&text) {
            Ok(h) => out.push(h),
            Err(msg) => r.error(pos, &item_path, msg),
        }
    }
    out
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

fn read_redirect(node: &Node, path: &str, r: &mut Reader) -> Option<String> {
    let text = r.non_empty_string(node, path)?;
    match text.parse::<http::Uri>() {
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
