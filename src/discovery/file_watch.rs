//! Watches upstreams.yaml and conf.d/*.yaml (those files, not everything beside them) and reloads.
//!
//! Events arrive in bursts (editors write, rename, chmod). They are coalesced: after the first
//! one the watcher waits a short, fixed delay (never extended, so a steady stream of writes
//! cannot starve reloads), then reloads, reading the files as they are then. An event that
//! arrives meanwhile leaves a permit behind and triggers one more reload, so the last write wins.
//!
//! A file truncated to be rewritten in place (`generate > upstreams.yaml`) is empty until its
//! writer's first bytes, which may come long after the truncation; reloading it then would drop
//! its routes meanwhile (an empty file is a valid configuration). So a watched file that had
//! content at the last reload and is empty now is given [`REWRITE_GRACE`] to get it back: the
//! reload waits for the write's own event, and takes the file as it is at the end of the grace.
//! A file that was empty already (a placeholder in conf.d) or is deleted does not wait.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::Reloader;

/// Delay between the first event of a burst and the reload.
const COALESCE: Duration = Duration::from_millis(25);

/// How long an emptied file is given to get its content back before it is taken as
/// meant (see the module's doc).
const REWRITE_GRACE: Duration = Duration::from_secs(1);

/// Whether `path` is one of the files whose change needs a reload.
fn relevant(path: &Path, upstreams: &Path, conf_d: &Path) -> bool {
    if path.file_name() == upstreams.file_name() && path.parent() == upstreams.parent() {
        return true;
    }
    let in_conf_d = path.parent() == Some(conf_d) || path == conf_d;
    in_conf_d && (path == conf_d || path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
}

/// Installs the watcher now (so no write after start-up is missed) and returns the task that
/// reloads on its events. If watching fails it logs why; SIGHUP still reloads.
pub fn install(reloader: Arc<Reloader>) -> Option<impl std::future::Future<Output = ()>> {
    let upstreams = absolute(&reloader.upstreams_path);
    let dir = upstreams
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
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
    let mut watcher = notify::recommended_watcher(handler)
        .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w))
        .map_err(|e| tracing::error!("cannot watch {}: {e}; use SIGHUP to reload", dir.display()))
        .ok()?;
    let watching_conf_d = watcher.watch(&conf_d, RecursiveMode::NonRecursive).is_ok();
    tracing::info!("watching {} for changes", upstreams.display());
    // Anything written between the first read and now is picked up by one check.
    changed.notify_one();
    let files = Watched { upstreams, conf_d };
    Some(run(reloader, watcher, changed, files, watching_conf_d))
}

/// The files a reload reads.
struct Watched {
    upstreams: PathBuf,
    conf_d: PathBuf,
}

impl Watched {
    /// Those that have content now: upstreams.yaml and conf.d's YAML files.
    fn with_content(&self) -> Vec<PathBuf> {
        let in_conf_d = std::fs::read_dir(&self.conf_d).into_iter().flatten();
        let in_conf_d = in_conf_d.filter_map(|entry| entry.ok().map(|e| e.path()));
        std::iter::once(self.upstreams.clone())
            .chain(in_conf_d.filter(|p| relevant(p, &self.upstreams, &self.conf_d)))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0))
            .collect()
    }
}

async fn run(
    reloader: Arc<Reloader>,
    mut watcher: impl Watcher,
    changed: Arc<Notify>,
    files: Watched,
    mut watching_conf_d: bool,
) {
    let mut had_content = files.with_content();
    loop {
        changed.notified().await;
        tokio::time::sleep(COALESCE).await;
        wait_while_emptied(&had_content, &changed).await;
        if !watching_conf_d && files.conf_d.is_dir() {
            watching_conf_d = watcher
                .watch(&files.conf_d, RecursiveMode::NonRecursive)
                .is_ok();
        }
        let reloader = reloader.clone();
        let _ = tokio::task::spawn_blocking(move || reloader.reload_files("file watch")).await;
        had_content = files.with_content();
    }
}

/// Waits while one of `had_content` is empty, at most [`REWRITE_GRACE`]; each event looks
/// again.
async fn wait_while_emptied(had_content: &[PathBuf], changed: &Notify) {
    let emptied = || {
        had_content
            .iter()
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == 0))
    };
    let Some(file) = emptied() else {
        return;
    };
    tracing::info!(
        "{} is empty: its routes stay until it has content again, for at most {REWRITE_GRACE:?} (to remove them, write `upstreams: {{}}`)",
        file.display()
    );
    let deadline = tokio::time::Instant::now() + REWRITE_GRACE;
    while emptied().is_some() {
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(COALESCE).await,
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wait_while_emptied` on `file` (which had content), spawned; the test drives the
    /// (paused) clock.
    fn waiting_on(file: &Path, changed: &Arc<Notify>) -> tokio::task::JoinHandle<Duration> {
        let (had_content, changed) = (vec![file.to_path_buf()], changed.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            wait_while_emptied(&had_content, &changed).await;
            started.elapsed()
        })
    }

    /// An upstreams.yaml that is empty now, in a directory that lives as long as the `TempDir`.
    fn emptied_file() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("upstreams.yaml");
        std::fs::write(&file, "").expect("emptied");
        (dir, file)
    }

    #[test]
    fn the_files_noted_are_the_watched_ones_with_content() {
        let dir = tempfile::tempdir().expect("temp dir");
        let conf_d = dir.path().join("conf.d");
        std::fs::create_dir(&conf_d).expect("conf.d");
        let files = Watched {
            upstreams: dir.path().join("upstreams.yaml"),
            conf_d: conf_d.clone(),
        };
        std::fs::write(&files.upstreams, "upstreams: {}\n").expect("upstreams");
        std::fs::write(conf_d.join("app.yaml"), "upstreams: {}\n").expect("app");
        std::fs::write(conf_d.join("placeholder.yaml"), "").expect("placeholder");
        std::fs::write(conf_d.join("notes.txt"), "not a config").expect("notes");
        let mut had = files.with_content();
        had.sort();
        assert_eq!(had, vec![conf_d.join("app.yaml"), files.upstreams.clone()]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_file_is_waited_for_until_its_content_comes() {
        let (_dir, file) = emptied_file();
        let changed = Arc::new(Notify::new());
        let waiting = waiting_on(&file, &changed);
        tokio::time::sleep(REWRITE_GRACE / 2).await;
        assert!(!waiting.is_finished(), "the reload did not wait");
        std::fs::write(&file, "upstreams: {}\n").expect("written");
        changed.notify_one();
        let waited = waiting.await.expect("the wait");
        assert_eq!(waited, REWRITE_GRACE / 2 + COALESCE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_left_empty_is_taken_as_it_is_after_the_grace() {
        let (_dir, file) = emptied_file();
        let changed = Arc::new(Notify::new());
        let waiting = waiting_on(&file, &changed);
        // An event that leaves it empty (a chmod, a touch) does not end the wait either.
        tokio::time::sleep(REWRITE_GRACE / 4).await;
        changed.notify_one();
        assert_eq!(waiting.await.expect("the wait"), REWRITE_GRACE);

        std::fs::write(&file, "upstreams: {}\n").expect("content");
        assert_eq!(
            waiting_on(&file, &changed).await.expect("the wait"),
            Duration::ZERO
        );
    }

    #[test]
    fn only_the_config_files_count() {
        let up = Path::new("/etc/aralez/upstreams.yaml");
        let cd = Path::new("/etc/aralez/conf.d");
        assert!(relevant(up, up, cd));
        assert!(relevant(Path::new("/etc/aralez/conf.d/a.yaml"), up, cd));
        assert!(relevant(cd, up, cd));
        assert!(!relevant(Path::new("/etc/aralez/main.yaml"), up, cd));
        assert!(!relevant(Path::new("/etc/aralez/conf.d/README.md"), up, cd));
        assert!(!relevant(
            Path::new("/etc/aralez/.upstreams.yaml.swp"),
            up,
            cd
        ));
    }
}
