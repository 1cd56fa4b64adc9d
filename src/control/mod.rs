//! Control-plane tasks that watch the serving snapshot's backends, off the request path: active
//! health checks ([`health`]) and periodic re-resolution of backends named by host name
//! ([`resolve`]). They only read the snapshot and write each backend's health and addresses;
//! the data path never calls into them. [`acme`] orders and renews certificates.

pub mod acme;
pub mod health;
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
    health::spawn(runtime, main, snapshot);
}
