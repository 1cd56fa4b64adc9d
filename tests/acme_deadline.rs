//! An ACME server that takes the connection and then says nothing: the order ends at its
//! deadline (300 s) with an error naming the server, and the set goes on to its back-off. The
//! exchanges had no deadline, and one such server stopped every set's orders and renewals for
//! good, with no line said. In process, on tokio's paused clock.

use std::time::Duration;

use aralez::config::acme_conf::{AcmeConfig, Challenge};
use aralez::control::acme::Acme;

#[tokio::test(start_paused = true)]
async fn an_acme_server_that_never_answers_ends_the_order_at_its_deadline() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = AcmeConfig {
        directory: format!("https://{addr}/dir"),
        email: None,
        ca_file: None,
        ca_file_at: None,
        challenge: Challenge::Http01,
        state_dir: Some(dir.path().join("state")),
        domains: vec!["acme.test".into()],
        renew_before_days: None,
        dns_resolver: None,
        dns_provider: None,
        challenge_given: false,
        challenge_at: None,
        domains_at: None,
    };
    std::fs::create_dir(dir.path().join("state")).unwrap();
    let acme = Acme::new(cfg, dir.path().join("certs"), Box::new(Vec::new));
    let started = tokio::time::Instant::now();
    let ordered = tokio::time::timeout(Duration::from_secs(3600), acme.order_now("acme.test"));
    let failed = ordered
        .await
        .expect("the order ended")
        .expect_err("nothing was issued");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(300) && took < Duration::from_secs(301),
        "{took:?}"
    );
    let said = failed.to_string();
    assert!(
        said.contains("did not finish the order within 300s"),
        "{said}"
    );
    assert!(said.contains(&addr.to_string()), "{said}");
    // `/acme_create`'s account, within 30 s.
    let started = tokio::time::Instant::now();
    let Err(failed) = acme.account_within().await else {
        panic!("an account from a server that says nothing");
    };
    assert!(
        started.elapsed() < Duration::from_secs(31),
        "{:?}",
        started.elapsed()
    );
    assert!(
        failed.to_string().contains("did not answer within 30s"),
        "{failed}"
    );
}
