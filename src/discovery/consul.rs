//! Consul discovery (SPEC §13.1): one blocking-query loop per service on
//! `/v1/health/service/<upstream>?passing=1&index=<i>&wait=<w>`, with `X-Consul-Token`.
//!
//! When Consul cannot be reached the last known backends keep serving; the loop moves on to the
//! next server in the list and retries with exponential backoff.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::{hosts_for, Reloader};
use crate::config::discovery_conf::{ConsulConfig, DiscoveredService};
use crate::config::values::{parse_server, ServerSpec};

/// How long Consul may hold a blocking query.
const WAIT: &str = "30s";
/// Our own limit on one query: the wait plus Consul's jitter (wait/16) and some slack.
const QUERY_TIMEOUT: Duration = Duration::from_secs(40);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The part of a health entry we read.
#[derive(serde::Deserialize)]
struct Entry {
    #[serde(rename = "Node")]
    node: NodeInfo,
    #[serde(rename = "Service")]
    service: ServiceInfo,
}

#[derive(serde::Deserialize)]
struct NodeInfo {
    #[serde(rename = "Address", default)]
    address: String,
}

#[derive(serde::Deserialize)]
struct ServiceInfo {
    #[serde(rename = "Address", default)]
    address: String,
    #[serde(rename = "Port")]
    port: u16,
}

/// Backends of a health response: `Service.Address` (else `Node.Address`) + `Service.Port`.
fn backends_of(body: &[u8]) -> Result<Vec<ServerSpec>, String> {
    let entries: Vec<Entry> =
        serde_json::from_slice(body).map_err(|e| format!("unexpected JSON: {e}"))?;
    let mut out: Vec<ServerSpec> = entries
        .iter()
        .filter_map(|e| {
            let host = if e.service.address.is_empty() {
                &e.node.address
            } else {
                &e.service.address
            };
            let entry = if host.contains(':') {
                format!("[{host}]:{}", e.service.port)
            } else {
                format!("{host}:{}", e.service.port)
            };
            parse_server(&entry).ok()
        })
        .collect();
    out.sort_by_key(ToString::to_string);
    out.dedup();
    Ok(out)
}

/// Every service's last known backends, and where they are routed.
struct Known {
    services: Vec<DiscoveredService>,
    backends: BTreeMap<usize, Vec<ServerSpec>>,
}

/// Runs the watch loops until the runtime stops.
pub async fn run(cfg: ConsulConfig, reloader: Arc<Reloader>) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let known = Arc::new(Mutex::new(Known {
        services: cfg.services.clone(),
        backends: BTreeMap::new(),
    }));
    let cfg = Arc::new(cfg);
    let mut tasks = Vec::new();
    for index in 0..cfg.services.len() {
        let watch = watch_service(
            index,
            cfg.clone(),
            client.clone(),
            known.clone(),
            reloader.clone(),
        );
        tasks.push(tokio::spawn(watch));
    }
    for task in tasks {
        let _ = task.await;
    }
}

async fn watch_service(
    which: usize,
    cfg: Arc<ConsulConfig>,
    client: HttpClient,
    known: Arc<Mutex<Known>>,
    reloader: Arc<Reloader>,
) {
    let name = cfg.services[which].upstream.clone();
    let (mut index, mut server, mut backoff) = (0u64, 0usize, BACKOFF_MIN);
    loop {
        let base = &cfg.servers[server % cfg.servers.len()];
        match query(&client, base, &name, index, cfg.token.as_deref()).await {
            Ok((new_index, backends)) => {
                backoff = BACKOFF_MIN;
                // A lower index means Consul's state was reset: start over from 0.
                index = if new_index < index { 0 } else { new_index };
                publish(which, backends, &known, &reloader);
            }
            Err(reason) => {
                tracing::warn!(service = %name, server = %base, "consul: {reason}; keeping the last known backends, retrying in {backoff:?}");
                server += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

async fn query(
    client: &HttpClient,
    base: &Uri,
    service: &str,
    index: u64,
    token: Option<&str>,
) -> Result<(u64, Vec<ServerSpec>), String> {
    let base_text = base.to_string();
    let base_text = base_text.trim_end_matches('/');
    let mut url = format!("{base_text}/v1/health/service/{service}?passing=1");
    if index > 0 {
        url.push_str(&format!("&index={index}&wait={WAIT}"));
    }
    let mut req = Request::get(url.as_str());
    if let Some(token) = token {
        req = req.header("x-consul-token", token);
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| format!("bad request: {e}"))?;
    let resp = tokio::time::timeout(QUERY_TIMEOUT, client.request(req))
        .await
        .map_err(|_| "no answer in time".to_string())?
        .map_err(|e| format!("unreachable: {e}"))?;
    let status = resp.status();
    let new_index = resp
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    match status {
        StatusCode::OK => Ok((new_index, backends_of(&body)?)),
        StatusCode::FORBIDDEN => Err("403: the ACL token was refused (check consul.token)".into()),
        other => Err(format!(
            "answered {other}: {}",
            String::from_utf8_lossy(&body).trim()
        )),
    }
}

fn publish(which: usize, backends: Vec<ServerSpec>, known: &Mutex<Known>, reloader: &Reloader) {
    let hosts = {
        let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
        if known.backends.get(&which) == Some(&backends) {
            return;
        }
        known.backends.insert(which, backends);
        let pairs: Vec<(&DiscoveredService, &[ServerSpec])> = known
            .backends
            .iter()
            .map(|(i, b)| (&known.services[*i], b.as_slice()))
            .collect();
        hosts_for(&pairs)
    };
    reloader.set_discovered("consul", hosts);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fixture_shape() {
        let body = br#"[{"Node":{"Address":"10.0.0.1"},"Service":{"Address":"","Port":80},"Checks":[]},
                        {"Node":{"Address":"10.0.0.1"},"Service":{"Address":"10.1.1.1","Port":8080},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"::1","Port":9},"Checks":[]}]"#;
        let list: Vec<String> = backends_of(body)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(list, ["10.0.0.1:80", "10.1.1.1:8080", "[::1]:9"]);
        assert!(backends_of(b"{}").is_err());
        assert!(backends_of(b"[]").unwrap().is_empty());
    }
}
