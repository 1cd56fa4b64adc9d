//! Logging set-up: `tracing` to stdout or `log_file`, filtered by `log_level`.

use std::fs::OpenOptions;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::MainConfig;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `log_level`.
pub fn init(main: &MainConfig) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{},h2=warn,hyper=warn", main.log_level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let result = match &main.log_file {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .try_init()
        }
        None => builder
            .with_ansi(std::io::stdout().is_terminal())
            .with_writer(std::io::stdout)
            .try_init(),
    };
    result.map_err(|e| e.to_string())
}
