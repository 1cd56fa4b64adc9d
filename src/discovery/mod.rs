//! Sources of configuration change. Every change goes the same way: parse -> validate -> compile
//! into an immutable [`Snapshot`] -> one `ArcSwap` store. A rejected change logs why, with file
//! and line, and leaves the serving snapshot in place.
//!
//! Sources: the upstreams file and conf.d (watched, and on SIGHUP), the admin API (`POST /conf`),
//! Consul and Kubernetes. Discovered routes are merged with the file's; the file wins on conflict.

#[cfg(feature = "kubernetes")]
mod answer_bounds;
#[cfg(feature = "kubernetes")]
mod bearer_file;
pub mod consul;
mod diff;
pub mod file_watch;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
mod open_writes;
mod services;
mod watch_paths;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

pub use services::{hosts_for, service_watchers, start, Watcher};
pub(crate) use services::{Outage, MAX_BACKENDS};

use crate::config::discovery_conf::{ConsulConfig, KubernetesConfig};
use crate::config::upstreams::HostConfig;
use crate::config::values::ServerSpec;
use crate::config::{self, Issues, UpstreamsConfig};
use crate::layers::PolicyState;
use crate::metrics::Metrics;
use crate::routing::Snapshot;
use crate::upstream::Registry;

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// A new snapshot is serving.
    Changed,
    /// The content was the same as what is serving; nothing was swapped.
    Unchanged,
}

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the configuration has errors")]
    Invalid(Issues),
    #[error("cannot save {path}: {source}")]
    Save {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Routes the process serves, by source, before merging.
#[derive(Default)]
struct Sources {
    /// The last valid file (or API) config.
    file: Option<UpstreamsConfig>,
    /// Digest of the files' bytes behind `file`, to skip reloading identical content.
    file_digest: u64,
    /// `file` came from `POST /conf` without `save`: the files on disk say something else, and
    /// a SIGHUP makes them serve again (the watcher still skips files left as they were).
    unsaved_api_config: bool,
    /// Digest of the files' bytes last rejected: the watcher's second look at the same bytes
    /// (it looks again after a burst of events) is not a second rejection.
    rejected_digest: Option<u64>,
    /// SHA-256 of the text behind `file` when it came through `POST /conf` (what a cluster
    /// master compares with what it pushed).
    text_digest: Option<String>,
    /// The text of upstreams.yaml behind `file` when it came from the files (what a cluster
    /// master passes on: the bytes it applied, not the file as it is later).
    file_text: Option<Arc<str>>,
    /// Hosts found by each discovery source (`consul`, `kubernetes`).
    discovered: BTreeMap<String, Vec<HostConfig>>,
    /// The backends each discovered service last had, by source and service name: watchers
    /// started anew (their section changed) begin from them ([`Reloader::seeded`]).
    found: BTreeMap<(String, String), Vec<ServerSpec>>,
}

/// Builds and publishes snapshots. Used only off the request path.
pub struct Reloader {
    pub upstreams_path: PathBuf,
    pub registry: Registry,
    /// What every compiled snapshot's policies share (keys, limiter tables).
    pub policy_state: Arc<PolicyState>,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    sources: Mutex<Sources>,
    /// Held from reading or saving a configuration until it is installed, so the one installed
    /// last is the one on disk: two `POST /conf?save` at once could each save, and the first
    /// saved install last, for good (the file and what served stayed apart).
    applying: Mutex<()>,
    /// The Consul and Kubernetes watchers running, and the settings they follow.
    watching: Mutex<Watching>,
    /// What of main.yaml the checks across both files need ([`Reloader::know_main`]).
    main_facts: std::sync::OnceLock<config::across::MainFacts>,
}

/// The discovery watchers running ([`start`]): restarted when a new file config changes their
/// settings, so a reload or `POST /conf` that changes `consul:` or `kubernetes:` takes effect
/// (it was dropped silently: the old services kept being watched and routed).
#[derive(Default)]
struct Watching {
    /// Where the watchers run; `None` until [`start`] (check-config, tests of the reloader).
    runtime: Option<tokio::runtime::Handle>,
    settings: (Option<ConsulConfig>, Option<KubernetesConfig>),
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Reloader {
    /// Counts a failed query, list or watch of `registry` (its last known backends serve on).
    pub fn discovery_failed(&self, registry: crate::metrics::Discovery) {
        self.metrics.discovery_failed(registry);
    }

    pub fn new(
        upstreams_path: PathBuf,
        registry: Registry,
        policy_state: Arc<PolicyState>,
        metrics: Arc<Metrics>,
    ) -> Reloader {
        Reloader {
            upstreams_path,
            registry,
            policy_state,
            snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::default())),
            metrics,
            sources: Mutex::new(Sources::default()),
            applying: Mutex::new(()),
            watching: Mutex::new(Watching::default()),
            main_facts: std::sync::OnceLock::new(),
        }
    }

    /// Checks each new upstreams configuration against `main` too, as check-config and the
    /// start do.
    pub fn know_main(&self, main: &config::MainConfig) {
        let _ = self.main_facts.set(config::across::MainFacts::of(main));
    }

    /// The checks across main.yaml and `cfg`, when main.yaml is known.
    fn check_across(&self, cfg: &UpstreamsConfig, issues: &mut Issues) {
        if let Some(main) = self.main_facts.get() {
            config::across::check_with(*main, cfg, issues);
        }
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What identifies the configuration serving: the SHA-256 of the text `POST /conf` gave
    /// (as [`text_digest`]), else `file:` and the digest of the files.
    pub fn config_digest(&self) -> String {
        let sources = self.sources();
        match &sources.text_digest {
            Some(digest) => digest.clone(),
            None => format!("file:{:016x}", sources.file_digest),
        }
    }

    /// upstreams.yaml's text, when the files still hash to `digest` (the bytes just parsed;
    /// a write landing in between leaves it unknown).
    fn text_behind(&self, digest: u64) -> Option<Arc<str>> {
        let bytes =
            config::file_bytes::read_regular(&self.upstreams_path, config::yaml::MAX_FILE_BYTES)
                .ok()?;
        let text = String::from_utf8(bytes).ok()?;
        (config::files_digest(&self.upstreams_path) == digest).then(|| Arc::from(text))
    }

    /// The text of upstreams.yaml behind the configuration serving, when it came from the files.
    pub fn applied_file_text(&self) -> Option<Arc<str>> {
        let sources = self.sources();
        sources
            .text_digest
            .is_none()
            .then(|| sources.file_text.clone())
            .flatten()
    }

    /// The file config currently serving (for consul/kubernetes settings and status pages).
    pub fn file_config(&self) -> Option<UpstreamsConfig> {
        self.sources().file.clone()
    }

    /// Whether the files' configuration serving has any host.
    pub fn serves_file_routes(&self) -> bool {
        self.sources()
            .file
            .as_ref()
            .is_some_and(|c| !c.hosts.is_empty())
    }

    /// An empty list of issues for reading a configuration this process would serve.
    fn issues(&self) -> Issues {
        Issues {
            no_master_secret: !self.policy_state.keys.has_jwt_master(),
            ..Issues::default()
        }
    }

    /// Reads the upstreams file (and conf.d) and publishes it unless it is unchanged.
    pub fn reload_files(self: &Arc<Self>, source: &str) -> Result<Applied, Issues> {
        let _applying = self.applying.lock().unwrap_or_else(|p| p.into_inner());
        let digest = config::files_digest(&self.upstreams_path);
        let unchanged = {
            let sources = self.sources();
            let asked = source == "SIGHUP" && sources.unsaved_api_config;
            sources.file.is_some() && sources.file_digest == digest && !asked
        };
        if unchanged {
            // Said where an operator asked for the reload; the watcher's own are routine.
            if source == "SIGHUP" {
                tracing::info!(source, "configuration files unchanged; nothing to reload");
            } else {
                tracing::debug!(source, "configuration files unchanged; nothing to reload");
            }
            return Ok(Applied::Unchanged);
        }
        if source != "SIGHUP" && self.sources().rejected_digest == Some(digest) {
            tracing::debug!(
                source,
                "configuration files as last rejected; nothing to reload"
            );
            return Ok(Applied::Unchanged);
        }
        let mut issues = self.issues();
        // The digest kept is that of the bytes parsed, not the one above: a write landing
        // between the two must not leave one file's digest beside another's routes (the
        // write after it, if it brought the digest back, would then be skipped as unchanged).
        let loaded = config::load_upstreams_digested(&self.upstreams_path, &mut issues);
        if let Some((cfg, _)) = &loaded {
            self.refuse_blanked(cfg, &mut issues);
            self.check_across(cfg, &mut issues);
        }
        match loaded {
            Some((cfg, digest)) if !issues.has_errors() => {
                for warning in issues.warnings() {
                    tracing::warn!(source, "{warning}");
                }
                let text = self.text_behind(digest);
                self.install_file_config(cfg, digest, source);
                self.sources().file_text = text;
                self.metrics.config_reload(metric_source(source), true);
                self.follow_discovery_settings();
                Ok(Applied::Changed)
            }
            _ => {
                self.sources().rejected_digest = Some(digest);
                self.metrics.config_reload(metric_source(source), false);
                for error in issues.errors() {
                    tracing::error!(
                        source,
                        "reload rejected, previous configuration kept: {error}"
                    );
                }
                Err(issues)
            }
        }
    }

    /// An upstreams file emptied (a failed template render, a full disk) would take every route
    /// away at once: refused, as the admin API refuses an empty body. So is one that routes
    /// nothing otherwise (a leftover `foo.com: ~`, a bare `{}`): `upstreams: {}` says it is meant.
    /// An upstreams.yaml emptied while conf.d still routes is refused too: its own hosts would
    /// go (truncate-then-write edits left them 404 for a moment).
    fn refuse_blanked(&self, cfg: &UpstreamsConfig, issues: &mut Issues) {
        let text =
            config::file_bytes::read_regular(&self.upstreams_path, config::yaml::MAX_FILE_BYTES)
                .unwrap_or_default();
        let emptied = config::is_blank_text(&text) && self.applied_file_had_content();
        if !emptied && !self.would_route_nothing(cfg) {
            return;
        }
        let why = if config::is_blank_text(&text) {
            "the file is empty; the running routes are kept (to remove every route, write `upstreams: {}`)"
        } else if config::says_no_routes(&text) {
            return;
        } else {
            "the file routes nothing (no host with paths); the running routes are kept (to remove every route, write `upstreams: {}`)"
        };
        let file: Arc<str> = self.upstreams_path.display().to_string().into();
        let start = crate::config::yaml::Pos { line: 1, column: 1 };
        issues.push(config::Severity::Error, &file, start, "(file)", why.into());
    }

    /// The upstreams.yaml behind the routes serving said something: not blank, and not
    /// `upstreams: {}` (emptying that loses nothing, and refusing it held every conf.d change
    /// back behind it).
    fn applied_file_had_content(&self) -> bool {
        let sources = self.sources();
        let text = sources.file_text.as_deref().map(str::as_bytes);
        text.is_some_and(|t| !config::is_blank_text(t) && !config::says_no_routes(t))
    }

    /// `cfg` has no host and watches no discovery while routes of the files serve.
    fn would_route_nothing(&self, cfg: &UpstreamsConfig) -> bool {
        cfg.hosts.is_empty()
            && cfg.consul.is_none()
            && cfg.kubernetes.is_none()
            && self.serves_file_routes()
    }

    /// A body handed over in memory (admin API) refused before it could be read as YAML (empty,
    /// not UTF-8): logged and counted as a refused one is.
    pub fn refuse_text(&self, why: &str) {
        self.metrics.config_reload("api", false);
        tracing::error!(
            source = "POST /conf",
            "configuration rejected, nothing changed: {why}"
        );
    }

    /// Validates upstreams YAML handed over in memory (admin API) and publishes it; with `save`
    /// the file is replaced atomically first (temp file + rename). The warnings, as a reload of
    /// the file logs them (they are logged too; so is a refusal).
    pub fn apply_text(
        self: &Arc<Self>,
        text: &str,
        save: bool,
    ) -> Result<Vec<String>, ReloadError> {
        let mut issues = self.issues();
        let origin = "POST /conf";
        let parsed =
            config::parse_upstreams_text_beside(text, origin, &self.upstreams_path, &mut issues);
        if let Some(cfg) = &parsed {
            self.check_across(cfg, &mut issues);
            if self.would_route_nothing(cfg) && !config::says_no_routes(text.as_bytes()) {
                let why = "the body routes nothing (no host with paths); nothing changed (to remove every route, send `upstreams: {}`)";
                let start = crate::config::yaml::Pos { line: 1, column: 1 };
                issues.push(
                    config::Severity::Error,
                    &Arc::from(origin),
                    start,
                    "(body)",
                    why.into(),
                );
            }
        }
        let cfg = match parsed {
            Some(cfg) if !issues.has_errors() => cfg,
            _ => {
                self.metrics.config_reload("api", false);
                for error in issues.errors() {
                    tracing::error!(
                        source = origin,
                        "configuration rejected, nothing changed: {error}"
                    );
                }
                return Err(ReloadError::Invalid(issues));
            }
        };
        let warnings: Vec<String> = issues.warnings().map(ToString::to_string).collect();
        for warning in &warnings {
            tracing::warn!(source = origin, "{warning}");
        }
        let _applying = self.applying.lock().unwrap_or_else(|p| p.into_inner());
        let mut digest = self.sources().file_digest;
        if save {
            save_atomically(&self.upstreams_path, text.as_bytes()).map_err(|source| {
                let failed = ReloadError::Save {
                    path: self.upstreams_path.clone(),
                    source,
                };
                self.metrics.config_reload("api", false);
                tracing::error!(source = origin, "configuration not applied: {failed}");
                failed
            })?;
            // The watcher will see the rename; the same digest makes it a no-op.
            digest = config::files_digest(&self.upstreams_path);
        }
        self.install_file_config(cfg, digest, origin);
        // Not saved, the files no longer say what serves: the next SIGHUP loads them again, as
        // nginx's HUP makes the running config the files' (it said "unchanged").
        let mut sources = self.sources();
        sources.text_digest = Some(text_digest(text));
        sources.unsaved_api_config = !save;
        drop(sources);
        self.metrics.config_reload("api", true);
        self.follow_discovery_settings();
        Ok(warnings)
    }

    /// Makes `cfg` the file config and publishes the merge.
    pub fn install_file_config(&self, cfg: UpstreamsConfig, digest: u64, source: &str) {
        let mut sources = self.sources();
        let old = merged(&sources);
        sources.file = Some(cfg);
        sources.file_digest = digest;
        sources.text_digest = None;
        sources.unsaved_api_config = false;
        // Bytes rejected before and written again later are a new mistake, said again.
        sources.rejected_digest = None;
        self.publish_locked(&sources, old.as_ref(), source);
    }

    fn publish_locked(&self, sources: &Sources, old: Option<&UpstreamsConfig>, source: &str) {
        let Some(new) = merged(sources) else { return };
        let snapshot = Snapshot::build(&new, &self.registry, &self.policy_state);
        self.snapshot.store(Arc::new(snapshot));
        match old {
            Some(old) => tracing::info!(
                source,
                "configuration applied: {}",
                diff::describe(old, &new)
            ),
            None => tracing::info!(source, "configuration loaded: {} host(s)", new.hosts.len()),
        }
    }
}

/// The file config with discovered hosts and paths added where the file has none.
fn merged(sources: &Sources) -> Option<UpstreamsConfig> {
    let mut cfg = sources.file.clone()?;
    for hosts in sources.discovered.values() {
        for host in hosts {
            match cfg.hosts.iter_mut().find(|h| h.name == host.name) {
                Some(existing) => {
                    for path in &host.paths {
                        if !existing.paths.iter().any(|p| p.prefix == path.prefix) {
                            existing.paths.push(path.clone());
                        }
                    }
                }
                None => cfg.hosts.push(host.clone()),
            }
        }
    }
    Some(cfg)
}

/// The `source` label of `aralez_config_reloads_total`: a short, bounded set of values.
fn metric_source(source: &str) -> &'static str {
    match source {
        "SIGHUP" => "signal",
        "file watch" => "file",
        _ => "other",
    }
}

/// The SHA-256 of a configuration's text, in hex.
pub fn text_digest(text: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so a reader (the
/// watcher, a reload) never sees half a file. A symbolic link is followed: its target is
/// replaced, the link stays. The file keeps its permissions (upstreams.yaml may hold
/// passwords and keys, and a `chmod 600` must survive a save); a new one gets the usual mode.
/// Gives the new copy of a saved file the owner and group of the one it replaces: saved by
/// root, an operator's file became root's, and its owner could no longer edit it. A process
/// that may not (it runs as another user) says whose the file becomes.
fn keep_owner(file: &std::fs::File, old: &std::fs::Metadata, path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (uid, gid) = (old.uid(), old.gid());
    let made = file.metadata().map(|m| (m.uid(), m.gid()));
    if made.is_ok_and(|made| made == (uid, gid)) {
        return;
    }
    if let Err(e) = std::os::unix::fs::fchown(file, Some(uid), Some(gid)) {
        let me = nix::unistd::geteuid();
        tracing::warn!(
            "saving {}: cannot keep its owner (uid {uid}, gid {gid}): {e}; it becomes uid {me}'s",
            path.display()
        );
    }
}

fn save_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("upstreams.yaml");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut file = std::fs::File::create(&tmp)?;
    if let Ok(old) = std::fs::metadata(&path) {
        keep_owner(&file, &old, &path);
        file.set_permissions(old.permissions())?;
    }
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)
}
