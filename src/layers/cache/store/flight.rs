//! Request coalescing for the memory tier: the first miss for a key fetches it, later ones wait
//! for that fetch (at most [`COALESCE_WAIT`]) and then look again. The fetches in flight are
//! kept by key hash in [`FLIGHT_SHARDS`] locked shards, each touched only on a miss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::CacheStore;

/// One shard of the fetches in flight: (key hash, when its fetch began, what waiters wait on,
/// made by the first of them: an uncontended miss allocates nothing here).
pub(super) type Flights = Vec<(u64, Instant, Option<Arc<InFlight>>)>;

/// Shards of the table of fetches in flight.
pub(super) const FLIGHT_SHARDS: usize = 32;

/// How long a miss waits for another request fetching the same key (nginx's
/// `proxy_cache_lock_timeout` default); then it goes to the backend itself.
pub const COALESCE_WAIT: Duration = Duration::from_secs(5);

impl CacheStore {
    /// The shard of fetches in flight that `key` belongs to.
    fn flights(&self, hash: u64) -> std::sync::MutexGuard<'_, Flights> {
        let shard = &self.in_flight[hash as usize % self.in_flight.len()];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the fetch of `key`: `Lead` when no one is fetching it (the guard ends the fetch
    /// when dropped), `Follow` with what to wait on otherwise.
    pub fn join_flight(self: &Arc<Self>, key: &str) -> Flight {
        let hash = std::hash::BuildHasher::hash_one(&self.flight_hasher, key);
        let mut flights = self.flights(hash);
        if let Some((_, began, waited_on)) = flights.iter_mut().find(|(h, ..)| *h == hash) {
            let fetch = waited_on.get_or_insert_with(|| Arc::new(InFlight::began(*began)));
            return Flight::Follow(fetch.clone());
        }
        flights.push((hash, Instant::now(), None));
        Flight::Lead(FlightGuard {
            store: self.clone(),
            hash,
            answered: false,
        })
    }
}

/// A request's part in fetching a key.
pub enum Flight {
    Lead(FlightGuard),
    Follow(Arc<InFlight>),
}

/// One fetch in flight: over once `done`, and then its waiters are woken; `abandoned` when it
/// ended with no answer from the backend (its client left first).
pub struct InFlight {
    /// When its leader joined, just before it asked the backend: a client's refresh takes
    /// only what a fetch begun after it arrived brought.
    pub began: Instant,
    done: AtomicBool,
    abandoned: AtomicBool,
    over: Notify,
}

impl InFlight {
    fn began(began: Instant) -> InFlight {
        InFlight {
            began,
            done: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            over: Notify::new(),
        }
    }
}

/// Held by the request fetching a key; dropping it (the response stored, or given up) wakes the
/// requests waiting for it.
pub struct FlightGuard {
    store: Arc<CacheStore>,
    hash: u64,
    answered: bool,
}

impl FlightGuard {
    /// The backend answered the fetch (or failed it): its end is no longer an abandonment.
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut flights = self.store.flights(self.hash);
        let Some(at) = flights.iter().position(|(h, ..)| *h == self.hash) else {
            return;
        };
        let (_, _, waited_on) = flights.swap_remove(at);
        drop(flights);
        if let Some(fetch) = waited_on {
            fetch.abandoned.store(!self.answered, Ordering::Relaxed);
            fetch.done.store(true, Ordering::Release);
            fetch.over.notify_waiters();
        }
    }
}

/// Waits until `fetch` is over, at most `limit`: whether it was abandoned (its leader's client
/// left before the backend answered, so another waiter should fetch in its place).
pub async fn wait_for(fetch: Arc<InFlight>, limit: Duration) -> bool {
    let over = fetch.over.notified();
    tokio::pin!(over);
    // Registered before the check, so an end between the two is not missed.
    over.as_mut().enable();
    if !fetch.done.load(Ordering::Acquire) && tokio::time::timeout(limit, over).await.is_err() {
        return false;
    }
    fetch.abandoned.load(Ordering::Relaxed)
}
