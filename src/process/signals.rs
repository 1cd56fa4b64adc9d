//! The process's signals: stop (TERM, INT, QUIT), reload (HUP), reopen the log files (USR1),
//! and USR2 answered with a pointer to `aralez -u`.
//!
//! SIGHUP re-reads the routes (upstreams.yaml, conf.d) and the certificates (certbot's deploy
//! hook sends it after a renewal). main.yaml holds the process's own
//! settings (listeners, threads, users), which apply on a restart or a live upgrade; nginx's HUP
//! re-reads everything, so an operator may expect it to. When main.yaml has changed since the
//! start, SIGHUP says so, and names the errors a restart would meet.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::accesslog::AccessLog;
use crate::config::{self, Issues};
use crate::discovery::Reloader;
use crate::logfile::LogFile;

use super::upgrade::Handovers;

/// main.yaml as the process started from it.
#[derive(Clone)]
pub(super) struct StartedFrom {
    path: PathBuf,
    digest: Option<u64>,
}

impl StartedFrom {
    pub(super) fn read(path: &Path) -> StartedFrom {
        StartedFrom {
            path: path.to_path_buf(),
            digest: digest_of(path),
        }
    }

    /// Logs whether main.yaml has changed since the start, and what a restart would meet.
    fn say_if_changed(&self) {
        let shown = self.path.display();
        if digest_of(&self.path) == self.digest {
            return;
        }
        let mut issues = Issues::default();
        let _ = config::load_main(&self.path, &mut issues);
        if issues.has_errors() {
            for error in issues.errors() {
                tracing::error!("SIGHUP: {error}");
            }
            tracing::error!("SIGHUP: {shown} has changed and has errors: a restart or `aralez -u` would fail on them; this process keeps the settings it started with");
        } else {
            tracing::warn!("SIGHUP: {shown} has changed: its settings apply on a restart or a live upgrade (`aralez -u`); SIGHUP re-reads upstreams.yaml, conf.d and the certificates only");
        }
    }
}

/// Reads the admin API's certificate again, saying what became of it.
fn reload_admin_certificate(pair: &crate::tls::OnePair) {
    match pair.reload() {
        Ok(true) => tracing::info!("SIGHUP: the admin API's certificate reloaded"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            "SIGHUP: the admin API's certificate does not load: {e}; the one loaded keeps serving"
        ),
    }
}

/// The hash of a file's bytes; `None` if it cannot be read.
fn digest_of(path: &Path) -> Option<u64> {
    let bytes = config::file_bytes::read_regular(path, config::yaml::MAX_FILE_BYTES).ok()?;
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(hasher.finish())
}

/// The signals the process answers; installed early (see `run`).
pub(super) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

/// How long SIGQUIT keeps the listeners for a new process that has not taken them yet.
const TAKER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What SIGHUP reloads: the routes, the certificates; and main.yaml, looked at only to say
/// that it changed.
pub(super) struct Reloads<'a> {
    pub routes: &'a Arc<Reloader>,
    pub certificates: &'a crate::tls::CertReload,
    /// The admin API's own certificate (`config_tls_certificate`), when it listens over TLS.
    pub admin_certificate: Option<&'a Arc<crate::tls::OnePair>>,
    pub started_from: &'a StartedFrom,
    /// Taken along by an exit that cannot wait for the usual way out.
    pub pid_file: &'a std::path::Path,
}

/// The files SIGUSR1 reopens.
pub(super) struct LogFiles {
    pub(super) app: Option<Arc<LogFile>>,
    pub(super) access: AccessLog,
}

impl LogFiles {
    fn reopen(&self) {
        if let Some(app) = &self.app {
            match app.reopen() {
                Ok(()) => tracing::info!("SIGUSR1: reopened {}", app.path().display()),
                Err(e) => tracing::warn!(
                    "SIGUSR1: cannot reopen {}: {e}; still writing to the old file",
                    app.path().display()
                ),
            }
        }
        // The access log's writer opens its own file before it writes its next line.
        self.access.reopen();
        tracing::info!("SIGUSR1: access log reopening");
    }
}

impl Signals {
    /// Needs a runtime context; `None` if a handler cannot be installed.
    pub(super) fn install() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Some(Signals {
            term: signal(SignalKind::terminate()).ok()?,
            int: signal(SignalKind::interrupt()).ok()?,
            quit: signal(SignalKind::quit()).ok()?,
            hup: signal(SignalKind::hangup()).ok()?,
            usr1: signal(SignalKind::user_defined1()).ok()?,
            usr2: signal(SignalKind::user_defined2()).ok()?,
        })
    }

    /// Returns on SIGTERM, SIGINT or SIGQUIT (the live upgrade's "drain and exit"); reloads on
    /// SIGHUP; reopens the log files on SIGUSR1 (logrotate); ignores SIGUSR2 (nginx's binary
    /// upgrade, which `aralez -u` does here), saying so.
    pub(super) async fn wait(
        &mut self,
        reloads: Reloads<'_>,
        logs: &LogFiles,
        handovers: Option<&Handovers>,
    ) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                _ = self.quit.recv() => {
                    self.wait_for_a_taker(handovers).await;
                    return;
                }
                _ = self.hup.recv() => {
                    reloads.certificates.now();
                    // Off the control runtime's one thread, as the file watcher's reloads: the
                    // files are read and parsed, and main.yaml's accounts looked up (NSS).
                    let reloader = reloads.routes.clone();
                    let started_from = reloads.started_from.clone();
                    let admin_certificate = reloads.admin_certificate.cloned();
                    let _ = tokio::task::spawn_blocking(move || {
                        // The reloader counts it in aralez_config_reloads_total.
                        let _ = reloader.reload_files("SIGHUP");
                        started_from.say_if_changed();
                        if let Some(pair) = admin_certificate {
                            reload_admin_certificate(&pair);
                        }
                    })
                    .await;
                }
                _ = self.usr1.recv() => logs.reopen(),
                _ = self.usr2.recv() => {
                    tracing::info!("SIGUSR2 ignored: for a new binary, run `aralez -u` (see the README)");
                }
            }
        }
    }

    /// SIGQUIT before a new process took the sockets (Aralez's systemd unit sends it first,
    /// then starts `aralez -u -d`, as Pingora's old process waits to hand its sockets over):
    /// the listeners stay open and served for up to [`TAKER_WAIT`] until one takes them. They
    /// closed at once, and the new process bound afresh: connections in between were refused.
    async fn wait_for_a_taker(&mut self, handovers: Option<&Handovers>) {
        if let Some(handovers) = handovers {
            handovers.quit_asked();
        }
        let Some(handovers) = handovers.filter(|h| !h.any()) else {
            tracing::info!("SIGQUIT: handing over to the new process");
            return;
        };
        tracing::info!(
            "SIGQUIT: no new process has taken the sockets yet; serving on until `aralez -u` does (at most {}s)",
            TAKER_WAIT.as_secs()
        );
        tokio::select! {
            () = handovers.next() => tracing::info!("SIGQUIT: handed over; draining"),
            () = tokio::time::sleep(TAKER_WAIT) => {
                tracing::warn!("SIGQUIT: no new process took the sockets within {}s; stopping", TAKER_WAIT.as_secs());
            }
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// Once the drain has begun: a SIGTERM or SIGINT ends the process at once, without waiting
    /// for the requests in flight (an operator's second Ctrl-C; it was ignored, and only
    /// SIGKILL stopped a drain that waited for its grace period).
    pub(super) async fn exit_on_another_stop(mut self, pid_file: std::path::PathBuf) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        tracing::warn!("another stop signal: exiting without waiting for the drain");
        super::pidfile::remove_if_ours(&pid_file);
        std::process::exit(1);
    }
}
