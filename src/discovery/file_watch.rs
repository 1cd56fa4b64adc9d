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
//!
//! A file written in place more slowly than the coalescing delay (a generator's output
//! redirected to it) is read only once its writer has closed it ([`super::open_writes`]), at
//! most [`WRITE_GRACE`] after the reload was due: read before, its first half could reload as
//! a valid configuration with fewer routes.
//!
//! Files reached through symbolic links (a Kubernetes ConfigMap mount) are followed: the watches
//! and the paths that count are worked out again after every reload ([`super::watch_paths`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::open_writes::OpenWrites;
use super::watch_paths::WatchPaths;
use super::Reloader;

/// Delay between the first event of a burst and the reload.
const COALESCE: Duration = Duration::from_millis(25);

/// How long an emptied file is given to get its content back before it is taken as
/// meant (see the module's doc).
const REWRITE_GRACE: Duration = Duration::from_secs(1);
/// How long a reload waits for a file being written in place to be closed.
const WRITE_GRACE: Duration = Duration::from_secs(5);

/// Whether `path` is one of the files (or links to them) whose change needs a reload, or a YAML
/// file in conf.d, or conf.d itself.
fn relevant(path: &Path, followed: &WatchPaths, conf_d: &Path) -> bool {
    followed.counts(path) || path == conf_d || is_conf_d_file(path, conf_d)
}

fn is_conf_d_file(path: &Path, conf_d: &Path) -> bool {
    path.parent() == Some(conf_d) && path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

/// Installs the watcher now (so no write after start-up is missed) and returns the task that
/// reloads on its events. If watching fails it logs why; SIGHUP still reloads.
pub fn install(reloader: Arc<Reloader>) -> Option<impl std::future::Future<Output = ()>> {
    let upstreams = absolute(&reloader.upstreams_path);
    let dir = upstreams
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let files = Watched {
        conf_d: dir.join("conf.d"),
        upstreams,
    };
    let followed = Arc::new(ArcSwap::from_pointee(files.to_follow()));
    let changed = Arc::new(Notify::new());
    let writes = Arc::new(OpenWrites::default());
    let (notify_handle, seen, conf_d) = (changed.clone(), followed.clone(), files.conf_d.clone());
    let noted = writes.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        if matches!(event.kind, EventKind::Access(_)) && event.kind != closed {
            return;
        }
        let followed = seen.load();
        let mut relevant_paths = false;
        for path in event
            .paths
            .iter()
            .filter(|p| relevant(p, &followed, &conf_d))
        {
            noted.note(&event.kind, path);
            relevant_paths = true;
        }
        if relevant_paths {
            notify_handle.notify_one();
        }
    };
    let mut watcher = notify::recommended_watcher(handler)
        .map_err(|e| tracing::error!("cannot watch {}: {e}; use SIGHUP to reload", dir.display()))
        .ok()?;
    let mut watches = Watches::default();
    watches.follow(&mut watcher, &followed.load());
    if !watches.has(&dir) {
        tracing::error!("cannot watch {}; use SIGHUP to reload", dir.display());
        return None;
    }
    // A link is said as one; a path with `..` in it only resolves to the same file.
    let linked = std::fs::symlink_metadata(&files.upstreams).is_ok_and(|m| m.is_symlink());
    match std::fs::canonicalize(&files.upstreams) {
        Ok(real) if linked && real != files.upstreams => tracing::info!(
            "watching {} (now a link to {}) for changes",
            files.upstreams.display(),
            real.display()
        ),
        _ => tracing::info!("watching {} for changes", files.upstreams.display()),
    }
    // Anything written between the first read and now is picked up by one check, unless the
    // files cannot be read now (runuser, after a start as root): that check could only fail,
    // logged as a rejected reload nobody made (the start has said why already).
    if files.files().iter().all(|f| std::fs::File::open(f).is_ok()) {
        changed.notify_one();
    }
    let watching = Watching {
        watcher,
        watches,
        followed,
    };
    Some(run(reloader, watching, (changed, writes), files))
}

/// The files a reload reads.
struct Watched {
    /// As configured (absolute, links not resolved).
    upstreams: PathBuf,
    conf_d: PathBuf,
}

impl Watched {
    /// upstreams.yaml and the YAML files in conf.d now, whatever their content.
    fn files(&self) -> Vec<PathBuf> {
        let in_conf_d = std::fs::read_dir(&self.conf_d).into_iter().flatten();
        let in_conf_d = in_conf_d.filter_map(|entry| entry.ok().map(|e| e.path()));
        std::iter::once(self.upstreams.clone())
            .chain(in_conf_d.filter(|p| is_conf_d_file(p, &self.conf_d)))
            .collect()
    }

    /// Those that have content now.
    fn with_content(&self) -> Vec<PathBuf> {
        let mut files = self.files();
        files.retain(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0));
        files
    }

    /// The paths to watch for them, following their links (and conf.d's own, when it is one:
    /// a projected volume's `conf.d -> ..data/conf.d`) as they are now.
    fn to_follow(&self) -> WatchPaths {
        let mut followed = self.files();
        followed.push(self.conf_d.clone());
        WatchPaths::of(&followed, &[self.upstreams_dir(), &self.conf_d])
    }

    fn upstreams_dir(&self) -> &Path {
        self.upstreams.parent().unwrap_or(Path::new("."))
    }
}

/// The watcher, its watches, and the paths its events are matched against.
struct Watching<W> {
    watcher: W,
    watches: Watches,
    followed: Arc<ArcSwap<WatchPaths>>,
}

impl<W: Watcher> Watching<W> {
    /// Follows the links as they are now: watches what they lead to, drops what they left.
    fn refresh(&mut self, files: &Watched) {
        let followed = files.to_follow();
        self.watches.follow(&mut self.watcher, &followed);
        self.followed.store(Arc::new(followed));
    }
}

/// The directories watched: what each resolves to -> the path given to the watcher, and the
/// directory's identity when it was watched.
#[derive(Default)]
struct Watches(HashMap<PathBuf, (PathBuf, Option<DirId>)>);

/// A directory's device, inode and birth time: one deleted and made again under the same name
/// (`rm -r conf.d; mkdir conf.d`) is another directory, whose watch went with the old one. The
/// kernel may give it the same inode number; its birth time differs (where the file system
/// keeps one).
type DirId = (u64, u64, Option<std::time::SystemTime>);

fn dir_id(dir: &Path) -> Option<DirId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.created().ok()))
}

impl Watches {
    /// Makes the watches those `paths` asks for. A directory that cannot be watched (conf.d
    /// before it exists) is tried again next time.
    fn follow(&mut self, watcher: &mut impl Watcher, paths: &WatchPaths) {
        let wanted = paths.dirs();
        // Dropped first: a link swapped to a new directory is watched again by the same path.
        self.0.retain(|real, (given, id)| {
            let keep = wanted.get(real) == Some(given) && *id == dir_id(given);
            if !keep {
                let _ = watcher.unwatch(given);
            }
            keep
        });
        for (real, given) in wanted {
            if !self.0.contains_key(real)
                && watcher.watch(given, RecursiveMode::NonRecursive).is_ok()
            {
                self.0.insert(real.clone(), (given.clone(), dir_id(given)));
            }
        }
    }

    fn has(&self, given: &Path) -> bool {
        self.0.values().any(|(g, _)| g == given)
    }
}

async fn run(
    reloader: Arc<Reloader>,
    mut watching: Watching<impl Watcher>,
    (changed, writes): (Arc<Notify>, Arc<OpenWrites>),
    files: Watched,
) {
    let mut had_content = files.with_content();
    loop {
        changed.notified().await;
        tokio::time::sleep(COALESCE).await;
        wait_while_emptied(&had_content, &changed).await;
        wait_while_written(&writes, &changed).await;
        let reloader = reloader.clone();
        let _ = tokio::task::spawn_blocking(move || reloader.reload_files("file watch")).await;
        watching.refresh(&files);
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
        "{} is empty: the reload waits for its content, for at most {REWRITE_GRACE:?}; then an emptied upstreams file is refused (to remove every route, write `upstreams: {{}}`) and an emptied conf.d file's hosts are removed",
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

/// Waits while a watched file is being written in place, at most [`WRITE_GRACE`]; each event
/// looks again. A writer that keeps its file open longer is forgotten.
async fn wait_while_written(writes: &OpenWrites, changed: &Notify) {
    let Some(file) = writes.one() else {
        return;
    };
    tracing::info!(
        "{} is being written: the reload waits until its writer closes it, for at most {WRITE_GRACE:?}",
        file.display()
    );
    let deadline = tokio::time::Instant::now() + WRITE_GRACE;
    while writes.one().is_some() {
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(COALESCE).await,
            () = tokio::time::sleep_until(deadline) => return writes.forget(),
        }
    }
}

/// `path` made absolute, its links left as they are (they are followed at each reload).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
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

    /// A directory with an empty conf.d, and the files watched there.
    fn with_conf_d() -> (tempfile::TempDir, Watched) {
        let dir = tempfile::tempdir().expect("temp dir");
        let conf_d = dir.path().join("conf.d");
        std::fs::create_dir(&conf_d).expect("conf.d");
        let upstreams = dir.path().join("upstreams.yaml");
        (dir, Watched { upstreams, conf_d })
    }

    #[test]
    fn the_files_noted_are_the_watched_ones_with_content() {
        let (_dir, files) = with_conf_d();
        let conf_d = files.conf_d.clone();
        std::fs::write(&files.upstreams, "upstreams: {}\n").expect("upstreams");
        std::fs::write(conf_d.join("app.yaml"), "upstreams: {}\n").expect("app");
        std::fs::write(conf_d.join("placeholder.yaml"), "").expect("placeholder");
        std::fs::write(conf_d.join("notes.txt"), "not a config").expect("notes");
        let mut had = files.with_content();
        had.sort();
        assert_eq!(had, vec![conf_d.join("app.yaml"), files.upstreams.clone()]);
    }

    #[test]
    fn a_linked_conf_d_is_followed_through_its_link() {
        // A projected volume with a `conf.d/` item: conf.d -> ..data/conf.d, ..data -> ..v1.
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("..v1/conf.d")).expect("version dir");
        std::os::unix::fs::symlink("..v1", dir.path().join("..data")).expect("..data");
        let conf_d = dir.path().join("conf.d");
        std::os::unix::fs::symlink("..data/conf.d", &conf_d).expect("conf.d link");
        let files = Watched {
            upstreams: dir.path().join("upstreams.yaml"),
            conf_d,
        };
        // The swap of `..data` (a rename over it) is an event that counts.
        assert!(files.to_follow().counts(&dir.path().join("..data")));
    }

    /// A watcher that notes what it is asked to watch and unwatch.
    #[derive(Default)]
    struct Noted {
        watched: Vec<PathBuf>,
        unwatched: Vec<PathBuf>,
    }

    impl Watcher for Noted {
        fn new<F: notify::EventHandler>(_: F, _: notify::Config) -> notify::Result<Self> {
            Ok(Noted::default())
        }
        fn watch(&mut self, path: &Path, _: RecursiveMode) -> notify::Result<()> {
            self.watched.push(path.to_path_buf());
            Ok(())
        }
        fn unwatch(&mut self, path: &Path) -> notify::Result<()> {
            self.unwatched.push(path.to_path_buf());
            Ok(())
        }
        fn kind() -> notify::WatcherKind {
            notify::WatcherKind::NullWatcher
        }
    }

    #[test]
    fn a_directory_made_again_is_watched_again() {
        let (dir, files) = with_conf_d();
        let conf_d = files.conf_d.clone();
        let (mut watches, mut watcher) = (Watches::default(), Noted::default());
        watches.follow(&mut watcher, &files.to_follow());
        watches.follow(&mut watcher, &files.to_follow());
        let times = |noted: &[PathBuf]| noted.iter().filter(|p| **p == conf_d).count();
        assert_eq!(
            times(&watcher.watched),
            1,
            "an unchanged directory is watched once"
        );

        // Another directory under the name (moved aside here, so that its inode is another
        // one whatever the file system keeps of birth times).
        std::fs::rename(&conf_d, dir.path().join("conf.d.old")).expect("mv conf.d");
        std::fs::create_dir(&conf_d).expect("mkdir conf.d");
        watches.follow(&mut watcher, &files.to_follow());
        assert_eq!(times(&watcher.unwatched), 1);
        assert_eq!(times(&watcher.watched), 2, "the new conf.d is not watched");
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

    #[tokio::test(start_paused = true)]
    async fn a_file_written_in_place_is_read_once_closed_or_after_the_grace() {
        use notify::event::{DataChange, ModifyKind};
        let file = Path::new("/etc/aralez/upstreams.yaml");
        let writes = Arc::new(OpenWrites::default());
        let changed = Arc::new(Notify::new());
        let wait = |writes: &Arc<OpenWrites>| {
            let (writes, changed) = (writes.clone(), changed.clone());
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                wait_while_written(&writes, &changed).await;
                started.elapsed()
            })
        };
        let modified = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        writes.note(&modified, file);
        let waiting = wait(&writes);
        tokio::time::sleep(WRITE_GRACE / 2).await;
        // More of it written: still open.
        changed.notify_one();
        tokio::time::sleep(COALESCE * 2).await;
        assert!(
            !waiting.is_finished(),
            "the reload did not wait for the close"
        );
        writes.note(
            &EventKind::Access(AccessKind::Close(AccessMode::Write)),
            file,
        );
        changed.notify_one();
        let waited = waiting.await.expect("the wait");
        assert_eq!(waited, WRITE_GRACE / 2 + COALESCE * 3);

        writes.note(&modified, file);
        assert_eq!(wait(&writes).await.expect("the wait"), WRITE_GRACE);
        assert_eq!(writes.one(), None, "a writer past the grace is forgotten");
        assert_eq!(wait(&writes).await.expect("the wait"), Duration::ZERO);
    }

    #[test]
    fn only_the_config_files_count() {
        let up = PathBuf::from("/etc/aralez/upstreams.yaml");
        let cd = Path::new("/etc/aralez/conf.d");
        let followed = WatchPaths::of(std::slice::from_ref(&up), &[]);
        assert!(relevant(&up, &followed, cd));
        assert!(relevant(
            Path::new("/etc/aralez/conf.d/a.yaml"),
            &followed,
            cd
        ));
        assert!(relevant(cd, &followed, cd));
        assert!(!relevant(Path::new("/etc/aralez/main.yaml"), &followed, cd));
        assert!(!relevant(
            Path::new("/etc/aralez/conf.d/README.md"),
            &followed,
            cd
        ));
        assert!(!relevant(
            Path::new("/etc/aralez/.upstreams.yaml.swp"),
            &followed,
            cd
        ));
    }
}
