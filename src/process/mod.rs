//! Process life: read config, set up logging, bind (or inherit) listeners, write the pid file,
//! drop privileges, start workers and the control plane, react to signals (SIGTERM/SIGINT and
//! SIGQUIT drain and exit, SIGHUP reloads) and clean up.

pub mod daemon;
mod log_pattern;
mod logging;
mod notify;
pub mod pidfile;
pub mod privileges;
pub mod probe;
mod signals;
mod single;
mod sockets;
pub mod upgrade;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use signals::{LogFiles, Signals};

use crate::accesslog::{AccessLog, Destination};
use crate::config::acme_conf::Challenge;
use crate::config::{self, Issues, MainConfig, UpstreamsConfig};
use crate::discovery::Reloader;
use crate::layers::{Keys, PolicyState};
use crate::logfile::LogFile;
use crate::metrics::Metrics;
use crate::proxy::Forwarder;
use crate::routing::Router;
use crate::server::{self, Limits, TcpKeepalive};
use crate::upstream::{Registry, Timeouts};
use crate::vocab::acme_challenges::{Challenges, ACME_TLS_ALPN};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the configuration has errors:\n{0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start {what}: {source}")]
    Runtime {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot set up logging: {0}")]
    Logging(String),
    #[error("cannot write the pid file {path}: {source}")]
    PidFile {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot drop privileges: {0}")]
    Privileges(#[from] privileges::PrivilegeError),
    #[error("live upgrade failed: {0}")]
    Upgrade(#[from] upgrade::UpgradeError),
    #[error("cannot go to the background: {0}")]
    Daemon(#[from] daemon::DaemonError),
    #[error("another instance is running: {0}")]
    AlreadyRunning(String),
}

fn render_errors(issues: &Issues) -> String {
    issues.errors().map(|i| format!("  {i}\n")).collect()
}

/// How `main` asked the process to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// `-d`: go to the background (also `daemon: true`).
    pub daemon: bool,
    /// `-u`: take the listening sockets of the running instance.
    pub upgrade: bool,
}

/// Goes to the background when `-d` or `daemon: true` asks for it. Call from `main` before
/// anything starts a thread. A config with errors stays in the foreground, so `run` reports it.
/// In the background process, gives the pipe on which to tell the starting command whether it
/// serves (hand it to [`run`]).
pub fn daemonize_if_asked(
    main_path: &Path,
    options: RunOptions,
) -> Result<Option<daemon::ReadyPipe>, StartError> {
    let mut issues = Issues::default();
    let Some(main) = config::load_main(main_path, &mut issues) else {
        return Ok(None);
    };
    if (options.daemon || main.daemon) && !issues.has_errors() {
        return Ok(Some(daemon::daemonize(main.log_file.as_deref())?));
    }
    Ok(None)
}

/// The upstreams config read at start, with the digest of the bytes it came from
/// ([`config::load_upstreams_digested`]).
pub type DigestedUpstreams = (UpstreamsConfig, u64);

fn load(main_path: &Path) -> Result<(MainConfig, DigestedUpstreams, Issues), StartError> {
    let mut issues = Issues::default();
    let main = config::load_main(main_path, &mut issues);
    let upstreams = config::upstreams_conf_of(main.as_ref(), main_path)
        .and_then(|path| config::load_upstreams_digested(&path, &mut issues));
    let (Some(main), Some(upstreams)) = (main, upstreams) else {
        return Err(StartError::Config(render_errors(&issues)));
    };
    if issues.has_errors() {
        return Err(StartError::Config(render_errors(&issues)));
    }
    Ok((main, upstreams, issues))
}

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
                crate::layers::cache::Store::new(c, &main.base_dir, main.threads).map_err(
                    |source| StartError::Runtime {
                        what: "the cache's disk tier",
                        source,
                    },
                )?,
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
                .with_acme_challenges(challenges),
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

/// Reads the config and runs the proxy until a stop signal. Returns after the drain.
/// `daemon_ready`, in a background process, is taken and told once the proxy serves; left in place if it fails
/// before that, for the caller to report the error on it.
pub fn run(
    main_path: &Path,
    options: RunOptions,
    daemon_ready: &mut Option<daemon::ReadyPipe>,
) -> Result<(), StartError> {
    // First, so that what start-up allocates is not on huge pages either; said once logs work.
    let small_pages = no_huge_pages();
    let (main, upstreams, issues) = load(main_path)?;
    let app_log = logging::open_app_log(&main).map_err(StartError::Logging)?;
    logging::init(&main, app_log.as_ref()).map_err(StartError::Logging)?;
    if let Err(e) = small_pages {
        tracing::debug!("cannot turn transparent huge pages off: {e}");
    }
    for warning in issues.warnings() {
        tracing::warn!("{warning}");
    }
    raise_open_files_limit();
    let ctx = Context::build(&main, upstreams, app_log.as_ref())?;

    let mut bound = sockets::open(&main, options.upgrade)?;
    let pid_file =
        pidfile::PidFile::write(&main.pid_file).map_err(|source| StartError::PidFile {
            path: main.pid_file.display().to_string(),
            source,
        })?;
    match privileges::drop_to(main.runuser.as_deref(), main.rungroup.as_deref()) {
        Ok(Some((uid, gid))) => tracing::info!("running as uid {uid}, gid {gid}"),
        Ok(None) => {}
        Err(e) => {
            pid_file.remove();
            return Err(e.into());
        }
    }
    let control = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("aralez-control")
        .enable_all()
        .build()
        .map_err(|source| StartError::Runtime {
            what: "the control runtime",
            source,
        })?;
    // Before "listening on": a SIGTERM sent as soon as the proxy says it listens must drain
    // and clean up, not meet the default action (exit on the spot, the pid file left behind).
    let signals = {
        let _context = control.enter();
        Signals::install()
    };
    let workers_count = bound.http.len();
    if let Some(addr) = bound.http.first().and_then(|l| l.local_addr().ok()) {
        tracing::info!("listening on http://{addr} with {workers_count} worker(s)");
    }
    let mut tls = tls_acceptor(&main, &control, ctx.acme.as_ref().map(|a| a.challenges()))?;
    let tls_addr = bound.tls.first().and_then(|l| l.local_addr().ok());
    if let Some(addr) = tls_addr {
        ctx.policy_state.tls_port.set(addr.port());
        tracing::info!("listening on https://{addr} with {workers_count} worker(s)");
    }
    let h3 = match (bound.quic.take(), tls.as_mut()) {
        (Some(socket), Some(side)) => Some(http3_side(socket, bound.quic_owner, side)),
        _ => None,
    };
    crate::control::start(&control, &main, ctx.reloader.snapshot.clone());
    crate::discovery::start(&control, ctx.reloader.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut side_tasks = start_side_listeners(&control, &main, &ctx, &stop_rx);

    let h3_thread = match h3 {
        Some(side) => {
            let serving = ctx.serving(&main);
            let addr = side.socket.local_addr();
            let started =
                server::h3::spawn(side, serving, limits(&main), main.threads, stop_rx.clone());
            let started = started.map_err(|e| StartError::Config(format!("  http3: {e}\n")))?;
            if let Ok(addr) = addr {
                tracing::info!("listening on h3://{addr} (HTTP/3 over QUIC)");
            }
            Some(started)
        }
        None => None,
    };
    // After HTTP/3, the last step that can fail: a start error must not return (and run the
    // exit handlers, aws-lc's among them) while a thread is still starting up.
    let listeners = server::Listeners {
        http: bound.http,
        tls: bound.tls,
        acceptor: tls,
    };
    let workers = server::spawn_workers(
        listeners,
        ctx.serving(&main),
        limits(&main),
        stop_rx.clone(),
    );
    let workers = match workers {
        Ok(workers) => workers,
        Err(failed) => {
            let _ = stop_tx.send(true);
            for thread in failed.started.into_iter().chain(h3_thread) {
                let _ = thread.join();
            }
            return Err(StartError::Runtime {
                what: "worker threads",
                source: failed.source,
            });
        }
    };

    let offer = bound.offer.clone();
    let upgrade_sock = bound.upgrade_sock;
    control.block_on(async {
        if let Some((listener, folder)) = bound.files {
            let limits = Limits {
                max_connections: main.file_server_max_connections,
                ..limits(&main)
            };
            let served = crate::fileserver::serve(listener, folder, limits, stop_rx);
            side_tasks.push(tokio::spawn(served));
        }
        if let Some(sock) = &upgrade_sock {
            drop(tokio::spawn(sock.serve(offer.clone())));
        }
        let ready = if options.upgrade {
            format!("MAINPID={}\nREADY=1", std::process::id())
        } else {
            "READY=1".to_string()
        };
        notify::notify(&ready);
        if let Some(pipe) = daemon_ready.take() {
            pipe.ready();
        }
        match signals {
            Some(signals) => {
                let logs = LogFiles {
                    app: app_log,
                    access: ctx.access_log.clone(),
                };
                signals.wait(&ctx.reloader, &logs).await
            }
            None => {
                tracing::error!("cannot install signal handlers; stop with SIGKILL");
                std::future::pending::<()>().await;
            }
        }
    });
    notify::notify("STOPPING=1");
    // Close our duplicates first, so the ports close (and refuse) once the workers let go.
    drop(offer.lock().map(|mut o| o.take()));
    tracing::info!(
        "stopping: no new connections; draining (up to {:?})",
        main.grace_period
    );
    let _ = stop_tx.send(true);
    for worker in workers.into_iter().chain(h3_thread) {
        let _ = worker.join();
    }
    // The admin API and file server drained alongside the workers.
    control.block_on(async {
        let all = futures_util::future::join_all(side_tasks);
        let _ = tokio::time::timeout(main.grace_period, all).await;
    });
    control.shutdown_timeout(std::time::Duration::from_millis(200));
    ctx.access_log.flush();
    if let Some(cache) = &ctx.policy_state.cache {
        cache.flush(std::time::Duration::from_secs(10));
    }
    if let Some(sock) = upgrade_sock {
        sock.remove();
    }
    pid_file.remove();
    tracing::info!("stopped");
    Ok(())
}

/// Raises the soft limit on open files to the hard limit: every client connection, backend
/// connection and TLS session holds a descriptor, and the usual soft limit (1024) is what an
/// attacker exhausts first.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!("open files limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("cannot raise the open files limit from {soft}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}

/// Turns transparent huge pages off for this process. The allocator asks for them on its
/// arenas, and then each 2 MiB region becomes resident whole at its first touch: every idle
/// client connection cost about 41 KiB of RSS with them and 31 KiB without (10,000 keep-alive
/// connections, bench/RESULTS.md), and the process starts 10 MB smaller. A proxy's working set
/// is small and scattered over many connections, which is where huge pages waste the most.
fn no_huge_pages() -> nix::Result<()> {
    nix::sys::prctl::set_thp_disable(true)
}

/// The admin API, on the control runtime; its tasks end after their drain.
fn start_side_listeners(
    control: &tokio::runtime::Runtime,
    main: &MainConfig,
    ctx: &Context,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if let Some(cache) = &ctx.policy_state.cache {
        cache.follow_drops(control.handle());
    }
    if let Some(limits) = &ctx.policy_state.shared_limits {
        limits.start(control.handle());
    }
    if let Some(acme) = &ctx.acme {
        control.spawn(acme.clone().run());
    }
    let admin = Arc::new(crate::admin::Admin {
        reloader: ctx.reloader.clone(),
        master_key: ctx.policy_state.keys.master().map(str::to_string),
        config_api_enabled: main.config_api_enabled,
        metrics: ctx.metrics.clone(),
        metrics_key: main.metrics_key.clone(),
        history: Default::default(),
        cache: ctx.policy_state.cache.clone(),
        shared_limits: ctx.policy_state.shared_limits.clone(),
        cluster: cluster_master(control, main, ctx),
        acme: ctx.acme.clone(),
    });
    match crate::admin::start(control, main, admin, stop) {
        Ok(tasks) => tasks,
        Err(e) => {
            tracing::error!("admin API: {e}");
            Vec::new()
        }
    }
}

/// Cluster mode's master, pushing to `worker_nodes` (with its retries on `control`); `None`
/// for any other instance.
fn cluster_master(
    control: &tokio::runtime::Runtime,
    main: &MainConfig,
    ctx: &Context,
) -> Option<Arc<crate::admin::cluster::Cluster>> {
    use crate::config::cluster_conf::Member;
    let key = ctx.policy_state.keys.master()?;
    if main.cluster.member != Member::Master {
        return None;
    }
    let cluster = Arc::new(crate::admin::cluster::Cluster::new(
        &main.cluster.worker_nodes,
        key,
    ));
    control.spawn(cluster.clone().keep_workers_current());
    Some(cluster)
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
        max_streams: server::MAX_CLIENT_STREAMS,
    }
}

/// HTTP/3's side (its UDP socket, the TLS listener's certificates), and `Alt-Svc` for the TLS
/// listener.
fn http3_side(
    socket: std::net::UdpSocket,
    previous_owner: Option<i32>,
    side: &mut server::TlsSide,
) -> server::H3Side {
    let port = socket.local_addr().map_or(0, |a| a.port());
    let alt_svc = format!("h3=\":{port}\"; ma=86400");
    side.alt_svc = http::HeaderValue::from_str(&alt_svc).ok();
    server::H3Side {
        socket,
        resolver: side.resolver.clone(),
        hsts: side.hsts,
        previous_owner,
    }
}

/// The TLS acceptor of the proxy listener: certificates from the watched directory, the grade's
/// suites, ALPN h2 + http/1.1. `None` when `proxy_address_tls` is not set.
fn tls_acceptor(
    main: &MainConfig,
    control: &tokio::runtime::Runtime,
    alpn_challenges: Option<Arc<Challenges>>,
) -> Result<Option<server::TlsSide>, StartError> {
    if main.proxy_address_tls.is_none() {
        return Ok(None);
    }
    let Some(dir) = &main.certificates_dir else {
        return Err(StartError::Config(
            "  proxy_address_tls needs a certificate directory: set proxy_certificates (or proxy_configs)\n".into(),
        ));
    };
    let (store, problems) = crate::tls::CertStore::open(dir);
    for problem in &problems {
        tracing::warn!("certificates: {problem}");
    }
    if store.is_empty() {
        tracing::warn!(
            "certificates: no usable pair in {}; TLS handshakes fail until one is added",
            dir.display()
        );
    } else {
        tracing::info!(
            "certificates: {} pair(s) from {}",
            store.len(),
            dir.display()
        );
    }
    if main.proxy_tls_grade == crate::config::main_conf::TlsGrade::Unsafe {
        tracing::warn!("proxy_tls_grade: unsafe offers the same as medium: rustls has nothing weaker than TLS 1.2 with AEAD suites");
    }
    // With TLS-ALPN-01, handshakes offering `acme-tls/1` get the challenge certificates.
    let resolver: Arc<dyn rustls::server::ResolvesServerCert> = match alpn_challenges {
        Some(challenges) => Arc::new(crate::tls::WithAcmeChallenges {
            inner: store.clone(),
            challenges,
        }),
        None => store.clone(),
    };
    let alpn: &[&[u8]] = if main
        .acme
        .as_ref()
        .is_some_and(|a| a.challenge == Challenge::TlsAlpn01)
    {
        &[b"h2", b"http/1.1", ACME_TLS_ALPN]
    } else {
        &[b"h2", b"http/1.1"]
    };
    let config = crate::tls::server_config(resolver.clone(), main.proxy_tls_grade, alpn)
        .map_err(|e| StartError::Config(format!("  {e}\n")))?;
    control.spawn(crate::tls::watch(store));
    Ok(Some(server::TlsSide {
        acceptor: tokio_rustls::TlsAcceptor::from(config),
        hsts: main.proxy_tls_grade == crate::config::main_conf::TlsGrade::High,
        resolver,
        alt_svc: None,
    }))
}
