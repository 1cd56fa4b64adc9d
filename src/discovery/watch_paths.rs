//! What the file watcher ([`super::file_watch`]) looks at: the paths whose change changes what a
//! reload reads, and the directories that hold them.
//!
//! A config file may be reached through symbolic links. In a Kubernetes ConfigMap mount,
//! `upstreams.yaml` links to `..data/upstreams.yaml` and `..data` to a timestamped directory; an
//! update writes a new directory, renames a new `..data` link over the old one and deletes the old
//! directory. The file itself is never written, and the directory it resolved to is gone after
//! the first update. So the paths are worked out from the links as they are after every reload:
//! the file as configured, each link on its way, and the file it resolves to, each in the
//! directory it is in.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

/// Links followed from one file before giving up (a loop, or a chain no one meant).
const MAX_HOPS: usize = 16;

/// The paths whose events count, and the directories to watch for them.
#[derive(Debug, Default)]
pub struct WatchPaths {
    /// Paths an event may name that count, each as the watcher reports it (the directory as it
    /// was given to the watcher, joined with the entry's name).
    names: HashSet<PathBuf>,
    /// The directories to watch: what each resolves to (one watch per real directory) -> the
    /// path given to the watcher.
    dirs: HashMap<PathBuf, PathBuf>,
}

impl WatchPaths {
    /// For `files` (as configured, absolute) followed through their links, and `dirs` watched
    /// whatever they hold (conf.d, for files still to come).
    pub fn of(files: &[PathBuf], dirs: &[&Path]) -> WatchPaths {
        let mut paths = WatchPaths::default();
        for dir in dirs {
            paths.watch_dir(dir);
        }
        for file in files {
            for name in chain(file) {
                paths.add(&name);
            }
        }
        paths
    }

    /// Whether an event naming `path` is one of these.
    pub fn counts(&self, path: &Path) -> bool {
        self.names.contains(path)
    }

    /// The directories to watch: what each resolves to -> the path to give the watcher.
    pub fn dirs(&self) -> &HashMap<PathBuf, PathBuf> {
        &self.dirs
    }

    /// The path given to the watcher for `dir` (the first one seen for its real directory).
    fn watch_dir(&mut self, dir: &Path) -> PathBuf {
        let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.dirs
            .entry(real)
            .or_insert_with(|| dir.to_path_buf())
            .clone()
    }

    fn add(&mut self, name: &Path) {
        let (Some(dir), Some(entry)) = (name.parent(), name.file_name()) else {
            return;
        };
        let given = self.watch_dir(dir);
        self.names.insert(given.join(entry));
        self.names.insert(name.to_path_buf());
    }
}

/// `file`, then for each symbolic link on its way the entry of the link's directory that its
/// target goes through (itself a link in a ConfigMap mount) and the target, and last the file it
/// resolves to in the end.
fn chain(file: &Path) -> Vec<PathBuf> {
    let mut names = vec![file.to_path_buf()];
    let mut at = file.to_path_buf();
    for _ in 0..MAX_HOPS {
        let Ok(target) = std::fs::read_link(&at) else {
            break;
        };
        let dir = at.parent().map(Path::to_path_buf).unwrap_or_default();
        if let Some(Component::Normal(first)) = target.components().next() {
            names.push(dir.join(first));
        }
        // An absolute target replaces `dir`.
        at = dir.join(target);
        names.push(at.clone());
    }
    if let Ok(real) = std::fs::canonicalize(file) {
        names.push(real);
    }
    names.extend(linked_ancestors(file));
    names
}

/// The directories on `file`'s way that are symbolic links (a release swap: `current` ->
/// `releases/N`, replaced by renaming a new link over it). The rename is an event in the
/// link's own directory, which nothing else watches: the file read changed with no event.
fn linked_ancestors(file: &Path) -> Vec<PathBuf> {
    file.ancestors()
        .skip(1)
        .take(MAX_HOPS)
        .filter(|dir| dir.parent().is_some())
        .filter(|dir| std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()))
        .map(Path::to_path_buf)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A ConfigMap mount as the kubelet writes it: `..data` -> `..v1`, the file -> `..data/file`.
    fn config_map(dir: &Path, file: &str) {
        std::fs::create_dir(dir.join("..v1")).expect("version dir");
        std::fs::write(dir.join("..v1").join(file), "upstreams: {}\n").expect("file");
        symlink("..v1", dir.join("..data")).expect("..data");
        symlink(Path::new("..data").join(file), dir.join(file)).expect("file link");
    }

    #[test]
    fn a_plain_file_is_itself_in_its_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("upstreams.yaml");
        std::fs::write(&file, "upstreams: {}\n").expect("file");
        let conf_d = dir.path().join("conf.d");
        let paths = WatchPaths::of(std::slice::from_ref(&file), &[&conf_d]);
        assert!(paths.counts(&file));
        assert!(!paths.counts(&dir.path().join("main.yaml")));
        let mut given: Vec<_> = paths.dirs().values().cloned().collect();
        given.sort();
        assert_eq!(given, vec![dir.path().to_path_buf(), conf_d]);
    }

    #[test]
    fn a_config_map_counts_its_link_swap_and_the_version_it_resolves_to() {
        let dir = tempfile::tempdir().expect("temp dir");
        config_map(dir.path(), "upstreams.yaml");
        let file = dir.path().join("upstreams.yaml");
        let paths = WatchPaths::of(std::slice::from_ref(&file), &[]);
        assert!(paths.counts(&file));
        // The rename of a new `..data` over the old one names `..data`.
        assert!(paths.counts(&dir.path().join("..data")));
        assert!(!paths.counts(&dir.path().join("..data_tmp")));
        // The version directory is watched once, through the path the link chain gave first.
        let version = std::fs::canonicalize(dir.path().join("..v1")).expect("version");
        assert_eq!(paths.dirs().get(&version), Some(&dir.path().join("..data")));
        assert!(paths.counts(&dir.path().join("..data/upstreams.yaml")));
        assert_eq!(paths.dirs().len(), 2);
    }

    #[test]
    fn a_link_to_another_directory_watches_that_one_too() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let real = there.path().join("generated.yaml");
        std::fs::write(&real, "upstreams: {}\n").expect("file");
        let file = here.path().join("upstreams.yaml");
        symlink(&real, &file).expect("link");
        let paths = WatchPaths::of(std::slice::from_ref(&file), &[]);
        assert!(paths.counts(&file));
        assert!(paths.counts(&real));
        assert_eq!(paths.dirs().len(), 2);
    }

    #[test]
    fn a_directory_link_on_the_way_counts_its_swap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let release = dir.path().join("releases/1");
        std::fs::create_dir_all(&release).expect("release");
        std::fs::write(release.join("upstreams.yaml"), "upstreams: {}\n").expect("file");
        let current = dir.path().join("current");
        symlink("releases/1", &current).expect("current");
        let file = current.join("upstreams.yaml");
        let paths = WatchPaths::of(std::slice::from_ref(&file), &[]);
        assert!(paths.counts(&file));
        // `mv -T current.tmp current` names `current` in its own directory, watched too.
        assert!(paths.counts(&current));
        let root = std::fs::canonicalize(dir.path()).expect("root");
        assert_eq!(paths.dirs().get(&root), Some(&dir.path().to_path_buf()));
    }

    #[test]
    fn a_link_loop_ends() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        symlink(&b, &a).expect("a");
        symlink(&a, &b).expect("b");
        let paths = WatchPaths::of(std::slice::from_ref(&a), &[]);
        assert!(paths.counts(&a) && paths.counts(&b));
    }
}
