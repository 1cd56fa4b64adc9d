//! A cap on one client address's connections to a listener ([`PerClient`]), for the listeners
//! whose whole cap is small (the admin API's 64): without it, one address that holds its
//! connections open (a slowloris reconnecting as each is cut) takes every place, and the
//! monitoring, the cluster's pushes and the operator are shut out. The proxy's listeners have
//! none: their cap is `max_connections`, and clients behind one NAT share an address.
//!
//! An address at its cap is not refused while one of its connections is idle (no request in
//! flight: a head still coming, a handshake, a kept-alive connection between requests): the
//! oldest such connection is closed to make room ([`ClientSlot::evicted`]). Refused, the
//! address was the attacker's and everyone's on it alike: sixteen half-sent heads from
//! loopback kept Prometheus and the operator's own `curl` out of a loopback admin API for as
//! long as they were held. A connection serving a request is never closed for another.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

use super::idle::Activity;

/// How many connections each client address holds.
pub struct PerClient {
    max: usize,
    open: Mutex<HashMap<IpAddr, Vec<Arc<Held>>>>,
}

/// What the table knows of one connection: whether it serves a request, and how to close it.
#[derive(Default)]
struct Held {
    /// The connection's requests, once it serves HTTP (none before: a handshake, or the first
    /// bytes still to come).
    activity: OnceLock<Arc<Activity>>,
    evict: Notify,
}

impl Held {
    fn idle(&self) -> bool {
        self.activity.get().is_none_or(|a| a.open_requests() == 0)
    }
}

/// One connection's place among its address's, given back when dropped.
pub struct ClientSlot {
    table: Arc<PerClient>,
    ip: IpAddr,
    held: Arc<Held>,
}

/// A place taken: the slot, and whether an idle connection of the address was closed for it.
pub struct Taken {
    pub slot: ClientSlot,
    pub evicted_one: bool,
}

impl PerClient {
    pub fn new(max: usize) -> Arc<PerClient> {
        Arc::new(PerClient {
            max,
            open: Mutex::default(),
        })
    }

    /// A place for a connection from `ip`: if it holds fewer than the cap, or one of its
    /// connections is idle (the oldest such is closed for it).
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Taken> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let held = open.entry(ip).or_default();
        let mut evicted_one = false;
        if held.len() >= self.max {
            let oldest_idle = held.iter().position(|h| h.idle())?;
            held.remove(oldest_idle).evict.notify_one();
            evicted_one = true;
        }
        let new = Arc::new(Held::default());
        held.push(new.clone());
        let slot = ClientSlot {
            table: self.clone(),
            ip,
            held: new,
        };
        Some(Taken { slot, evicted_one })
    }
}

impl ClientSlot {
    /// The connection serves HTTP now, its requests counted in `activity`.
    pub fn serves(&self, activity: &Arc<Activity>) {
        let _ = self.held.activity.set(activity.clone());
    }

    /// Ready once the connection is to close for another of its address's.
    pub fn evicted(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let held = self.held.clone();
        async move { held.evict.notified().await }
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = open.get_mut(&self.ip) {
            held.retain(|h| !Arc::ptr_eq(h, &self.held));
            if held.is_empty() {
                open.remove(&self.ip);
            }
        }
    }
}

/// Spawns `serving`; with `evicted` (a listener that caps an address's connections), it ends
/// when that says the connection is to close for another of its address's.
pub fn spawn_evictable<F>(serving: F, evicted: Option<impl Future<Output = ()> + Send + 'static>)
where
    F: Future<Output = ()> + Send + 'static,
{
    let task = match evicted {
        None => tokio::spawn(serving),
        Some(evicted) => tokio::spawn(async move {
            tokio::select! {
                () = serving => {}
                () = evicted => {}
            }
        }),
    };
    drop(task);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn an_address_gets_its_places_back_as_its_connections_end() {
        let table = PerClient::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let busy = Activity::new(Arc::new(AtomicBool::new(false)));
        let _request = busy.begin(false);
        let first = table.take(a).expect("a place").slot;
        let second = table.take(a).expect("a place").slot;
        first.serves(&busy);
        second.serves(&busy);
        assert!(table.take(a).is_none(), "a third, both busy");
        assert!(table.take(b).is_some(), "another address has its own");
        drop(first);
        assert!(table.take(a).is_some(), "a place came back");
        drop(table.take(b));
        assert!(
            !table.open.lock().unwrap().contains_key(&b),
            "no entry left for an address"
        );
    }

    #[tokio::test]
    async fn an_address_at_its_cap_closes_its_oldest_idle_connection_for_a_new_one() {
        let table = PerClient::new(3);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let draining = Arc::new(AtomicBool::new(false));
        let (busy, idle) = (Activity::new(draining.clone()), Activity::new(draining));
        let _request = busy.begin(false);
        let serving = table.take(a).expect("a place").slot;
        serving.serves(&busy);
        let between_requests = table.take(a).expect("a place").slot;
        between_requests.serves(&idle);
        let handshaking = table.take(a).expect("a place").slot;
        let taken = table.take(a).expect("an idle one closed for it");
        assert!(taken.evicted_one);
        let closed = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            between_requests.evicted(),
        );
        assert!(
            closed.await.is_ok(),
            "the oldest idle one was told to close"
        );
        let taken = table.take(a).expect("the next idle one");
        assert!(taken.evicted_one);
        let closed = tokio::time::timeout(std::time::Duration::from_secs(1), handshaking.evicted());
        assert!(closed.await.is_ok());
        let not_yet = tokio::time::timeout(std::time::Duration::from_millis(50), serving.evicted());
        assert!(not_yet.await.is_err(), "one serving a request stays");
    }
}
