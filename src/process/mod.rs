//! Process life: read config, set up logging, bind listeners, start workers and the control plane,
//! react to signals (SIGTERM/SIGINT drain and exit, SIGHUP reloads).

mod logging;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{self, Issues, MainConfig};
use crate::discovery::Reloader;
use crate::proxy::Proxy;
use crate::server::{self, ServeSettings, TcpKeepalive};
use crate::upstream::{Registry, Timeouts};

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
}

fn render_errors(issues: &Issues) -> String {
    issues.errors().map(|i| format!("  {i}\n")).collect()
}

/// Reads the config and runs the proxy until a stop signal. Returns after the drain.
pub fn run(main_path: &Path) -> Result<(), StartError> {
    let mut issues = Issues::default();
    let main = config::load_main(main_path, &mut issues);
    let upstreams = main
        .as_ref()
        .and_then(|m| config::load_upstreams(&m.upstreams_conf, &mut issues));
    let (Some(main), Some(upstreams)) = (main, upstreams) else {
        return Err(StartError::Config(render_errors(&issues)));
    };
    if issues.has_errors() {
        return Err(StartError::Config(render_errors(&issues)));
    }
    logging::init(&main).map_err(StartError::Logging)?;
    for warning in issues.warnings() {
        tracing::warn!("{warning}");
    }

    let threads = main.threads;
    let registry = Registry::new(threads, main.upstream_keepalive_pool_size, main.hc_interval);
    let reloader = Arc::new(Reloader::new(main.upstreams_conf.clone(), registry));
    let digest = crate::discovery::files_digest(&main.upstreams_conf);
    reloader.install_file_config(upstreams, digest, "start");

    let listeners = server::bind_reuseport(main.proxy_address_http, threads).map_err(|source| {
        StartError::Bind {
            addr: main.proxy_address_http,
            source,
        }
    })?;
    if let Some(addr) = listeners.first().and_then(|l| l.local_addr().ok()) {
        tracing::info!("listening on http://{addr} with {threads} worker(s)");
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
    crate::layers::start(&control, &main, reloader.snapshot.clone());
    let file_server = control.block_on(bind_file_server(&main))?;
    crate::discovery::start(&control, &main, reloader.clone());

    let proxy = Arc::new(Proxy {
        snapshot: reloader.snapshot.clone(),
        timeouts: Timeouts {
            connect: main.upstream_connect_timeout,
            response: main.upstream_response_timeout,
        },
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = server::spawn_workers(listeners, proxy, serve_settings(&main), stop_rx).map_err(
        |source| StartError::Runtime {
            what: "worker threads",
            source,
        },
    )?;

    control.block_on(async {
        if let Some((listener, folder)) = file_server {
            tokio::spawn(crate::fileserver::serve(listener, folder));
        }
        wait_for_signals(&reloader).await;
    });
    tracing::info!(
        "stopping: no new connections; draining (up to {:?})",
        main.grace_period
    );
    let _ = stop_tx.send(true);
    for worker in workers {
        let _ = worker.join();
    }
    control.shutdown_timeout(std::time::Duration::from_millis(200));
    tracing::info!("stopped");
    Ok(())
}

async fn bind_file_server(
    main: &MainConfig,
) -> Result<Option<(tokio::net::TcpListener, std::path::PathBuf)>, StartError> {
    let (Some(folder), Some(addr)) = (&main.file_server_folder, main.file_server_address) else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    if let Ok(local) = listener.local_addr() {
        tracing::info!(
            "file server: serving {} on http://{local}",
            folder.display()
        );
    }
    Ok(Some((listener, folder.clone())))
}

fn serve_settings(main: &MainConfig) -> ServeSettings {
    ServeSettings {
        header_timeout: main.client_header_timeout,
        max_header_bytes: main.max_request_header_bytes,
        max_connections: main.max_connections,
        keepalive: main.tcp_keepalive_idle.map(|idle| TcpKeepalive {
            idle,
            interval: main.tcp_keepalive_interval,
            count: main.tcp_keepalive_count,
        }),
        grace_period: main.grace_period,
    }
}

/// Returns on SIGTERM or SIGINT; reloads on SIGHUP.
async fn wait_for_signals(reloader: &Reloader) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                let _ = reloader.reload_files("SIGHUP");
            }
        }
    }
}
