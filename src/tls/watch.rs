//! Reloads the certificate directory within about a second of a change, and at once on SIGHUP
//! ([`CertReload`]).
//!
//! What is watched, besides the directory's own entries:
//! - its parent, for the directory itself being replaced (removed and made again, renamed over,
//!   or a symlink to it swapped): the watch follows the path, not the old directory;
//! - the directories a symlinked pair leads through (certbot's `live/NAME/*.pem` links into
//!   `archive/NAME/`): a renewal changes the links there, never the entries here.
//!
//! The watch is set up again after each reload, so it follows links that now lead elsewhere;
//! whatever changed while it was not set up (before the first one, or between two) is found by
//! comparing the directory with what the last reload read. A directory that is gone for a while
//! (replaced by `mv`) keeps its pairs serving, and its parent's watch tells when it is back; with
//! nothing to watch at all, it is looked at every few seconds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::CertStore;

/// Directories watched for the links of one certificate directory, at most: beyond, a renewal
/// through links is picked up on SIGHUP only.
const MAX_LINK_DIRS: usize = 512;
/// How often a directory that cannot be watched is looked at.
const UNWATCHED_LOOK: Duration = Duration::from_secs(5);
/// The longest wait for a pair's validity to change before looking again.
const A_DAY: Duration = Duration::from_secs(86_400);
/// Hops followed along one chain of symlinks.
const MAX_HOPS: usize = 8;
/// Entries of the certificate directory looked at for links.
const MAX_ENTRIES: usize = 16_384;

/// Asks the watcher to reload the certificates now (SIGHUP); does nothing without TLS.
#[derive(Clone, Default)]
pub struct CertReload(Option<Arc<Notify>>);

impl CertReload {
    /// A reload handle for [`watch`].
    pub fn new() -> CertReload {
        CertReload(Some(Arc::new(Notify::new())))
    }

    pub fn now(&self) {
        if let Some(wake) = &self.0 {
            wake.notify_one();
        }
    }
}

/// Watches `store`'s directory, reloading it after each change and whenever `reload` asks.
pub async fn watch(store: Arc<CertStore>, reload: CertReload) {
    let wake = reload.0.unwrap_or_default();
    let dir = std::path::absolute(&store.dir).unwrap_or_else(|_| store.dir.clone());
    let mut said_unwatched = false;
    let mut identity = dir_identity(&dir);
    let mut armed = arm_or_say(&dir, &wake, &mut said_unwatched);
    loop {
        // A directory made anew, or changed, since it was last read (the first time: since the
        // start read it, before it was watched): read it now.
        let now = dir_identity(&dir);
        if now != identity || store.changed_since_read() {
            identity = now;
            wake.notify_one();
        }
        // A pair that becomes valid or expires changes what is served, with no file changed:
        // read again then (looked at once a day at least, a wait that long being capped).
        let boundary = store.until_validity_change().map(|left| left.min(A_DAY));
        match armed {
            Some(_) => {
                // The directory missing (a link to where nothing is yet): its parent's watch
                // may not see it come (a link's target elsewhere, or beside it), so look now
                // and then as well.
                let wait = match dir.is_dir() {
                    true => boundary,
                    false => Some(boundary.map_or(UNWATCHED_LOOK, |l| l.min(UNWATCHED_LOOK))),
                };
                let woken = match wait {
                    Some(left) => tokio::time::timeout(left, wake.notified()).await.is_ok(),
                    None => {
                        wake.notified().await;
                        true
                    }
                };
                let due = || {
                    store.validity_changed()
                        || dir_identity(&dir) != identity
                        || store.changed_since_read()
                };
                if !woken && !due() {
                    continue;
                }
            }
            // Nothing watched (the directory and its parent gone): look again now and then.
            None => {
                let look = boundary.map_or(UNWATCHED_LOOK, |left| left.min(UNWATCHED_LOOK));
                let woken = tokio::time::timeout(look, wake.notified()).await;
                let due = store.changed_since_read() || store.validity_changed();
                if woken.is_err() && !due {
                    armed = arm_or_say(&dir, &wake, &mut said_unwatched);
                    continue;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The rest of the burst (a write, then its close) woke it again meanwhile: this one
        // reload covers it.
        let _ = tokio::time::timeout(Duration::ZERO, wake.notified()).await;
        let store = store.clone();
        let reloaded = tokio::task::spawn_blocking(move || (store.reload(), store.len())).await;
        if let Ok((problems, count)) = reloaded {
            for p in &problems {
                tracing::warn!("certificates: {p}");
            }
            match count {
                0 => tracing::warn!(
                    "certificates reloaded: no usable pair in {}; TLS handshakes fail until one is added",
                    dir.display()
                ),
                _ => tracing::info!("certificates reloaded: {count} pair(s) serving"),
            }
        }
        // The next watch (links may lead elsewhere now) is set before this one goes: a change
        // made meanwhile wakes one of them. Dropped first, the watch missed a renewal's links
        // moved while it was being set up again, until the next SIGHUP.
        let next = arm_or_say(&dir, &wake, &mut said_unwatched);
        drop(std::mem::replace(&mut armed, next));
    }
}

/// [`arm`], saying once (until it works again) when the directory cannot be watched.
fn arm_or_say(
    dir: &Path,
    wake: &Arc<Notify>,
    said_unwatched: &mut bool,
) -> Option<RecommendedWatcher> {
    match arm(dir, wake.clone()) {
        Ok(watcher) => {
            *said_unwatched = false;
            Some(watcher)
        }
        Err(e) => {
            if !*said_unwatched {
                tracing::warn!(
                    "certificates: cannot watch {}: {e}; it is looked at every {}s and on SIGHUP",
                    dir.display(),
                    UNWATCHED_LOOK.as_secs()
                );
                *said_unwatched = true;
            }
            None
        }
    }
}

/// The directory's device and inode, to tell a directory made anew from the one watched.
fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

/// A watcher waking `wake` on changes to `dir`'s entries, to `dir` itself (through its parent)
/// and to the directories its symlinks lead through.
fn arm(dir: &Path, wake: Arc<Notify>) -> notify::Result<RecommendedWatcher> {
    let parent = dir.parent().map(Path::to_path_buf);
    let links = link_dirs(dir);
    let parent_only = parent.clone().filter(|p| !links.contains(p));
    let own = dir.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        // The parent's other entries are none of this directory's business.
        let elsewhere = |path: &PathBuf| path.parent() == parent_only.as_deref() && *path != own;
        if !event.paths.is_empty() && event.paths.iter().all(elsewhere) {
            return;
        }
        wake.notify_one();
    })?;
    let own_watch = watcher.watch(dir, RecursiveMode::NonRecursive);
    // Best effort beyond the directory itself: it still reloads on its own changes and SIGHUP.
    let mut others = false;
    for other in parent.iter().chain(links.iter()) {
        match watcher.watch(other, RecursiveMode::NonRecursive) {
            Ok(()) => others = true,
            Err(e) => tracing::debug!("certificates: cannot watch {}: {e}", other.display()),
        }
    }
    match own_watch {
        Ok(()) => Ok(watcher),
        // The directory is gone for now (being replaced): its parent tells when it is back.
        Err(e) if others => {
            tracing::debug!("certificates: cannot watch {} yet: {e}", dir.display());
            Ok(watcher)
        }
        Err(e) => Err(e),
    }
}

/// The directories `dir`'s symlinked entries lead through (each link's own directory and its
/// target's, hop by hop), `dir` left out.
fn link_dirs(dir: &Path) -> BTreeSet<PathBuf> {
    let mut dirs = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return dirs;
    };
    for entry in entries.filter_map(Result::ok).take(MAX_ENTRIES) {
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if is_link {
            follow_links(entry.path(), &mut dirs);
        }
        if dirs.len() > MAX_LINK_DIRS {
            tracing::warn!(
                "certificates: the links of {} lead through more than {MAX_LINK_DIRS} directories; changes beyond them reload on SIGHUP only",
                dir.display()
            );
            break;
        }
    }
    dirs.remove(dir);
    dirs
}

/// Adds the directory of each hop of the symlink chain starting at `link`.
fn follow_links(mut link: PathBuf, dirs: &mut BTreeSet<PathBuf>) {
    for _ in 0..MAX_HOPS {
        let Ok(target) = std::fs::read_link(&link) else {
            return;
        };
        let Some(from) = link.parent() else { return };
        let next = from.join(target);
        if let Some(at) = next.parent() {
            dirs.insert(at.to_path_buf());
        }
        link = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_of_every_hop_of_a_link_chain_are_watched() {
        // certbot's layout: certs/b.crt -> le/live/b/fullchain.pem -> ../../archive/b/f1.pem
        let root = tempfile::tempdir().expect("temp dir");
        let at = |p: &str| root.path().join(p);
        for dir in ["certs", "le/live/b", "le/archive/b"] {
            std::fs::create_dir_all(at(dir)).expect("dir");
        }
        std::fs::write(at("le/archive/b/f1.pem"), "x").expect("file");
        std::os::unix::fs::symlink("../../archive/b/f1.pem", at("le/live/b/fullchain.pem"))
            .expect("link");
        std::os::unix::fs::symlink(at("le/live/b/fullchain.pem"), at("certs/b.crt")).expect("link");
        std::fs::write(at("certs/plain.crt"), "x").expect("file");
        let dirs: Vec<PathBuf> = link_dirs(&at("certs")).into_iter().collect();
        assert_eq!(dirs.len(), 2, "{dirs:?}");
        assert!(dirs[0].ends_with("le/live/b"), "{dirs:?}");
        assert!(dirs[1].ends_with("le/live/b/../../archive/b"), "{dirs:?}");
    }
}
