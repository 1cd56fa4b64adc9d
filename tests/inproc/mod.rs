//! The in-process harness: the proxy's real request path (router, policies, forwarding,
//! upstream pools), its accept helper and its health checks, built from config text with the
//! same `Context` the binary builds, and served on an ephemeral 127.0.0.1 listener inside the
//! test's own runtime. Under `#[tokio::test(start_paused = true)]` every timer (health rounds,
//! timeouts, passive health, rate limits) runs on tokio's paused clock: [`Proxy::pass`] lets
//! virtual time go by, no test waits on the wall clock.
//!
//! Backends, clients and the proxy must all run in the test's runtime (no threads of their
//! own), so that the paused clock only moves when nothing is left to do.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aralez::config::{self, Issues, MainConfig};
use aralez::control::health::{self, HealthSettings};
use aralez::process::{self, Context};
use aralez::vocab::WorkerId;
use tokio::sync::watch;

/// What the proxies of one test logged (every test runs on its own thread, and its runtime's
/// tasks with it, so a thread-local subscriber catches exactly its own lines).
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// This thread's log, installed as its tracing subscriber on first use.
    fn of_this_thread() -> Log {
        thread_local! {
            static LOG: std::cell::OnceCell<Log> = const { std::cell::OnceCell::new() };
        }
        LOG.with(|cell| {
            cell.get_or_init(|| {
                let log = Log::default();
                let writer = log.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_env_filter("info,aralez=debug")
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish();
                // Kept for the thread's life: the test is the thread.
                std::mem::forget(tracing::subscriber::set_default(subscriber));
                log
            })
            .clone()
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }
}

/// A proxy served inside the test, stopped (drained) on drop.
pub struct Proxy {
    pub addr: SocketAddr,
    pub log: Log,
    pub ctx: Context,
    pub main: MainConfig,
    stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// `aralez_discovery_failures_total{source}` as `/metrics` says it.
    pub fn discovery_failures(&self, source: &str) -> u64 {
        let text = self.ctx.metrics.render_prometheus(std::iter::empty());
        let series = format!("aralez_discovery_failures_total{{source=\"{source}\"}} ");
        let line = text.lines().find_map(|l| l.strip_prefix(&series));
        let count = line.and_then(|n| n.parse().ok());
        count.unwrap_or_else(|| panic!("no {series}in {text}"))
    }

    /// Starts the proxy with this `upstreams.yaml` and extra `main.yaml` lines; active health
    /// checks run (on their `hc_interval`) unless every route turns them off.
    pub async fn start(upstreams: &str, main_extra: &str) -> Proxy {
        Proxy::start_workers(upstreams, main_extra, 1).await
    }

    /// [`Proxy::start`] with `workers` workers: each its own SO_REUSEPORT listener on the same
    /// port, its own [`WorkerId`] (pool slots, metrics shard), all in the test's runtime.
    pub async fn start_workers(upstreams: &str, main_extra: &str, workers: usize) -> Proxy {
        let log = Log::of_this_thread();
        let dir = tempfile::tempdir().expect("temp dir");
        let ups_path = dir.path().join("upstreams.yaml");
        std::fs::write(&ups_path, upstreams).expect("write upstreams.yaml");
        let main_path = dir.path().join("main.yaml");
        let main_text = format!(
            "threads: {workers}\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"{}\"\npid_file: \"{}\"\nlog_level: warn\n{main_extra}\n",
            ups_path.display(),
            dir.path().join("aralez.pid").display()
        );
        std::fs::write(&main_path, main_text).expect("write main.yaml");
        let mut issues = Issues::default();
        let main = config::load_main(&main_path, &mut issues);
        let main = main.unwrap_or_else(|| panic!("main.yaml does not load: {issues:?}"));
        let ups = config::load_upstreams_digested(&main.upstreams_conf, &mut issues)
            .expect("upstreams.yaml loads");
        assert!(!issues.has_errors(), "config errors: {issues:?}");
        // The app log stays with the test harness; `log_file` still receives the access log.
        let log_file = main.log_file.as_ref().map(|path| {
            let file = aralez::logfile::LogFile::open(path, main.log_rotation).expect("log_file");
            std::sync::Arc::new(file)
        });
        let ctx = Context::build(&main, ups, log_file.as_ref()).expect("context");

        let any_port: SocketAddr = "127.0.0.1:0".parse().expect("address");
        // The `tcp:` block's listener options, but SO_REUSEPORT always (one socket a worker).
        let options = aralez::server::ListenOptions {
            reuseport: true,
            fastopen: main.tcp.fastopen,
            defer_accept: main.tcp.defer_accept,
        };
        let listeners = aralez::server::bind_listeners(any_port, workers, options);
        let listeners = listeners.expect("bind proxy");
        let addr = listeners[0].local_addr().expect("local addr");
        let (stop, stop_rx) = watch::channel(false);
        let serving = ctx.serving(&main);
        let limits = process::limits(&main);
        for (index, listener) in listeners.into_iter().enumerate() {
            tokio::spawn(aralez::server::serve_worker(
                WorkerId(index),
                listener,
                None,
                serving.clone(),
                limits.clone(),
                stop_rx.clone(),
            ));
        }
        let snapshot = ctx.reloader.snapshot.clone();
        tokio::spawn(aralez::control::idle_sweep::run(
            snapshot.clone(),
            aralez::control::idle_sweep::EVERY,
        ));
        tokio::spawn(health::run(snapshot, HealthSettings::from_main(&main)));
        ctx.reloader
            .start_watchers(tokio::runtime::Handle::current());
        Proxy {
            addr,
            log,
            ctx,
            main,
            stop,
            _dir: dir,
        }
    }

    /// Lets `d` of (paused) time go by while the proxy, its health checks and the backends run.
    pub async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Everything logged so far in this test.
    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// How many log lines contain `text`.
    pub fn log_count(&self, text: &str) -> usize {
        self.log.text().lines().filter(|l| l.contains(text)).count()
    }

    /// Asks the listener to drain, as SIGTERM does.
    pub fn shut_down(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Awaits `work` for up to `limit` of wall-clock time while the paused clock stands still, for
/// a check that waits on the kernel rather than on a timer: a byte or a FIN in flight on
/// loopback is late under load, and the paused clock would otherwise jump (and a timeout
/// fire) whenever the runtime finds nothing to do meanwhile. A blocking task in flight keeps
/// tokio from advancing the clock; it ends as soon as `work` does. `None` when `limit` passed.
pub async fn in_real_time<F: std::future::Future>(limit: Duration, work: F) -> Option<F::Output> {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holding = done.clone();
    let hold = tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + limit;
        while !holding.load(std::sync::atomic::Ordering::Relaxed) {
            if std::time::Instant::now() >= until {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    tokio::pin!(hold);
    let out = tokio::select! {
        out = work => Some(out),
        _ = &mut hold => None,
    };
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = hold.await;
    out
}
