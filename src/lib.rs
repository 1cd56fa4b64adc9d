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

pub mod accesslog;
pub mod admin;
pub mod allocator;
pub mod check;
pub mod config;
pub mod control;
pub mod discovery;
pub mod fileserver;
pub mod layers;
pub mod logfile;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod routing;
pub mod server;
pub mod tls;
pub mod upstream;
pub mod utc;
pub mod vocab;
