//! main.yaml's `acme:` block (automatic certificates, SPEC §14): which ACME directory, which
//! challenge, where the account and orders are kept, which names; and Aralez's top-level
//! `acme_dns_provider` with the environment variables each provider reads. Only parsing and
//! validation live here; the client is `control::acme`.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::reader::{join, Reader};
use super::yaml::{Node, Pos, Value};

/// Let's Encrypt's production directory (the default).
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// Let's Encrypt's staging directory (`directory: staging`).
pub const LETS_ENCRYPT_STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

/// How the ACME server checks that aralez answers for a name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Challenge {
    /// `/.well-known/acme-challenge/<token>` on `proxy_address_http`.
    #[default]
    Http01,
    /// A challenge certificate on `proxy_address_tls` for ALPN `acme-tls/1` (RFC 8737).
    TlsAlpn01,
    /// A TXT record `_acme-challenge.<name>` published through `acme_dns_provider`.
    Dns01,
}

/// Aralez's `acme_dns_provider`: whose DNS API publishes DNS-01 records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsProvider {
    Cloudflare,
    Route53,
    DigitalOcean,
}

impl DnsProvider {
    pub fn name(self) -> &'static str {
        match self {
            DnsProvider::Cloudflare => "cloudflare",
            DnsProvider::Route53 => "route53",
            DnsProvider::DigitalOcean => "digitalocean",
        }
    }

    /// The environment variables the provider cannot work without (each alternative spelling
    /// joined by `|`).
    pub fn env_needed(self) -> &'static [&'static str] {
        match self {
            DnsProvider::Cloudflare => &["CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ZONE_ID"],
            DnsProvider::Route53 => &[
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_HOSTED_ZONE_ID",
            ],
            DnsProvider::DigitalOcean => &["DIGITALOCEAN_TOKEN|DO_AUTH_TOKEN"],
        }
    }

    /// The first of [`env_needed`](Self::env_needed)'s variables that is not set.
    pub fn env_missing(self, lookup: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
        self.env_needed().iter().copied().find(|names| {
            !names
                .split('|')
                .any(|n| lookup(n).is_some_and(|v| !v.trim().is_empty()))
        })
    }
}

/// The `acme:` block with its defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcmeConfig {
    pub directory: String,
    pub email: Option<String>,
    /// Trust roots for the ACME server's own TLS (a private server).
    pub ca_file: Option<PathBuf>,
    /// Where `ca_file` is written, for its check once resolved ([`check_ca_file`]).
    pub ca_file_at: Option<Pos>,
    pub challenge: Challenge,
    /// Where the account and the orders are kept; `None`: `<proxy_configs>/autoconfigs`, else
    /// `autoconfigs` beside main.yaml.
    pub state_dir: Option<PathBuf>,
    pub domains: Vec<String>,
    /// Renew this many days before expiry; `None`: when a third of the lifetime is left.
    pub renew_before_days: Option<u64>,
    /// `dns_resolver`: asked whether a DNS-01 record is visible; `None`: the system's.
    pub dns_resolver: Option<SocketAddr>,
    /// main.yaml's `acme_dns_provider`.
    pub dns_provider: Option<DnsProvider>,
    /// Whether `challenge` was written (Aralez picks DNS-01 from `acme_dns_provider` alone).
    pub challenge_given: bool,
    /// Where `challenge` and `domains` are written, for the checks across keys.
    pub challenge_at: Option<Pos>,
    pub domains_at: Option<Pos>,
}

const KEYS: &[&str] = &[
    "directory",
    "email",
    "ca_file",
    "challenge",
    "state_dir",
    "domains",
    "renew_before_days",
    "dns_resolver",
];

impl AcmeConfig {
    /// The defaults of an `acme:` block, ordering from `directory`.
    pub fn ordering_from(directory: &str) -> AcmeConfig {
        AcmeConfig {
            directory: directory.to_string(),
            email: None,
            ca_file: None,
            ca_file_at: None,
            challenge: Challenge::Http01,
            state_dir: None,
            domains: Vec::new(),
            renew_before_days: None,
            dns_resolver: None,
            dns_provider: None,
            challenge_given: false,
            challenge_at: None,
            domains_at: None,
        }
    }
}

/// Reads the `acme:` block. `None` when a value is wrong (each error already reported).
pub fn read_acme(block: &Node, r: &mut Reader) -> Option<AcmeConfig> {
    let mut cfg = AcmeConfig::ordering_from(LETS_ENCRYPT);
    if matches!(block.value, Value::Null) {
        let why = "says nothing (every key under it left out or commented out): certificates are ordered from Let's Encrypt's production directory with no contact email; remove the key to order none";
        r.warn(block.pos, "acme", why);
    }
    let entries = r.map(block, "acme")?;
    let mut ok = true;
    for (key, value) in entries {
        let path = join("acme", &key.name);
        let p = path.as_str();
        let read = match key.name.as_str() {
            "directory" => read_directory(value, p, r).map(|d| cfg.directory = d),
            "email" => read_email(value, p, r).map(|e| cfg.email = Some(e)),
            "ca_file" => r.non_empty_string(value, p).map(|f| {
                cfg.ca_file = Some(PathBuf::from(f));
                cfg.ca_file_at = Some(value.pos);
            }),
            "challenge" => read_challenge(value, p, r).map(|c| {
                cfg.challenge = c;
                cfg.challenge_given = true;
                cfg.challenge_at = Some(key.pos);
            }),
            "state_dir" => r
                .non_empty_string(value, p)
                .map(|d| cfg.state_dir = Some(PathBuf::from(d))),
            "domains" => read_domains(value, p, r).map(|d| {
                cfg.domains = d;
                cfg.domains_at = Some(key.pos);
            }),
            "renew_before_days" => r
                .uint(value, p, 1, 365)
                .map(|n| cfg.renew_before_days = Some(n)),
            "dns_resolver" => read_resolver(value, p, r).map(|a| cfg.dns_resolver = Some(a)),
            _ => {
                r.unknown_key(key, p, KEYS);
                Some(())
            }
        };
        ok &= read.is_some();
    }
    ok.then_some(cfg)
}

/// The checks across `acme:` and `acme_dns_provider` (at `provider`'s line), once both are
/// read. A provider with no `challenge` written means DNS-01, as in Aralez. `false`: an error
/// was reported.
pub fn check_with_provider(
    cfg: &mut AcmeConfig,
    provider: Option<(Pos, DnsProvider)>,
    acme_pos: Pos,
    r: &mut Reader,
) -> bool {
    cfg.dns_provider = provider.map(|(_, p)| p);
    if provider.is_some() && !cfg.challenge_given {
        cfg.challenge = Challenge::Dns01;
    }
    let mut ok = true;
    match (cfg.challenge, provider) {
        (Challenge::Dns01, None) => {
            let why = "dns-01 publishes its records through acme_dns_provider (cloudflare, route53 or digitalocean): set it";
            r.error(cfg.challenge_at.unwrap_or(acme_pos), "acme.challenge", why);
            ok = false;
        }
        (Challenge::Dns01, Some((pos, p))) => {
            if let Some(names) = p.env_missing(|n| std::env::var(n).ok()) {
                let why = format!("{} reads {} from the environment, which is not set: orders will fail until it is", p.name(), names.replace('|', " or "));
                r.warn(pos, "acme_dns_provider", why);
            }
        }
        (_, Some((pos, p))) => {
            let why = format!("`{}` is not used: acme.challenge is not dns-01", p.name());
            r.warn(pos, "acme_dns_provider", why);
        }
        (_, None) => {}
    }
    if cfg.challenge != Challenge::Dns01 {
        if let Some(wild) = cfg.domains.iter().find(|d| d.starts_with("*.")) {
            let why = format!("`{wild}`: a wildcard name can only be validated by dns-01");
            r.error(cfg.domains_at.unwrap_or(acme_pos), "acme.domains", why);
            ok = false;
        }
    }
    ok
}

/// Reads `acme_dns_provider` (any case).
pub fn read_dns_provider(node: &Node, path: &str, r: &mut Reader) -> Option<DnsProvider> {
    let text = r.non_empty_string(node, path)?;
    match text.trim().to_ascii_lowercase().as_str() {
        "cloudflare" => Some(DnsProvider::Cloudflare),
        "route53" | "route_53" | "aws" => Some(DnsProvider::Route53),
        "digitalocean" | "do" => Some(DnsProvider::DigitalOcean),
        other => {
            let why = format!("`{other}` is not cloudflare, route53 or digitalocean");
            r.error(node.pos, path, why);
            None
        }
    }
}

fn read_resolver(node: &Node, path: &str, r: &mut Reader) -> Option<SocketAddr> {
    let text = r.non_empty_string(node, path)?;
    let text = text.trim();
    let parsed = text.parse::<SocketAddr>().ok().or_else(|| {
        let ip = text.parse::<std::net::IpAddr>().ok()?;
        Some(SocketAddr::new(ip, 53))
    });
    if parsed.is_none() {
        r.error(node.pos, path, format!("`{text}` is not ip:port"));
    }
    parsed
}

fn read_directory(node: &Node, path: &str, r: &mut Reader) -> Option<String> {
    let text = r.non_empty_string(node, path)?;
    let text = text.trim();
    if text.eq_ignore_ascii_case("staging") {
        return Some(LETS_ENCRYPT_STAGING.to_string());
    }
    if !text.starts_with("https://") {
        r.error(
            node.pos,
            path,
            format!("`{text}` is not an https:// URL or `staging`"),
        );
        return None;
    }
    Some(text.to_string())
}

fn read_challenge(node: &Node, path: &str, r: &mut Reader) -> Option<Challenge> {
    let text = r.non_empty_string(node, path)?;
    match text.trim().to_ascii_lowercase().as_str() {
        "http-01" => Some(Challenge::Http01),
        "tls-alpn-01" => Some(Challenge::TlsAlpn01),
        "dns-01" => Some(Challenge::Dns01),
        _ => {
            let why = format!("`{}` is not http-01, tls-alpn-01 or dns-01", text.trim());
            r.error(node.pos, path, why);
            None
        }
    }
}

/// `acme.ca_file` (resolved) holds PEM certificates, as the ACME client reads it at every order:
/// a missing or unreadable file passed check-config, and each order failed with "No such file
/// or directory" or "no items found", naming neither the file nor the key.
pub fn check_ca_file(cfg: &AcmeConfig, r: &mut Reader) -> bool {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let (Some(path), Some(at)) = (&cfg.ca_file, cfg.ca_file_at) else {
        return true;
    };
    let problem = match super::file_bytes::read_regular(path, super::yaml::MAX_FILE_BYTES) {
        Err(e) => format!("cannot be read: {e}"),
        Ok(bytes) if !CertificateDer::pem_slice_iter(&bytes).any(|c| c.is_ok()) => {
            "holds no PEM certificate".to_string()
        }
        Ok(_) => return true,
    };
    r.error(
        at,
        "acme.ca_file",
        format!("`{}` {problem}", path.display()),
    );
    false
}

/// An account's contact: one address, `local@domain` with a dotted domain (the ACME server
/// refuses anything else, and the account was asked for again at every retry).
fn read_email(node: &Node, path: &str, r: &mut Reader) -> Option<String> {
    let email = r.non_empty_string(node, path)?;
    let email = email.trim().trim_start_matches("mailto:").to_string();
    let shaped = email.split_once('@').is_some_and(|(local, domain)| {
        !local.is_empty()
            && domain.contains('.')
            && !email.contains(|c: char| c.is_whitespace() || c == ',' || c == '<' || c == '>')
            && !domain.contains('@')
    });
    if !shaped {
        r.error(node.pos, path, format!("`{email}` is not an email address"));
        return None;
    }
    Some(email)
}

fn read_domains(node: &Node, path: &str, r: &mut Reader) -> Option<Vec<String>> {
    let Value::Seq(items) = &node.value else {
        r.error(node.pos, path, "expected a list of names");
        return None;
    };
    let mut domains = Vec::with_capacity(items.len());
    let mut ok = true;
    // Every bad name is said, not the first only.
    for item in items {
        let Some(name) = r.non_empty_string(item, path) else {
            ok = false;
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        if let Some(why) = not_orderable(&name) {
            r.error(item.pos, path, format!("`{name}` {why}"));
            ok = false;
            continue;
        }
        domains.push(name);
    }
    ok.then_some(domains)
}

/// Why a certificate cannot be ordered for a host with `acme: true`, if it cannot: a wildcard
/// (only `acme.domains` with dns-01 orders one), or what [`not_orderable`] says.
pub fn not_orderable_for_host(name: &str) -> Option<&'static str> {
    if name.starts_with("*.") {
        return Some("is a wildcard, which only dns-01 validates and `acme.domains` orders");
    }
    not_orderable(name)
}

/// Why a certificate cannot be ordered for `name`, if it cannot: not a DNS name (labels of
/// letters, digits and inner `-`), or an IP address (ACME orders DNS identifiers here).
pub fn not_orderable(name: &str) -> Option<&'static str> {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Some("is an IP address: certificates are ordered for DNS names");
    }
    if bare
        .split('.')
        .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Some(
            "is digits and dots only, no DNS name: certificates are ordered for DNS names",
        );
    }
    let valid = bare.contains('.')
        && name.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !valid {
        return Some("is not a DNS name");
    }
    // The certificate's files are named after it (`_wildcard.` for `*.`), the longest
    // `<name>.acme-tmp`: past 255 bytes it cannot be written, and every retry was another
    // certificate issued and thrown away.
    let stem = if name.starts_with("*.") {
        name.len() + 8
    } else {
        name.len()
    };
    (stem > MAX_FILE_STEM).then_some(
        "is too long for its certificate's file name (246 characters at most, 238 for a wildcard)",
    )
}

/// The longest file stem a certificate's files can have: a file name is at most 255 bytes,
/// and `.acme-tmp` takes 9.
const MAX_FILE_STEM: usize = 255 - ".acme-tmp".len();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::issues::Issues;
    use crate::config::yaml;

    fn read(text: &str) -> (Option<AcmeConfig>, Issues) {
        let mut issues = Issues::default();
        let root = yaml::parse(text).expect("yaml");
        let cfg = {
            let mut r = Reader::new("main.yaml".into(), &mut issues);
            read_acme(&root, &mut r)
        };
        (cfg, issues)
    }

    #[test]
    fn defaults_and_values() {
        let (cfg, _) = read("domains: [\"Example.com\", \"www.example.com\"]\n");
        let cfg = cfg.expect("valid");
        assert_eq!(cfg.directory, LETS_ENCRYPT);
        assert_eq!(cfg.domains, ["example.com", "www.example.com"]);
        let (cfg, _) = read("directory: staging\ndomains: [a.test]\nrenew_before_days: 20\n");
        let cfg = cfg.expect("valid");
        assert_eq!(
            (cfg.directory.as_str(), cfg.renew_before_days),
            (LETS_ENCRYPT_STAGING, Some(20))
        );
    }

    #[test]
    fn every_bad_domain_is_said() {
        let (cfg, issues) = read("domains: [\"a b\", a.test, \"x..test\", \"10.0.0.1\"]\n");
        assert!(cfg.is_none());
        assert_eq!(issues.errors().count(), 3, "{issues:?}");
    }

    #[test]
    fn errors_name_their_line() {
        for (text, line, says) in [
            ("domains: [a]\n", 1, "not a DNS name"),
            ("domains: [\"*.*.a.test\"]\n", 1, "not a DNS name"),
            (
                "domains: [a.test]\ndns_resolver: \"x:1\"\n",
                2,
                "not ip:port",
            ),
            ("domains: [a.test]\nchallenge: smoke\n", 2, "not http-01"),
            ("domains: [\"a b\"]\n", 1, "not a DNS name"),
            ("domains: [\"1.2.3.4\"]\n", 1, "is an IP address"),
            ("domains: [\"-a.test\"]\n", 1, "not a DNS name"),
            (
                "domains: [a.test]\nemail: \"not an email\"\n",
                2,
                "not an email address",
            ),
            (
                "domains: [a.test]\ndirectory: \"http://x\"\n",
                2,
                "not an https://",
            ),
        ] {
            let (cfg, issues) = read(text);
            assert!(cfg.is_none(), "{text}");
            let e = issues.errors().next().expect("an error");
            assert_eq!(e.line, line, "{text}");
            assert!(e.message.contains(says), "{text}: {}", e.message);
        }
    }
}
