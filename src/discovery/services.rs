//! The discovered side of the [`Reloader`]: which Consul and Kubernetes watchers the serving
//! upstreams file asks for, restarting them when its `consul:` or `kubernetes:` changes, the
//! backends last known for each service (so a restart serves them at once), and the hosts a
//! source's services make.

use std::collections::BTreeMap;
use std::sync::Arc;

#[cfg(feature = "kubernetes")]
use super::kubernetes;
use super::{consul, file_watch, merged, Reloader, Sources, Watching};
use crate::config::discovery_conf::{ConsulConfig, DiscoveredService, KubernetesConfig};
use crate::config::upstreams::{HostConfig, PathConfig};
use crate::config::values::ServerSpec;

impl Reloader {
    /// Starts the watchers the serving file config asks for, on `runtime`.
    pub fn start_watchers(self: &Arc<Self>, runtime: tokio::runtime::Handle) {
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        watching.runtime = Some(runtime);
        self.spawn_watchers(&mut watching);
    }

    /// Restarts the watchers when the serving file config's `consul:` or `kubernetes:` differs
    /// from what they follow.
    pub(super) fn follow_discovery_settings(self: &Arc<Self>) {
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        if watching.runtime.is_none() || watching.settings == discovery_settings(self) {
            return;
        }
        for task in watching.tasks.drain(..) {
            task.abort();
        }
        tracing::info!("discovery settings changed: watchers restarted");
        self.spawn_watchers(&mut watching);
    }

    /// Starts the watchers of the serving settings. Their services' routes are published
    /// first, with the backends last known for each (none yet: a 503, not a 404, until the
    /// first answer): a changed section used to take every discovered route away until its
    /// watchers' first answers, for good while Consul was down.
    fn spawn_watchers(self: &Arc<Self>, watching: &mut Watching) {
        let Some(runtime) = watching.runtime.clone() else {
            return;
        };
        watching.settings = discovery_settings(self);
        self.publish_seeds(&watching.settings);
        for watcher in service_watchers(self) {
            watching.tasks.push(runtime.spawn(watcher).abort_handle());
        }
    }

    /// The discovered routes of `settings`' services, from the backends last known for each;
    /// the sources no longer configured lose theirs.
    fn publish_seeds(&self, (consul, k8s): &(Option<ConsulConfig>, Option<KubernetesConfig>)) {
        let mut sources = self.sources();
        let old = merged(&sources);
        let before = sources.discovered.clone();
        sources.discovered.clear();
        let configured = [
            ("consul", consul.as_ref().map(|c| &c.services)),
            ("kubernetes", k8s.as_ref().map(|k| &k.services)),
        ];
        for (source, services) in configured {
            let Some(services) = services else { continue };
            let seeds = seeded_locked(&sources, source, services);
            let pairs: Vec<(&DiscoveredService, &[ServerSpec])> = seeds
                .iter()
                .map(|(i, b)| (&services[*i], b.as_slice()))
                .collect();
            let hosts = hosts_for(&pairs);
            sources.discovered.insert(source.to_string(), hosts);
        }
        if sources.discovered != before {
            self.publish_locked(&sources, old.as_ref(), "discovery settings");
        }
    }

    /// The backends last known for each of `services` (by index) of `source`; an empty list
    /// for a service not known yet.
    pub fn seeded(
        &self,
        source: &str,
        services: &[DiscoveredService],
    ) -> BTreeMap<usize, Vec<ServerSpec>> {
        seeded_locked(&self.sources(), source, services)
    }

    /// Notes the backends `service` of `source` has now.
    pub fn remember(&self, source: &str, service: &str, backends: &[ServerSpec]) {
        let key = (source.to_string(), service.to_string());
        self.sources().found.insert(key, backends.to_vec());
    }

    /// Replaces the hosts a discovery source found, and republishes.
    pub fn set_discovered(&self, source: &str, hosts: Vec<HostConfig>) {
        let mut sources = self.sources();
        if sources.discovered.get(source) == Some(&hosts) {
            return;
        }
        let old = merged(&sources);
        sources.discovered.insert(source.to_string(), hosts);
        self.publish_locked(&sources, old.as_ref(), source);
        self.metrics.config_reload(source, true);
    }
}

fn seeded_locked(
    sources: &Sources,
    source: &str,
    services: &[DiscoveredService],
) -> BTreeMap<usize, Vec<ServerSpec>> {
    let known = |svc: &DiscoveredService| {
        let key = (source.to_string(), svc.upstream.clone());
        sources.found.get(&key).cloned().unwrap_or_default()
    };
    services.iter().map(known).enumerate().collect()
}

/// Starts the control-plane sources: the file watcher, and Consul/Kubernetes watchers when the
/// upstreams file asks for them.
pub fn start(runtime: &tokio::runtime::Runtime, reloader: Arc<Reloader>) {
    if let Some(watch) = file_watch::install(reloader.clone()) {
        runtime.spawn(watch);
    }
    reloader.start_watchers(runtime.handle().clone());
}

/// The discovery settings of the serving file config.
fn discovery_settings(reloader: &Reloader) -> (Option<ConsulConfig>, Option<KubernetesConfig>) {
    let file = reloader.file_config();
    let consul = file.as_ref().and_then(|c| c.consul.clone());
    (consul, file.and_then(|c| c.kubernetes))
}

/// A source of discovered routes, running until its runtime stops.
pub type Watcher = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The Consul and Kubernetes watchers the serving file config asks for (none, one or both).
pub fn service_watchers(reloader: &Arc<Reloader>) -> Vec<Watcher> {
    let mut watchers: Vec<Watcher> = Vec::new();
    if let Some(consul) = reloader.file_config().and_then(|c| c.consul) {
        tracing::info!("consul: watching {} service(s)", consul.services.len());
        watchers.push(Box::pin(consul::run(consul, reloader.clone())));
    }
    if let Some(k8s) = reloader.file_config().and_then(|c| c.kubernetes) {
        kubernetes_watcher(k8s, reloader, &mut watchers);
    }
    watchers
}

#[cfg(feature = "kubernetes")]
fn kubernetes_watcher(
    k8s: KubernetesConfig,
    reloader: &Arc<Reloader>,
    watchers: &mut Vec<Watcher>,
) {
    tracing::info!("kubernetes: watching {} service(s)", k8s.services.len());
    watchers.push(Box::pin(kubernetes::run(k8s, reloader.clone())));
}

/// A binary built without the `kubernetes` feature says so instead of serving nothing quietly.
#[cfg(not(feature = "kubernetes"))]
fn kubernetes_watcher(k8s: KubernetesConfig, _: &Arc<Reloader>, _: &mut Vec<Watcher>) {
    tracing::error!(
        "kubernetes: {} service(s) configured, but this binary was built without the `kubernetes` feature",
        k8s.services.len()
    );
}

/// Hosts for discovered services: each service becomes a path of its host. A service with no
/// healthy instance keeps its path with no backend, so its requests get 503 + Retry-After.
pub fn hosts_for(services: &[(&DiscoveredService, &[ServerSpec])]) -> Vec<HostConfig> {
    let mut hosts: Vec<HostConfig> = Vec::new();
    for (svc, backends) in services {
        let path = PathConfig {
            prefix: svc.path.clone(),
            servers: backends.to_vec(),
            settings: svc.settings.clone(),
        };
        match hosts.iter_mut().find(|h| h.name == svc.hostname) {
            Some(host) => host.paths.push(path),
            None => hosts.push(HostConfig {
                name: svc.hostname.clone(),
                settings: Default::default(),
                paths: vec![path],
            }),
        }
    }
    hosts
}

/// Most backends one discovered service may list: an answer (Consul) or a list (Kubernetes)
/// past it is refused with an error and the last known backends kept. Routes of that many
/// backends are far past what a proxy's balancing serves well, and building them held the
/// control plane.
pub(crate) const MAX_BACKENDS: usize = 10_000;

/// A discovery source's failures since its last answer, for the line that says an outage ended.
#[derive(Default)]
pub(crate) struct Outage(Option<(u32, tokio::time::Instant)>);

impl Outage {
    pub(crate) fn failed(&mut self) {
        let (failures, _) = self.0.get_or_insert((0, tokio::time::Instant::now()));
        *failures = failures.saturating_add(1);
    }

    /// How many queries failed and for how long, if any did before this answer.
    pub(crate) fn ended(&mut self) -> Option<(u32, std::time::Duration)> {
        let (failures, since) = self.0.take()?;
        Some((failures, since.elapsed()))
    }
}
