//! The cache's memory tier: stored responses by key (scheme, host, path and query), each key
//! holding its `Vary` variants; bounded in bytes (quick_cache, S3-FIFO eviction, sharded so a
//! hit takes one shard's read lock). It also owns request coalescing: the first miss for a key
//! fetches, later ones wait for it (bounded) and then look again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};
use tokio::sync::watch;
use tokio::time::Instant;

use super::disk::DiskTier;
use super::remote::{Fetched, RemoteTier};
use super::rules::Storable;
use crate::config::cache_conf::{CacheConfig, Storage};
use crate::vocab::normalise;

/// One stored response.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The request's values of the headers `Vary` names, in `Vary`'s order.
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
    pub shared_with_auth: bool,
    pub stored_at: Instant,
    pub initial_age: Duration,
    pub fresh_for: Duration,
    /// Never served stale (`must-revalidate`, `no-cache`).
    pub must_revalidate: bool,
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
}

impl Entry {
    /// A stored answer with `storable`'s freshness, stored now.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        vary: Vec<(HeaderName, Option<HeaderValue>)>,
        storable: &Storable,
    ) -> Entry {
        Entry {
            status,
            headers,
            body,
            vary,
            shared_with_auth: storable.shared_with_auth,
            stored_at: Instant::now(),
            initial_age: storable.initial_age,
            fresh_for: storable.fresh_for,
            must_revalidate: storable.must_revalidate,
            stale_while_revalidate: storable.stale_while_revalidate,
            stale_if_error: storable.stale_if_error,
        }
    }

    /// How far past its freshness the entry is.
    pub fn staleness(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.stored_at)
            .saturating_sub(self.fresh_for)
    }

    /// May be served while one request refreshes it (RFC 5861 `stale-while-revalidate`).
    pub fn may_serve_while_updating(&self, now: Instant) -> bool {
        !self.must_revalidate && self.staleness(now) <= self.stale_while_revalidate
    }

    /// May be served when the backend fails (RFC 5861 `stale-if-error`, from the stored answer
    /// or the request).
    pub fn may_serve_on_error(&self, now: Instant, asked: Option<Duration>) -> bool {
        let allowance = self.stale_if_error.max(asked.unwrap_or_default());
        !self.must_revalidate && self.staleness(now) <= allowance
    }

    pub fn age(&self, now: Instant) -> Duration {
        self.initial_age + now.saturating_duration_since(self.stored_at)
    }

    pub fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored_at) < self.fresh_for
    }

    /// The request carries the same values of the `Vary` headers as the one stored.
    pub fn matches(&self, req: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| vary_value(req, name) == *value)
    }

    fn weight(&self) -> u64 {
        let head: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 32)
            .sum();
        (self.body.len() + head + 256) as u64
    }
}

/// A request's value of a header `Vary` names: all its fields joined, as one value.
pub fn vary_value(req: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let mut values = req.get_all(name).iter();
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(first.clone());
    };
    let mut joined = first.as_bytes().to_vec();
    for v in std::iter::once(second).chain(values) {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(v.as_bytes());
    }
    HeaderValue::from_bytes(&joined).ok()
}

/// The variants stored under one key.
type Variants = Arc<[Arc<Entry>]>;

#[derive(Clone)]
struct ByBytes;

/// Counts what the memory tier evicts to stay within `mem_size_mb`.
#[derive(Clone)]
struct CountEvictions(Arc<AtomicU64>);

impl Lifecycle<Box<str>, Variants> for CountEvictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _: Box<str>, variants: Variants) {
        self.0.fetch_add(variants.len() as u64, Ordering::Relaxed);
    }
}

impl Weighter<Box<str>, Variants> for ByBytes {
    fn weight(&self, key: &Box<str>, variants: &Variants) -> u64 {
        key.len() as u64 + variants.iter().map(|e| e.weight()).sum::<u64>()
    }
}

/// Counters of the cache, read by `/metrics`.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stored: AtomicU64,
    pub bytes_stored: AtomicU64,
    pub evictions: Arc<AtomicU64>,
    pub purged: AtomicU64,
}

/// The memory tier, shared by every worker and every snapshot (built once at start).
pub struct CacheStore {
    entries: Cache<Box<str>, Variants, ByBytes, DefaultHashBuilder, CountEvictions>,
    in_flight: Mutex<HashMap<Box<str>, watch::Receiver<()>>>,
    /// `hybrid`'s files.
    disk: Option<Arc<DiskTier>>,
    /// `redis://`'s shared tier.
    remote: Option<Arc<RemoteTier>>,
    pub item_max_size: usize,
    pub default_ttl: Duration,
    pub counters: CacheCounters,
}

impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStore")
            .field("entries", &self.entries.len())
            .field("bytes", &self.entries.weight())
            .finish()
    }
}

/// Variants kept under one key at most.
const MAX_VARIANTS: usize = 16;

/// How long a miss waits for another request fetching the same key (nginx's
/// `proxy_cache_lock_timeout` default); then it goes to the backend itself.
pub const COALESCE_WAIT: Duration = Duration::from_secs(5);

impl CacheStore {
    /// The tiers `cfg` asks for; `base_dir` resolves a relative `file_path`, `workers` is how
    /// many connection slots the Redis tier keeps. Fails when the disk tier's directory cannot
    /// be made or read, or the Redis URL cannot be read.
    pub fn new(
        cfg: &CacheConfig,
        base_dir: &std::path::Path,
        workers: usize,
    ) -> std::io::Result<CacheStore> {
        let items = (cfg.mem_size / 4096).clamp(64, 1 << 20) as usize;
        let counters = CacheCounters::default();
        let options = OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(cfg.mem_size)
            .build();
        let lifecycle = CountEvictions(counters.evictions.clone());
        let entries = match options {
            Ok(options) => {
                Cache::with_options(options, ByBytes, DefaultHashBuilder::default(), lifecycle)
            }
            // Only an estimate of zero items is refused, and `items` is at least 64.
            Err(_) => Cache::with(
                items,
                cfg.mem_size,
                ByBytes,
                DefaultHashBuilder::default(),
                lifecycle,
            ),
        };
        let disk = match cfg.storage {
            Storage::Hybrid => Some(DiskTier::open(
                &base_dir.join(&cfg.file_path),
                cfg.file_size,
            )?),
            _ => None,
        };
        let remote = match &cfg.storage {
            Storage::Redis(url) => {
                Some(RemoteTier::new(url, workers).map_err(std::io::Error::other)?)
            }
            _ => None,
        };
        Ok(CacheStore {
            entries,
            in_flight: Mutex::new(HashMap::new()),
            disk,
            remote,
            item_max_size: usize::try_from(cfg.item_max_size).unwrap_or(usize::MAX),
            default_ttl: cfg.ttl,
            counters,
        })
    }

    /// The stored variant that answers a request with `req` headers, fresh or not.
    pub fn find(&self, key: &str, req: &HeaderMap) -> Option<Arc<Entry>> {
        let variants = self.entries.get(key)?;
        let found = variants.iter().find(|e| e.matches(req)).cloned();
        found
    }

    /// The stored variant that answers a request: from memory, else from disk (read on a
    /// blocking thread) or Redis, kept in memory from then on. `Err` when Redis could not be
    /// asked in time (the request then bypasses the cache). `slot` is the worker's.
    pub async fn lookup(
        &self,
        key: &str,
        req: &HeaderMap,
        slot: usize,
    ) -> Result<Option<Arc<Entry>>, Unreachable> {
        if let Some(found) = self.find(key, req) {
            return Ok(Some(found));
        }
        let entries = if let Some(disk) = self.disk.clone().filter(|d| d.has(key)) {
            let owned = key.to_string();
            let read = tokio::task::spawn_blocking(move || disk.read_key(&owned)).await;
            read.unwrap_or_default()
        } else if let Some(remote) = &self.remote {
            match remote.get(slot, key).await {
                Fetched::Found(entries) => entries,
                Fetched::Missing => Vec::new(),
                Fetched::Unreachable => return Err(Unreachable),
            }
        } else {
            Vec::new()
        };
        for entry in entries {
            self.insert_shared(key, Arc::new(entry));
        }
        Ok(self.find(key, req))
    }

    /// Waits for the disk tier's queued writes (SIGTERM), at most `limit`.
    pub fn flush(&self, limit: Duration) {
        if let Some(disk) = &self.disk {
            disk.flush(limit);
        }
    }

    /// Stores `entry` under `key`, replacing the variant with the same `Vary` values.
    pub fn insert(&self, key: &str, entry: Entry, slot: usize) {
        self.insert_arc(key, Arc::new(entry), slot);
    }

    /// [`insert`](Self::insert) for an entry already shared (a revalidated one, being served).
    pub fn insert_arc(&self, key: &str, entry: Arc<Entry>, slot: usize) {
        if let Some(disk) = &self.disk {
            disk.write(key, &entry);
        }
        if let Some(remote) = &self.remote {
            remote.put(slot, key, entry.clone());
        }
        self.counters.stored.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_stored
            .fetch_add(entry.body.len() as u64, Ordering::Relaxed);
        self.insert_shared(key, entry);
    }

    /// Puts an entry in the memory tier only (one read back from disk).
    fn insert_shared(&self, key: &str, entry: Arc<Entry>) {
        let mut variants: Vec<Arc<Entry>> = match self.entries.get(key) {
            Some(old) => old
                .iter()
                .filter(|e| e.vary != entry.vary)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        // A client can make up any number of `Vary` values: the oldest variants give way.
        if variants.len() >= MAX_VARIANTS {
            variants.drain(..=variants.len() - MAX_VARIANTS);
        }
        variants.push(entry);
        self.entries.insert(key.into(), variants.into());
    }

    /// Drops every variant stored under `key`.
    pub fn invalidate(&self, key: &str, slot: usize) {
        self.entries.remove(key);
        if let Some(disk) = &self.disk {
            disk.remove_key(key);
        }
        if let Some(remote) = &self.remote {
            remote.remove_later(slot, key);
        }
    }

    /// Drops every variant stored under `key`, in memory and on disk; returns how many.
    pub async fn purge_key(&self, key: &str) -> usize {
        let in_memory = self.entries.remove(key).map_or(0, |(_, v)| v.len());
        let on_disk = self.disk.as_ref().map_or(0, |d| d.remove_key(key));
        let shared = match &self.remote {
            Some(remote) => remote.remove(remote.admin_slot(), key).await,
            None => 0,
        };
        let removed = in_memory.max(on_disk).max(shared);
        self.counters
            .purged
            .fetch_add(removed as u64, Ordering::Relaxed);
        removed
    }

    /// Drops every entry of `host` (normalised; both schemes) whose path lies under `prefix`
    /// (whole segments); returns how many variants went.
    pub async fn purge_prefix(&self, host: &str, prefix: &str) -> usize {
        let in_memory = AtomicU64::new(0);
        self.entries.retain(|key, variants| {
            let under = key_under(key, host, prefix);
            if under {
                in_memory.fetch_add(variants.len() as u64, Ordering::Relaxed);
            }
            !under
        });
        let in_memory = in_memory.into_inner() as usize;
        let on_disk = self.disk.as_ref().map_or(0, |disk| {
            let keys = disk.keys();
            let under = keys.iter().filter(|k| key_under(k, host, prefix));
            under.map(|k| disk.remove_key(k)).sum()
        });
        let mut shared = 0;
        if let Some(remote) = &self.remote {
            let slot = remote.admin_slot();
            for key in remote.keys(slot).await {
                if key_under(&key, host, prefix) {
                    shared += remote.remove(slot, &key).await;
                }
            }
        }
        let removed = in_memory.max(on_disk).max(shared);
        self.counters
            .purged
            .fetch_add(removed as u64, Ordering::Relaxed);
        removed
    }

    /// The cache's series in Prometheus' text format.
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let series: [(&str, &str, &str, u64); 8] = [
            (
                "aralez_cache_hits_total",
                "counter",
                "answers served from the cache",
                load(&c.hits),
            ),
            (
                "aralez_cache_misses_total",
                "counter",
                "requests the cache sent to a backend",
                load(&c.misses),
            ),
            (
                "aralez_cache_stores_total",
                "counter",
                "answers stored",
                load(&c.stored),
            ),
            (
                "aralez_cache_stored_bytes_total",
                "counter",
                "body bytes stored",
                load(&c.bytes_stored),
            ),
            (
                "aralez_cache_evictions_total",
                "counter",
                "entries evicted to stay within mem_size_mb",
                load(&c.evictions),
            ),
            (
                "aralez_cache_purged_total",
                "counter",
                "entries removed by POST /cache/purge",
                load(&c.purged),
            ),
            (
                "aralez_cache_bytes",
                "gauge",
                "what the tier holds now (bodies and heads)",
                self.entries.weight(),
            ),
            (
                "aralez_cache_entries",
                "gauge",
                "keys held now",
                self.entries.len() as u64,
            ),
        ];
        for (name, kind, help, value) in series {
            let _ = writeln!(out, "# HELP {name} Cache: {help}.\n# TYPE {name} {kind}\n{name}{{tier=\"memory\"}} {value}");
        }
        if let Some(remote) = &self.remote {
            let name = "aralez_cache_errors_total";
            let errors = remote.errors.load(Ordering::Relaxed);
            let _ = writeln!(out, "# HELP {name} Cache: a tier that failed or was too slow (the request went on without it).\n# TYPE {name} counter\n{name}{{tier=\"redis\"}} {errors}");
        }
    }

    /// What the memory tier holds now, in bytes.
    pub fn weight(&self) -> u64 {
        self.entries.weight()
    }

    /// Joins the fetch of `key`: `Lead` when no one is fetching it (the guard ends the fetch
    /// when dropped), `Follow` with what to wait on otherwise.
    pub fn join_flight(self: &Arc<Self>, key: &str) -> Flight {
        let mut map = match self.in_flight.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(rx) = map.get(key) {
            return Flight::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        map.insert(key.into(), rx);
        Flight::Lead(FlightGuard {
            store: self.clone(),
            key: key.into(),
            _done: tx,
        })
    }
}

/// The key (`scheme://host/target`) belongs to `host` and its path lies under `prefix`.
fn key_under(key: &str, host: &str, prefix: &str) -> bool {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let Some(target) = rest.strip_prefix(host).filter(|t| t.starts_with('/')) else {
        return false;
    };
    let path = target.split('?').next().unwrap_or(target);
    normalise::prefix_matches(prefix, path)
}

/// Redis could not be asked in time: the request goes on without the cache.
#[derive(Debug)]
pub struct Unreachable;

/// A request's part in fetching a key.
pub enum Flight {
    Lead(FlightGuard),
    Follow(watch::Receiver<()>),
}

/// Held by the request fetching a key; dropping it (the response stored, or given up) wakes the
/// requests waiting for it.
pub struct FlightGuard {
    store: Arc<CacheStore>,
    key: Box<str>,
    _done: watch::Sender<()>,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut map = match self.store.in_flight.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.remove(&self.key);
        // `_done` drops after this: the waiters see the channel close once the key is free.
    }
}

/// Waits until the fetch that `rx` follows is over, at most `limit`.
pub async fn wait_for(mut rx: watch::Receiver<()>, limit: Duration) {
    // `changed` fails once the sender is dropped, which is the end of the fetch.
    let _ = tokio::time::timeout(limit, async { while rx.changed().await.is_ok() {} }).await;
}
