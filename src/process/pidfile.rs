//! The pid file: written atomically without following symlinks, removed on exit only while it
//! still names this process (after a live upgrade it names the new one). A start that fails
//! after writing it gives it back to the instance it named before, when that one still runs (a
//! live upgrade that failed leaves the old instance serving), and removes it otherwise.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A written pid file; [`PidFile::remove`] deletes it if it is still ours.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    pid: u32,
    /// Another process's pid that the file held before this one wrote it.
    replaced: Option<u32>,
}

impl PidFile {
    /// Writes this process's pid to `path` (see [`write_pid`]).
    pub fn write(path: &Path) -> std::io::Result<PidFile> {
        let pid = std::process::id();
        let replaced = read_pid(path).filter(|previous| *previous != pid);
        write_pid(path, pid)?;
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
            replaced,
        })
    }

    /// Removes the file when it still holds our pid.
    pub fn remove(self) {
        if self.still_ours() {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("cannot remove pid file {}: {e}", self.path.display());
            }
        }
    }

    /// For a start that failed: the file names again the process it named before, if that one
    /// still runs; otherwise it goes as on exit.
    pub fn abandon(self) {
        match self.replaced.filter(|previous| is_running(*previous)) {
            Some(previous) if self.still_ours() => {
                if let Err(e) = write_pid(&self.path, previous) {
                    tracing::warn!(
                        "cannot give pid file {} back to process {previous}: {e}",
                        self.path.display()
                    );
                }
            }
            _ => self.remove(),
        }
    }

    fn still_ours(&self) -> bool {
        read_pid(&self.path) == Some(self.pid)
    }
}

/// Writes `pid` to `path`: a new file created next to it with `O_EXCL` (which never follows a
/// symlink) is renamed over `path` (rename replaces a symlink, never follows it), so a planted
/// link cannot redirect the write.
fn write_pid(path: &Path, pid: u32) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(format!("{pid}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether a process `pid` exists (signal 0 checks without sending). Never asks about 0 or a
/// negative number, which would mean a whole process group.
fn is_running(pid: u32) -> bool {
    use nix::errno::Errno;
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => true,
        Err(_) => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pid_file_in(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("aralez.pid")
    }

    /// A pid no process has: a child that has exited and been reaped.
    fn gone_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait for true");
        pid
    }

    #[test]
    fn exit_removes_the_file_while_it_is_ours_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = pid_file_in(&dir);
        PidFile::write(&path).expect("write").remove();
        assert!(!path.exists(), "our pid file is removed on exit");

        let ours = PidFile::write(&path).expect("write");
        write_pid(&path, gone_pid()).expect("the next instance's pid");
        ours.remove();
        assert!(path.exists(), "a file naming another process stays");
    }

    #[test]
    fn a_failed_start_gives_the_file_back_to_the_running_instance() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = pid_file_in(&dir);
        let running = std::os::unix::process::parent_id();
        write_pid(&path, running).expect("the running instance's pid");
        let ours = PidFile::write(&path).expect("write");
        assert_eq!(read_pid(&path), Some(std::process::id()));
        ours.abandon();
        assert_eq!(read_pid(&path), Some(running));
    }

    #[test]
    fn a_failed_start_removes_the_file_when_its_previous_process_is_gone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = pid_file_in(&dir);
        write_pid(&path, gone_pid()).expect("a stale pid");
        PidFile::write(&path).expect("write").abandon();
        assert!(!path.exists(), "a stale pid is not put back");

        PidFile::write(&path).expect("write").abandon();
        assert!(!path.exists(), "a first start leaves nothing behind");
    }

    #[test]
    fn only_positive_pids_are_asked_about() {
        assert!(is_running(std::process::id()));
        assert!(!is_running(0), "0 is our process group, not a process");
        assert!(!is_running(u32::MAX), "-1 would be every process");
        assert!(!is_running(gone_pid()));
    }
}
