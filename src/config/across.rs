//! Checks that need main.yaml and upstreams.yaml together: a setting of one file that the
//! other makes pointless. Warnings only (each file alone is valid), at the upstreams key's line.

use std::path::Path;
use std::sync::Arc;

use super::yaml::Pos;
use super::{file_bytes, Issues, MainConfig, Severity, UpstreamsConfig};

/// `to_https: true` with no TLS listener: the redirect sends clients to a port where nothing
/// listens (nginx has no such key; HAProxy's `redirect scheme https` has the same trap).
/// `acme: true` with no `acme:` block in main.yaml: nothing orders the certificates.
pub fn check(main: &MainConfig, upstreams: &UpstreamsConfig, path: &Path, issues: &mut Issues) {
    let file: Arc<str> = path.display().to_string().into();
    if main.proxy_address_tls.is_none() && redirects_to_https(upstreams) {
        let why = "`to_https: true` but main.yaml has no `proxy_address_tls`: clients are sent to \
                   an HTTPS port where nothing listens";
        let (file, at, key) = issues.first_to_https.clone().unwrap_or_else(|| {
            let at = line_of_setting(path, "to_https");
            (file.clone(), at, "to_https".to_string())
        });
        issues.push(Severity::Warning, &file, at, &key, why.into());
    }
    if main.acme.is_none() && upstreams.asks_for_acme() {
        let why = "`acme: true` but main.yaml has no `acme:` block: no certificate is ordered \
                   (add `acme:` with at least its `directory` or `email`)";
        let at = line_of_setting(path, "acme");
        issues.push(Severity::Warning, &file, at, "acme", why.into());
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

/// Where `key` is first set to true in the file at `path` (line 1 if it cannot be told).
fn line_of_setting(path: &Path, key: &str) -> Pos {
    let text = file_bytes::read_regular(path, super::yaml::MAX_FILE_BYTES).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let line = text.lines().position(|l| {
        let l = l.trim_start().trim_start_matches(['{', ' ']);
        l.starts_with(key) && l.contains("true")
    });
    Pos {
        line: line.map_or(1, |n| u32::try_from(n + 1).unwrap_or(u32::MAX)),
        column: 1,
    }
}
