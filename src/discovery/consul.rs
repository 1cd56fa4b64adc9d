//! Consul discovery (SPEC §13.1): one blocking-query loop per service on
//! `/v1/health/service/<upstream>?passing=1&index=<i>&wait=<w>`, with `X-Consul-Token`.
//!
//! When Consul cannot be reached the last known backends keep serving; the loop moves on to the
//! next server in the list and retries with exponential backoff.
//!
//! What a server answers is bounded: the whole answer, head and body, comes within
//! `QUERY_TIMEOUT` and holds at most `MAX_ANSWER_BYTES`, and queries start at most every
//! `MIN_QUERY_INTERVAL` whatever comes back (an index that never moves, or none, made every
//! query return at once, thousands a second). An index is never below 1 after the first answer,
//! as Consul's blocking-query guide asks of clients. The answers every service reads at once
//! hold at most `ANSWERS_TOGETHER_BYTES` together.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::{hosts_for, Outage, Reloader, MAX_BACKENDS};
use crate::config::discovery_conf::{ConsulConfig, DiscoveredService};
use crate::config::values::{parse_server, ServerSpec};
use crate::vocab::error_text::with_causes;

/// How long Consul may hold a blocking query.
const WAIT: &str = "30s";
/// Our own limit on one query: the wait plus Consul's jitter (wait/16) and some slack.
const QUERY_TIMEOUT: Duration = Duration::from_secs(40);
/// The limit on a query that does not block (the first, with no index): Consul answers it at
/// once, and a server that takes connections and says nothing held every service at 503 for
/// the whole `QUERY_TIMEOUT` before the next server was asked.
const FIRST_QUERY_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The largest answer read: a health list of tens of thousands of instances fits.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// What the answers every service reads at once may hold together: each service reads its own
/// at once, and eight services' answers of `MAX_ANSWER_BYTES` held 528 MB.
const ANSWERS_TOGETHER_BYTES: usize = 128 * 1024 * 1024;
/// A permit of the answers' budget is this many bytes.
const BUDGET_UNIT: usize = 1024;
/// The least time from one query's start to the next one's.
const MIN_QUERY_INTERVAL: Duration = Duration::from_millis(250);
/// How much of an error answer's body goes into the log.
const ERROR_BODY_SHOWN: usize = 256;
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

/// The backends of a health answer, and the entries that name none.
#[derive(Debug, Default, PartialEq)]
struct Listed {
    backends: Vec<ServerSpec>,
    skipped: Vec<String>,
}

/// Backends of a health response: `Service.Address` (else `Node.Address`) + `Service.Port`.
/// An entry that does not read (a `Port` out of range or missing) is left out with the others
/// that name no usable backend, not the whole answer: one bad registration froze every update
/// of its service, instances gone kept their traffic.
fn backends_of(body: &[u8]) -> Result<Listed, String> {
    let entries: Vec<serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| format!("unexpected JSON: {e}"))?;
    let mut listed = Listed::default();
    for (i, entry) in entries.into_iter().enumerate() {
        let e = match serde_json::from_value::<Entry>(entry) {
            Ok(e) => e,
            Err(why) => {
                listed.skipped.push(format!("entry {}: {why}", i + 1));
                continue;
            }
        };
        let written = if e.service.address.is_empty() {
            &e.node.address
        } else {
            &e.service.address
        };
        // An IP address in one spelling: `::1` and `0:0:0:0:0:0:0:1` are one backend.
        let canonical = written.parse::<std::net::IpAddr>().map(|ip| ip.to_string());
        let host = canonical.as_ref().unwrap_or(written);
        let entry = if host.contains(':') {
            format!("[{host}]:{}", e.service.port)
        } else {
            format!("{host}:{}", e.service.port)
        };
        match parse_server(&entry) {
            Ok(server) => listed.backends.push(server),
            Err(_) => listed.skipped.push(entry),
        }
    }
    listed.backends.sort_by_key(ToString::to_string);
    listed.backends.dedup();
    Ok(listed)
}

/// `name` as one segment of a URL path: every byte but the unreserved ones percent-encoded, so
/// a `?` or a space in a service's name is asked for as part of it.
fn path_segment(name: &str) -> String {
    let mut segment = String::with_capacity(name.len());
    for byte in name.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                segment.push(char::from(byte))
            }
            other => segment.push_str(&format!("%{other:02X}")),
        }
    }
    segment
}

/// Every service's last known backends, and where they are routed.
struct Known {
    services: Vec<DiscoveredService>,
    backends: BTreeMap<usize, Vec<ServerSpec>>,
}

/// Runs the watch loops until the runtime stops.
pub async fn run(cfg: ConsulConfig, reloader: Arc<Reloader>) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // From the backends last known, as published when the watchers started.
    let known = Arc::new(Mutex::new(Known {
        backends: reloader.seeded("consul", &cfg.services),
        services: cfg.services.clone(),
    }));
    let cfg = Arc::new(cfg);
    let budget = Arc::new(Semaphore::new(ANSWERS_TOGETHER_BYTES / BUDGET_UNIT));
    // A set, not loose tasks: when the settings change this future is aborted, and the set
    // aborts every service's watch with it. Loose ones went on publishing their old view over
    // the new one (an `authorization` just added came and went with each change in Consul).
    let mut watches = tokio::task::JoinSet::new();
    for index in 0..cfg.services.len() {
        let watch = watch_service(
            index,
            cfg.clone(),
            client.clone(),
            known.clone(),
            reloader.clone(),
            budget.clone(),
        );
        watches.spawn(watch);
    }
    while watches.join_next().await.is_some() {}
}

async fn watch_service(
    which: usize,
    cfg: Arc<ConsulConfig>,
    client: HttpClient,
    known: Arc<Mutex<Known>>,
    reloader: Arc<Reloader>,
    budget: Arc<Semaphore>,
) {
    let name = cfg.services[which].upstream.clone();
    let (mut index, mut server, mut backoff) = (0u64, 0usize, BACKOFF_MIN);
    let mut skipped_before = Vec::new();
    let mut outage = Outage::default();
    loop {
        let base = &cfg.servers[server % cfg.servers.len()];
        let started = tokio::time::Instant::now();
        let limit = if index == 0 {
            FIRST_QUERY_TIMEOUT
        } else {
            QUERY_TIMEOUT
        };
        let answer = tokio::time::timeout(
            limit,
            query(&client, base, &name, index, cfg.token.as_deref(), &budget),
        );
        let answer = answer
            .await
            .unwrap_or_else(|_| Err(format!("no whole answer within {limit:?}")))
            .and_then(|(index, listed)| match listed.backends.len() {
                0..=MAX_BACKENDS => Ok((index, listed)),
                more => Err(format!(
                    "the service lists {more} backends, more than {MAX_BACKENDS}"
                )),
            });
        match answer {
            Ok((new_index, listed)) => {
                backoff = BACKOFF_MIN;
                if let Some((failures, lasted)) = outage.ended() {
                    tracing::info!(service = %name, server = %base, "consul: answering again after {failures} failed {} over {lasted:?}; the backends follow it again", if failures == 1 { "query" } else { "queries" });
                }
                // A lower index means Consul's state was reset: start over from 0. Else at
                // least 1: an index of 0 would make every query return at once.
                index = if new_index < index {
                    0
                } else {
                    new_index.max(1)
                };
                if listed.skipped != skipped_before {
                    if let Some(first) = listed.skipped.first() {
                        tracing::warn!(service = %name, server = %base, "consul: {} entries name no usable backend and are left out, first `{first}`", listed.skipped.len());
                    }
                    skipped_before = listed.skipped;
                }
                publish(which, listed.backends, &known, &reloader);
                tokio::time::sleep_until(started + MIN_QUERY_INTERVAL).await;
            }
            Err(reason) => {
                outage.failed();
                reloader.discovery_failed(crate::metrics::Discovery::Consul);
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
    budget: &Semaphore,
) -> Result<(u64, Listed), String> {
    let base_text = base.to_string();
    let base_text = base_text.trim_end_matches('/');
    let service = path_segment(service);
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
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("unreachable: {}", with_causes(&e)))?;
    let status = resp.status();
    let new_index = resp
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Held until the answer is read into backends.
    let (body, _held) = read_within(resp.into_body(), MAX_ANSWER_BYTES, budget).await?;
    match status {
        StatusCode::OK => Ok((new_index, backends_of(&body)?)),
        StatusCode::FORBIDDEN => Err("403: the ACL token was refused (check consul.token)".into()),
        other => Err(format!("answered {other}: {}", shown_error_body(&body))),
    }
}

/// Reads `body` whole, at most `max` bytes, each taken from `budget` (in [`BUDGET_UNIT`]s) and
/// held until the returned permit is dropped. An answer that would pass what is left of the
/// budget fails, and is asked again after the back-off, when the others have let theirs go.
async fn read_within<B>(
    mut body: B,
    max: usize,
    budget: &Semaphore,
) -> Result<(Bytes, SemaphorePermit<'_>), String>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let over_budget = || {
        let mib = (budget.available_permits() * BUDGET_UNIT) >> 20;
        format!(
            "the answers being read at once would pass {} MiB together ({mib} MiB left)",
            ANSWERS_TOGETHER_BYTES >> 20
        )
    };
    let mut held = budget.try_acquire_many(0).map_err(|_| over_budget())?;
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if read.len() + data.len() > max {
            return Err(format!("reading the answer: larger than {} MiB", max >> 20));
        }
        read.extend_from_slice(&data);
        let wanted = read.len().div_ceil(BUDGET_UNIT) as u32;
        let more = wanted.saturating_sub(held.num_permits() as u32);
        if more > 0 {
            held.merge(budget.try_acquire_many(more).map_err(|_| over_budget())?);
        }
    }
    Ok((read.freeze(), held))
}

/// The start of an error answer's body, its control characters escaped: it goes into a log
/// line, where a newline would start a line the server wrote.
fn shown_error_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_SHOWN)]);
    let mut shown: String = text.trim().escape_debug().collect();
    if body.len() > ERROR_BODY_SHOWN {
        shown.push_str("...");
    }
    shown
}

fn publish(which: usize, backends: Vec<ServerSpec>, known: &Mutex<Known>, reloader: &Reloader) {
    let hosts = {
        let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
        if known.backends.get(&which) == Some(&backends) {
            return;
        }
        reloader.remember("consul", &known.services[which].upstream, &backends);
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

    /// Answers read at once share one budget: the second fails while the first holds its
    /// bytes, and is read once they are let go.
    #[tokio::test]
    async fn answers_read_at_once_share_one_budget() {
        let budget = Semaphore::new(5);
        let body = || http_body_util::Full::new(Bytes::from(vec![b' '; 3 * BUDGET_UNIT]));
        let (first, held) = read_within(body(), 4 * BUDGET_UNIT, &budget).await.unwrap();
        assert_eq!((first.len(), held.num_permits()), (3 * BUDGET_UNIT, 3));
        let refused = read_within(body(), 4 * BUDGET_UNIT, &budget).await;
        let said = refused.expect_err("past the budget");
        assert!(said.contains("would pass 128 MiB together"), "{said}");
        assert_eq!(
            budget.available_permits(),
            2,
            "a refused answer lets its part go"
        );
        drop(held);
        let (_, held) = read_within(body(), 4 * BUDGET_UNIT, &budget).await.unwrap();
        assert_eq!(held.num_permits(), 3);
        let said = read_within(body(), 2 * BUDGET_UNIT, &budget)
            .await
            .expect_err("past max");
        assert!(said.contains("larger than"), "{said}");
    }

    #[test]
    fn one_address_in_two_spellings_is_one_backend() {
        let body = br#"[{"Node":{"Address":"n"},"Service":{"Address":"::1","Port":9},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"0:0:0:0:0:0:0:1","Port":9},"Checks":[]}]"#;
        let listed = backends_of(body).unwrap();
        let list: Vec<String> = listed.backends.iter().map(ToString::to_string).collect();
        assert_eq!(list, ["[::1]:9"]);
    }

    #[test]
    fn a_service_name_is_one_path_segment() {
        assert_eq!(path_segment("web-1.v2_x~"), "web-1.v2_x~");
        assert_eq!(path_segment("web?dc=x"), "web%3Fdc%3Dx");
        assert_eq!(path_segment("my service/é"), "my%20service%2F%C3%A9");
    }

    #[test]
    fn reads_the_fixture_shape() {
        let body = br#"[{"Node":{"Address":"10.0.0.1"},"Service":{"Address":"","Port":80},"Checks":[]},
                        {"Node":{"Address":"10.0.0.1"},"Service":{"Address":"10.1.1.1","Port":8080},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"::1","Port":9},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"bad host!!","Port":9},"Checks":[]}]"#;
        let listed = backends_of(body).unwrap();
        let list: Vec<String> = listed.backends.iter().map(ToString::to_string).collect();
        assert_eq!(list, ["10.0.0.1:80", "10.1.1.1:8080", "[::1]:9"]);
        assert_eq!(listed.skipped, ["bad host!!:9"]);
        // One registration that does not read leaves out only itself.
        let body = br#"[{"Node":{"Address":"n"},"Service":{"Address":"10.0.0.1","Port":70000},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"10.0.0.2"},"Checks":[]},
                        {"Node":{"Address":"n"},"Service":{"Address":"10.0.0.3","Port":80},"Checks":[]}]"#;
        let listed = backends_of(body).unwrap();
        let list: Vec<String> = listed.backends.iter().map(ToString::to_string).collect();
        assert_eq!(list, ["10.0.0.3:80"]);
        assert_eq!(listed.skipped.len(), 2, "{:?}", listed.skipped);
        assert!(
            listed.skipped[0].starts_with("entry 1: invalid value: integer `70000`"),
            "{:?}",
            listed.skipped
        );
        assert!(
            listed.skipped[1].starts_with("entry 2: missing field `Port`"),
            "{:?}",
            listed.skipped
        );
        assert!(backends_of(b"{}").is_err());
        assert_eq!(backends_of(b"[]").unwrap(), Listed::default());
    }

    /// A server's error body cannot forge log lines, nor fill the log.
    #[test]
    fn an_error_body_is_shown_short_and_escaped() {
        let forged = b"oops\n2026-12-06T00:00:00Z  INFO configuration applied: FORGED";
        let shown = shown_error_body(forged);
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.starts_with("oops\\n2026"), "{shown}");
        let long = vec![b'x'; 10_000];
        assert_eq!(shown_error_body(&long).len(), ERROR_BODY_SHOWN + 3);
    }
}
