//! `upstreams.yaml` (and `conf.d/*.yaml`): hosts, paths, backends and their policies (SPEC §3).
//!
//! Both shapes are read: v0.92's `upstreams:` wrapper and the older README's top-level hosts.
//! Global, host and path levels carry the same policy keys; what a level leaves unset it inherits.

use super::host_name::normalise_host;
use super::issues::did_you_mean;
use super::reader::{join, Reader};
use super::settings::{read_setting, SETTING_KEYS};
pub use super::settings::{CompressRule, HeaderList, RouteSettings};
use super::values::{parse_server, ServerSpec};
use super::yaml::{Key, Node, Pos, Value};
use crate::vocab::normalise;

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

const GLOBAL_ONLY_KEYS: &[&str] = &["provider", "consul", "kubernetes", "upstreams"];

fn known_at(level_keys: &[&'static str]) -> Vec<&'static str> {
    SETTING_KEYS.iter().chain(level_keys).copied().collect()
}

impl UpstreamsConfig {
    /// The hosts with `acme: true` (their own, or the file's global one): main.yaml's `acme:`
    /// keeps a certificate for each. `DEFAULT` and names that are not DNS names are left out.
    pub fn acme_hosts(&self) -> Vec<String> {
        self.hosts
            .iter()
            .filter(|h| h.settings.acme.or(self.globals.acme) == Some(true))
            .map(|h| h.name.clone())
            .filter(|name| super::acme_conf::not_orderable_for_host(name).is_none())
            .collect()
    }

    /// Whether any host asks for `acme: true` (its own, or the file's global one), orderable
    /// or not.
    pub fn asks_for_acme(&self) -> bool {
        self.hosts
            .iter()
            .any(|h| h.settings.acme.or(self.globals.acme) == Some(true))
    }

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
        let mut provider_key = None;
        let mut section_keys = Vec::new();
        let mut unknown: Vec<&Key> = Vec::new();
        for entry @ (key, value) in entries {
            let k = key.name.as_str();
            match k {
                "upstreams" => {}
                "provider" => {
                    cfg.provider = read_provider(value, r).unwrap_or_default();
                    provider_key = Some(key.pos);
                }
                "consul" => {
                    cfg.consul = super::discovery_conf::read_consul(value, k, r);
                    section_keys.push((k, key.pos));
                }
                "kubernetes" => {
                    cfg.kubernetes = super::discovery_conf::read_kubernetes(value, k, r);
                    section_keys.push((k, key.pos));
                }
                _ if SETTING_KEYS.contains(&k) => read_setting(&mut cfg.globals, key, value, "", r),
                _ if looks_like_host(value) => top_level_hosts.push(entry),
                // Compose files' extension fields: where anchors for `<<: *name` are kept.
                _ if k.starts_with("x-") => {}
                _ if matches!(value.value, Value::Map(_))
                    && did_you_mean(k, &global_known).is_none() =>
                {
                    unknown.push(key);
                    r.warn(
                        key.pos,
                        k,
                        format!("unknown key `{k}` (ignored; a host needs `paths`)"),
                    )
                }
                _ => {
                    unknown.push(key);
                    r.unknown_key(key, k, &global_known);
                }
            }
        }
        match provider_key {
            Some(pos) => say_what_provider_changes(&cfg, pos, r),
            None => say_sections_watched_without_provider(&section_keys, r),
        }
        r.global_authorization = cfg.globals.authorization.is_some();
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
        let consul = cfg.consul.iter().flat_map(|c| &c.services);
        let services: Vec<_> = consul
            .chain(cfg.kubernetes.iter().flat_map(|k| &k.services))
            .collect();
        warn_hidden_by_the_file(&services, &cfg.hosts, r);
        if wrapper.is_none()
            && cfg.consul.is_none()
            && cfg.kubernetes.is_none()
            && cfg.hosts.is_empty()
        {
            refuse_unknown_keys_routing_nothing(&unknown, r);
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
        // upstreams.yaml's own keys: taken for hosts, they said `host `upstreams` has no
        // `paths``, or that a setting is not a mapping.
        let (file_keys, hosts): (Vec<_>, Vec<_>) = entries.iter().cloned().partition(|(key, _)| {
            GLOBAL_ONLY_KEYS.contains(&key.name.as_str())
                || SETTING_KEYS.contains(&key.name.as_str())
        });
        for (key, _) in &file_keys {
            let k = key.name.as_str();
            let why = match k {
                "upstreams" => "a conf.d file holds hosts at its top level (`a.example: {paths: ...}`): drop the `upstreams:` wrapper".to_string(),
                _ => format!("a conf.d file holds hosts only: `{k}` belongs in upstreams.yaml (or under a host or path here)"),
            };
            r.error(key.pos, k, why);
        }
        let hosts = read_hosts(&hosts, "", r);
        if r.issues.errors().count() > errors_before {
            return false;
        }
        for host in hosts {
            match self.hosts.iter_mut().find(|h| h.name == host.name) {
                Some(slot) => {
                    // As documented, but nothing said it: a host copied into conf.d and left in
                    // upstreams.yaml made edits to the one there go nowhere.
                    let at = entries.iter().find(|(k, _)| {
                        k.name
                            .trim()
                            .trim_end_matches('.')
                            .eq_ignore_ascii_case(&host.name)
                    });
                    if let Some((key, _)) = at {
                        let why = format!("host `{}` replaces the one of upstreams.yaml or of an earlier conf.d file, whole", host.name);
                        r.warn(key.pos, &key.name, why);
                    }
                    *slot = host;
                }
                None => self.hosts.push(host),
            }
        }
        true
    }
}

/// A file that routes nothing and has top-level keys no one knows (`upstrems:`, main.yaml handed
/// over as upstreams) is a mistake: loaded, it would take every route away with only a warning
/// said (nginx and HAProxy refuse an unknown directive). `upstreams: {}` says nothing is meant.
fn refuse_unknown_keys_routing_nothing(unknown: &[&Key], r: &mut Reader) {
    let Some(first) = unknown.first() else {
        return;
    };
    let names: Vec<String> = unknown.iter().map(|k| format!("`{}`", k.name)).collect();
    let what = if names.len() == 1 {
        "is not a key"
    } else {
        "are not keys"
    };
    let why = format!(
        "nothing here is a route, and {} {what} aralez knows: loading it would remove every route (to mean that, write `upstreams: {{}}`)",
        names.join(", "),
    );
    r.error(first.pos, &first.name, why);
}

/// Services of `consul` and `kubernetes` routed to a host and path `hosts` route already: the
/// file's route wins (a discovered route only fills what the file leaves open), so the service
/// gets no request. A warning at the service.
fn warn_hidden_by_the_file(
    services: &[&super::discovery_conf::DiscoveredService],
    hosts: &[HostConfig],
    r: &mut Reader,
) {
    for svc in services {
        let host = hosts.iter().find(|h| h.name == svc.hostname);
        if host.is_some_and(|h| h.paths.iter().any(|p| p.prefix == svc.path)) {
            let message = format!(
                "{}{} is routed by this file's own host `{}` too: the file's route wins and this \
                 service gets no request",
                svc.hostname, svc.path, svc.hostname
            );
            r.warn(svc.written_at.pos, &svc.written_at.path, message);
        }
    }
}

/// A top-level key whose value is a mapping holding `paths` is a host of the older shape.
fn looks_like_host(value: &Node) -> bool {
    matches!(&value.value, Value::Map(entries) if entries.iter().any(|(k, _)| k.name == "paths"))
}

/// aralez watches every discovery section present, whatever `provider` says; Aralez watches
/// only the provider's. Where the two would differ, a warning says what this one does.
fn say_what_provider_changes(cfg: &UpstreamsConfig, pos: Pos, r: &mut Reader) {
    let sections = [
        ("consul", Provider::Consul, cfg.consul.is_some()),
        ("kubernetes", Provider::Kubernetes, cfg.kubernetes.is_some()),
    ];
    for (name, provider, present) in sections {
        let named = cfg.provider == provider;
        let why = match (named, present) {
            (true, false) => format!("`{name}`, but there is no `{name}:` section: nothing is discovered"),
            (false, true) => format!("not `{name}`, but the `{name}:` section is watched all the same (Aralez would ignore it)"),
            _ => continue,
        };
        r.warn(pos, "provider", why);
    }
}

/// With no `provider`, Aralez reads `file` and ignores a discovery section; aralez watches it.
fn say_sections_watched_without_provider(sections: &[(&str, Pos)], r: &mut Reader) {
    for (name, pos) in sections {
        let why = format!(
            "watched, though `provider` is not set (Aralez reads `file` then and would ignore this section): set `provider: {name}` to say so"
        );
        r.warn(*pos, name, why);
    }
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
    let mut hosts: Vec<HostConfig> = Vec::new();
    // Where each name was first defined: one lookup a host (a search of the list was
    // quadratic: 77,000 hosts took 17 s of CPU to check).
    let mut first_seen: std::collections::HashMap<String, Pos> = std::collections::HashMap::new();
    for (key, value) in entries {
        let path = join(parent, &key.name);
        let Some(name) = normalise_host_key(key, &path, r) else {
            continue;
        };
        if let Some(first) = first_seen.get(&name) {
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
        first_seen.insert(name.clone(), key.pos);
        if let Some(host) = read_host(name, key, value, &path, r) {
            warn_if_unorderable(&host, key, &path, r);
            hosts.push(host);
        }
    }
    hosts
}

/// `acme: true` on a host no certificate can be ordered for (an IP address, one label, a
/// wildcard, a name too long for its file): said at the host, as `acme.domains` says it. It
/// was left out without a word.
fn warn_if_unorderable(host: &HostConfig, key: &Key, path: &str, r: &mut Reader) {
    if host.settings.acme != Some(true) || host.name == "DEFAULT" {
        return;
    }
    if let Some(why) = super::acme_conf::not_orderable_for_host(&host.name) {
        let said = format!(
            "acme: true, but `{}` {why}: no certificate is ordered for it",
            host.name
        );
        r.warn(key.pos, path, said);
    }
}

fn normalise_host_key(key: &Key, path: &str, r: &mut Reader) -> Option<String> {
    normalise_host(&key.name, key.pos, path, r)
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
                    if paths.is_empty() {
                        let why = format!(
                            "host `{}` has no path: its requests get 404 (they do not go to DEFAULT)",
                            host_key.name
                        );
                        r.warn(value.pos, &key_path, why);
                    }
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
    // Each prefix as matched, case folded: where it was first written, and how.
    let mut first_seen: std::collections::HashMap<String, (Pos, &str)> =
        std::collections::HashMap::new();
    for (key, value) in entries {
        let path = join(parent, &key.name);
        let Some(prefix) = path_prefix(key, &path, r) else {
            continue;
        };
        match first_seen.entry(prefix.to_ascii_lowercase()) {
            std::collections::hash_map::Entry::Occupied(first) => {
                let (pos, written) = first.get();
                let message = format!(
                    "path `{}` matches the same requests as `{written}` (line {}): paths match \
                     whatever their case and encoding, and the first one wins",
                    key.name, pos.line
                );
                r.warn(key.pos, &path, message);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert((key.pos, key.name.as_str()));
            }
        }
        if let Some(mut p) = read_path(key, value, &path, r) {
            p.prefix = prefix;
            paths.push(p);
        }
    }
    paths
}

/// A `paths` key as routing matches it: in the form request paths are normalised to
/// (`normalise::prefix`: `/café` is `/caf%C3%A9`, `//a` is `/a`). An error when no request
/// could ever match it: a prefix with a query, or with what requests are refused for before
/// routing (`normalise::is_ambiguous`).
fn path_prefix(key: &Key, path: &str, r: &mut Reader) -> Option<String> {
    let written = key.name.as_str();
    let problem = if !written.starts_with('/') {
        Some("must start with `/`")
    } else if written.contains(['?', '#']) {
        Some("holds a query or a fragment: routes match the path alone")
    } else if normalise::is_ambiguous(written) {
        Some(
            "can never match: requests whose path holds `;`, `\\`, an encoded `/`, `\\`, `;` \
             or NUL, a dot segment or a `%` without two hex digits are refused (400) before routing",
        )
    } else {
        None
    };
    if let Some(problem) = problem {
        r.error(key.pos, path, format!("path `{written}` {problem}"));
        return None;
    }
    let prefix = normalise::prefix(written);
    if written.contains("//") {
        let message = format!(
            "path `{written}` matches as `{prefix}`: request paths have repeated slashes merged"
        );
        r.warn(key.pos, path, message);
    }
    Some(prefix)
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
            "acme" => r.warn(
                value.pos,
                &key_path,
                "acme: true applies to a host (its certificate), not to a path: move it up",
            ),
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
