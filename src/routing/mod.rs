//! Routing: the compiled, immutable routing state (host -> longest path prefix -> [`Route`])
//! and the [`Router`], the request path's entry, which finds a request's route and runs it
//! through the route's policies to forwarding.
//!
//! A [`Snapshot`] is built from validated config off the request path, then published with one
//! `ArcSwap` store. Requests load it once and never see it change under them.

mod router;

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use crate::config::upstreams::{HeaderList, RouteSettings, UpstreamsConfig};
use crate::layers::{Policies, PolicyState, Redirect};
use crate::proxy::HeaderRules;
use crate::upstream::{Backend, BackendSet, Registry};
use crate::vocab::normalise;

pub use router::{check_head, Router};

/// Everything a request needs once its route is known.
#[derive(Debug)]
pub struct Route {
    /// The host key as written in the config (`DEFAULT` included).
    pub host: Box<str>,
    pub prefix: Box<str>,
    /// The backends, their rotation and round-robin position.
    pub backends: BackendSet,
    /// `server_headers` and `client_headers`.
    pub headers: HeaderRules,
    /// All policy settings, global and host values already folded in.
    pub settings: RouteSettings,
    /// The policies compiled from `settings` (auth, limits, sticky sessions).
    pub policies: Policies,
    /// Made by routing, not written: it only sends the client on to the prefix with a `/`
    /// added ([`slash_short_routes`]); left out of [`Snapshot::routes`].
    pub adds_slash: bool,
}

/// A host's routes, longest prefix first.
#[derive(Debug, Default)]
struct HostRoutes {
    routes: Vec<Arc<Route>>,
}

impl HostRoutes {
    fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|r| normalise::prefix_matches(&r.prefix, path))
    }
}

/// For each prefix written with a trailing slash (`/secret/`) and no route without it, a route
/// of that path (`/secret`) whose one policy sends the client to the slash
/// ([`Redirect::add_slash`]), as nginx answers a `location /secret/`: the request went to the
/// route of `/`, whose backend may serve `/secret` as `/secret/` without `/secret/`'s
/// policies. A route of its own, so the request path does not pay for it (a lookup result of
/// its own made every request's routing future copy itself twice more, +330 instructions).
fn slash_short_routes(routes: &[Arc<Route>], state: &PolicyState) -> Vec<Arc<Route>> {
    let short_of = |route: &Arc<Route>| {
        let short = route.prefix.strip_suffix('/').filter(|s| !s.is_empty())?;
        let written = routes.iter().any(|r| r.prefix.eq_ignore_ascii_case(short));
        (!written).then(|| short.to_string())
    };
    routes
        .iter()
        .filter_map(|route| {
            let short = short_of(route)?;
            Some(Arc::new(Route {
                host: route.host.clone(),
                prefix: short.into(),
                backends: BackendSet::new(Box::new([]), None, false),
                headers: HeaderRules::default(),
                settings: RouteSettings::default(),
                policies: Policies::only_redirect(Redirect::add_slash(&state.tls_port)),
                adds_slash: true,
            }))
        })
        .collect()
}

/// The result of a lookup.
pub enum Lookup<'s> {
    Found(&'s Arc<Route>),
    /// A host no route names and none could: it has an empty label (`a..b`), a 400.
    BadHost,
    /// The host (or `DEFAULT`) exists but no path of it matches.
    NoPath,
    /// Neither the host nor `DEFAULT` exists.
    NoHost,
}

/// One immutable version of the routing table.
#[derive(Debug, Default)]
pub struct Snapshot {
    hosts: HashMap<Box<str>, HostRoutes, ahash::RandomState>,
    default: Option<HostRoutes>,
}

impl Snapshot {
    /// Compiles validated config; backends come from `registry` so their state carries over,
    /// and policies share `state` (keys, limiter tables) with every other snapshot.
    pub fn build(cfg: &UpstreamsConfig, registry: &Registry, state: &PolicyState) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for host in &cfg.hosts {
            let host_settings = host.settings.inherit(&cfg.globals);
            let mut routes: Vec<Arc<Route>> = host
                .paths
                .iter()
                .map(|p| {
                    let settings = p.settings.inherit(&host_settings);
                    let verify_tls = settings.upstream_tls_verify == Some(true);
                    if verify_tls {
                        // Off the request path: the trust store is read here, once.
                        crate::upstream::tls::load_trust_store();
                    }
                    let health_checked = settings.healthcheck != Some(false);
                    let backends: Box<[Arc<Backend>]> = p
                        .servers
                        .iter()
                        .map(|s| registry.backend(s, verify_tls))
                        .collect();
                    let policies = Policies::compile(
                        &settings,
                        &p.settings,
                        &host.name,
                        &p.prefix,
                        &backends,
                        state,
                    );
                    Arc::new(Route {
                        host: host.name.as_str().into(),
                        prefix: p.prefix.as_str().into(),
                        // A `DEFAULT` route takes any host a client makes up: its TLS backends
                        // are always asked for by their own name.
                        backends: BackendSet::new(
                            backends,
                            health_checked.then_some((host.name.as_str(), p.prefix.as_str())),
                            host.name != "DEFAULT",
                        ),
                        headers: HeaderRules {
                            to_backend: boxed(&settings.server_headers),
                            to_client: boxed(&settings.client_headers),
                        },
                        policies,
                        settings,
                        adds_slash: false,
                    })
                })
                .collect();
            let slash_short = slash_short_routes(&routes, state);
            routes.extend(slash_short);
            routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
            let table = HostRoutes { routes };
            if host.name == "DEFAULT" {
                snapshot.default = Some(table);
            } else {
                snapshot.hosts.insert(host.name.as_str().into(), table);
            }
        }
        snapshot
    }

    /// Finds the route for a request's host (raw `Host`/`:authority` bytes) and path.
    pub fn route(&self, raw_host: Option<&[u8]>, raw_path: &str) -> Lookup<'_> {
        let mut buf = [0u8; normalise::MAX_HOST];
        let host = raw_host.and_then(|raw| normalise::host(raw, &mut buf));
        self.route_normalised(host, raw_path)
    }

    /// [`route`](Self::route) for a host already normalised (`normalise::host`).
    pub fn route_normalised(&self, host: Option<&str>, raw_path: &str) -> Lookup<'_> {
        let table = match host.and_then(|name| self.hosts.get(name)) {
            Some(table) => table,
            None if host.is_some_and(|h| normalise::has_empty_label(h.as_bytes())) => {
                return Lookup::BadHost;
            }
            None => match &self.default {
                Some(table) => table,
                None => return Lookup::NoHost,
            },
        };
        match table.find(&normalise::path(raw_path)) {
            Some(route) => Lookup::Found(route),
            None => Lookup::NoPath,
        }
    }

    /// Every route, for status pages and health checks.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.hosts
            .values()
            .chain(self.default.iter())
            .flat_map(|t| t.routes.iter())
            .filter(|r| !r.adds_slash)
    }
}

fn boxed(list: &HeaderList) -> Box<[(HeaderName, HeaderValue)]> {
    list.iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_upstreams_text, Issues};
    use std::time::Duration;

    fn snapshot(yaml: &str) -> Snapshot {
        let mut issues = Issues::default();
        let cfg = parse_upstreams_text(yaml, "test", &mut issues).expect("valid config");
        let state = PolicyState::new(crate::layers::Keys::for_tests(None));
        Snapshot::build(
            &cfg,
            &Registry::for_tests(1, Duration::from_secs(1)),
            &state,
        )
    }

    fn found(s: &Snapshot, host: Option<&str>, path: &str) -> Option<String> {
        match s.route(host.map(str::as_bytes), path) {
            Lookup::Found(r) => Some(format!("{}{}", r.host, r.prefix)),
            _ => None,
        }
    }

    #[test]
    fn host_then_longest_prefix() {
        let s = snapshot(
            "upstreams:\n  example.com:\n    paths:\n      /: {servers: [\"127.0.0.1:1\"]}\n      /api: {servers: [\"127.0.0.1:2\"]}\n      /api/v2: {servers: [\"127.0.0.1:3\"]}\n  DEFAULT:\n    paths:\n      /: {servers: [\"127.0.0.1:4\"]}\n",
        );
        assert_eq!(
            found(&s, Some("Example.com:80"), "/api/x").unwrap(),
            "example.com/api"
        );
        assert_eq!(
            found(&s, Some("example.com"), "/api/v2/y").unwrap(),
            "example.com/api/v2"
        );
        assert_eq!(
            found(&s, Some("example.com"), "/apix").unwrap(),
            "example.com/"
        );
        assert_eq!(
            found(&s, Some("example.com"), "/x/../api").unwrap(),
            "example.com/api"
        );
        assert_eq!(found(&s, Some("other.org"), "/api").unwrap(), "DEFAULT/");
        // No host has an empty label: not the default's (nginx: 400).
        for bad in [&b"mixed.test.."[..], b"a..b", b".a"] {
            assert!(matches!(s.route(Some(bad), "/"), Lookup::BadHost));
        }
        assert_eq!(found(&s, None, "/").unwrap(), "DEFAULT/");
    }

    /// `/secret/` written, `/secret` asked for: sent to `/secret/` (nginx's 301), not to `/`,
    /// unless a route is written for `/secret` itself.
    #[test]
    fn a_path_one_slash_short_of_a_prefix_is_sent_to_it() {
        let s = snapshot(
            "upstreams:\n  a.com:\n    paths:\n      /: {servers: [\"127.0.0.1:1\"]}\n      /secret/: {servers: [\"127.0.0.1:2\"]}\n      /both/: {servers: [\"127.0.0.1:2\"]}\n      /both: {servers: [\"127.0.0.1:3\"]}\n",
        );
        for path in ["/secret", "/SECRET"] {
            let Lookup::Found(route) = s.route(Some(b"a.com"), path) else {
                panic!("{path}: no route");
            };
            assert!(route.adds_slash, "{path}");
            assert!(route.policies.redirect.is_some(), "{path}");
        }
        assert!(s.routes().all(|r| !r.adds_slash), "not listed");
        assert_eq!(
            found(&s, Some("a.com"), "/secret/x").unwrap(),
            "a.com/secret/"
        );
        assert_eq!(found(&s, Some("a.com"), "/both").unwrap(), "a.com/both");
        assert_eq!(found(&s, Some("a.com"), "/both/x").unwrap(), "a.com/both/");
        assert_eq!(found(&s, Some("a.com"), "/secretx").unwrap(), "a.com/");
    }

    /// A prefix written with characters a URL encodes matches however the client sends them.
    #[test]
    fn prefixes_match_encoded_and_raw_paths_alike() {
        let s = snapshot(
            "upstreams:\n  a.com:\n    paths:\n      /: {servers: [\"127.0.0.1:1\"]}\n      \"/caf\u{e9}\": {servers: [\"127.0.0.1:2\"]}\n      \"/a b\": {servers: [\"127.0.0.1:3\"]}\n",
        );
        for path in ["/caf%C3%A9", "/caf%c3%a9/x", "/caf\u{e9}"] {
            assert_eq!(
                found(&s, Some("a.com"), path).unwrap(),
                "a.com/caf%C3%A9",
                "{path}"
            );
        }
        assert_eq!(found(&s, Some("a.com"), "/a%20b").unwrap(), "a.com/a%20b");
    }

    #[test]
    fn no_default_means_no_route() {
        let s = snapshot(
            "upstreams:\n  a.com:\n    paths:\n      /api: {servers: [\"127.0.0.1:1\"]}\n",
        );
        assert!(matches!(s.route(Some(b"b.com"), "/api"), Lookup::NoHost));
        assert!(matches!(s.route(Some(b"a.com"), "/other"), Lookup::NoPath));
    }

    #[test]
    fn settings_inherit_and_headers_add_up() {
        let s = snapshot(
            "upstreams:\n  a.com:\n    rate_limit: 5\n    server_headers: [\"X-Host:1\"]\n    paths:\n      /:\n        servers: [\"127.0.0.1:1\"]\n        server_headers: [\"X-Path:2\"]\nserver_headers: [\"X-Global:0\"]\nrate_limit: 100\n",
        );
        let Lookup::Found(r) = s.route(Some(b"a.com"), "/") else {
            panic!("no route")
        };
        assert_eq!(r.settings.rate_limit, Some(5));
        let names: Vec<&str> = r
            .headers
            .to_backend
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["x-global", "x-host", "x-path"]);
    }
}
