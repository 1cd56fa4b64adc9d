//! The pid file: written atomically without following symlinks, removed on exit only while it
//! still names this process (after a live upgrade it names the new one).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A written pid file; [`PidFile::remove`] deletes it if it is still ours.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    pid: u32,
}

impl PidFile {
    /// Writes this process's pid to `path`: a new file created next to it with `O_EXCL` (which
    /// never follows a symlink) is renamed over `path` (rename replaces a symlink, never follows
    /// it), so a planted link cannot redirect the write.
    pub fn write(path: &Path) -> std::io::Result<PidFile> {
        let pid = std::process::id();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{pid}.tmp"));
        let tmp = PathBuf::from(tmp);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(format!("{pid}\n").as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
        })
    }

    /// Removes the file when it still holds our pid.
    pub fn remove(self) {
        let ours = read_pid(&self.path) == Some(self.pid);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("cannot remove pid file {}: {e}", self.path.display());
            }
        }
    }
}

/// The pid in `path`, read without following a symlink.
pub fn read_pid(path: &Path) -> Option<u32> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .ok()?;
    text.trim().parse().ok()
}
