//! The cache's memory tier: stored responses by key (scheme, host, path and query), each key
//! holding its `Vary` variants; bounded in bytes (quick_cache, S3-FIFO eviction, sharded so a
//! hit takes one shard's read lock). It also owns request coalescing: the first miss for a key
//! fetches, later ones wait for it (bounded) and then look again. A key whose last answer could
//! not be stored is marked for a while ([`UNCACHEABLE_FOR`], Varnish's "hit-for-miss"): its
//! requests go straight to the backend, side by side, without waiting for one another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderMap, HeaderName};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};
use tokio::time::Instant;

use super::disk::DiskTier;
use super::entry::Entry;
use super::remote::{Dropped, Fetched, RemoteTier};
use crate::config::cache_conf::{CacheConfig, Storage};
use crate::vocab::normalise;

mod flight;
pub use flight::{wait_for, Flight, FlightGuard, COALESCE_WAIT};
use flight::{Flights, FLIGHT_SHARDS};

/// What follows a key's target when the client wrote its host otherwise than it is routed:
/// then the host as written (`key_of`).
pub const SPELLED: &str = "\0as ";

/// What memory holds under one key.
#[derive(Clone)]
enum Held {
    /// The variants stored (by their `Vary` values).
    Variants(Arc<[Arc<Entry>]>),
    /// The key's last answer could not be stored; until then, its requests are not coalesced.
    Uncacheable(Instant),
}

impl Held {
    fn variant_count(&self) -> usize {
        match self {
            Held::Variants(v) => v.len(),
            Held::Uncacheable(_) => 0,
        }
    }
}

/// What memory says of a request.
pub enum Found {
    Stored(Arc<Entry>),
    /// The key is marked uncacheable: no entry, and no fetch to wait for.
    Uncacheable,
    /// The key holds answers for other values of the fields their `Vary` names: this request's
    /// values of them, which key its own fetch.
    OtherVariant(String),
    Nothing,
}

/// How long a key whose answer could not be stored stays marked (Varnish's default).
pub const UNCACHEABLE_FOR: Duration = Duration::from_secs(120);

#[derive(Clone)]
struct ByBytes;

/// Counts what the memory tier evicts to stay within `mem_size_mb`.
#[derive(Clone)]
struct CountEvictions(Arc<AtomicU64>);

/// What a purge removed (the most of any one tier: a shared answer is in several), and whether
/// Redis, the shared tier, could not be reached: then the answers kept there, and in the other
/// instances' memory, may still be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub removed: usize,
    pub shared_unreached: bool,
}

/// Drops the keys of the shared tier that `hit`, then publishes `tell_others`; `None` when
/// Redis did not answer a step.
async fn purge_shared(
    remote: &RemoteTier,
    hit: &impl Fn(&str) -> bool,
    tell_others: Option<Dropped>,
) -> Option<usize> {
    let slot = remote.admin_slot();
    let mut removed = 0;
    for key in remote.keys(slot).await? {
        if hit(&key) {
            removed += remote.remove(slot, &key).await?;
        }
    }
    match tell_others {
        Some(dropped) => remote.publish(slot, &dropped).await.then_some(removed),
        None => Some(removed),
    }
}

/// The memory tier's shards: as many as quick_cache's default (four a core), but each large
/// enough for an answer of `item_max` bytes with its head. quick_cache splits the capacity
/// evenly and refuses an item over about 97 % of a shard's: 8 shards of a 4 MB tier never kept
/// an answer over 500 KB, whatever `item_max_size` said.
fn shards_for(mem_size: u64, item_max: u64) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let by_cores = u64::try_from(cores * 4).unwrap_or(u64::MAX);
    let fitting = (mem_size / (item_max + item_max / 4).max(1)).max(1);
    let most = by_cores.min(fitting);
    // The largest power of two not over `most` (quick_cache rounds up).
    let shards = 1u64 << (63 - most.leading_zeros());
    usize::try_from(shards).unwrap_or(1)
}

impl Lifecycle<Box<str>, Held> for CountEvictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _: Box<str>, held: Held) {
        self.0
            .fetch_add(held.variant_count() as u64, Ordering::Relaxed);
    }
}

impl Weighter<Box<str>, Held> for ByBytes {
    fn weight(&self, key: &Box<str>, held: &Held) -> u64 {
        let held = match held {
            Held::Variants(v) => v.iter().map(|e| e.weight()).sum::<u64>(),
            Held::Uncacheable(_) => 64,
        };
        key.len() as u64 + held
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
    entries: Cache<Box<str>, Held, ByBytes, DefaultHashBuilder, CountEvictions>,
    /// Keys being fetched, sharded by the key's hash so misses of different keys rarely meet.
    /// Each shard lists (key hash, what to wait on); two keys that share a 64-bit hash share a
    /// fetch, and the follower, finding nothing for its own key, fetches it itself.
    in_flight: Box<[Mutex<Flights>]>,
    flight_hasher: DefaultHashBuilder,
    /// Held while a key's variants are read, changed and put back, sharded by the key's hash:
    /// two variants of one URL stored at once each put back the list without the other's.
    storing: Box<[Mutex<()>]>,
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

/// One series of `/metrics`: name, type, help, and a value per tier.
type Series<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, u64)>);

/// Variants kept under one key at most.
const MAX_VARIANTS: usize = 16;

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
            .shards(shards_for(cfg.mem_size, cfg.item_max_size))
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
                cfg.flush_interval,
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
            in_flight: (0..FLIGHT_SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            flight_hasher: DefaultHashBuilder::default(),
            storing: (0..FLIGHT_SHARDS).map(|_| Mutex::new(())).collect(),
            disk,
            remote,
            item_max_size: usize::try_from(cfg.item_max_size).unwrap_or(usize::MAX),
            default_ttl: cfg.ttl,
            counters,
        })
    }

    /// The stored variant that answers a request with `req` headers, fresh or not.
    fn find(&self, key: &str, req: &HeaderMap) -> Found {
        match self.entries.get(key) {
            // The newest first (RFC 9111 §4.1: the most recent of the responses selected).
            Some(Held::Variants(variants)) => {
                match variants.iter().rev().find(|e| e.matches(req)) {
                    Some(entry) => Found::Stored(entry.clone()),
                    None => match variants.last() {
                        Some(any) => Found::OtherVariant(any.variant_of(req)),
                        None => Found::Nothing,
                    },
                }
            }
            Some(Held::Uncacheable(until)) if Instant::now() < until => Found::Uncacheable,
            _ => Found::Nothing,
        }
    }

    /// Marks `key` uncacheable for [`UNCACHEABLE_FOR`], unless it holds variants (another
    /// variant's answer may well be storable).
    pub fn mark_uncacheable(&self, key: &str) {
        if self.entries.get(key).is_none() {
            let until = Instant::now() + UNCACHEABLE_FOR;
            self.entries.insert(key.into(), Held::Uncacheable(until));
        }
    }

    /// Drops the mark of `key`: its answer varies now, so the next request keeps what it sent.
    pub fn unmark(&self, key: &str) {
        self.entries
            .remove_if(key, |held| matches!(held, Held::Uncacheable(_)));
    }

    /// The stored variant that answers a request: from memory, else from disk (read on a
    /// blocking thread) or Redis, kept in memory from then on. `Err` when Redis could not be
    /// asked in time (the request then bypasses the cache). `slot` is the worker's.
    ///
    /// Memory answers without awaiting; only a miss with a tier behind it awaits, in a boxed
    /// future, so the request's own future does not carry the lower tiers' (Redis, timers).
    pub async fn lookup(
        &self,
        key: &str,
        req: &HeaderMap,
        slot: usize,
    ) -> Result<Found, Unreachable> {
        let found = self.find(key, req);
        let missed = matches!(found, Found::Nothing | Found::OtherVariant(_));
        if !missed || (self.disk.is_none() && self.remote.is_none()) {
            return Ok(found);
        }
        Box::pin(self.lookup_lower(key, req, slot)).await
    }

    /// [`lookup`](Self::lookup) past memory: disk or Redis.
    async fn lookup_lower(
        &self,
        key: &str,
        req: &HeaderMap,
        slot: usize,
    ) -> Result<Found, Unreachable> {
        let entries = if let Some(disk) = self.disk.clone().filter(|d| d.has(key)) {
            let owned = key.to_string();
            let reader = disk.clone();
            let read = tokio::task::spawn_blocking(move || reader.read_key(&owned)).await;
            let read = read.unwrap_or_default();
            if !read.is_empty() {
                disk.reads.fetch_add(1, Ordering::Relaxed);
            }
            read
        } else if let Some(remote) = &self.remote {
            match remote.get(slot, key).await {
                Fetched::Found(entries) => {
                    remote.reads.fetch_add(1, Ordering::Relaxed);
                    entries
                }
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
        let hash = std::hash::BuildHasher::hash_one(&self.flight_hasher, key);
        let shard = &self.storing[hash as usize % self.storing.len()];
        let _storing = shard.lock().unwrap_or_else(|p| p.into_inner());
        // The variants of another `Vary` go: the newest answer says what the resource varies
        // on, and an older variant selected under the old names was served in its place.
        // In any order (`Accept, Accept-Language` names what `Accept-Language, Accept` does).
        let has = |e: &Entry, name: &HeaderName| e.vary.iter().any(|(n, _)| n == name);
        let same_names = |e: &Entry| {
            e.vary.len() == entry.vary.len() && e.vary.iter().all(|(name, _)| has(&entry, name))
        };
        let mut variants: Vec<Arc<Entry>> = match self.entries.get(key) {
            Some(Held::Variants(old)) => old
                .iter()
                .filter(|e| e.vary != entry.vary && same_names(e))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        // A client can make up any number of `Vary` values: the oldest variants give way.
        if variants.len() >= MAX_VARIANTS {
            variants.drain(..=variants.len() - MAX_VARIANTS);
        }
        variants.push(entry);
        self.entries
            .insert(key.into(), Held::Variants(variants.into()));
    }

    /// Drops every variant stored under `key`.
    pub fn invalidate(&self, key: &str, slot: usize) {
        // A change made under one spelling of the host goes for the routed one's entry too
        // (the other spellings' entries are left to their lifetime: finding them is a scan).
        if let Some((routed, _)) = key.split_once(SPELLED) {
            self.invalidate(routed, slot);
        }
        self.entries.remove(key);
        if let Some(disk) = &self.disk {
            disk.remove_key(key);
        }
        if let Some(remote) = &self.remote {
            remote.remove_later(slot, key);
        }
    }

    /// Drops every variant stored under `key` (a key of the host as routed), and under each
    /// spelling of its host that clients wrote (`site:8080`, `SITE`: keys of their own, see
    /// `key_of`), in memory, on disk and in Redis.
    pub async fn purge_key(&self, key: &str) -> Purged {
        let spelled = format!("{key}{SPELLED}");
        // Each key's removal from Redis tells the other instances itself.
        let of_key = |k: &str| k == key || k.starts_with(&spelled);
        self.purge_where(of_key, None).await
    }

    /// Drops every entry of `host` (normalised; both schemes) whose path lies under `prefix`
    /// (whole segments).
    pub async fn purge_prefix(&self, host: &str, prefix: &str) -> Purged {
        let (host_name, path) = (host.to_string(), prefix.to_string());
        let under = Dropped::Under {
            host: host_name,
            prefix: path,
        };
        let of_prefix = |k: &str| key_under(k, host, prefix);
        self.purge_where(of_prefix, Some(under)).await
    }

    /// Drops the entries whose keys `hit`, from every tier; `tell_others` is published once
    /// the shared tier is done.
    async fn purge_where(
        &self,
        hit: impl Fn(&str) -> bool,
        tell_others: Option<Dropped>,
    ) -> Purged {
        let in_memory = AtomicU64::new(0);
        self.entries.retain(|k, held| {
            let hit = hit(k);
            if hit {
                in_memory.fetch_add(held.variant_count() as u64, Ordering::Relaxed);
            }
            !hit
        });
        let in_memory = in_memory.into_inner() as usize;
        let on_disk = self.disk.as_ref().map_or(0, |disk| {
            let keys = disk.keys();
            keys.iter()
                .filter(|k| hit(k))
                .map(|k| disk.remove_key(k))
                .sum()
        });
        let shared = match &self.remote {
            Some(remote) => purge_shared(remote, &hit, tell_others).await,
            None => Some(0),
        };
        let removed = in_memory.max(on_disk).max(shared.unwrap_or(0));
        self.counters
            .purged
            .fetch_add(removed as u64, Ordering::Relaxed);
        Purged {
            removed,
            shared_unreached: shared.is_none(),
        }
    }

    /// Follows the other instances' drops (through Redis) on `runtime`, dropping the same
    /// from memory; nothing without a Redis tier.
    pub fn follow_drops(self: &Arc<Self>, runtime: &tokio::runtime::Handle) {
        let Some(remote) = self.remote.clone() else {
            return;
        };
        let store = Arc::downgrade(self);
        runtime.spawn(remote.listen(move |dropped| {
            if let Some(store) = store.upgrade() {
                store.drop_from_memory(&dropped);
            }
        }));
    }

    fn drop_from_memory(&self, dropped: &Dropped) {
        match dropped {
            Dropped::Key(key) => {
                self.entries.remove(key.as_str());
            }
            Dropped::Under { host, prefix } => {
                self.entries.retain(|key, _| !key_under(key, host, prefix));
            }
            Dropped::All => self.entries.clear(),
        }
    }

    /// The cache's series in Prometheus' text format, a `tier` label on each.
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let disk = self.disk.as_deref();
        let remote = self.remote.as_deref();
        let lower = |d: Option<u64>, r: Option<u64>| {
            let mut tiers = Vec::new();
            tiers.extend(d.map(|v| ("disk", v)));
            tiers.extend(r.map(|v| ("redis", v)));
            tiers
        };
        let with_memory = |v: u64, more: Vec<(&'static str, u64)>| {
            let mut tiers = vec![("memory", v)];
            tiers.extend(more);
            tiers
        };
        let series: Vec<Series> = vec![
            (
                "aralez_cache_hits_total",
                "counter",
                "answers served from memory; for disk and redis, entries read back from them",
                with_memory(
                    load(&c.hits),
                    lower(disk.map(|d| load(&d.reads)), remote.map(|r| load(&r.reads))),
                ),
            ),
            (
                "aralez_cache_misses_total",
                "counter",
                "requests the cache sent to a backend",
                with_memory(load(&c.misses), Vec::new()),
            ),
            (
                "aralez_cache_stores_total",
                "counter",
                "answers stored",
                with_memory(load(&c.stored), Vec::new()),
            ),
            (
                "aralez_cache_stored_bytes_total",
                "counter",
                "body bytes stored",
                with_memory(load(&c.bytes_stored), Vec::new()),
            ),
            (
                "aralez_cache_evictions_total",
                "counter",
                "entries evicted to stay within the tier's size",
                with_memory(
                    load(&c.evictions),
                    lower(disk.map(|d| load(&d.evictions)), None),
                ),
            ),
            (
                "aralez_cache_purged_total",
                "counter",
                "entries removed by POST /cache/purge",
                with_memory(load(&c.purged), Vec::new()),
            ),
            (
                "aralez_cache_bytes",
                "gauge",
                "what the tier holds now",
                with_memory(
                    self.entries.weight(),
                    lower(disk.map(DiskTier::bytes), None),
                ),
            ),
            (
                "aralez_cache_entries",
                "gauge",
                "keys held in memory now",
                with_memory(self.entries.len() as u64, Vec::new()),
            ),
            (
                "aralez_cache_errors_total",
                "counter",
                "a tier that failed or was too slow (the request went on without it)",
                lower(None, remote.map(RemoteTier::errors)),
            ),
        ];
        for (name, kind, help, tiers) in series {
            if tiers.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {name} Cache: {help}.\n# TYPE {name} {kind}");
            for (tier, value) in tiers {
                let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {value}");
            }
        }
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
