//! Sources of configuration change. Every change goes the same way: parse -> validate -> compile
//! into an immutable [`Snapshot`] -> one `ArcSwap` store. A rejected change logs why, with file
//! and line, and leaves the serving snapshot in place.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{self, Issues, UpstreamsConfig};
use crate::routing::Snapshot;
use crate::upstream::Registry;

/// Builds and publishes snapshots.
pub struct Reloader {
    pub upstreams_path: PathBuf,
    pub registry: Registry,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
}

impl Reloader {
    /// Reads the upstreams file (and conf.d) and publishes it; returns every issue on rejection.
    pub fn reload_files(&self, source: &str) -> Result<(), Issues> {
        let mut issues = Issues::default();
        match config::load_upstreams(&self.upstreams_path, &mut issues) {
            Some(cfg) if !issues.has_errors() => {
                self.publish(&cfg);
                for warning in issues.warnings() {
                    tracing::warn!("{warning}");
                }
                tracing::info!(source, "configuration reloaded: {} hosts", cfg.hosts.len());
                Ok(())
            }
            _ => {
                for error in issues.errors() {
                    tracing::error!(source, "reload rejected: {error}");
                }
                Err(issues)
            }
        }
    }

    /// Compiles `cfg` and makes it the serving snapshot.
    pub fn publish(&self, cfg: &UpstreamsConfig) {
        let snapshot = Snapshot::build(cfg, &self.registry);
        self.snapshot.store(Arc::new(snapshot));
    }
}
