//! Automatic certificates (`acme:` in main.yaml) against Debian's `pebble` (an ACME server for
//! tests) and `pebble-challtestsrv` (its DNS, which points every name at 127.0.0.1), both
//! started here on loopback ports; pebble's own HTTPS listener uses a certificate of a CA the
//! test makes, which aralez trusts through `acme.ca_file`. HTTP-01: pebble fetches the token
//! from aralez's plain listener, which answers it before routing; the certificate lands in the
//! watched directory and is served on SNI at once, verified against pebble's root; a restart
//! does not order again.

use crate::support;

use std::net::SocketAddr;

use support::pebble::*;
use support::ports::free_port;
use support::*;

#[tokio::test]
async fn http_01_issues_a_certificate_served_at_once_and_kept_across_a_restart() {
    let Some(Issued {
        pebble,
        http,
        yaml,
        main,
        certs,
        state,
        proxy,
        backend: _backend,
    }) = issued_for_acme_test().await
    else {
        return;
    };
    let crt = certs.path().join("acme.test.crt");
    assert!(crt.exists() && state.path().join("account.json").exists());
    // Served on SNI at once, and it chains to pebble's root.
    let root = pebble.root().await;
    assert!(
        serves(&proxy, "acme.test", root.clone()).await,
        "acme.test is not served with pebble's certificate"
    );
    let admin = proxy.logged_addr("admin API on http://");
    let issued = "aralez_acme_orders_total{domain=\"acme.test\",result=\"issued\"}";
    assert_eq!(metric(admin, issued).await, Some(1.0));
    let expiry = metric(
        admin,
        "aralez_acme_certificate_expiry_seconds{domain=\"acme.test\"}",
    )
    .await;
    assert!(expiry.is_some_and(|s| s > 29.0 * 86_400.0), "{expiry:?}");

    // Aralez's admin endpoints, behind the master key.
    let call = |path: &'static str, key: &'static str| async move {
        let mut c = Client::connect(Proto::H1, admin).await;
        let resp = c
            .send(
                http::Method::POST,
                Some("localhost"),
                path,
                &[("x-api-key", key)],
                full(""),
            )
            .await;
        let status = resp.status().as_u16();
        (
            status,
            String::from_utf8_lossy(&body_bytes(resp).await).into_owned(),
        )
    };
    assert_eq!(call("/acme_create", "wrong").await.0, 403);
    let (status, account) = call("/acme_create", "k").await;
    assert_eq!(status, 200);
    assert!(account.contains("/my-account/"), "{account}");
    assert_eq!(
        call("/acme_order/acme.test", "k").await,
        (
            200,
            "Fresh certificate exists. Not renewing ! \n".to_string()
        )
    );
    assert_eq!(
        call("/acme_order/other.test", "k").await,
        (200, "Certificate is successfully generated \n".to_string())
    );
    assert!(certs.path().join("other.test.crt").exists());
    // Counted as the sets' orders are (it was not).
    let other = "aralez_acme_orders_total{domain=\"other.test\",result=\"issued\"}";
    assert_eq!(metric(admin, other).await, Some(1.0));
    assert!(serves(&proxy, "other.test", root.clone()).await);
    assert_eq!(call("/acme_order/..%2Fetc", "k").await.0, 400);
    // What the CA refuses is refused here, before an order is spent on it.
    for (path, why) in [
        ("/acme_order/10.0.0.1", "is an IP address"),
        ("/acme_order/localhost", "is not a DNS name"),
        ("/acme_order/-bad.test", "is not a DNS name"),
        ("/acme_order/1.2.3.4.5", "is digits and dots only"),
    ] {
        let (status, said) = call(path, "k").await;
        assert_eq!(status, 400, "{path}: {said}");
        assert!(said.contains(why), "{path}: {said}");
    }

    // A restart with a fresh certificate orders nothing.
    let first = std::fs::read(&crt).expect("certificate");
    drop(proxy);
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    assert!(
        logs(&proxy, "a fresh certificate exists").await,
        "{}",
        proxy.log_text()
    );
    assert_eq!(std::fs::read(&crt).expect("certificate"), first);
    drop(proxy);

    // A renewal threshold past the remaining lifetime renews, with the same account.
    let renewing = main_for(
        &pebble,
        certs.path(),
        state.path(),
        "  renew_before_days: 60\n",
    );
    let proxy = ProxyProcess::start_on(&yaml, &renewing, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    let second = std::fs::read(&crt).expect("certificate");
    assert_ne!(second, first, "renewed");
    assert!(!proxy.log_text().contains("account created"));
    assert!(logs(&proxy, "next order in an hour at the earliest").await);
    drop(proxy);

    // A challenge the ACME server cannot check (it asks a port nobody answers on) fails the
    // order: logged with the problem, counted, and the certificate in place keeps being served.
    let Some(refusing) = Pebble::start(free_port()).await else {
        return;
    };
    let state_b = tempfile::tempdir().expect("state dir");
    let failing = main_for(
        &refusing,
        certs.path(),
        state_b.path(),
        "  renew_before_days: 60\n",
    );
    let proxy = ProxyProcess::start_on(&yaml, &failing, http);
    assert!(
        logs(&proxy, "acme: order failed").await,
        "{}",
        proxy.log_text()
    );
    // The line names the domain and carries the ACME problem (pebble's connection error).
    let log = proxy.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("acme: order failed"))
        .unwrap_or_default();
    assert!(
        line.contains("acme.test") && line.contains("urn:ietf:params:acme:error:"),
        "{line}"
    );
    assert_eq!(
        std::fs::read(&crt).expect("certificate"),
        second,
        "the old one stays"
    );
    assert!(
        serves(&proxy, "acme.test", root).await,
        "the old certificate is still served"
    );
    let admin = proxy.logged_addr("admin API on http://");
    let failed = "aralez_acme_orders_total{domain=\"acme.test\",result=\"failed\"}";
    assert_eq!(metric(admin, failed).await, Some(1.0));
}

#[tokio::test]
async fn tls_alpn_01_is_answered_on_the_tls_listener() {
    let (http, tls): (SocketAddr, SocketAddr) = (
        ([127, 0, 0, 1], free_port()).into(),
        ([127, 0, 0, 1], free_port()).into(),
    );
    let Some(pebble) = Pebble::start_alpn(tls.port()).await else {
        return;
    };
    let backend = Backend::start("site").await;
    let yaml = host_route("alpn.test", &backend);
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    let main = main_for(&pebble, certs.path(), state.path(), "")
        .replace(
            "proxy_address_tls: \"127.0.0.1:0\"",
            &format!("proxy_address_tls: \"{tls}\""),
        )
        .replace("challenge: http-01", "challenge: tls-alpn-01")
        .replace("domains: [\"acme.test\"]", "domains: [\"alpn.test\"]");
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    assert!(certs.path().join("alpn.test.crt").exists());
    let root = pebble.root().await;
    assert!(
        serves(&proxy, "alpn.test", root).await,
        "alpn.test is not served with pebble's certificate"
    );
}

#[tokio::test]
async fn hosts_marked_acme_true_get_a_certificate_each_also_after_a_reload() {
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let Some(pebble) = Pebble::start(http.port()).await else {
        return;
    };
    let backend = Backend::start("site").await;
    let site = || Host::new().path("/", Path::servers(&[&backend]).healthcheck(false));
    // `to_https` as well: the challenge is answered on the plain listener all the same.
    let yaml = Upstreams::new()
        .host("one.test", site().set("acme", true).to_https(true))
        .host("plain.test", site())
        .render();
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    // No `domains`: the hosts alone say what to get.
    let main = main_for(&pebble, certs.path(), state.path(), "")
        .replace("  domains: [\"acme.test\"]\n", "");
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    let root = pebble.root().await;
    assert!(serves(&proxy, "one.test", root.clone()).await);
    assert!(!certs.path().join("plain.test.crt").exists());

    // A reload that marks another host: it gets its own certificate without a restart.
    let yaml = Upstreams::new()
        .host("one.test", site().set("acme", true))
        .host("two.test", site().set("acme", true))
        .render();
    std::fs::write(proxy.path("upstreams.yaml"), yaml).expect("rewrite upstreams");
    assert!(
        proxy
            .wait_log_count(
                "acme: certificate issued",
                2,
                std::time::Duration::from_secs(90)
            )
            .await,
        "{}",
        proxy.log_text()
    );
    assert!(serves(&proxy, "two.test", root).await);
    assert_eq!(
        proxy.log_count("acme: certificate issued"),
        2,
        "one.test is not ordered again"
    );
}

/// An account the ACME server no longer knows (deactivated, or its database reset) is set
/// aside and a new one made: ordering failed with `accountDoesNotExist` at every retry, for
/// good, until someone deleted account.json by hand.
#[tokio::test]
async fn an_account_the_server_no_longer_knows_is_replaced() {
    let Some(Issued {
        http,
        yaml,
        main,
        certs,
        state,
        proxy,
        pebble: _pebble,
        backend: _backend,
    }) = issued_for_acme_test().await
    else {
        return;
    };
    drop(proxy);
    // The account's URL now names one the server never made; the certificate is gone.
    let account = state.path().join("account.json");
    let mut creds: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&account).expect("account.json")).expect("json");
    let id = creds["id"].as_str().expect("account id").to_string();
    creds["id"] = serde_json::Value::String(format!("{id}gone"));
    std::fs::write(&account, creds.to_string()).expect("write account.json");
    std::fs::remove_file(certs.path().join("acme.test.crt")).expect("certificate");
    std::fs::remove_file(certs.path().join("acme.test.key")).expect("key");
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    assert!(proxy.log_text().contains("does not know the account"));
    assert!(state.path().join("account.json.previous").exists());
    assert!(certs.path().join("acme.test.crt").exists());
}

/// An account that cannot be saved (here `account.json` is a folder) is used all the same
/// while the process runs: the order is issued with it, and the admin API gets the same
/// account. The order failed at saving it, and each retry registered another account at the
/// CA, which limits how many an address may make.
#[tokio::test]
async fn an_account_that_cannot_be_saved_is_used_and_not_registered_again() {
    let in_the_way = |state: &std::path::Path| {
        let folder = state.join("account.json").join("in-the-way");
        std::fs::create_dir_all(folder).expect("a folder named account.json");
    };
    // Issued at all: the order failed at saving the account before.
    let Some(Issued { proxy, .. }) = issued_after(in_the_way).await else {
        return;
    };
    let log = proxy.log_text();
    assert!(
        log.contains("the account is used until this process ends"),
        "{log}"
    );
    let admin = proxy.logged_addr("admin API on http://");
    assert_eq!(post_keyed(admin, "/acme_create").await.0, 200);
    assert_eq!(
        proxy.log_count("acme: account created"),
        1,
        "{}",
        proxy.log_text()
    );
}

/// `/acme_order` of a CA that cannot be reached is a 502 naming the step and the directory: the
/// CA failed, not this server (it was a 500 "Internal Server Error").
#[tokio::test]
async fn an_order_the_ca_fails_is_a_502_that_names_it() {
    let backend = Backend::start("site").await;
    let certs = tempfile::tempdir().expect("certificate dir");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let directory = format!("https://{}/dir", closed.local_addr().unwrap());
    drop(closed);
    let main = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nconfig_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\nacme:\n  directory: \"{directory}\"\n",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&host_route("site.test", &backend), &main);
    let admin = proxy.logged_addr("admin API on http://");
    let (status, said) = post_keyed(admin, "/acme_order/site.test").await;
    assert_eq!(status, 502);
    let want = format!("ACME server {directory}, registering an account");
    assert!(said.contains(&want), "{said}");
    // And in the log, as the scheduler's failures are (the answer reached its caller only).
    let logged = "acme: order asked through the admin API failed";
    proxy
        .wait_log(logged, std::time::Duration::from_secs(5))
        .await;
}

/// `POST path` on the admin API at `admin` with the master key `k`: the status and the text.
async fn post_keyed(admin: SocketAddr, path: &str) -> (u16, String) {
    let mut c = Client::connect(Proto::H1, admin).await;
    let resp = c
        .send(
            http::Method::POST,
            Some("localhost"),
            path,
            &[("x-api-key", "k")],
            full(""),
        )
        .await;
    let status = resp.status().as_u16();
    let text = String::from_utf8_lossy(&body_bytes(resp).await).into_owned();
    (status, text)
}
