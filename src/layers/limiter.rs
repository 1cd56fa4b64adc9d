//! The shared state behind `rate_limit` and `x4xx_limit`: a sharded table of per-client counters.
//!
//! One table serves every worker thread, so a limit holds for the whole process (never per
//! thread). The table is split into [`SHARDS`] shards, each behind its own mutex, so the hot path
//! takes one short, rarely contended lock and never a global one. Memory is bounded: a shard keeps
//! at most [`MAX_PER_SHARD`] entries; a full shard first drops idle entries (which are equivalent
//! to no entry at all), then, if every entry is active, an arbitrary eighth of them.
//!
//! Counting uses GCRA (the generic cell rate algorithm): one timestamp per key, the "theoretical
//! arrival time", gives a rate of `n` per second with a burst of `n`. Time comes from tokio, so
//! tests run on a paused clock.
//!
//! Keys are 64-bit hashes of (client IP, limit scope) under a per-process random seed; two clients
//! sharing a bucket would need a 64-bit collision.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Number of shards (a power of two).
pub const SHARDS: usize = 64;
/// Entries a shard keeps before it evicts.
pub const MAX_PER_SHARD: usize = 2048;
/// Most entries a table ever holds.
pub const MAX_ENTRIES: usize = SHARDS * MAX_PER_SHARD;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A compiled limit: `per_second` events per second with a burst of the same size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    /// Time one event "costs", in nanoseconds.
    emission_ns: u64,
    /// How far ahead of now the theoretical arrival time may run (the burst).
    tolerance_ns: u64,
}

impl Rate {
    /// `None` for 0 (which means "no limit").
    pub fn per_second(n: u32) -> Option<Rate> {
        if n == 0 {
            return None;
        }
        let emission_ns = NANOS_PER_SEC / u64::from(n);
        Some(Rate {
            per_second: n,
            emission_ns,
            tolerance_ns: emission_ns * (u64::from(n) - 1),
        })
    }

    /// Time one event costs (ns).
    pub fn emission_ns(self) -> u64 {
        self.emission_ns
    }

    /// How far ahead of now the arrival time may run (ns): the burst less one event.
    pub fn tolerance_ns(self) -> u64 {
        self.tolerance_ns
    }

    /// Charges one event against `tat` at `now`; `None` when over the limit (nothing charged).
    fn charge(self, tat: u64, now: u64) -> Option<u64> {
        let tat = tat.max(now);
        (tat - now <= self.tolerance_ns).then_some(tat + self.emission_ns)
    }
}

/// What a table stores per key.
pub trait Slot: Copy {
    /// True when the entry says nothing a missing entry would not (safe to evict).
    fn is_idle(&self, now: u64) -> bool;
}

/// Identity hasher: keys are already uniformly distributed 64-bit hashes.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Shard<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// A bounded, sharded map from client key to counter state.
pub struct Table<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    seed: ahash::RandomState,
    epoch: Instant,
}

impl<V> std::fmt::Debug for Table<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("limiter::Table")
    }
}

impl<V: Slot> Default for Table<V> {
    fn default() -> Self {
        Table::new()
    }
}

impl<V: Slot> Table<V> {
    pub fn new() -> Table<V> {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            seed: ahash::RandomState::new(),
            epoch: Instant::now(),
        }
    }

    /// The key of `parts` (client IP and limit scope) in this table.
    pub fn key(&self, parts: impl Hash) -> u64 {
        self.seed.hash_one(parts)
    }

    /// Nanoseconds since the table was made, on tokio's clock.
    pub fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Shard<V>> {
        // Bits neither hashbrown's bucket index (low bits) nor its tag (top 7 bits) use.
        let index = (key >> 40) as usize & (SHARDS - 1);
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The entry for `key`, if any.
    pub fn get(&self, key: u64) -> Option<V> {
        self.shard(key).get(&key).copied()
    }

    /// Reads and replaces the entry for `key` in one critical section: `f` gets the current value
    /// and returns the new one (`None` removes it) and a result.
    pub fn update<R>(&self, key: u64, now: u64, f: impl FnOnce(Option<V>) -> (Option<V>, R)) -> R {
        let mut shard = self.shard(key);
        let (new, result) = f(shard.get(&key).copied());
        match new {
            Some(value) => {
                if shard.len() >= MAX_PER_SHARD && !shard.contains_key(&key) {
                    evict(&mut shard, now);
                }
                shard.insert(key, value);
            }
            None => {
                shard.remove(&key);
            }
        }
        result
    }

    /// Entries held (for tests and status pages).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the tables' slots take (an upper bound of the heap they use).
    pub fn allocated_bytes(&self) -> usize {
        let per_slot = std::mem::size_of::<(u64, V)>() + 1;
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).capacity() * per_slot)
            .sum()
    }
}

fn evict<V: Slot>(shard: &mut Shard<V>, now: u64) {
    shard.retain(|_, v| !v.is_idle(now));
    if shard.len() >= MAX_PER_SHARD {
        // Every entry is active (a flood of clients): drop an arbitrary eighth so the next sweeps
        // are rare. Those clients start with a fresh budget.
        let mut dropped = 0;
        shard.retain(|_, _| {
            dropped += 1;
            dropped > MAX_PER_SHARD / 8
        });
    }
}

/// `rate_limit` state: the theoretical arrival time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tat(u64);

impl Slot for Tat {
    fn is_idle(&self, now: u64) -> bool {
        self.0 <= now
    }
}

impl Table<Tat> {
    /// Counts one request; false when it is over `rate`.
    pub fn admit(&self, key: u64, rate: Rate) -> bool {
        let now = self.now();
        self.update(key, now, |slot| {
            match rate.charge(slot.map_or(now, |t| t.0), now) {
                Some(tat) => (Some(Tat(tat)), true),
                None => (slot, false),
            }
        })
    }
}

/// `x4xx_limit` state: 4xx responses counted like requests, and a block that lasts until the
/// client has been quiet for [`QUIET`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strikes {
    tat: u64,
    blocked_until: u64,
}

/// How long a blocked client must send nothing before it is let through again.
pub const QUIET: Duration = Duration::from_secs(1);

impl Slot for Strikes {
    fn is_idle(&self, now: u64) -> bool {
        self.tat <= now && self.blocked_until <= now
    }
}

impl Table<Strikes> {
    /// False while the client is blocked; each refused request pushes the end of the block out.
    pub fn admit_4xx(&self, key: u64) -> bool {
        let now = self.now();
        match self.get(key) {
            Some(s) if s.blocked_until > now => {}
            _ => return true,
        }
        let quiet = QUIET.as_nanos() as u64;
        self.update(key, now, |slot| match slot {
            Some(s) if s.blocked_until > now => (
                Some(Strikes {
                    blocked_until: now + quiet,
                    ..s
                }),
                false,
            ),
            other => (other, true),
        })
    }

    /// Blocks the client for `span` (another instance saw it go over its 4xx limit).
    pub fn block(&self, key: u64, span: Duration) {
        let now = self.now();
        let until = now.saturating_add(span.as_nanos() as u64);
        self.update(key, now, |slot| {
            let s = slot.unwrap_or(Strikes {
                tat: now,
                blocked_until: 0,
            });
            let blocked_until = s.blocked_until.max(until);
            (Some(Strikes { blocked_until, ..s }), ())
        });
    }

    /// Records a 4xx response; over `rate`, the client is blocked.
    pub fn record_4xx(&self, key: u64, rate: Rate) {
        let now = self.now();
        let quiet = QUIET.as_nanos() as u64;
        self.update(key, now, |slot| {
            let s = slot.unwrap_or(Strikes {
                tat: now,
                blocked_until: 0,
            });
            // The answer that fills the burst blocks: `x4xx_limit: N` tolerates N 4xx answers
            // a second, and the request after the Nth gets the 429.
            let next = match rate.charge(s.tat, now) {
                Some(tat) if tat - now <= rate.tolerance_ns() => Strikes { tat, ..s },
                charged => Strikes {
                    tat: charged.unwrap_or(s.tat),
                    blocked_until: now + quiet,
                },
            };
            (Some(next), ())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[tokio::test(start_paused = true)]
    async fn rate_gives_a_burst_then_refills() {
        let table = Table::<Tat>::new();
        let rate = Rate::per_second(10).unwrap();
        let a = table.key((ip(1), 7u64));
        let b = table.key((ip(2), 7u64));
        let admitted = (0..15).filter(|_| table.admit(a, rate)).count();
        assert_eq!(admitted, 10);
        assert!(table.admit(b, rate), "another client has its own budget");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(table.admit(a, rate), "one token back after 1/10 s");
        assert!(!table.admit(a, rate));
        tokio::time::advance(Duration::from_secs(1)).await;
        let admitted = (0..15).filter(|_| table.admit(a, rate)).count();
        assert_eq!(admitted, 10, "a full burst after a quiet second");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_of_one_means_one_per_second() {
        let table = Table::<Tat>::new();
        let rate = Rate::per_second(1).unwrap();
        let k = table.key(ip(1));
        assert!(table.admit(k, rate));
        assert!(!table.admit(k, rate));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!table.admit(k, rate));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(table.admit(k, rate));
        assert!(Rate::per_second(0).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn strikes_block_until_quiet() {
        let table = Table::<Strikes>::new();
        let rate = Rate::per_second(3).unwrap();
        let k = table.key(ip(1));
        for n in 0..3 {
            assert!(
                table.admit_4xx(k),
                "three 4xx per second are tolerated ({n})"
            );
            table.record_4xx(k, rate);
        }
        assert!(
            !table.admit_4xx(k),
            "the request after the third is refused"
        );
        // Knocking again keeps the block going.
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(500)).await;
            assert!(!table.admit_4xx(k));
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!table.admit_4xx(k), "not yet a quiet second");
        tokio::time::advance(QUIET).await;
        assert!(table.admit_4xx(k), "free after a quiet second");
        assert!(table.admit_4xx(table.key(ip(2))), "others never blocked");
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_under_many_clients() {
        let table = Table::<Tat>::new();
        let rate = Rate::per_second(5).unwrap();
        // 100,000 distinct clients within one instant: every entry is active.
        for n in 0..100_000 {
            table.admit(table.key((ip(n), 1u64)), rate);
        }
        assert!(table.len() <= MAX_ENTRIES);
        // A million more, spread over time, still fit the bound.
        for n in 0..1_000_000u32 {
            if n % 100_000 == 0 {
                tokio::time::advance(Duration::from_millis(300)).await;
            }
            table.admit(table.key((ip(n + 200_000), 1u64)), rate);
        }
        assert!(table.len() <= MAX_ENTRIES, "{} entries", table.len());
        let bytes = table.allocated_bytes();
        assert!(bytes <= 8 << 20, "limiter uses {bytes} bytes (> 8 MiB)");
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_keeps_active_entries_first() {
        let table = Table::<Tat>::new();
        let rate = Rate::per_second(1).unwrap();
        let hot = table.key(ip(0));
        assert!(table.admit(hot, rate));
        // Fill the table with clients that go idle.
        for n in 1..(MAX_ENTRIES as u32 * 2) {
            table.admit(table.key(ip(n)), Rate::per_second(1000).unwrap());
            if n % 1000 == 0 {
                tokio::time::advance(Duration::from_millis(1)).await;
            }
        }
        // `hot` was charged a whole second and less than that has passed: it is still active, so
        // eviction (which had idle entries to drop) must have kept it.
        assert!(table.now() < NANOS_PER_SEC);
        assert!(!table.admit(hot, rate), "an active entry survived eviction");
        assert!(table.len() <= MAX_ENTRIES);
    }
}
