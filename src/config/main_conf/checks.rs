//! main.yaml's checks that need every key read first: the required keys, keys that only work
//! together (the admin API and its key, `acme` and its challenge's listener, an access log file
//! and `access_log`), the listeners, and the files and accounts it names.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::MainConfig;
use crate::config::acme_conf::{self, DnsProvider};
use crate::config::cache_conf;
use crate::config::exists;
use crate::config::listeners;
use crate::config::main_values::AccessLog;
use crate::config::net_conf;
use crate::config::reader::Reader;
use crate::config::yaml::{Key, KeyPositions, Node, Pos};

/// What reading main.yaml's keys one by one found for the checks that follow.
#[derive(Default)]
pub(super) struct Seen<'a> {
    pub http: bool,
    pub upstreams: bool,
    pub proxy_configs: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// Pingora's `user` and `group`: `runuser` and `rungroup` win over them.
    pub pingora_user: Option<String>,
    pub pingora_group: Option<String>,
    pub positions: KeyPositions<'a>,
    pub dns_provider: Option<(Pos, DnsProvider)>,
    pub tcp_top: Vec<(&'a Key, &'a Node)>,
    pub tcp_block: Option<&'a Node>,
    /// A key's value was refused.
    pub failed: bool,
}

impl MainConfig {
    /// Runs the checks that need every key (`seen` says what the keys were) on the config read
    /// from `root` of `path`: the config if none failed.
    pub(super) fn check_whole(
        self,
        root: &Node,
        path: &Path,
        seen: Seen<'_>,
        r: &mut Reader,
    ) -> (MainConfig, bool) {
        let mut cfg = self;
        let Seen {
            http: seen_http,
            upstreams: seen_upstreams,
            proxy_configs,
            ca_file,
            pingora_user,
            pingora_group,
            positions,
            dns_provider,
            tcp_top,
            tcp_block,
            mut failed,
        } = seen;
        let keyed = crate::config::master_secret_set(&cfg);
        let own_admin: Vec<SocketAddr> = [cfg.config_address, cfg.config_tls_address]
            .into_iter()
            .flatten()
            .collect();
        failed |= !cfg
            .cluster
            .check(keyed, cfg.config_api_enabled, &own_admin, r);
        let keyless = cfg.config_api_enabled && !keyed;
        if let Some(pos) = positions.of("config_api_enabled").filter(|_| keyless) {
            let why = "no master_key: the admin API answers every call with 403";
            r.warn(pos, "config_api_enabled", why);
        }
        match net_conf::read_tcp(&tcp_top, tcp_block, r) {
            Some(tcp) => cfg.tcp = tcp,
            None => failed = true,
        }
        if !seen_http {
            r.error(
                root.pos,
                "proxy_address_http",
                "required key is missing (e.g. proxy_address_http: \"0.0.0.0:6193\")",
            );
            failed = true;
        }
        if !seen_upstreams {
            r.error(
                root.pos,
                "upstreams_conf",
                "required key is missing (path of upstreams.yaml)",
            );
            failed = true;
        }
        match (&cfg.certificates_dir, positions.of("proxy_configs")) {
            (None, _) => cfg.certificates_dir = proxy_configs.map(|dir| dir.join("certificates")),
            (Some(_), Some(at)) => r.warn(
                at,
                "proxy_configs",
                "its certificates folder is not read: proxy_certificates is set, and that folder serves",
            ),
            (Some(_), None) => {}
        }
        let given = listeners::Given {
            certificates_dir: cfg.certificates_dir.is_some(),
            config_tls_certificate: cfg.config_tls_certificate.is_some(),
            config_tls_key_file: cfg.config_tls_key_file.is_some(),
            file_server_folder: cfg.file_server_folder.is_some(),
            http3: cfg.http3,
            http3_built: cfg!(feature = "http3"),
        };
        failed |= !listeners::check(&positions, |key| cfg.address_of(key), &given, r);
        let acme_pos = positions.of("acme").unwrap_or(root.pos);
        if let Some(acme) = &mut cfg.acme {
            failed |= !acme_conf::check_with_provider(acme, dns_provider, acme_pos, r);
        } else if let Some((pos, _)) = dns_provider {
            r.warn(pos, "acme_dns_provider", "not used without an acme: block");
        }
        let alpn = cfg.acme.as_ref().map(|a| a.challenge) == Some(acme_conf::Challenge::TlsAlpn01);
        if alpn && cfg.proxy_address_tls.is_none() {
            let why = "tls-alpn-01 is answered on proxy_address_tls: set it, or use http-01";
            let at = cfg.acme.as_ref().and_then(|a| a.challenge_at);
            r.error(at.unwrap_or(acme_pos), "acme.challenge", why);
            failed = true;
        }
        if cfg.acme.is_some() && cfg.certificates_dir.is_none() {
            let pos = acme_pos;
            let why = "writes certificates into proxy_certificates (or <proxy_configs>/certificates): set one";
            r.error(pos, "acme", why);
            failed = true;
        }
        if let (Some(at), Some(_)) = (positions.of("error_log"), positions.of("log_file")) {
            let why = "not read: log_file is set too, and the log goes there (keep one of the two)";
            r.warn(at, "error_log", why);
        }
        let unused = [
            (
                "access_log_format",
                cfg.access_log == AccessLog::Off,
                "not used while access_log is off (set access_log: all or error)",
            ),
            (
                "file_server_max_connections",
                cfg.file_server_address.is_none() || cfg.file_server_folder.is_none(),
                "not used without a file server (file_server_address and file_server_folder)",
            ),
        ];
        for (key, unused, why) in unused {
            if let Some(pos) = positions.of(key).filter(|_| unused) {
                r.warn(pos, key, why);
            }
        }
        let unwritten = cfg.access_log_file.is_some() && cfg.access_log == AccessLog::Off;
        if let Some(pos) = positions.of("access_log_file").filter(|_| unwritten) {
            let why = "not written while access_log is off (set access_log: all or error)";
            r.warn(pos, "access_log_file", why);
        }
        cfg.runuser = cfg.runuser.take().or(pingora_user);
        cfg.rungroup = cfg.rungroup.take().or(pingora_group);
        // The files and accounts are checked whatever failed above: check-config reports every
        // problem at once (a bad value hid the missing files behind it, one CI run per layer).
        let written = cfg.upstreams_conf.clone();
        cfg.resolve_paths();
        let ca_file = ca_file.map(|p| cfg.base_dir.join(p));
        let named = exists::Named {
            tls: cfg.proxy_address_tls.is_some(),
            certificates_dir: cfg.certificates_dir.as_deref(),
            config_tls_certificate: cfg.config_tls_certificate.as_deref(),
            config_tls_key_file: cfg.config_tls_key_file.as_deref(),
            admin_tls: cfg.config_tls_address.is_some(),
            file_server_folder: cfg.file_server_folder.as_deref(),
            ca_file: ca_file.as_deref(),
            runuser: cfg.runuser.as_deref(),
            rungroup: cfg.rungroup.as_deref(),
            pid_file: &cfg.pid_file,
            upgrade_sock: &cfg.upgrade_sock,
            log_file: cfg.log_file.as_deref(),
            access_log_file: cfg
                .access_log_file
                .as_deref()
                .filter(|_| cfg.access_log != AccessLog::Off),
            log_rotates: cfg.log_rotation.is_some(),
            access_log_rotates: cfg.access_log_rotation.is_some(),
            config_files: [path, &cfg.upstreams_conf],
        };
        let mut everything_exists = exists::check(&named, &positions, r);
        if let Some(cache) = &cfg.cache {
            let block = positions.of("cache").unwrap_or(root.pos);
            everything_exists &= cache_conf::check_file_path(cache, &cfg.base_dir, block, r);
        }
        if let Some(acme) = &cfg.acme {
            everything_exists &= acme_conf::check_ca_file(acme, r);
        }
        let resolved = &cfg.upstreams_conf;
        let unnamed = written.as_os_str().is_empty(); // already an error: the key is missing
        let problem = match std::fs::metadata(resolved) {
            _ if unnamed => None,
            Ok(meta) if meta.is_dir() => Some("is a directory, not a file"),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
            Err(_) => None, // reported when the file is read
        };
        if let Some(problem) = problem {
            let shown = if written == *resolved {
                format!("`{}` {problem}", written.display())
            } else {
                format!(
                    "`{}` {problem} (looked for {})",
                    written.display(),
                    resolved.display()
                )
            };
            let pos = positions.of("upstreams_conf").unwrap_or(root.pos);
            r.error(pos, "upstreams_conf", shown);
            return (cfg, false);
        }
        let valid = everything_exists && !failed;
        (cfg, valid)
    }

    /// The address a listener's key names; `None` for any other key.
    fn address_of(&self, key: &str) -> Option<SocketAddr> {
        match key {
            "proxy_address_http" => Some(self.proxy_address_http),
            "proxy_address_tls" => self.proxy_address_tls,
            "config_address" => self.config_address,
            "config_tls_address" => self.config_tls_address,
            "file_server_address" => self.file_server_address,
            _ => None,
        }
    }

    /// Makes relative paths relative to main.yaml's directory (for files it only reads: unless
    /// only the cwd-relative one exists).
    fn resolve_paths(&mut self) {
        let base = self.base_dir.clone();
        let fix = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                let beside = base.join(&*p);
                if beside.exists() || !p.exists() {
                    *p = beside;
                }
            }
        };
        fix(&mut self.upstreams_conf);
        // Files the process creates are always beside main.yaml: which directory a service is
        // started from (`/` under systemd) must not decide where its logs go.
        let beside = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        };
        beside(&mut self.pid_file);
        beside(&mut self.upgrade_sock);
        for log in [&mut self.log_file, &mut self.access_log_file]
            .into_iter()
            .flatten()
        {
            beside(log);
        }
        for p in [
            &mut self.certificates_dir,
            &mut self.file_server_folder,
            &mut self.config_tls_certificate,
            &mut self.config_tls_key_file,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
        if let Some(acme) = &mut self.acme {
            let dir = self.certificates_dir.as_ref().and_then(|c| c.parent());
            let state = acme.state_dir.take().unwrap_or_else(|| match dir {
                Some(configs) => configs.join("autoconfigs"),
                None => PathBuf::from("autoconfigs"),
            });
            acme.state_dir = Some(state);
            for p in [&mut acme.state_dir, &mut acme.ca_file]
                .into_iter()
                .flatten()
            {
                beside(p);
            }
        }
    }
}
