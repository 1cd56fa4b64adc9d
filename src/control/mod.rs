//! Control-plane tasks that watch the serving snapshot's backends, off the request path: active
//! health checks ([`health`]), periodic re-resolution of backends named by host name
//! //! ([`resolve`]) and the closing of idle connections their backends closed ([`idle_sweep`]).
//! They only read the snapshot, write each backend's health and addresses and close its pooled
//! connections that ended; the data path never calls into them. [`acme`] orders and renews certificates.

pub mod acme;
pub mod health;
pub mod idle_sweep;
pub mod resolve;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::routing::Snapshot;

/// Starts the health checks and DNS refresh on the control runtime; they run until it stops.
pub fn start(
    runtime: &tokio::runtime::Runtime,
    main: &crate::config::MainConfig,
    snapshot: Arc<ArcSwap<Snapshot>>,
) {
    runtime.spawn(resolve::run(snapshot.clone(), resolve::EVERY));
    runtime.spawn(idle_sweep::run(snapshot.clone(), idle_sweep::EVERY));
    health::spawn(runtime, main, snapshot);
}
