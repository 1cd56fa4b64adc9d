//! The test suite's one binary: every integration test of `tests/` except the external judges
//! (`tests/external_judges.rs`) and the two 10,000-connection memory tests (`tests/idle_load.rs`,
//! `tests/idle_tls_memory.rs`), which measure a process's memory and so run in their own.
//!
//! One binary instead of one per file: each file was its own crate that compiled and linked
//! hyper, tokio and rustls's generic code again, and that was most of the suite's build time.
//! Each file is a module here, as it was a crate; the helpers are shared (`support`, `inproc`,
//! ...), and so is the process: a port counter (`support::ports`) and the judges' lock
//! (`support::tools`) now cover every test. Cargo's discovery of `tests/*.rs` is off
//! (`autotests = false` in Cargo.toml); a new file must be named below to run.

mod cache_support;
mod inproc;
mod policies_support;
mod support;

mod acme;
mod acme_ari;
mod acme_dns;
mod admin;
mod architecture;
mod bad_requests;
mod cache;
mod cache_redis;
mod cache_uncacheable;
mod check_config;
mod cluster;
mod compression;
mod consul;
mod failover;
mod fileserver;
mod forwarding;
mod grpc;
mod h2_abuse;
mod hardening;
mod health;
mod http3;
mod kubernetes;
mod limits;
mod listeners;
mod logs;
mod operations;
mod operations_logs;
mod operators;
mod parking;
mod policies;
mod real_client;
mod real_client_limits;
mod release;
mod reload;
mod shared_limits;
mod status_page;
mod tcp_block;
mod tls;
mod tunnels;
mod upstream_protocols;
mod websocket;
