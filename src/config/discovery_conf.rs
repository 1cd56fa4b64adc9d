//! The `consul:` and `kubernetes:` sections of upstreams.yaml (SPEC §13): which services to
//! discover and the host, path and policies each one gets.

use http::Uri;

use super::host_name::normalise_host;
use super::reader::{join, Reader};
use super::settings::{read_setting, RouteSettings, SETTING_KEYS};
use super::yaml::{Node, Pos, Value};

/// One discovered service and where it is routed.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveredService {
    pub hostname: String,
    /// The Consul service name, or the Kubernetes Service name.
    pub upstream: String,
    pub path: String,
    pub settings: RouteSettings,
    /// Where the service is written, for messages about it.
    pub written_at: WrittenAt,
}

/// Where a service is written: its line and key path. Not part of what the service is (a
/// service moved to another line is the same service; its watch is not started again).
#[derive(Clone, Debug, Default)]
pub struct WrittenAt {
    pub pos: Pos,
    pub path: String,
}

impl PartialEq for WrittenAt {
    fn eq(&self, _: &WrittenAt) -> bool {
        true
    }
}

/// `consul:`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsulConfig {
    pub servers: Vec<Uri>,
    pub token: Option<String>,
    pub services: Vec<DiscoveredService>,
}

/// `kubernetes:`.
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesConfig {
    /// API servers as written (`host:port` or URLs); empty means the in-cluster defaults.
    pub servers: Vec<String>,
    pub tokenpath: String,
    pub namespace: Option<String>,
    pub services: Vec<DiscoveredService>,
}

const SERVICE_KEYS: &[&str] = &["hostname", "upstream", "path"];

/// Whose names a service's `upstream` is: Consul takes any (asked for URL-encoded); Kubernetes
/// only a DNS-1035 label (RFC 1035), which its label selector is made of.
#[derive(Clone, Copy, PartialEq)]
enum Registry {
    Consul,
    Kubernetes,
}

/// Whether `name` is a DNS label of at most 63 lowercase letters, digits and `-`, neither
/// beginning nor ending with `-` (Kubernetes' DNS-1123 label: a namespace), and beginning with
/// a letter if `letter_first` (its DNS-1035 label: a service).
fn is_kubernetes_name(name: &str, letter_first: bool) -> bool {
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= 63
        && bytes.iter().all(allowed)
        && *first != b'-'
        && *last != b'-'
        && (!letter_first || first.is_ascii_lowercase())
}

fn read_services(
    node: &Node,
    path: &str,
    r: &mut Reader,
    registry: Registry,
) -> Vec<DiscoveredService> {
    let items = match &node.value {
        Value::Seq(items) => items,
        Value::Null => return Vec::new(),
        other => {
            r.error(
                node.pos,
                path,
                format!("expected a list of services, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Some(entries) = r.map(item, &item_path) else {
            continue;
        };
        let mut svc = DiscoveredService {
            hostname: String::new(),
            upstream: String::new(),
            path: "/".into(),
            settings: RouteSettings::default(),
            written_at: WrittenAt {
                pos: item.pos,
                path: item_path.clone(),
            },
        };
        let known: Vec<&str> = SERVICE_KEYS.iter().chain(SETTING_KEYS).copied().collect();
        for (key, value) in entries {
            let key_path = join(&item_path, &key.name);
            match key.name.as_str() {
                // Read as a host of upstreams.yaml: `DEFAULT` is the catch-all there too.
                "hostname" => {
                    svc.hostname = r
                        .non_empty_string(value, &key_path)
                        .and_then(|raw| normalise_host(&raw, value.pos, &key_path, r))
                        .unwrap_or_default()
                }
                "upstream" => {
                    svc.upstream = r.non_empty_string(value, &key_path).unwrap_or_default();
                    let kubernetes = registry == Registry::Kubernetes;
                    if kubernetes
                        && !svc.upstream.is_empty()
                        && !is_kubernetes_name(&svc.upstream, true)
                    {
                        let why = format!("`{}` is not a Kubernetes service name (at most 63 lowercase letters, digits and `-`, beginning with a letter, not ending with `-`)", svc.upstream);
                        r.error(value.pos, &key_path, why);
                    }
                }
                "path" => match r.non_empty_string(value, &key_path) {
                    Some(p) if p.starts_with('/') => svc.path = p,
                    Some(p) => r.error(
                        value.pos,
                        &key_path,
                        format!("path `{p}` must start with `/`"),
                    ),
                    None => {}
                },
                k if SETTING_KEYS.contains(&k) => {
                    read_setting(&mut svc.settings, key, value, &item_path, r)
                }
                _ => r.unknown_key(key, &key_path, &known),
            }
        }
        for (field, value) in [("hostname", &svc.hostname), ("upstream", &svc.upstream)] {
            if value.is_empty() && !entries.iter().any(|(k, _)| k.name == field) {
                r.error(
                    item.pos,
                    &join(&item_path, field),
                    "required key is missing",
                );
            }
        }
        let twin = out
            .iter()
            .position(|o: &DiscoveredService| o.hostname == svc.hostname && o.path == svc.path);
        if let Some(first) = twin.filter(|_| !svc.hostname.is_empty()) {
            let message = format!(
                "{}{} is routed by {path}[{first}] already: this service gets no request",
                svc.hostname, svc.path
            );
            r.warn(item.pos, &item_path, message);
        }
        out.push(svc);
    }
    out
}

const NOT_A_SERVER: &str = "is not an API server address (`host:port` or `https://host:port`)";

/// `kubernetes.servers`: `host:port` (HTTPS) or an `http(s)://` URL each, as the watcher reads
/// them; one it could not use is an error here (it failed only when discovery started).
fn read_api_servers(node: &Node, path: &str, r: &mut Reader) -> Vec<String> {
    let mut servers = Vec::new();
    for (pos, item_path, text) in r.string_list(node, path).unwrap_or_default() {
        let url = match text.contains("://") {
            true => text.clone(),
            false => format!("https://{text}"),
        };
        let parsed = url.parse::<Uri>().ok();
        let usable = parsed
            .as_ref()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
            .and_then(Uri::authority)
            .filter(|a| !a.host().is_empty());
        match usable {
            None => r.error(pos, &item_path, format!("`{text}` {NOT_A_SERVER}")),
            Some(a) if !super::values::port_in_range(a) => r.error(pos, &item_path, PORT_OUT_OF_RANGE),
            // Shown in log lines that name the server: refused, and not echoed.
            Some(a) if a.as_str().contains('@') => r.error(
                pos,
                &item_path,
                "the URL carries credentials, which are never sent: the token is read from `tokenpath`",
            ),
            Some(_) => servers.push(text),
        }
    }
    servers
}

/// The error for a server URL whose port is no port (`:86536` was read as no port: 80).
const PORT_OUT_OF_RANGE: &str = "the port is out of range (1-65535)";

/// `consul.token`, trimmed as the Kubernetes token file is (a YAML block scalar ends in a
/// newline); one that still cannot be a header value is an error here, not on every query.
fn read_consul_token(node: &Node, path: &str, r: &mut Reader) -> Option<String> {
    let token = r.string(node, path)?.trim().to_string();
    if http::HeaderValue::from_str(&token).is_err() {
        r.error(
            node.pos,
            path,
            "holds a character a header cannot carry (a line break inside it?)",
        );
        return None;
    }
    Some(token)
}

/// Reads `consul:`.
pub fn read_consul(node: &Node, path: &str, r: &mut Reader) -> Option<ConsulConfig> {
    let entries = r.map(node, path)?;
    let mut cfg = ConsulConfig {
        servers: Vec::new(),
        token: None,
        services: Vec::new(),
    };
    for (key, value) in entries {
        let key_path = join(path, &key.name);
        match key.name.as_str() {
            "servers" => {
                for (pos, item_path, text) in r.string_list(value, &key_path).unwrap_or_default() {
                    match text.parse::<Uri>() {
                        // Never used (Consul takes a token), and shown in every log line that
                        // names the server: refused, and not echoed.
                        Ok(uri) if uri.authority().is_some_and(|a| a.as_str().contains('@')) => {
                            r.error(
                                pos,
                                &item_path,
                                "the URL carries credentials, which Consul does not read: set the ACL token as `token`",
                            )
                        }
                        Ok(uri) if uri.authority().is_some_and(|a| !super::values::port_in_range(a)) => {
                            r.error(pos, &item_path, PORT_OUT_OF_RANGE)
                        }
                        Ok(uri)
                            if uri.scheme_str() == Some("http") && uri.authority().is_some() =>
                        {
                            cfg.servers.push(uri)
                        }
                        Ok(uri) if uri.scheme_str() == Some("https") => r.error(
                            pos,
                            &item_path,
                            format!("`{uri}`: Consul over https is not supported yet; use http://"),
                        ),
                        _ => r.error(
                            pos,
                            &item_path,
                            format!("`{text}` must be a URL such as http://127.0.0.1:8500"),
                        ),
                    }
                }
            }
            "token" => cfg.token = read_consul_token(value, &key_path, r),
            "services" => cfg.services = read_services(value, &key_path, r, Registry::Consul),
            _ => r.unknown_key(key, &key_path, &["servers", "token", "services"]),
        }
    }
    if cfg.servers.is_empty() {
        cfg.servers.push(Uri::from_static("http://127.0.0.1:8500"));
    }
    Some(cfg)
}

/// Reads `kubernetes:`.
pub fn read_kubernetes(node: &Node, path: &str, r: &mut Reader) -> Option<KubernetesConfig> {
    let entries = r.map(node, path)?;
    let mut cfg = KubernetesConfig {
        servers: Vec::new(),
        tokenpath: "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
        namespace: None,
        services: Vec::new(),
    };
    for (key, value) in entries {
        let key_path = join(path, &key.name);
        match key.name.as_str() {
            "servers" => {
                cfg.servers = read_api_servers(value, &key_path, r);
                if cfg.servers.len() > 1 {
                    r.warn(
                        key.pos,
                        &key_path,
                        "only the first API server is used (no failover to the others)",
                    );
                }
            }
            "tokenpath" => {
                cfg.tokenpath = r
                    .non_empty_string(value, &key_path)
                    .unwrap_or(cfg.tokenpath)
            }
            "namespace" => {
                cfg.namespace = r.non_empty_string(value, &key_path);
                if let Some(ns) = cfg
                    .namespace
                    .as_deref()
                    .filter(|ns| !is_kubernetes_name(ns, false))
                {
                    let why = format!("`{ns}` is not a Kubernetes namespace name (at most 63 lowercase letters, digits and `-`, neither beginning nor ending with `-`)");
                    r.error(value.pos, &key_path, why);
                }
            }
            "services" => cfg.services = read_services(value, &key_path, r, Registry::Kubernetes),
            _ => r.unknown_key(
                key,
                &key_path,
                &["servers", "tokenpath", "namespace", "services"],
            ),
        }
    }
    Some(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::issues::Issues;
    use crate::config::yaml;

    fn token(text: &str) -> (Option<String>, bool) {
        let mut issues = Issues::default();
        let doc = yaml::parse(text).expect("yaml");
        let mut r = Reader::new("upstreams.yaml".into(), &mut issues);
        let token = read_consul_token(&doc, "consul.token", &mut r);
        (token, issues.has_errors())
    }

    #[test]
    fn a_consul_token_is_trimmed_and_one_no_header_can_carry_is_an_error() {
        assert_eq!(token("|\n  b5e3c6d2\n"), (Some("b5e3c6d2".into()), false));
        assert_eq!(token("\" tok \""), (Some("tok".into()), false));
        assert_eq!(token("\"a\\nb\""), (None, true));
    }
}
