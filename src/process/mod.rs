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
mod resources;
mod signals;
mod single;
mod sockets;
mod tls_side;
pub mod upgrade;

mod context;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use resources::{
    descriptors_free, descriptors_left_to_serve, no_huge_pages, raise_open_files_limit,
    CONTROL_RUNTIME_DESCRIPTORS,
};
use signals::{LogFiles, Reloads, Signals, StartedFrom};

pub use context::{limits, Context, DigestedUpstreams};

use crate::config::{self, Issues, MainConfig};
use crate::logfile::LogFile;
use crate::server::{self, Limits};

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
    #[error("cannot listen on UDP {addr} for HTTP/3 (the TLS listener's port): {source}")]
    BindUdp {
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
    #[error("cannot start the admin API: {0}")]
    Admin(#[from] crate::admin::AdminError),
}

fn render_errors(issues: &Issues) -> String {
    issues.errors().map(|i| format!("  {i}\n")).collect()
}

/// Before a live upgrade takes the running process's sockets: refused on the certificate errors
/// check-config reports (a pair of the directory that does not load, the admin API's that does
/// not). The running process serves those names with their last good copies, and would hand its
/// sockets to one that serves them another certificate, or none; nginx's reload and binary
/// upgrade test the configuration first too. A fresh start serves the pairs that load.
fn refuse_upgrade_on_certificates(main: &MainConfig, main_path: &Path) -> Result<(), StartError> {
    let mut issues = Issues::default();
    crate::check::check_certificates(main, main_path, &mut issues);
    if !issues.has_errors() {
        return Ok(());
    }
    let said = issues.warnings().chain(issues.errors());
    let mut text: String = said.map(|i| format!("  {i}\n")).collect();
    text.push_str("  the live upgrade is refused and the running process keeps serving\n");
    Err(StartError::Config(text))
}

/// How `main` asked the process to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// `-d`: go to the background (also `daemon: true`).
    pub daemon: bool,
    /// `-u`: take the listening sockets of the running instance.
    pub upgrade: bool,
}

/// Ignores SIGHUP, SIGUSR1 and SIGUSR2 until their handlers are installed (`Signals::install`,
/// which replaces this): by default each ends the process, and a reload or a log reopen asked
/// in the first tens of milliseconds of a start (by a supervisor signalling its child) ended it
/// (exit 129, 138). Such a signal is not acted on: the configuration read next is the file's.
/// The stop signals keep their default, as a stop asked before the start is one.
#[allow(unsafe_code)]
pub fn hold_signals_until_handled() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for held in [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2] {
        // SAFETY: `SigIgn` runs no code in the handler; only the disposition changes.
        if let Err(e) = unsafe { signal(held, SigHandler::SigIgn) } {
            eprintln!("aralez: cannot hold {held} until it is handled: {e}");
        }
    }
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
        // Said here, in the foreground: the background process writes to `log_file`, which is
        // the running instance's.
        if let Some(why) = (!options.upgrade)
            .then(|| single::another_instance(&main))
            .flatten()
        {
            return Err(StartError::AlreadyRunning(why));
        }
        return Ok(Some(daemon::daemonize(main.log_file.as_deref())?));
    }
    Ok(None)
}

fn load(main_path: &Path) -> Result<(MainConfig, DigestedUpstreams, Issues), StartError> {
    let mut issues = Issues::default();
    let main = config::load_main(main_path, &mut issues);
    issues.no_master_secret = main.as_ref().is_some_and(|m| !config::master_secret_set(m));
    let upstreams_path = config::upstreams_conf_of(main.as_ref(), main_path);
    let upstreams = upstreams_path
        .as_ref()
        .and_then(|path| config::load_upstreams_digested(path, &mut issues));
    let (Some(main), Some(upstreams)) = (main, upstreams) else {
        return Err(StartError::Config(render_errors(&issues)));
    };
    config::across::check(&main, &upstreams.0, &mut issues);
    if issues.has_errors() {
        return Err(StartError::Config(render_errors(&issues)));
    }
    Ok((main, upstreams, issues))
}

/// Reads the config and runs the proxy until a stop signal. Returns after the drain.
/// `daemon_ready`, in a background process, is taken and told once the proxy serves; left in
/// place if it fails before that, for the caller to report the error on it.
pub fn run(
    main_path: &Path,
    options: RunOptions,
    daemon_ready: &mut Option<daemon::ReadyPipe>,
) -> Result<(), StartError> {
    // First, so that what start-up allocates is not on huge pages either; said once logs work.
    let small_pages = no_huge_pages();
    let started_from = StartedFrom::read(main_path);
    let (main, upstreams, issues) = load(main_path)?;
    // Before the log is opened: a start refused for a running instance wrote its "configuration
    // loaded" (and with -d its refusal) into that instance's log, a start that never happened.
    // `sockets::open` asks again right before it binds.
    if !options.upgrade {
        if let Some(why) = single::another_instance(&main) {
            return Err(StartError::AlreadyRunning(why));
        }
    }
    let app_log = logging::open_app_log(&main).map_err(StartError::Logging)?;
    if let (Some(log), Some(_)) = (&app_log, daemon_ready.as_ref()) {
        // A background process's stdout and stderr are this file (`daemonize`).
        log.carry_stdio();
    }
    logging::init(&main, app_log.as_ref()).map_err(StartError::Logging)?;
    if let Err(e) = small_pages {
        tracing::debug!("cannot turn transparent huge pages off: {e}");
    }
    for warning in issues.warnings() {
        tracing::warn!("{warning}");
    }
    raise_open_files_limit();
    let ctx = Context::build(&main, upstreams, app_log.as_ref())?;
    // Before the bind, as nginx's master installs its handlers before it listens: once a port
    // accepts, a SIGHUP or SIGTERM must meet our handlers, not the default action (exit on the
    // spot, the pid file left behind). One that comes before the serving loop waits for it.
    let control = ControlPlane::start()?;
    if options.upgrade {
        refuse_upgrade_on_certificates(&main, main_path)?;
    }
    let bound = sockets::open(&main, options.upgrade)?;
    let pid_file =
        pidfile::PidFile::write(&main.pid_file).map_err(|source| StartError::PidFile {
            path: main.pid_file.display().to_string(),
            source,
        })?;
    // Every way out from here takes the pid file along: a failed start must not leave it
    // naming a process that is gone (nor, after a failed live upgrade, hide the old one).
    let read_at_start = (app_log, started_from);
    match serve(
        &main,
        options,
        &ctx,
        (control, bound),
        read_at_start,
        daemon_ready,
    ) {
        Ok(()) => {
            pid_file.leave();
            tracing::info!("stopped");
            Ok(())
        }
        Err(e) => {
            pid_file.leave();
            Err(e)
        }
    }
}

/// Drops privileges, starts what serves, serves until a stop signal, and drains.
fn serve(
    main: &MainConfig,
    options: RunOptions,
    ctx: &Context,
    (
        ControlPlane {
            runtime: control,
            signals,
        },
        bound,
    ): (ControlPlane, sockets::Bound),
    (app_log, started_from): (Option<Arc<LogFile>>, StartedFrom),
    daemon_ready: &mut Option<daemon::ReadyPipe>,
) -> Result<(), StartError> {
    let certificates = tls_side::load_certificates(main)?;
    let (runuser, rungroup) = (main.runuser.as_deref(), main.rungroup.as_deref());
    let access_log = main
        .access_log_file
        .as_deref()
        .filter(|_| main.access_log != crate::config::main_conf::AccessLog::Off)
        .map(|path| (path, main.access_log_rotation.is_some()));
    let written_log = main
        .log_file
        .as_deref()
        .map(|path| (path, main.log_rotation.is_some()));
    let logs: Vec<_> = written_log.into_iter().chain(access_log).collect();
    privileges::hand_over_logs(runuser, rungroup, &logs);
    let removed_at_exit = [main.pid_file.as_path(), main.upgrade_sock.as_path()];
    privileges::warn_left_behind(runuser, rungroup, &removed_at_exit);
    if let (Some(acme), Some(certs)) = (&main.acme, &main.certificates_dir) {
        let state = acme.state_dir.as_deref().unwrap_or(certs);
        let written = [
            ("acme.state_dir", state),
            ("proxy_certificates", certs.as_path()),
        ];
        privileges::warn_unwritable_folders(runuser, rungroup, &written);
    }
    let ids = privileges::drop_to(runuser, rungroup)?;
    if let Some((uid, gid)) = ids {
        tracing::info!("running as uid {uid}, gid {gid}");
        if let Some(certificates) = &certificates {
            certificates.check_readable_after_privileges_drop();
        }
        privileges::warn_unreadable_config(&main.upstreams_conf);
    }
    let cert_reload = certificates
        .as_ref()
        .map(tls_side::LoadedCertificates::reload)
        .unwrap_or_default();
    let sockets::Bound {
        proxy,
        admin:
            crate::admin::AdminBound {
                listeners: admin,
                certificate: admin_certificate,
            },
        files,
        upgrade_sock,
        offer,
    } = bound;
    let files_access_log = ctx.access_log.clone();
    let mut running = Running::start(main, ctx, &control, (proxy, certificates), admin)?;
    control.block_on(async {
        if let Some((listener, folder)) = files {
            let limits = Limits {
                max_connections: main.file_server_max_connections,
                ..limits(main)
            };
            let logs = (limits, files_access_log.clone());
            let served = crate::fileserver::serve(listener, folder, logs, running.stopped());
            running.side_tasks.push(tokio::spawn(served));
        }
        let handovers = upgrade_sock.as_ref().map(|sock| {
            let handovers = Arc::new(upgrade::Handovers::default());
            drop(tokio::spawn(sock.serve(offer.clone(), handovers.clone())));
            handovers
        });
        announce_ready(options.upgrade, daemon_ready);
        let logs = LogFiles {
            app: app_log,
            access: ctx.access_log.clone(),
        };
        let reloads = Reloads {
            routes: &ctx.reloader,
            certificates: &cert_reload,
            admin_certificate: admin_certificate.as_ref(),
            started_from: &started_from,
            pid_file: &main.pid_file,
        };
        until_stop_signal(signals, reloads, &logs, handovers.as_deref()).await;
    });
    notify::notify("STOPPING=1");
    // Close our duplicates first, so the ports close (and refuse) once the workers let go.
    drop(offer.lock().map(|mut o| o.take()));
    running.drain(main.grace_period, &control);
    control.shutdown_timeout(std::time::Duration::from_millis(200));
    ctx.access_log.flush();
    if let Some(cache) = &ctx.policy_state.cache {
        cache.flush(std::time::Duration::from_secs(10));
    }
    if let Some(sock) = upgrade_sock {
        sock.remove();
    }
    Ok(())
}

/// The control runtime (one thread: reloads, discovery, the admin API) and the signal handlers
/// installed on it, made before the sockets are bound. Its thread changes user with the rest of
/// the process: the C library applies `setuid`/`setgid` to every thread.
struct ControlPlane {
    runtime: tokio::runtime::Runtime,
    signals: Option<Signals>,
}

impl ControlPlane {
    fn start() -> Result<ControlPlane, StartError> {
        // tokio makes a socket pair for its signal handling with the first runtime that has a
        // signal driver, and panics when it cannot (no file descriptor left: `ulimit -n 8`).
        // With its epoll and waker, and a copy of the pair's reader, that runtime takes five.
        let free = descriptors_free(CONTROL_RUNTIME_DESCRIPTORS);
        if free < CONTROL_RUNTIME_DESCRIPTORS {
            let why = format!("{free} file descriptors free, under the {CONTROL_RUNTIME_DESCRIPTORS} it takes: raise the open-files limit (ulimit -n, systemd's LimitNOFILE)");
            let source = std::io::Error::other(why);
            return Err(StartError::Runtime {
                what: "the control runtime",
                source,
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("aralez-control")
            .enable_all()
            .build()
            .map_err(|source| StartError::Runtime {
                what: "the control runtime",
                source,
            })?;
        let signals = {
            let _context = runtime.enter();
            Signals::install()
        };
        Ok(ControlPlane { runtime, signals })
    }
}

/// What serves once started, stopped together: the worker threads (and HTTP/3's), and the
/// tasks on the control runtime that drain with them.
struct Running {
    stop: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    side_tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Starts the control plane, the admin API, HTTP/3 and the workers. On an error, what had
    /// started is stopped and joined first.
    fn start(
        main: &MainConfig,
        ctx: &Context,
        control: &tokio::runtime::Runtime,
        (proxy, certificates): (sockets::ProxySockets, Option<tls_side::LoadedCertificates>),
        admin: crate::admin::AdminListeners,
    ) -> Result<Running, StartError> {
        let sockets::ProxySockets {
            http,
            tls: tls_listeners,
            quic,
        } = proxy;
        let workers_count = http.len();
        if let Some(addr) = http.first().and_then(|l| l.local_addr().ok()) {
            tracing::info!("listening on http://{addr} with {workers_count} worker(s)");
        }
        let challenges = ctx.acme.as_ref().map(|a| a.challenges());
        let cert_store = certificates.as_ref().map(|c| c.store().clone());
        let mut tls = tls_side::tls_acceptor(main, control, challenges, certificates)?;
        if let Some(addr) = tls_listeners.first().and_then(|l| l.local_addr().ok()) {
            ctx.policy_state.tls_port.set(addr.port());
            tracing::info!("listening on https://{addr} with {workers_count} worker(s)");
        }
        let h3 = match (quic, tls.as_mut()) {
            (Some((socket, owner)), Some(side)) => Some(tls_side::http3_side(socket, owner, side)),
            _ => None,
        };
        crate::control::start(control, main, ctx.reloader.snapshot.clone());
        crate::discovery::start(control, ctx.reloader.clone());
        let (stop, stopped) = watch::channel(false);
        let side = SideListeners {
            admin,
            certificates: cert_store,
        };
        let side_tasks = start_side_listeners(control, main, ctx, side, &stopped);
        let mut running = Running {
            stop,
            threads: Vec::new(),
            side_tasks,
        };
        if let Some(side) = h3 {
            let addr = side.socket.local_addr();
            let started = server::h3::spawn(
                side,
                ctx.serving(main),
                limits(main),
                main.threads,
                stopped.clone(),
            );
            let started = started.map_err(|e| StartError::Config(format!("  http3: {e}\n")))?;
            if let Ok(addr) = addr {
                tracing::info!("listening on h3://{addr} (HTTP/3 over QUIC)");
            }
            running.threads.push(started);
        }
        // After HTTP/3, the last step that can fail: a start error must not return (and run the
        // exit handlers, aws-lc's among them) while a thread is still starting up.
        let listeners = server::Listeners {
            http,
            tls: tls_listeners,
            acceptor: tls,
        };
        match server::spawn_workers(listeners, ctx.serving(main), limits(main), stopped) {
            Ok(workers) => {
                running.threads.splice(0..0, workers);
                if let Err(source) = descriptors_left_to_serve() {
                    running.stop_and_join();
                    let what = "serving";
                    return Err(StartError::Runtime { what, source });
                }
                Ok(running)
            }
            Err(failed) => {
                running.threads.splice(0..0, failed.started);
                running.stop_and_join();
                Err(StartError::Runtime {
                    what: "worker threads",
                    source: failed.source,
                })
            }
        }
    }

    /// A receiver that turns true when the drain begins.
    fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    fn stop_and_join(&mut self) {
        let _ = self.stop.send(true);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    /// Stops accepting and waits for the workers' drain, then the side tasks' (which drain
    /// alongside, for at most `grace_period`).
    fn drain(mut self, grace_period: std::time::Duration, control: &tokio::runtime::Runtime) {
        tracing::info!("stopping: no new connections; draining (up to {grace_period:?})");
        self.stop_and_join();
        control.block_on(async {
            let all = futures_util::future::join_all(self.side_tasks);
            let _ = tokio::time::timeout(grace_period, all).await;
        });
    }
}

/// Tells systemd (and, in the background, the starting command) that the proxy serves.
fn announce_ready(upgrade: bool, daemon_ready: &mut Option<daemon::ReadyPipe>) {
    let ready = if upgrade {
        format!("MAINPID={}\nREADY=1", std::process::id())
    } else {
        "READY=1".to_string()
    };
    notify::notify(&ready);
    if let Some(pipe) = daemon_ready.take() {
        pipe.ready();
    }
}

/// Reacts to signals (reloads, log reopening) until one asks to stop; then another stop signal
/// ends the process at once.
async fn until_stop_signal(
    signals: Option<Signals>,
    reloads: Reloads<'_>,
    logs: &LogFiles,
    handovers: Option<&upgrade::Handovers>,
) {
    match signals {
        Some(mut signals) => {
            let pid_file = reloads.pid_file.to_path_buf();
            signals.wait(reloads, logs, handovers).await;
            drop(tokio::spawn(signals.exit_on_another_stop(pid_file)));
        }
        None => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// What the admin API serves besides the context: its listeners, and the certificate
/// directory's pairs for their expiry series.
struct SideListeners {
    admin: crate::admin::AdminListeners,
    certificates: Option<Arc<crate::tls::CertStore>>,
}

/// The admin API (and what it shows: the cache, shared limits, ACME, the cluster), on the
/// control runtime; its tasks end after their drain.
fn start_side_listeners(
    control: &tokio::runtime::Runtime,
    main: &MainConfig,
    ctx: &Context,
    SideListeners {
        admin: listeners,
        certificates,
    }: SideListeners,
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
        cluster: cluster_master(control, main, ctx, listeners.first_url()),
        acme: ctx.acme.clone(),
        certificates,
        conf_turn: Default::default(),
    });
    crate::admin::start(control, main, listeners, admin, stop)
}

/// Cluster mode's master, pushing to `worker_nodes` (with its retries on `control`); `None`
/// for any other instance.
fn cluster_master(
    control: &tokio::runtime::Runtime,
    main: &MainConfig,
    ctx: &Context,
    admin_url: Option<String>,
) -> Option<Arc<crate::admin::cluster::Cluster>> {
    use crate::config::cluster_conf::Member;
    let key = ctx.policy_state.keys.master()?;
    if main.cluster.member != Member::Master {
        return None;
    }
    let cluster = Arc::new(crate::admin::cluster::Cluster::new(
        &main.cluster.worker_nodes,
        key,
        &master_name(admin_url),
    ));
    control.spawn(cluster.clone().keep_workers_current());
    control.spawn(cluster.clone().follow_file_reloads(ctx.reloader.clone()));
    Some(cluster)
}

/// How a master names itself to its workers (they log it with each push): its host name and
/// its admin API's URL.
fn master_name(admin_url: Option<String>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let admin_url = admin_url.unwrap_or_else(|| "none".to_string());
    format!("{} (admin API {admin_url})", host.trim())
}
