//! Which watched files are being written in place now: modified since their writer last closed
//! them (inotify's `IN_MODIFY` and `IN_CLOSE_WRITE`, notify's `Modify(Data)` and
//! `Access(Close(Write))`). A reload that read such a file could take the part written so far,
//! and the first half of a YAML file is often a valid configuration with fewer routes: the file
//! watch waits for the close ([`super::file_watch`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::EventKind;

/// The watched files modified and not closed since.
#[derive(Default)]
pub struct OpenWrites(Mutex<HashSet<PathBuf>>);

impl OpenWrites {
    /// Notes what an event of `kind` says of `path`'s writer.
    pub fn note(&self, kind: &EventKind, path: &Path) {
        match kind {
            EventKind::Modify(ModifyKind::Data(_)) => {
                let mut open = self.lock();
                if !open.contains(path) {
                    open.insert(path.to_path_buf());
                }
            }
            // Closed, or gone (a file renamed away or deleted is not written here any more).
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(_)) => {
                self.lock().remove(path);
            }
            _ => {}
        }
    }

    /// A file being written now, if any.
    pub fn one(&self) -> Option<PathBuf> {
        self.lock().iter().next().cloned()
    }

    /// Forgets every writer (one that kept its file open past the wait).
    pub fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<PathBuf>> {
        // A panic while holding it leaves a set that is still a set.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, MetadataKind, RemoveKind, RenameMode};

    #[test]
    fn a_file_is_written_from_its_first_modification_to_its_close() {
        let writes = OpenWrites::default();
        let (a, b) = (
            Path::new("/c/upstreams.yaml"),
            Path::new("/c/conf.d/b.yaml"),
        );
        let modified = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        writes.note(&EventKind::Create(CreateKind::File), a);
        writes.note(
            &EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
            a,
        );
        assert_eq!(writes.one(), None, "created or touched is not written");
        writes.note(&modified, a);
        writes.note(&modified, a);
        writes.note(&modified, b);
        writes.note(&closed, a);
        assert_eq!(writes.one().as_deref(), Some(b));
        writes.note(&EventKind::Remove(RemoveKind::File), b);
        assert_eq!(writes.one(), None);
        writes.note(&modified, a);
        writes.note(&EventKind::Modify(ModifyKind::Name(RenameMode::From)), a);
        assert_eq!(writes.one(), None, "renamed away");
        writes.note(&modified, b);
        writes.forget();
        assert_eq!(writes.one(), None);
    }
}
