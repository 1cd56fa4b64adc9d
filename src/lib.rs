//! aralez: a reverse proxy and lightweight ingress on hyper, tokio and tower that reads the
//! Aralez proxy's `main.yaml` and `upstreams.yaml`.
//!
//! The request path: `server` (listeners, workers) -> `routing` (snapshot lookup) -> `proxy`
//! (forwarding, error responses) -> `upstream` (pools, backends). Config comes in through
//! `config` and is published by `discovery`; `process` ties the process together.
#![deny(unsafe_code)]

pub mod accesslog;
pub mod admin;
pub mod check;
pub mod config;
pub mod discovery;
pub mod fileserver;
pub mod layers;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod routing;
pub mod server;
pub mod tls;
pub mod upstream;
