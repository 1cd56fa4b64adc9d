//! Kubernetes discovery (SPEC §13.2) with kube: each service's `discovery.k8s.io/v1`
//! EndpointSlices (label `kubernetes.io/service-name=<upstream>`) are listed and watched; ready
//! endpoints become backends on the slice's port. kube's watcher relists on 410 Gone; errors
//! back off (doubling to 30 s) and the last known backends keep serving meanwhile. A service's
//! changes are published at most every [`COALESCE`], and a list is bounded ([`MAX_BACKENDS`]).
//! Each of the API server's answers is bounded in size and time, and watches in how often they
//! start ([`super::answer_bounds`]). The token file is read by [`super::bearer_file`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use super::answer_bounds::AnswerBoundsLayer;
use super::bearer_file::BearerFileLayer;
use super::{hosts_for, Outage, Reloader, MAX_BACKENDS};
use crate::config::discovery_conf::{DiscoveredService, KubernetesConfig};
use crate::config::file_bytes::read_regular;
use crate::config::values::{parse_server, ServerSpec};
use crate::vocab::error_text::with_causes;
use crate::vocab::said_every::SaidEvery;

/// Why the Kubernetes client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    #[error("no API server: set kubernetes.servers or KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT_HTTPS")]
    NoServer,
    #[error("`{0}` is not a valid API server address")]
    BadServer(String),
    #[error("cannot build the client: {0}")]
    Client(#[from] kube::Error),
}

/// The API server URL: the first configured one (https:// unless a scheme is given), else the
/// in-cluster environment.
fn cluster_url(cfg: &KubernetesConfig) -> Result<http::Uri, KubeSetupError> {
    let raw = match cfg.servers.first() {
        Some(s) => s.clone(),
        None => {
            let host =
                std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| KubeSetupError::NoServer)?;
            let port =
                std::env::var("KUBERNETES_SERVICE_PORT_HTTPS").unwrap_or_else(|_| "443".into());
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        }
    };
    let with_scheme = if raw.contains("://") {
        raw.clone()
    } else {
        format!("https://{raw}")
    };
    with_scheme
        .parse()
        .map_err(|_| KubeSetupError::BadServer(raw))
}

/// The namespace: configured, else the service account's `namespace` file, else `POD_NAMESPACE`,
/// else `default`.
fn namespace(cfg: &KubernetesConfig, account_dir: &Path) -> String {
    cfg.namespace
        .clone()
        .or_else(|| {
            read_regular(&account_dir.join("namespace"), 4096)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into())
}

/// The client, its namespace, and the API server it asks (named on the watches' lines, as
/// Consul's name theirs).
fn client_for(cfg: &KubernetesConfig) -> Result<(Client, String, Arc<str>), KubeSetupError> {
    let account_dir = Path::new(&cfg.tokenpath)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let url = cluster_url(cfg)?;
    let server = Arc::from(url.to_string());
    let mut config = kube::Config::new(url);
    let ns = namespace(cfg, &account_dir);
    config.default_namespace = ns.clone();
    let ca = account_dir.join("ca.crt");
    if ca.is_file() {
        config.root_cert_file = Some(ca);
    }
    // The token file is read (and read again as it rotates) by a layer of ours, not by kube.
    let token = BearerFileLayer::new(PathBuf::from(&cfg.tokenpath));
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&AnswerBoundsLayer::new())
        .with_layer(&token)
        .build();
    Ok((client, ns, server))
}

/// Ready endpoints of a slice, on its first port. `conditions.ready` absent means ready.
/// The slice's port that carries HTTP: a TCP one (a slice's port without a protocol is TCP),
/// the one named `http` or `https` (or starting so: `http-web`) when there are several, else
/// the first. Slices list their ports in no promised order, so a `metrics` or UDP port listed
/// first got the traffic.
fn http_port(slice: &EndpointSlice) -> Option<i32> {
    let tcp = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
        .filter(|p| p.port.is_some());
    let named_http = |p: &&k8s_openapi::api::discovery::v1::EndpointPort| {
        p.name
            .as_deref()
            .is_some_and(|name| name.starts_with("http"))
    };
    let mut first = None;
    for port in tcp {
        if named_http(&port) {
            return port.port;
        }
        first = first.or(port.port);
    }
    first
}

fn ready_backends(slice: &EndpointSlice) -> Vec<ServerSpec> {
    let Some(port) = http_port(slice) else {
        // Said: its endpoints leave the route (a 503 if they were all it had) for a reason
        // only the slice shows.
        let endpoints = slice.endpoints.iter().flatten().count();
        if endpoints > 0 {
            let name = slice.metadata.name.as_deref().unwrap_or("");
            tracing::warn!("kubernetes: EndpointSlice `{name}` lists no TCP port with a number; its {endpoints} endpoint(s) are left out");
        }
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|addr| {
            let entry = if addr.contains(':') {
                format!("[{addr}]:{port}")
            } else {
                format!("{addr}:{port}")
            };
            match parse_server(&entry) {
                Ok(server) => Some(server),
                Err(_) => {
                    let slice = slice.metadata.name.as_deref().unwrap_or("");
                    tracing::warn!("kubernetes: EndpointSlice `{slice}` names `{entry}`, no usable address; left out");
                    None
                }
            }
        })
        .collect()
}

struct Known {
    services: Vec<DiscoveredService>,
    /// Per service, per slice name: its ready backends.
    slices: BTreeMap<usize, BTreeMap<String, Vec<ServerSpec>>>,
}

/// Runs the watches until the runtime stops.
pub async fn run(cfg: KubernetesConfig, reloader: Arc<Reloader>) {
    let (client, ns, server) = match client_for(&cfg) {
        Ok(made) => made,
        Err(e) => {
            tracing::error!("kubernetes: {e}; discovery is off");
            return;
        }
    };
    // From the backends last known, as published when the watchers started.
    let seeds = reloader.seeded("kubernetes", &cfg.services);
    let known = Arc::new(Mutex::new(Known {
        services: cfg.services.clone(),
        slices: seeds
            .into_iter()
            .map(|(which, backends)| (which, [(String::new(), backends)].into()))
            .collect(),
    }));
    // A set, so that aborting this future (the settings changed) aborts every watch; see
    // `consul::run`.
    let mut watches = tokio::task::JoinSet::new();
    for which in 0..cfg.services.len() {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let tokenpath = Arc::from(Path::new(&cfg.tokenpath));
        watches.spawn(watch_service(
            which,
            (api, server.clone()),
            tokenpath,
            known.clone(),
            reloader.clone(),
        ));
    }
    while watches.join_next().await.is_some() {}
}

/// One service's publishes are at least this far apart: a rolling deploy's burst of slice
/// changes is one rebuild of the routes and one log line, not one per endpoint (Consul's
/// queries are as far apart).
const COALESCE: Duration = Duration::from_millis(250);

/// Most slices one service may list; with [`MAX_BACKENDS`], ready endpoints counted over its
/// slices. A list past either is dropped, the last known backends kept, and listed again after
/// a back-off: an API server that pages on without end held it all in memory.
const MAX_SLICES: usize = 10_000;

/// The wait before watching again after `failures` failures in a row: kube's own back-off
/// starts again whenever its watcher begins a list, which it reports before the list fails.
fn back_off(failures: u32) -> Duration {
    let doubled = Duration::from_millis(500).saturating_mul(1 << failures.min(6));
    doubled.min(Duration::from_secs(30))
}

/// Whether a list being gathered is past what one service may list.
fn too_many(slices: &BTreeMap<String, Vec<ServerSpec>>) -> bool {
    slices.len() > MAX_SLICES || slices.values().map(Vec::len).sum::<usize>() > MAX_BACKENDS
}

async fn watch_service(
    which: usize,
    (api, server): (Api<EndpointSlice>, Arc<str>),
    tokenpath: Arc<Path>,
    known: Arc<Mutex<Known>>,
    reloader: Arc<Reloader>,
) {
    let service = known.lock().unwrap_or_else(|p| p.into_inner()).services[which]
        .upstream
        .clone();
    let config =
        watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
    let start = || {
        watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed()
    };
    let mut events = start();
    let mut slices: BTreeMap<String, Vec<ServerSpec>> = BTreeMap::new();
    let mut relisting: Option<BTreeMap<String, Vec<ServerSpec>>> = None;
    let mut failing = Failing::default();
    let mut publishing = Coalesced::default();
    // A server that answers every watch with 410 is relisted once a second: said once a minute.
    let gone_said = SaidEvery::new(Duration::from_secs(60));
    loop {
        let event = match publishing.due {
            Some(due) => tokio::select! {
                event = events.next() => event,
                () = tokio::time::sleep_until(due) => {
                    publishing.done();
                    publish(which, &slices, &known, &reloader);
                    continue;
                }
            },
            None => events.next().await,
        };
        let Some(event) = event else { break };
        let name_of = |s: &EndpointSlice| s.metadata.name.clone().unwrap_or_default();
        let answered = match event {
            Ok(watcher::Event::Init) => {
                relisting = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(slice)) => {
                let Some(buffer) = relisting.as_mut() else {
                    continue;
                };
                buffer.insert(name_of(&slice), ready_backends(&slice));
                if too_many(buffer) {
                    relisting = None;
                    let wait = failing.failed();
                    reloader.discovery_failed(crate::metrics::Discovery::Kubernetes);
                    tracing::error!(service = %service, server = %server, "kubernetes: the service lists more than {MAX_BACKENDS} backends or {MAX_SLICES} slices; keeping the last known backends, listing again in {wait:?}");
                    tokio::time::sleep(wait).await;
                    events = start();
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                slices = relisting.take().unwrap_or_default();
                true
            }
            Ok(watcher::Event::Apply(slice)) => {
                slices.insert(name_of(&slice), ready_backends(&slice));
                true
            }
            Ok(watcher::Event::Delete(slice)) => {
                slices.remove(&name_of(&slice));
                true
            }
            Err(e) if watch_refused_as_gone(&e) => {
                // kube's watcher retries such a watch from the same, compacted, version for
                // good; a watcher made anew lists first (the fixtures' "or an HTTP 410").
                if let Some(since) = gone_said.due_note(tokio::time::Instant::now()) {
                    tracing::info!(service = %service, server = %server, "kubernetes: the watch's version is gone (410); listing again{since}");
                }
                events = start();
                relisting = None;
                false
            }
            Err(e) => {
                let wait = failing.failed();
                reloader.discovery_failed(crate::metrics::Discovery::Kubernetes);
                tracing::warn!(service = %service, server = %server, "kubernetes: {}; keeping the last known backends, watching again in {wait:?}", describe(&e, &tokenpath));
                tokio::time::sleep(wait).await;
                false
            }
        };
        // A list done, or a change watched: the API server answers again.
        if answered {
            failing.answered(&service, &server);
            publishing.changed();
        }
    }
}

/// One service's failures in a row, for its back-off and the line that says they ended.
#[derive(Default)]
struct Failing {
    outage: Outage,
    in_a_row: u32,
}

impl Failing {
    /// Notes a failure; how long to wait before watching again.
    fn failed(&mut self) -> Duration {
        self.outage.failed();
        self.in_a_row += 1;
        back_off(self.in_a_row)
    }

    /// The API server answered: the back-off starts over, and an outage's end is said.
    fn answered(&mut self, service: &str, server: &str) {
        self.in_a_row = 0;
        if let Some((errors, lasted)) = self.outage.ended() {
            tracing::info!(service = %service, server = %server, "kubernetes: watching again after {errors} failed {} over {lasted:?}; the backends follow it again", if errors == 1 { "try" } else { "tries" });
        }
    }
}

/// When a service's next publish is due: at once after a quiet spell, else [`COALESCE`] after
/// the last one.
#[derive(Default)]
struct Coalesced {
    last: Option<tokio::time::Instant>,
    due: Option<tokio::time::Instant>,
}

impl Coalesced {
    fn changed(&mut self) {
        let now = tokio::time::Instant::now();
        let earliest = self.last.map_or(now, |last| (last + COALESCE).max(now));
        self.due.get_or_insert(earliest);
    }

    fn done(&mut self) {
        self.last = Some(tokio::time::Instant::now());
        self.due = None;
    }
}

/// Whether the API server said 410 Gone, to the watch request itself or as an `ERROR` event in
/// its stream (routine, when etcd compacts): the version was compacted away, and only a new
/// list helps. Not a failure: the event had been warned, counted and waited a second for.
fn watch_refused_as_gone(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        watcher::Error::WatchError(status) => status.code == 410,
        _ => false,
    }
}

/// A watcher error in an operator's words (a 401 says which token file to check, and whether
/// it is there at all).
fn describe(e: &watcher::Error, tokenpath: &Path) -> String {
    let text = with_causes(e);
    if !(text.contains("401") || text.contains("Unauthorized")) {
        return text;
    }
    let file = match std::fs::metadata(tokenpath) {
        Ok(_) => format!("`{}`", tokenpath.display()),
        Err(why) => format!("`{}`, which cannot be read: {why}", tokenpath.display()),
    };
    format!("401 Unauthorized from the API server: check the token at kubernetes.tokenpath, {file} ({text})")
}

fn publish(
    which: usize,
    slices: &BTreeMap<String, Vec<ServerSpec>>,
    known: &Mutex<Known>,
    reloader: &Reloader,
) {
    let hosts = {
        let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
        let mut flat: Vec<ServerSpec> = slices.values().flatten().cloned().collect();
        flat.sort_by_key(ToString::to_string);
        flat.dedup();
        let as_map: BTreeMap<String, Vec<ServerSpec>> = [(String::new(), flat)].into();
        if known.slices.get(&which) == Some(&as_map) {
            return;
        }
        let service = &known.services[which].upstream;
        reloader.remember("kubernetes", service, &as_map[""]);
        known.slices.insert(which, as_map);
        let pairs: Vec<(&DiscoveredService, &[ServerSpec])> = known
            .slices
            .iter()
            .filter_map(|(i, m)| m.get("").map(|b| (&known.services[*i], b.as_slice())))
            .collect();
        hosts_for(&pairs)
    };
    reloader.set_discovered("kubernetes", hosts);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice_with_ports(ports: serde_json::Value) -> EndpointSlice {
        let slice = serde_json::json!({
            "addressType": "IPv4",
            "metadata": { "name": "web-1" },
            "endpoints": [{ "addresses": ["10.0.0.1"] }],
            "ports": ports,
        });
        serde_json::from_value(slice).expect("an EndpointSlice")
    }

    #[test]
    fn the_http_port_is_a_tcp_one_named_http_else_the_first_tcp_one() {
        let cases = [
            (
                serde_json::json!([{ "name": "metrics", "port": 9090 }, { "name": "http", "port": 8080 }]),
                Some(8080),
            ),
            (
                serde_json::json!([{ "name": "dns", "port": 53, "protocol": "UDP" }, { "port": 8080 }]),
                Some(8080),
            ),
            (
                serde_json::json!([{ "name": "grpc", "port": 9000, "protocol": "TCP" }, { "name": "admin", "port": 9001 }]),
                Some(9000),
            ),
            (
                serde_json::json!([{ "name": "http-web", "port": 81 }]),
                Some(81),
            ),
            (serde_json::json!([{ "port": 53, "protocol": "UDP" }]), None),
            (serde_json::json!([]), None),
        ];
        for (ports, want) in cases {
            assert_eq!(http_port(&slice_with_ports(ports.clone())), want, "{ports}");
        }
    }
}
