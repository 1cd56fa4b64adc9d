//! Background mode (`-d`, `daemon: true`): fork before any runtime or thread exists, start a new
//! session, and point stdin at /dev/null and stdout/stderr at the log file (or /dev/null).
//!
//! As with nginx, the command returns only once the background process serves (exit 0) or has
//! failed to start (exit 1, its error on stderr): the child reports over a pipe ([`ReadyPipe`]).
//!
//! This is the only place in the crate that forks, and the only `unsafe` besides taking ownership
//! of the descriptors received in a live upgrade (`upgrade.rs`) and the global allocator
//! (`allocator.rs`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};

use crate::logfile::say_on_stderr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use nix::unistd::{dup2_stderr, dup2_stdin, dup2_stdout, setsid, ForkResult};

/// Why the process could not go to the background.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("fork failed: {0}")]
    Fork(nix::Error),
    #[error("setsid failed: {0}")]
    Setsid(nix::Error),
    #[error("cannot open {path} for the daemon's output: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot redirect the standard streams: {0}")]
    Redirect(nix::Error),
    #[error("cannot make the readiness pipe: {0}")]
    Pipe(nix::Error),
}

/// How long `-d` waits for the background process to say it serves.
const READY_WAIT: Duration = Duration::from_secs(90);

/// The background process's line to the command that started it: "ready", or why not.
pub struct ReadyPipe(File);

impl ReadyPipe {
    /// The process serves: the starting command exits 0.
    pub fn ready(mut self) {
        let _ = self.0.write_all(b"ready\n");
    }

    /// The process cannot start: the starting command prints `why` and exits 1.
    pub fn failed(mut self, why: &str) {
        let _ = write!(self.0, "error: {why}");
    }
}

/// Forks; the parent waits for the child's word and exits with it (see [`ReadyPipe`]), the child
/// returns (in a new session) with its end of the pipe and runs on.
///
/// Must be called while the process has a single thread: before any tokio runtime, logging
/// thread or worker starts.
pub fn daemonize(log_file: Option<&Path>) -> Result<ReadyPipe, DaemonError> {
    // Open first, so a bad path is reported by the foreground process.
    let output = match log_file {
        Some(path) => OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| DaemonError::Open {
                path: path.display().to_string(),
                source,
            })?,
        None => open_dev_null(true)?,
    };
    let input = open_dev_null(false)?;
    let (from_child, to_parent) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(DaemonError::Pipe)?;
    match fork_once()? {
        ForkResult::Parent { .. } => {
            drop(to_parent);
            std::process::exit(await_child(from_child));
        }
        ForkResult::Child => drop(from_child),
    }
    setsid().map_err(DaemonError::Setsid)?;
    dup2_stdin(&input).map_err(DaemonError::Redirect)?;
    dup2_stdout(&output).map_err(DaemonError::Redirect)?;
    dup2_stderr(&output).map_err(DaemonError::Redirect)?;
    Ok(ReadyPipe(File::from(to_parent)))
}

/// The parent's side: the exit code of `aralez -d`, after the child's word (or its silence).
fn await_child(from_child: OwnedFd) -> i32 {
    let (tx, rx) = std::sync::mpsc::channel();
    // The parent may start a thread: it only waits and exits.
    std::thread::spawn(move || {
        let mut said = String::new();
        let _ = File::from(from_child).read_to_string(&mut said);
        let _ = tx.send(said);
    });
    match rx.recv_timeout(READY_WAIT) {
        Ok(said) if said.starts_with("ready") => 0,
        Ok(said) if !said.is_empty() => {
            say_on_stderr(format_args!(
                "aralez: the background process did not start: {}",
                said.trim_end()
            ));
            1
        }
        Ok(_) => {
            say_on_stderr(format_args!(
                "aralez: the background process exited before it served (see log_file)"
            ));
            1
        }
        Err(_) => {
            say_on_stderr(format_args!(
                "aralez: the background process did not say it serves within {}s (see log_file)",
                READY_WAIT.as_secs()
            ));
            1
        }
    }
}

fn open_dev_null(write: bool) -> Result<File, DaemonError> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .map_err(|source| DaemonError::Open {
            path: "/dev/null".into(),
            source,
        })
}

#[allow(unsafe_code)]
fn fork_once() -> Result<ForkResult, DaemonError> {
    // SAFETY: `fork` is unsound only when other threads exist (the child could inherit a lock
    // held by a thread that no longer exists). `daemonize` runs from `main` before any runtime,
    // logging thread or worker is started, so the process has exactly one thread here; the child
    // then only calls async-signal-safe functions (setsid, dup2) before going on as usual.
    unsafe { nix::unistd::fork() }.map_err(DaemonError::Fork)
}
