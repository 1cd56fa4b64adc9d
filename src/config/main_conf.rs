//! `main.yaml`: process settings, read once at start (SPEC §2).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::acme_conf::{self, AcmeConfig};
use super::cache_conf::{self, CacheConfig};
use super::cluster_conf::ClusterConfig;
use super::log_conf::{AccessLogFormat, PatternPiece, Rotation};
use super::main_values::{
    listen, one_of, opt, read_access_log, read_body_size, read_grade, read_hc_method,
    read_log_level, read_log_pattern, read_log_target, seconds, set,
};
pub use super::main_values::{AccessLog, TlsGrade};
use super::net_conf::{self, Cidr, TcpSettings};
use super::reader::Reader;
use super::yaml::Node;
use checks::Seen;

mod checks;

/// The process settings of `main.yaml`, with defaults filled in.
#[derive(Clone, Debug)]
pub struct MainConfig {
    /// Directory of main.yaml; relative paths are resolved against it.
    pub base_dir: PathBuf,
    pub threads: usize,
    pub daemon: bool,
    pub pid_file: PathBuf,
    pub log_file: Option<PathBuf>,
    /// Size rotation of `log_file` (Aralez 0.95's `"path, max MB, keep, compress"`).
    pub log_rotation: Option<Rotation>,
    /// `log_pattern`: how app log lines look (tracing's default format when absent).
    pub log_pattern: Option<Vec<PatternPiece>>,
    pub log_level: String,
    pub access_log: AccessLog,
    /// Where the access log goes; with the app log when absent.
    pub access_log_file: Option<PathBuf>,
    pub access_log_rotation: Option<Rotation>,
    pub access_log_format: AccessLogFormat,
    pub runuser: Option<String>,
    pub rungroup: Option<String>,
    pub upgrade_sock: PathBuf,
    pub upstream_keepalive_pool_size: usize,
    /// Open connections per backend, across workers; past it requests get 503.
    pub upstream_max_connections: usize,
    pub proxy_address_http: SocketAddr,
    pub proxy_address_tls: Option<SocketAddr>,
    pub certificates_dir: Option<PathBuf>,
    pub proxy_tls_grade: TlsGrade,
    pub upstreams_conf: PathBuf,
    pub config_api_enabled: bool,
    pub config_address: Option<SocketAddr>,
    pub config_tls_address: Option<SocketAddr>,
    pub config_tls_certificate: Option<PathBuf>,
    pub config_tls_key_file: Option<PathBuf>,
    pub master_key: Option<String>,
    /// Opens the admin API's `/metrics` and `/status` only.
    pub metrics_key: Option<String>,
    pub hc_method: http::Method,
    pub hc_interval: Duration,
    pub file_server_folder: Option<PathBuf>,
    pub file_server_address: Option<SocketAddr>,
    /// Connections the file server serves at once (its own count, apart from the proxy's).
    pub file_server_max_connections: usize,
    /// The `tcp:` block (and the keep-alive keys at the top level).
    pub tcp: TcpSettings,
    /// The proxy listeners expect a PROXY protocol header (v1 or v2) on every connection.
    pub proxy_protocol: bool,
    /// Peers whose `X-Forwarded-For` and `X-Request-Id` are believed.
    pub trusted_proxies: Vec<Cidr>,
    pub client_header_timeout: Duration,
    pub client_idle_timeout: Duration,
    /// How long a connection with requests in flight may go without any of them making
    /// progress (a response head or body bytes going out) before it is closed.
    pub client_send_timeout: Duration,
    pub upstream_connect_timeout: Duration,
    pub upstream_response_timeout: Duration,
    pub grace_period: Duration,
    pub max_request_header_bytes: usize,
    /// `client_max_body_size` (nginx's): the largest request body taken, in bytes; `None`, any
    /// (the default, as Aralez; nginx's is 1 MiB).
    pub client_max_body_size: Option<u64>,
    pub max_connections: usize,
    /// The `cache:` block; no caching when absent.
    pub cache: Option<CacheConfig>,
    /// `cluster_member`, `worker_nodes`, `limits_store`.
    pub cluster: ClusterConfig,
    /// The `acme:` block: certificates ordered and renewed automatically.
    pub acme: Option<AcmeConfig>,
    /// `http3`: HTTP/3 (QUIC) on the UDP port of `proxy_address_tls`.
    pub http3: bool,
}

const KEYS: &[&str] = &[
    "threads",
    "daemon",
    "pid_file",
    "error_log",
    "log_file",
    "log_level",
    "log_pattern",
    "access_log",
    "access_log_file",
    "access_log_format",
    "runuser",
    "rungroup",
    "upgrade_sock",
    "upstream_keepalive_pool_size",
    "upstream_max_connections",
    "proxy_address_http",
    "proxy_address_tls",
    "proxy_certificates",
    "proxy_configs",
    "proxy_tls_grade",
    "upstreams_conf",
    "config_api_enabled",
    "config_address",
    "config_tls_address",
    "config_tls_certificate",
    "config_tls_key_file",
    "master_key",
    "metrics_key",
    "hc_method",
    "hc_interval",
    "file_server_folder",
    "file_server_address",
    "file_server_max_connections",
    "tcp_keepalive_idle",
    "tcp_keepalive_interval",
    "tcp_keepalive_count",
    "tcp",
    "proxy_protocol",
    "trusted_proxies",
    "client_header_timeout",
    "client_idle_timeout",
    "client_send_timeout",
    "upstream_connect_timeout",
    "upstream_response_timeout",
    "grace_period_seconds",
    "max_request_header_bytes",
    "client_max_body_size",
    "max_connections",
    "cache",
    "cluster_member",
    "worker_nodes",
    "limits_store",
    "acme",
    "acme_dns_provider",
    "http3",
];

/// Keys of Pingora's server config that Aralez files carry; accepted and ignored.
const PINGORA_KEYS: &[&str] = &[
    "version",
    "work_stealing",
    "graceful_shutdown_timeout_seconds",
    "error_log_level",
    "upstream_keepalive_pool_size_per_thread",
    "ca_file",
    "client_bind_to_ipv4",
    "client_bind_to_ipv6",
    "upstream_connect_offload_threadpools",
    "upstream_connect_offload_thread_per_pool",
    "upstream_debug_ssl_keylog",
    "max_retries",
];

impl MainConfig {
    fn defaults(base_dir: PathBuf) -> Self {
        MainConfig {
            base_dir,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            daemon: false,
            pid_file: PathBuf::from("/tmp/aralez.pid"),
            log_file: None,
            log_rotation: None,
            log_pattern: None,
            access_log_file: None,
            access_log_rotation: None,
            access_log_format: AccessLogFormat::Logfmt,
            log_level: "info".into(),
            access_log: AccessLog::Off,
            runuser: None,
            rungroup: None,
            upgrade_sock: PathBuf::from("/tmp/aralez.sock"),
            upstream_keepalive_pool_size: 128,
            upstream_max_connections: 1024,
            proxy_address_http: SocketAddr::from(([0, 0, 0, 0], 0)),
            proxy_address_tls: None,
            certificates_dir: None,
            proxy_tls_grade: TlsGrade::Medium,
            upstreams_conf: PathBuf::new(),
            config_api_enabled: false,
            config_address: None,
            config_tls_address: None,
            config_tls_certificate: None,
            config_tls_key_file: None,
            master_key: None,
            metrics_key: None,
            hc_method: http::Method::HEAD,
            hc_interval: Duration::from_secs(2),
            file_server_folder: None,
            file_server_address: None,
            file_server_max_connections: 1024,
            tcp: TcpSettings::default(),
            proxy_protocol: false,
            trusted_proxies: Vec::new(),
            client_header_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            client_send_timeout: Duration::from_secs(60),
            upstream_connect_timeout: Duration::from_secs(5),
            upstream_response_timeout: Duration::from_secs(60),
            grace_period: Duration::from_secs(30),
            max_request_header_bytes: 64 * 1024,
            client_max_body_size: None,
            max_connections: 100_000,
            cache: None,
            cluster: ClusterConfig::default(),
            acme: None,
            http3: false,
        }
    }

    /// Reads the root of main.yaml. Returns `None` when a required key is missing or bad.
    pub fn read(root: &Node, path: &Path, r: &mut Reader) -> Option<MainConfig> {
        let (cfg, valid) = MainConfig::read_as_far_as_valid(root, path, r)?;
        valid.then_some(cfg)
    }

    /// [`MainConfig::read`], and when the file has errors, what it says all the same (a bad
    /// key at its default), with `false`: for `check-config` to go on checking what depends on
    /// it (the certificates). `None` when the document is no mapping.
    pub fn read_as_far_as_valid(
        root: &Node,
        path: &Path,
        r: &mut Reader,
    ) -> Option<(MainConfig, bool)> {
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut cfg = MainConfig::defaults(base_dir);
        let entries = r.map(root, "(document)")?;
        let mut seen = Seen::default();
        for (key, value) in entries {
            let k = key.name.as_str();
            seen.positions.note(k, value.pos);
            let ok = match k {
                "threads" => set(
                    &mut cfg.threads,
                    r.uint(value, k, 1, 1024).map(|n| n as usize),
                ),
                "daemon" => set(&mut cfg.daemon, r.boolean(value, k)),
                "pid_file" => set(
                    &mut cfg.pid_file,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "error_log" | "log_file" => {
                    let target = read_log_target(value, k, r);
                    // `log_file` wins over `error_log` whatever their order.
                    if k == "log_file" || cfg.log_file.is_none() {
                        if let Some(t) = &target {
                            cfg.log_file = Some(t.path.clone());
                            cfg.log_rotation = t.rotation;
                        }
                    }
                    target.is_some()
                }
                "log_pattern" => opt(&mut cfg.log_pattern, read_log_pattern(value, r)),
                "log_level" => set(&mut cfg.log_level, read_log_level(value, r)),
                "access_log" => set(&mut cfg.access_log, read_access_log(value, r)),
                "access_log_file" => match read_log_target(value, k, r) {
                    Some(t) => {
                        cfg.access_log_file = Some(t.path);
                        cfg.access_log_rotation = t.rotation;
                        true
                    }
                    None => false,
                },
                "access_log_format" => set(
                    &mut cfg.access_log_format,
                    one_of(
                        value,
                        k,
                        r,
                        &[
                            ("logfmt", AccessLogFormat::Logfmt),
                            ("json", AccessLogFormat::Json),
                        ],
                    ),
                ),
                "runuser" => opt(&mut cfg.runuser, r.non_empty_string(value, k)),
                "rungroup" => opt(&mut cfg.rungroup, r.non_empty_string(value, k)),
                // Pingora's names for them (Aralez's README uses these): `runuser`/`rungroup`
                // win whatever the order.
                "user" => {
                    let name = r.non_empty_string(value, k);
                    seen.pingora_user = name.clone();
                    name.is_some()
                }
                "group" => {
                    let name = r.non_empty_string(value, k);
                    seen.pingora_group = name.clone();
                    name.is_some()
                }
                "upgrade_sock" => set(
                    &mut cfg.upgrade_sock,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "upstream_keepalive_pool_size" => set(
                    &mut cfg.upstream_keepalive_pool_size,
                    r.uint(value, k, 0, 1_000_000).map(|n| n as usize),
                ),
                "upstream_max_connections" => set(
                    &mut cfg.upstream_max_connections,
                    r.uint(value, k, 1, 10_000_000).map(|n| n as usize),
                ),
                "proxy_address_http" => {
                    seen.http = true;
                    set(&mut cfg.proxy_address_http, listen(value, k, r))
                }
                "proxy_address_tls" => opt(&mut cfg.proxy_address_tls, listen(value, k, r)),
                "proxy_certificates" => opt(
                    &mut cfg.certificates_dir,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "proxy_configs" => opt(
                    &mut seen.proxy_configs,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "proxy_tls_grade" => set(&mut cfg.proxy_tls_grade, read_grade(value, r)),
                "upstreams_conf" => {
                    seen.upstreams = true;
                    set(
                        &mut cfg.upstreams_conf,
                        r.non_empty_string(value, k).map(PathBuf::from),
                    )
                }
                "config_api_enabled" => set(&mut cfg.config_api_enabled, r.boolean(value, k)),
                "config_address" => opt(&mut cfg.config_address, listen(value, k, r)),
                "config_tls_address" => opt(&mut cfg.config_tls_address, listen(value, k, r)),
                "config_tls_certificate" => opt(
                    &mut cfg.config_tls_certificate,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "config_tls_key_file" => opt(
                    &mut cfg.config_tls_key_file,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "master_key" => opt(&mut cfg.master_key, r.non_empty_string(value, k)),
                "metrics_key" => opt(&mut cfg.metrics_key, r.non_empty_string(value, k)),
                "hc_method" => set(&mut cfg.hc_method, read_hc_method(value, r)),
                "hc_interval" => set(&mut cfg.hc_interval, seconds(value, k, 1, 3600, r)),
                "file_server_folder" => opt(
                    &mut cfg.file_server_folder,
                    r.non_empty_string(value, k).map(PathBuf::from),
                ),
                "file_server_address" => opt(&mut cfg.file_server_address, listen(value, k, r)),
                _ if net_conf::is_top_level_tcp_key(k) => {
                    seen.tcp_top.push((key, value));
                    true
                }
                "cache" => opt(&mut cfg.cache, cache_conf::read_cache(value, r)),
                "acme" => opt(&mut cfg.acme, acme_conf::read_acme(value, r)),
                "acme_dns_provider" => acme_conf::read_dns_provider(value, k, r)
                    .map(|p| seen.dns_provider = Some((value.pos, p)))
                    .is_some(),
                _ if cfg.cluster.read(k, value, r).is_some_and(|read| !read) => false,
                "cluster_member" | "worker_nodes" | "limits_store" => true,
                "tcp" => {
                    seen.tcp_block = Some(value);
                    true
                }
                "proxy_protocol" => set(&mut cfg.proxy_protocol, r.boolean(value, k)),
                "http3" => set(&mut cfg.http3, r.boolean(value, k)),
                "trusted_proxies" => set(
                    &mut cfg.trusted_proxies,
                    net_conf::read_trusted_proxies(value, k, r),
                ),
                "client_header_timeout" => set(
                    &mut cfg.client_header_timeout,
                    seconds(value, k, 1, 3600, r),
                ),
                "client_idle_timeout" => set(
                    &mut cfg.client_idle_timeout,
                    seconds(value, k, 1, 86_400, r),
                ),
                "client_send_timeout" => set(
                    &mut cfg.client_send_timeout,
                    seconds(value, k, 1, 86_400, r),
                ),
                "upstream_connect_timeout" => set(
                    &mut cfg.upstream_connect_timeout,
                    seconds(value, k, 1, 3600, r),
                ),
                "upstream_response_timeout" => set(
                    &mut cfg.upstream_response_timeout,
                    seconds(value, k, 1, 86_400, r),
                ),
                "grace_period_seconds" => {
                    set(&mut cfg.grace_period, seconds(value, k, 0, 86_400, r))
                }
                "max_request_header_bytes" => set(
                    &mut cfg.max_request_header_bytes,
                    r.uint(value, k, 8192, 16 * 1024 * 1024).map(|n| n as usize),
                ),
                "client_max_body_size" => {
                    set(&mut cfg.client_max_body_size, read_body_size(value, k, r))
                }
                "max_connections" => set(
                    &mut cfg.max_connections,
                    r.uint(value, k, 1, 10_000_000).map(|n| n as usize),
                ),
                "file_server_max_connections" => set(
                    &mut cfg.file_server_max_connections,
                    r.uint(value, k, 1, 10_000_000).map(|n| n as usize),
                ),
                // Pingora's CA for upstream TLS: aralez uses the system trust store instead,
                // but the file must exist, as it must for Aralez to start.
                "ca_file" => {
                    seen.ca_file = r.non_empty_string(value, k).map(PathBuf::from);
                    seen.ca_file.is_some()
                }
                _ if PINGORA_KEYS.contains(&k) => true,
                _ => {
                    r.unknown_key(key, k, KEYS);
                    true
                }
            };
            seen.failed |= !ok;
        }
        Some(cfg.check_whole(root, path, seen, r))
    }
}
