//! The pid file: written atomically without following symlinks, removed on exit only while it
//! still names this process (after a live upgrade it names the new one). A start that fails
//! after writing it gives it back to the aralez it named before, when that one still runs (a
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

    /// On the way out (a failed start, or a stop): when this process took the file over from
    /// an aralez that still runs (a live upgrade rolled back by stopping the new one, as
    /// nginx's `.oldbin`), the file names that one again; otherwise it goes. Removed, the
    /// old instance was left with no pid file, and `cat pid` in logrotate and systemd broke.
    pub fn leave(self) {
        match self.replaced.filter(|previous| is_live_aralez(*previous)) {
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

/// Removes the pid file at `path` when it names this process (an exit that cannot wait for
/// the usual way out: a second stop signal during the drain).
pub fn remove_if_ours(path: &Path) {
    if read_pid(path) == Some(std::process::id()) {
        let _ = std::fs::remove_file(path);
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

/// Whether `pid` is a running aralez other than this process: its program's name says so, and
/// it has not exited (a zombie, exited but not yet reaped by its parent, serves nothing).
pub fn is_live_aralez(pid: u32) -> bool {
    if pid == std::process::id() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        name_and_state(&stat)
            .is_some_and(|(name, state)| name.starts_with("aralez") && !matches!(state, 'Z' | 'X'))
    })
}

/// The program name and state letter of a `/proc/PID/stat` line: `PID (NAME) STATE ...`, where
/// the name may itself hold spaces and parentheses (so it ends at the last `)`).
fn name_and_state(stat: &str) -> Option<(&str, char)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    Some((name, rest.trim_start().chars().next()?))
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

    /// A process whose program is called aralez (`sleep` under that name), killed on drop.
    struct OtherAralez(std::process::Child);

    impl OtherAralez {
        fn start(dir: &tempfile::TempDir) -> OtherAralez {
            let named = dir.path().join("aralez-old");
            std::os::unix::fs::symlink("/bin/sleep", &named).expect("symlink");
            let child = std::process::Command::new(named).arg("60").spawn();
            let other = OtherAralez(child.expect("spawn the other aralez"));
            // Until its exec, the child has the name of the test's thread that forked it.
            let comm = format!("/proc/{}/comm", other.0.id());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::fs::read_to_string(&comm).unwrap_or_default() != "aralez-old\n" {
                assert!(std::time::Instant::now() < deadline, "sleep never ran");
                std::thread::yield_now();
            }
            other
        }
    }

    impl Drop for OtherAralez {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
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
    fn leaving_gives_the_file_back_to_the_running_aralez_it_was_taken_from() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = pid_file_in(&dir);
        let old = OtherAralez::start(&dir);
        write_pid(&path, old.0.id()).expect("the running instance's pid");
        let ours = PidFile::write(&path).expect("write");
        assert_eq!(read_pid(&path), Some(std::process::id()));
        ours.leave();
        assert_eq!(read_pid(&path), Some(old.0.id()));
    }

    #[test]
    fn a_failed_start_removes_the_file_when_its_previous_process_is_no_aralez() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = pid_file_in(&dir);
        write_pid(&path, gone_pid()).expect("a stale pid");
        PidFile::write(&path).expect("write").leave();
        assert!(!path.exists(), "a stale pid is not put back");

        let unrelated = std::os::unix::process::parent_id();
        write_pid(&path, unrelated).expect("a pid reused by another program");
        PidFile::write(&path).expect("write").leave();
        assert!(
            !path.exists(),
            "a pid now of another program is not put back"
        );

        PidFile::write(&path).expect("write").leave();
        assert!(!path.exists(), "a first start leaves nothing behind");
    }

    #[test]
    fn only_another_running_aralez_counts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let other = OtherAralez::start(&dir);
        assert!(is_live_aralez(other.0.id()));
        assert!(!is_live_aralez(std::process::id()), "this process");
        assert!(!is_live_aralez(std::os::unix::process::parent_id()));
        assert!(!is_live_aralez(gone_pid()));
    }

    #[test]
    fn an_aralez_that_exited_unreaped_is_not_live() {
        let dir = tempfile::tempdir().expect("temp dir");
        let named = dir.path().join("aralez-old");
        std::os::unix::fs::symlink("/bin/true", &named).expect("symlink");
        let mut child = std::process::Command::new(named).spawn().expect("spawn");
        let stat = format!("/proc/{}/stat", child.id());
        // Not waited for: once `true` has run and exited, the child stays a zombie named by it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_to_string(&stat)
            .unwrap_or_default()
            .contains("(aralez-old) Z")
        {
            assert!(std::time::Instant::now() < deadline, "no zombie: {stat}");
            std::thread::yield_now();
        }
        assert!(!is_live_aralez(child.id()));
        child.wait().expect("reap");
    }

    #[test]
    fn stat_lines_give_the_name_and_state() {
        assert_eq!(name_and_state("42 (aralez) S 1 42"), Some(("aralez", 'S')));
        assert_eq!(name_and_state("42 (a) (b)) Z 1"), Some(("a) (b)", 'Z')));
        assert_eq!(name_and_state("42 aralez S"), None);
        assert_eq!(name_and_state("42 (aralez)"), None);
    }
}
