//! A binary built without the default features (`cargo build --no-default-features`; see
//! Cargo.toml's `[features]`). `scripts/test.sh` builds it before the suite and names it in
//! `ARALEZ_NO_DEFAULT_FEATURES_BIN`. Without `http3` it refuses `http3: true` and says why;
//! without `kubernetes` it names a `kubernetes` provider in an error and serves the other routes.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use support::*;

/// The binary built without the default features, or `None` (the test is skipped) when the
/// suite runs outside `scripts/test.sh`. With `ARALEZ_REQUIRE_JUDGES=1` (the test command), a
/// missing binary fails the test.
fn without_default_features() -> Option<PathBuf> {
    let found = std::env::var_os("ARALEZ_NO_DEFAULT_FEATURES_BIN")
        .map(PathBuf::from)
        .filter(|path| path.is_file());
    if found.is_none() {
        tools::skipped_unless_required(
            "ARALEZ_NO_DEFAULT_FEATURES_BIN names no binary (scripts/test.sh builds it)",
        );
    }
    found
}

/// `http3: true` is a configuration error in this binary: at start-up, which exits before any
/// listener or thread starts, and in `check-config`, each naming the file, line and key.
#[test]
fn without_http3_the_proxy_refuses_http3_true_and_says_why() {
    let Some(program) = without_default_features() else {
        return;
    };
    let certs = tempfile::tempdir().expect("certs dir");
    write_self_signed(certs.path(), "localhost", &["localhost"]);
    let tls = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nhttp3: true",
        certs.path().display()
    );
    let (dir, main) = write_config(&unused_route(), &tls);
    let line = std::fs::read_to_string(&main)
        .expect("main.yaml")
        .lines()
        .position(|l| l.starts_with("http3:"))
        .expect("an http3 line")
        + 1;
    let said = format!(
        "main.yaml:{line}:8: error: `http3`: this binary was built without the `http3` feature"
    );
    let main_arg = main.display().to_string();
    let start = ["-c".to_string(), main_arg.clone()];
    let check = ["check-config".to_string(), "-c".to_string(), main_arg];
    for args in [&start[..], &check[..]] {
        let run = tools::run_blocking(&program, args, dir.path(), Duration::from_secs(20));
        assert_eq!(run.code, Some(1), "{args:?} stderr:\n{}", run.stderr);
        let output = format!("{}{}", run.stdout, run.stderr);
        assert!(output.contains(&said), "{args:?} wants {said:?}:\n{output}");
        assert!(!output.contains("panicked"), "{args:?}:\n{output}");
        assert!(!output.contains("listening on"), "{args:?}:\n{output}");
    }
}

#[tokio::test]
async fn without_kubernetes_a_kubernetes_provider_is_an_error_and_the_rest_serves() {
    let Some(program) = without_default_features() else {
        return;
    };
    let backend = Backend::start("static").await;
    // The API server's address refuses connections: a binary with the feature would retry it.
    let discovery = Discovery::kubernetes(&["http://127.0.0.1:1"]).service(Service::new(
        "web.local",
        "web",
        "/",
    ));
    let upstreams = Upstreams::new()
        .discovery(discovery)
        .host("x.test", Host::new().path("/", Path::servers(&[&backend])))
        .render();
    let proxy = ProxyProcess::start_binary(&program, &upstreams, "", &[]);
    let error = "kubernetes: 1 service(s) configured, but this binary was built without the `kubernetes` feature";
    let logged = eventually_async(Duration::from_secs(10), || async {
        (proxy.log_count(error) == 1).then_some(())
    })
    .await;
    assert!(logged.is_some(), "log:\n{}", proxy.log_text());
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    let resp = client.get("x.test", "/").await;
    assert_eq!(resp.status(), 200, "log:\n{}", proxy.log_text());
    assert_eq!(header(&resp, "x-backend"), "static");
}
