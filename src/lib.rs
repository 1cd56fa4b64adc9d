//! aralez: a reverse proxy and lightweight ingress on hyper, tokio and tower that reads the
//! Aralez proxy's `main.yaml` and `upstreams.yaml`.
//!
//! The request path, each module importing only those after it: `server` (listeners, workers,
//! the one accept helper) -> `routing` (snapshot lookup, the router) -> `layers` (policies) ->
//! `proxy` (forwarding) -> `upstream` (balancer, pools, the one connector) -> `vocab` (the
//! shared request vocabulary). `config`, `utc`, `metrics`, `logfile` and `accesslog` are leaves
//! beside it. The control plane (`control`: health checks and DNS; `discovery`; `admin`; `tls` certificates)
//! sits above the data path and hands it new snapshots; `process` ties the process together.
//! `tests/architecture.rs` holds the order.
#![deny(unsafe_code)]

// A fuzz build (`cfg(fuzzing)`, set by cargo-fuzz for scripts/fuzz.sh) compiles only the modules
// its targets reach (fuzz/fuzz_targets/): config, routing and what it imports, and the PROXY
// header parser. The listeners, the control plane and the process were a third of the crate's
// lines and most of its async code; leaving them out shortened the fuzz build, the longest phase
// of the test command.
#[cfg(not(fuzzing))]
pub mod accesslog;
#[cfg(not(fuzzing))]
pub mod admin;
pub mod allocator;
#[cfg(not(fuzzing))]
pub mod check;
pub mod config;
#[cfg(not(fuzzing))]
pub mod control;
#[cfg(not(fuzzing))]
pub mod discovery;
#[cfg(not(fuzzing))]
pub mod fileserver;
pub mod layers;
#[cfg(not(fuzzing))]
pub mod logfile;
pub mod metrics;
#[cfg(not(fuzzing))]
pub mod process;
pub mod proxy;
pub mod routing;
#[cfg(not(fuzzing))]
pub mod server;
#[cfg(not(fuzzing))]
pub mod tls;
pub mod upstream;
pub mod utc;
pub mod vocab;

/// The fuzz build's listeners: only the PROXY protocol header parser its `proxy_header` target
/// fuzzes.
#[cfg(fuzzing)]
pub mod server {
    pub mod proxy_protocol;
}
