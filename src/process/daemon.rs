//! Background mode (`-d`, `daemon: true`): fork before any runtime or thread exists, start a new
//! session, and point stdin at /dev/null and stdout/stderr at the log file (or /dev/null).
//!
//! This is the only place in the crate that forks, and the only `unsafe` besides taking ownership
//! of the descriptors received in a live upgrade (`upgrade.rs`).

use std::fs::{File, OpenOptions};
use std::path::Path;

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
}

/// Forks; the parent exits 0 at once, the child returns (in a new session) and runs on.
///
/// Must be called while the process has a single thread: before any tokio runtime, logging
/// thread or worker starts.
pub fn daemonize(log_file: Option<&Path>) -> Result<(), DaemonError> {
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
    match fork_once()? {
        ForkResult::Parent { .. } => std::process::exit(0),
        ForkResult::Child => {}
    }
    setsid().map_err(DaemonError::Setsid)?;
    dup2_stdin(&input).map_err(DaemonError::Redirect)?;
    dup2_stdout(&output).map_err(DaemonError::Redirect)?;
    dup2_stderr(&output).map_err(DaemonError::Redirect)?;
    Ok(())
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
