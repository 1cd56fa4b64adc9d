//! Automatic certificates (`acme:` in main.yaml) against Debian's `pebble` (an ACME server for
//! tests) and `pebble-challtestsrv` (its DNS, which points every name at 127.0.0.1), both
//! started here on loopback ports; pebble's own HTTPS listener uses a certificate of a CA the
//! test makes, which aralez trusts through `acme.ca_file`. HTTP-01: pebble fetches the token
//! from aralez's plain listener, which answers it before routing; the certificate lands in the
//! watched directory and is served on SNI at once, verified against pebble's root; a restart
//! does not order again.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::redis::free_port;
use support::tools::{self, Tool};
use support::*;

const PEBBLE: Tool = Tool {
    env: "ARALEZ_PEBBLE",
    installed: "/usr/bin/pebble", // Debian's package
    on_path: &["pebble"],
};
const CHALLTESTSRV: Tool = Tool {
    env: "ARALEZ_PEBBLE_CHALLTESTSRV",
    installed: "/usr/bin/pebble-challtestsrv",
    on_path: &["pebble-challtestsrv"],
};

/// A child process killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// pebble and its DNS, with the CA pebble's listener is signed by.
struct Pebble {
    _dns: Running,
    _server: Running,
    directory: String,
    management: SocketAddr,
    ca_file: std::path::PathBuf,
    ca: rustls_pki_types::CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

impl Pebble {
    /// pebble validating HTTP-01 on `http_port` of whatever its DNS says (127.0.0.1).
    async fn start(http_port: u16) -> Option<Pebble> {
        Pebble::start_on(http_port, free_port()).await
    }

    /// pebble validating TLS-ALPN-01 on `tls_port`.
    async fn start_alpn(tls_port: u16) -> Option<Pebble> {
        Pebble::start_on(free_port(), tls_port).await
    }

    async fn start_on(http_port: u16, tls_port: u16) -> Option<Pebble> {
        let pebble = tools::find(&PEBBLE)?;
        let challtestsrv = tools::find(&CHALLTESTSRV)?;
        let dir = tempfile::tempdir().expect("temp dir");
        // The test's CA, and pebble's listener certificate signed by it.
        let pki = test_pki(&["127.0.0.1", "localhost"]);
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &pki.ca_pem).expect("write CA");
        std::fs::write(dir.path().join("pebble.crt"), &pki.leaf_pem).expect("write cert");
        std::fs::write(dir.path().join("pebble.key"), &pki.leaf_key_pem).expect("write key");
        let (dns_port, acme_port, mgmt_port, cts_mgmt) =
            (free_port(), free_port(), free_port(), free_port());
        let dns = Command::new(challtestsrv)
            .args([
                "-dns01",
                &format!("127.0.0.1:{dns_port}"),
                "-http01",
                "",
                "-https01",
                "",
            ])
            .args([
                "-tlsalpn01",
                "",
                "-management",
                &format!("127.0.0.1:{cts_mgmt}"),
            ])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble-challtestsrv");
        let config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{acme_port}"),
            "managementListenAddress": format!("127.0.0.1:{mgmt_port}"),
            "certificate": dir.path().join("pebble.crt"),
            "privateKey": dir.path().join("pebble.key"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            // 30 days: a renewal threshold of 60 days makes any certificate due.
            "certificateValidityPeriod": 30 * 86_400,
            "externalAccountBindingRequired": false,
        }});
        let config_file = dir.path().join("pebble.json");
        std::fs::write(&config_file, config.to_string()).expect("write pebble config");
        let server = Command::new(pebble)
            .arg("-config")
            .arg(&config_file)
            .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble");
        let up = eventually_async(Duration::from_secs(10), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", acme_port))
                .await
                .ok()
        });
        assert!(up.await.is_some(), "pebble did not start");
        Some(Pebble {
            _dns: Running(dns),
            _server: Running(server),
            directory: format!("https://127.0.0.1:{acme_port}/dir"),
            management: ([127, 0, 0, 1], mgmt_port).into(),
            ca_file,
            ca: pki.ca,
            _dir: dir,
        })
    }

    /// pebble's current issuing root (its management API), for checking what aralez serves.
    async fn root(&self) -> rustls_pki_types::CertificateDer<'static> {
        use rustls_pki_types::pem::PemObject;
        let config = tls_client_config(std::slice::from_ref(&self.ca), &[b"http/1.1"]);
        let mut client = Client::connect_tls(self.management, "localhost", config).await;
        let resp = client
            .send(
                http::Method::GET,
                Some("localhost"),
                "/roots/0",
                &[],
                full(bytes::Bytes::new()),
            )
            .await;
        let pem = body_bytes(resp).await;
        rustls_pki_types::CertificateDer::from_pem_slice(&pem).expect("pebble's root in PEM")
    }
}

/// main.yaml lines for `acme.test` from `pebble`, with extra `acme:` lines.
fn main_for(
    pebble: &Pebble,
    certs: &std::path::Path,
    state: &std::path::Path,
    extra: &str,
) -> String {
    format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nconfig_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\nacme:\n  directory: \"{}\"\n  ca_file: \"{}\"\n  email: \"ops@acme.test\"\n  challenge: http-01\n  state_dir: \"{}\"\n  domains: [\"acme.test\"]\n{extra}",
        certs.display(),
        pebble.directory,
        pebble.ca_file.display(),
        state.display()
    )
}

/// `name` is served over TLS by `proxy` with a certificate that chains to `root`.
async fn serves(
    proxy: &ProxyProcess,
    name: &'static str,
    root: rustls_pki_types::CertificateDer<'static>,
) -> bool {
    let tls = proxy.logged_addr("listening on https://");
    let config = tls_client_config(&[root], &[b"http/1.1"]);
    let served = eventually_async(Duration::from_secs(10), || {
        let config = config.clone();
        async move {
            let stream = tokio::net::TcpStream::connect(tls).await.ok()?;
            let name = rustls_pki_types::ServerName::try_from(name).ok()?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .ok()
        }
    });
    served.await.is_some()
}

/// `proxy`'s log says `text` within 60 s.
async fn logs(proxy: &ProxyProcess, text: &str) -> bool {
    let said = eventually_async(Duration::from_secs(60), || async {
        proxy.log_text().contains(text).then_some(())
    });
    said.await.is_some()
}

#[tokio::test]
async fn http_01_issues_a_certificate_served_at_once_and_kept_across_a_restart() {
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let Some(pebble) = Pebble::start(http.port()).await else {
        return;
    };
    let backend = Backend::start("site").await;
    let yaml = Upstreams::new()
        .host(
            "acme.test",
            Host::new().path("/", Path::servers(&[&backend]).healthcheck(false)),
        )
        .render();
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    let main = main_for(&pebble, certs.path(), state.path(), "");
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    let crt = certs.path().join("acme.test.crt");
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
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
    assert!(serves(&proxy, "other.test", root.clone()).await);
    assert_eq!(call("/acme_order/..%2Fetc", "k").await.0, 400);

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
    let yaml = Upstreams::new()
        .host(
            "alpn.test",
            Host::new().path("/", Path::servers(&[&backend]).healthcheck(false)),
        )
        .render();
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
