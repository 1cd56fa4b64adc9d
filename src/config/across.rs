//! Checks that need main.yaml and upstreams.yaml together: a setting of one file that the
//! other makes pointless. Warnings only (each file alone is valid), at the place in
//! upstreams.yaml or conf.d where the setting is first set (noted as it was read).

use super::{Issues, MainConfig, Severity, UpstreamsConfig};

/// `to_https: true` with no TLS listener: the redirect sends clients to a port where nothing
/// listens (nginx has no such key; HAProxy's `redirect scheme https` has the same trap).
/// `acme: true` with no `acme:` block in main.yaml: nothing orders the certificates.
/// `cache_ttl` with no `cache:` block: nothing is cached.
pub fn check(main: &MainConfig, upstreams: &UpstreamsConfig, issues: &mut Issues) {
    check_with(MainFacts::of(main), upstreams, issues);
}

/// What of main.yaml [`check`] looks at: kept for every reload, which checks upstreams.yaml
/// alone otherwise (a reload said nothing of the `to_https` that check-config and the start
/// warned of).
#[derive(Clone, Copy, Debug)]
pub struct MainFacts {
    tls_listener: bool,
    acme: bool,
    cache: bool,
}

impl MainFacts {
    pub fn of(main: &MainConfig) -> MainFacts {
        MainFacts {
            tls_listener: main.proxy_address_tls.is_some(),
            acme: main.acme.is_some(),
            cache: main.cache.is_some(),
        }
    }
}

/// [`check`], with main.yaml's facts.
pub fn check_with(main: MainFacts, upstreams: &UpstreamsConfig, issues: &mut Issues) {
    if !main.tls_listener && redirects_to_https(upstreams) {
        let why = "`to_https: true` but main.yaml has no `proxy_address_tls`: clients are sent to \
                   an HTTPS port where nothing listens";
        warn_at_first_true(issues, "to_https", why);
    }
    if !main.acme && upstreams.asks_for_acme() {
        let why = "`acme: true` but main.yaml has no `acme:` block: no certificate is ordered \
                   (add `acme:` with at least its `directory` or `email`)";
        warn_at_first_true(issues, "acme", why);
    }
    if !main.cache {
        let why = "`cache_ttl` but main.yaml has no `cache:` block: nothing is cached (add \
                   `cache:`)";
        warn_at_first_true(issues, "cache_ttl", why);
    }
}

/// Warns with `why` where the setting `name` was first set true.
fn warn_at_first_true(issues: &mut Issues, name: &str, why: &str) {
    if let Some(at) = issues.first_true.get(name).cloned() {
        issues.push(Severity::Warning, &at.file, at.pos, &at.key, why.into());
    }
}

fn redirects_to_https(upstreams: &UpstreamsConfig) -> bool {
    let on = |s: &super::settings::RouteSettings| s.to_https == Some(true);
    on(&upstreams.globals)
        || upstreams
            .hosts
            .iter()
            .any(|host| on(&host.settings) || host.paths.iter().any(|p| on(&p.settings)))
}
