//! An ACME server that takes the connection and then says nothing: the order ends at its
//! deadline (300 s) with an error naming the server, and the set goes on to its back-off. The
//! exchanges had no deadline, and one such server stopped every set's orders and renewals for
//! good, with no line said. In process, on tokio's paused clock.

use crate::support;

use std::time::Duration;

use aralez::config::acme_conf::AcmeConfig;
use aralez::control::acme::Acme;

#[tokio::test(start_paused = true)]
async fn an_acme_server_that_never_answers_ends_the_order_at_its_deadline() {
    let addr = support::silent_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AcmeConfig::ordering_from(&format!("https://{addr}/dir"));
    cfg.state_dir = Some(dir.path().join("state"));
    cfg.domains = vec!["acme.test".into()];
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

/// A failed exchange says which step failed and with which server: a refused connection's
/// error (`client error (Connect)`) named neither, and an operator with a staging and a
/// production directory could not tell which one was down.
#[tokio::test]
async fn a_failed_exchange_names_its_step_and_its_server() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let directory = format!("https://{addr}/dir");
    let mut cfg = AcmeConfig::ordering_from(&directory);
    cfg.state_dir = Some(dir.path().join("state"));
    cfg.domains = vec!["acme.test".into()];
    let acme = Acme::new(cfg, dir.path().join("certs"), Box::new(Vec::new));
    let failed = acme
        .order_now("acme.test")
        .await
        .expect_err("nothing was issued");
    let said = aralez::vocab::error_text::with_causes(&failed);
    assert!(
        said.starts_with(&format!(
            "ACME server {directory}, registering an account: "
        )),
        "{said}"
    );
    assert!(said.contains("Connection refused"), "{said}");
}
