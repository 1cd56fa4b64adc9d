//! What start-up builds once from main.yaml and hands to whoever needs it: metrics, the access
//! log sink, keys and limiter tables, the backend registry and its reloader, ACME, the request
//! path over them, and the listeners' limits. Nothing of it is process-wide, so a second proxy
//! in one process (tests) builds its own.

use std::sync::Arc;

use super::StartError;
use crate::accesslog::{AccessLog, Destination};
use crate::config::{self, MainConfig, UpstreamsConfig};
use crate::discovery::Reloader;
use crate::layers::{Keys, PolicyState};
use crate::logfile::LogFile;
use crate::metrics::Metrics;
use crate::proxy::Forwarder;
use crate::routing::Router;
use crate::server::{self, Limits, TcpKeepalive};
use crate::upstream::{Registry, Timeouts};

/// The upstreams config read at start, with the digest of the bytes it came from
/// ([`config::load_upstreams_digested`]).
pub type DigestedUpstreams = (UpstreamsConfig, u64);

/// What start-up builds once and hands to whoever needs it: nothing of it is process-wide, so
/// a second proxy in one process (tests) builds its own.
pub struct Context {
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
    pub policy_state: Arc<PolicyState>,
    pub reloader: Arc<Reloader>,
    /// `acme:`: the certificates ordered and renewed automatically.
    pub acme: Option<Arc<crate::control::acme::Acme>>,
}

impl Context {
    /// Metrics, the access log sink, keys and limiter tables, the backend registry, and the
    /// reloader with `upstreams` installed as the first snapshot. `app_log` is `log_file`
    /// opened, which the access log shares unless `access_log_file` names its own.
    pub fn build(
        main: &MainConfig,
        (upstreams, digest): DigestedUpstreams,
        app_log: Option<&Arc<LogFile>>,
    ) -> Result<Context, StartError> {
        let metrics = Arc::new(Metrics::new(main.threads));
        let destination = access_log_destination(main, app_log)?;
        let access_log = crate::accesslog::start(
            main.access_log,
            main.access_log_format,
            destination,
            metrics.clone(),
        )
        .map_err(|e| StartError::Logging(e.to_string()))?;
        let cache = match &main.cache {
            Some(c) => Some(Arc::new(
                crate::layers::cache::Store::new(c, &main.base_dir, main.threads)
                    .map_err(|source| cache_start_error(c, &main.base_dir, &source))?,
            )),
            None => None,
        };
        let limits_store = main.cluster.limits_store.as_deref();
        let policy_state = PolicyState::new(Keys::from_config(main.master_key.as_deref()))
            .with_cache(cache)
            .with_limits_store(limits_store, main.threads)
            .map_err(|e| StartError::Config(format!("limits_store: {e}")))?;
        let policy_state = Arc::new(policy_state);
        let registry = Registry::new(
            main.threads,
            main.upstream_keepalive_pool_size,
            main.hc_interval,
            metrics.clone(),
        )
        .with_max_connections(main.upstream_max_connections);
        let reloader = Arc::new(Reloader::new(
            main.upstreams_conf.clone(),
            registry,
            policy_state.clone(),
            metrics.clone(),
        ));
        reloader.know_main(main);
        reloader.install_file_config(upstreams, digest, "start");
        let acme = main.acme.as_ref().zip(main.certificates_dir.as_ref());
        let acme = acme.map(|(cfg, dir)| {
            let serving = reloader.clone();
            let hosts: crate::control::acme::AcmeHosts = Box::new(move || {
                serving
                    .file_config()
                    .map(|c| c.acme_hosts())
                    .unwrap_or_default()
            });
            Arc::new(crate::control::acme::Acme::new(
                cfg.clone(),
                dir.clone(),
                hosts,
            ))
        });
        Ok(Context {
            metrics,
            access_log,
            policy_state,
            reloader,
            acme,
        })
    }

    /// The request path: router and forwarder over the reloader's snapshot.
    pub fn router(&self, main: &MainConfig) -> Arc<Router> {
        let forwarder = Forwarder {
            timeouts: Timeouts {
                connect: main.upstream_connect_timeout,
                response: main.upstream_response_timeout,
            },
        };
        let master = main.cluster.member == crate::config::cluster_conf::Member::Master;
        let router = Router::new(
            self.reloader.snapshot.clone(),
            forwarder,
            self.metrics.clone(),
        );
        let challenges = self.acme.as_ref().map(|acme| acme.challenges());
        Arc::new(
            router
                .for_cluster_master(master)
                .with_acme_challenges(challenges)
                .with_body_limit(main.client_max_body_size),
        )
    }

    /// What the proxy listeners' connections share.
    pub fn serving(&self, main: &MainConfig) -> server::Serving {
        server::Serving {
            router: self.router(main),
            metrics: self.metrics.clone(),
            access_log: self.access_log.clone(),
            trusted: Arc::new(server::real_client::TrustedProxies::new(
                &main.trusted_proxies,
            )),
            proxy_protocol: main.proxy_protocol,
        }
    }
}

/// Where the access log writes: its own file, the app log's, or stdout.
fn access_log_destination(
    main: &MainConfig,
    app_log: Option<&Arc<LogFile>>,
) -> Result<Destination, StartError> {
    if main.access_log == config::main_conf::AccessLog::Off {
        return Ok(Destination::Stdout);
    }
    Ok(match (&main.access_log_file, app_log) {
        (Some(path), _) => {
            let file = LogFile::open(path, main.access_log_rotation)
                .map_err(|e| StartError::Logging(format!("{}: {e}", path.display())))?;
            Destination::File(Arc::new(file))
        }
        (None, Some(shared)) => Destination::File(shared.clone()),
        (None, None) => Destination::Stdout,
    })
}

/// The limits of the proxy listeners (and the file server).
pub fn limits(main: &MainConfig) -> Limits {
    Limits {
        header_timeout: main.client_header_timeout,
        max_header_bytes: main.max_request_header_bytes,
        max_connections: main.max_connections,
        keepalive: main.tcp.keepalive_idle.map(|idle| TcpKeepalive {
            idle,
            interval: main.tcp.keepalive_interval,
            count: main.tcp.keepalive_count,
        }),
        grace_period: main.grace_period,
        idle_timeout: main.client_idle_timeout,
        send_timeout: main.client_send_timeout,
        backend_wait: main.upstream_response_timeout,
        max_streams: server::MAX_CLIENT_STREAMS,
    }
}

/// Why the cache's tiers could not be set up, by the key at fault: the disk tier's directory
/// (`file_path`), or the Redis URL (`storage`).
fn cache_start_error(
    cache: &crate::config::cache_conf::CacheConfig,
    base_dir: &std::path::Path,
    source: &std::io::Error,
) -> StartError {
    use crate::config::cache_conf::Storage;
    StartError::Config(match &cache.storage {
        Storage::Hybrid => format!(
            "cache.file_path: the disk tier cannot use `{}`: {source}",
            base_dir.join(&cache.file_path).display()
        ),
        _ => format!("cache.storage: {source}"),
    })
}
