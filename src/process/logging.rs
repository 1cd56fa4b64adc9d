//! Logging set-up: `tracing` to stdout or `log_file`, filtered by `log_level`, each line in
//! tracing's format or `log_pattern`'s. The log file is reopened on SIGUSR1 (logrotate's
//! `postrotate kill -USR1`), as nginx does, and rotates itself when `log_file` gives a size.

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use super::log_pattern::PatternFormat;
use crate::config::MainConfig;
use crate::logfile::LogFile;

/// `tracing`'s writer for a [`LogFile`]: each event arrives formatted, in one write.
struct SharedLog(Arc<LogFile>);

/// One log line on its way to the file.
struct LogLine<'a>(&'a LogFile);

impl Write for LogLine<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.append(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for SharedLog {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine(&self.0)
    }
}

/// Opens `log_file` (rotating as it says), when there is one: the app log's file, which the
/// access log shares unless it has its own.
pub fn open_app_log(main: &MainConfig) -> Result<Option<Arc<LogFile>>, String> {
    let Some(path) = &main.log_file else {
        return Ok(None);
    };
    LogFile::open(path, main.log_rotation)
        .map(|f| Some(Arc::new(f)))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Installs the global subscriber, writing to `file` or stdout. `RUST_LOG`, when set,
/// overrides `log_level`. The libraries' own lines below warnings are left out, and notify's
/// warnings too: it says it could not remove the watch of a directory already deleted (every
/// ConfigMap update, and a conf.d removed), as a raw debug struct; aralez says what it watches
/// itself. rustls's warnings too: it warns of every ClientHello whose SNI
/// is an IP address (wrk and h2load send one), a line per handshake that any client could use
/// to fill the disk; a handshake that fails is aralez's to say. kube-client's errors too: they
/// name neither the API server nor the service (`failed with error client error (Connect)`),
/// and aralez's own warning for the watch says the same with its causes.
pub fn init(main: &MainConfig, file: Option<&Arc<LogFile>>) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{},h2=warn,hyper=warn,notify=error,rustls=error,kube_client=off",
            main.log_level
        ))
    });
    // A line that cannot be written is lost, not said on stderr: tracing says it with
    // `eprintln!`, which panics (and the process aborts) when stderr cannot be written either, as
    // a daemon's log on a full disk or a closed pipe.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .log_internal_errors(false);
    let ansi = file.is_none() && std::io::stdout().is_terminal();
    let builder = builder.with_ansi(ansi);
    let writer = match file {
        Some(file) => BoxMakeWriter::new(SharedLog(file.clone())),
        None => BoxMakeWriter::new(std::io::stdout),
    };
    let builder = builder.with_writer(writer);
    let result = match &main.log_pattern {
        Some(pattern) => builder
            .event_format(PatternFormat::new(pattern.clone()))
            .try_init(),
        None => builder.try_init(),
    };
    result.map_err(|e| e.to_string())
}
