//! Periodic re-resolution of backends named by host name (SPEC §3.3), on the control plane:
//! the request path only ever reads the last resolved addresses.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::routing::Snapshot;

/// How often host names are looked up again (like nginx's `resolver ... valid=30s`).
pub const EVERY: Duration = Duration::from_secs(30);

/// Re-resolves every named backend of the serving snapshot every `every`, until the runtime stops.
pub async fn run(snapshot: Arc<ArcSwap<Snapshot>>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let current = snapshot.load_full();
        let named: Vec<_> = current
            .routes()
            .flat_map(|r| r.backends.iter().cloned())
            .filter(|b| b.spec.ip_addr().is_none())
            .collect();
        if named.is_empty() {
            continue;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for backend in named {
                backend.re_resolve();
            }
        })
        .await;
    }
}
