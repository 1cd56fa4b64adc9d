//! Logging set-up: `tracing` to stdout or `log_file`, filtered by `log_level`. A log file is
//! reopened on SIGUSR1 (logrotate's `postrotate kill -USR1`), as nginx does.

use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::MainConfig;

/// A log file that can be reopened at its path, for the rotation tool to move the old one away.
pub struct LogFile {
    path: PathBuf,
    file: Mutex<File>,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl LogFile {
    pub fn open(path: &Path) -> io::Result<Arc<LogFile>> {
        Ok(Arc::new(LogFile {
            path: path.to_path_buf(),
            file: Mutex::new(open_append(path)?),
        }))
    }

    /// Opens the path again (creating it) and writes there from now on; on failure the old file
    /// stays in use.
    pub fn reopen(&self) -> io::Result<()> {
        let fresh = open_append(&self.path)?;
        *self.lock() = fresh;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, File> {
        // A panic while writing a log line leaves a usable file behind.
        self.file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `tracing`'s writer for a [`LogFile`].
struct SharedLog(Arc<LogFile>);

/// One log line's hold on the file.
struct LogLine<'a>(MutexGuard<'a, File>);

impl Write for LogLine<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<'a> MakeWriter<'a> for SharedLog {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine(self.0.lock())
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `log_level`. Returns the log
/// file, when there is one, for SIGUSR1 to reopen.
pub fn init(main: &MainConfig) -> Result<Option<Arc<LogFile>>, String> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{},h2=warn,hyper=warn", main.log_level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match &main.log_file {
        Some(path) => {
            let file = LogFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(SharedLog(file.clone()))
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(Some(file))
        }
        None => {
            builder
                .with_ansi(std::io::stdout().is_terminal())
                .with_writer(std::io::stdout)
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
    }
}
