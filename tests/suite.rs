//! The test suite's one binary: every integration test of `tests/` except the external judges
//! (`tests/external_judges.rs`) and the two 10,000-connection memory tests (`tests/idle_load.rs`,
//! `tests/idle_tls_memory.rs`), which measure a process's memory and so run in their own.
//!
//! One binary instead of one per file: each file was its own crate that compiled and linked
//! hyper, tokio and rustls's generic code again (2 min 10 s of a 15.8 min clean build on a 2-core
//! VM; 1 min 25 s as one binary), and the run keeps its threads busy across files (224 s -> 182 s).
//! Each file is a module here, as it was a crate; the helpers are shared (`support`, `inproc`,
//! ...), and so is the process: a port counter (`support::ports`) and the judges' lock
//! (`support::tools`) now cover every test. Cargo's discovery of `tests/*.rs` is off
//! (`autotests = false` in Cargo.toml); a new file must be named below to run, and
//! `every_test_file_is_built` fails while one is not.

mod cache_support;
mod inproc;
mod policies_support;
mod support;

mod acme;
mod acme_ari;
mod acme_deadline;
mod acme_dns;
mod admin;
mod architecture;
mod bad_requests;
mod body_size;
mod cache;
mod cache_coalescing;
mod cache_redis;
mod cache_uncacheable;
mod cache_variants;
mod check_config;
mod chunked_uploads;
mod cluster;
mod compression;
mod consul;
mod early_answers;
mod failover;
mod features;
mod fileserver;
mod forward_auth_answers;
mod forwarding;
mod grpc;
mod h2_abuse;
mod h2_backend_recycling;
mod h2_cut_answers;
mod h2_hpack;
mod h2_refused_heads;
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
mod timeouts;
mod tls;
mod trailers;
mod tunnels;
mod upgrade_listeners;
mod upstream_protocols;
mod websocket;

/// Every `tests/*.rs` is built: a test binary of Cargo.toml, or a module of one. With Cargo's
/// discovery off, a file named nowhere would never be compiled, and its tests never fail.
#[test]
fn every_test_file_is_built() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let manifest = read("Cargo.toml");
    let roots = ["tests/suite.rs", "tests/external_judges.rs"].map(read);
    let mut unbuilt = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).expect("tests/") {
        let name = entry.expect("tests/ entry").file_name();
        let Some(module) = name.to_str().and_then(|n| n.strip_suffix(".rs")) else {
            continue;
        };
        let a_binary = manifest.contains(&format!("path = \"tests/{module}.rs\""));
        let a_module = roots
            .iter()
            .any(|root| root.lines().any(|l| l == format!("mod {module};")));
        if !a_binary && !a_module {
            unbuilt.push(module.to_string());
        }
    }
    assert!(
        unbuilt.is_empty(),
        "tests/{{{}}}.rs: in no test binary (add `mod` to tests/suite.rs)",
        unbuilt.join(",")
    );
}
