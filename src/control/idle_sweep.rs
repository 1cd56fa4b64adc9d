//! Closes idle backend connections their backend has closed. A plain HTTP/1.1 connection
//! waiting in a worker's pool (aralez's own HTTP/1.1 client's) is not read while idle: when
//! the backend ends it (its keep-alive timeout, a restart) it stays half-closed (CLOSE-WAIT),
//! holding a descriptor and a place in `upstream_max_connections`, until the next request to
//! that backend finds it and opens another. nginx closes such a connection as the backend's end
//! arrives; here a sweep every [`EVERY`] looks at each idle one without reading (a readiness
//! check, a system call only for those that became readable) and closes those that ended.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::routing::Snapshot;

/// How often the idle connections are looked at.
pub const EVERY: Duration = Duration::from_secs(2);

/// Sweeps the serving snapshot's backends every `every`, forever.
pub async fn run(snapshot: Arc<ArcSwap<Snapshot>>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let closed = sweep(&snapshot.load());
        if closed > 0 {
            tracing::debug!("closed {closed} idle backend connections their backends had closed");
        }
    }
}

/// One sweep over each backend of `snapshot` once; how many connections it closed.
pub fn sweep(snapshot: &Snapshot) -> usize {
    let mut seen: HashSet<usize> = HashSet::new();
    let mut closed = 0;
    for route in snapshot.routes() {
        for backend in route.backends.iter() {
            if seen.insert(Arc::as_ptr(backend) as usize) {
                closed += backend.close_gone_idle();
            }
        }
    }
    closed
}
