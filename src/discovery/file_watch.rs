//! Watches upstreams.yaml and conf.d/*.yaml (those files, not everything beside them) and reloads.
//!
//! Events arrive in bursts (editors write, rename, chmod). They are coalesced: after the first
//! one the watcher waits for a short quiet spell, then reloads, reading the files as they are
//! then. An event that arrives during a reload triggers another one, so the last write wins.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::Reloader;

/// How long the files must stay quiet before a reload.
const QUIET: Duration = Duration::from_millis(30);

/// Whether `path` is one of the files whose change needs a reload.
fn relevant(path: &Path, upstreams: &Path, conf_d: &Path) -> bool {
    if path.file_name() == upstreams.file_name() && path.parent() == upstreams.parent() {
        return true;
    }
    let in_conf_d = path.parent() == Some(conf_d) || path == conf_d;
    in_conf_d && (path == conf_d || path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
}

/// Runs until the runtime stops. Logs and gives up (serving stays as is) if watching fails.
pub async fn watch(reloader: Arc<Reloader>) {
    let upstreams = absolute(&reloader.upstreams_path);
    let dir = upstreams.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let conf_d = dir.join("conf.d");
    let changed = Arc::new(Notify::new());
    let notify_handle = changed.clone();
    let (up, cd) = (upstreams.clone(), conf_d.clone());
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        if event.paths.iter().any(|p| relevant(p, &up, &cd)) {
            notify_handle.notify_one();
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("cannot watch {}: {e}; use SIGHUP to reload", upstreams.display());
            return;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::error!("cannot watch {}: {e}; use SIGHUP to reload", dir.display());
        return;
    }
    let mut watching_conf_d = watcher.watch(&conf_d, RecursiveMode::NonRecursive).is_ok();
    tracing::info!("watching {} for changes", upstreams.display());
    loop {
        changed.notified().await;
        // Coalesce the burst: wait until no event has come for QUIET.
        while tokio::time::timeout(QUIET, changed.notified()).await.is_ok() {}
        if !watching_conf_d && conf_d.is_dir() {
            watching_conf_d = watcher.watch(&conf_d, RecursiveMode::NonRecursive).is_ok();
        }
        let reloader = reloader.clone();
        let _ = tokio::task::spawn_blocking(move || reloader.reload_files("file watch")).await;
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_config_files_count() {
        let up = Path::new("/etc/aralez/upstreams.yaml");
        let cd = Path::new("/etc/aralez/conf.d");
        assert!(relevant(up, up, cd));
        assert!(relevant(Path::new("/etc/aralez/conf.d/a.yaml"), up, cd));
        assert!(relevant(cd, up, cd));
        assert!(!relevant(Path::new("/etc/aralez/main.yaml"), up, cd));
        assert!(!relevant(Path::new("/etc/aralez/conf.d/README.md"), up, cd));
        assert!(!relevant(Path::new("/etc/aralez/.upstreams.yaml.swp"), up, cd));
    }
}
