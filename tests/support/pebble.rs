//! pebble (Debian's ACME server for tests) and pebble-challtestsrv (its DNS, which points
//! every name at 127.0.0.1 and serves the TXT records its management API is given), both
//! started on loopback ports; pebble's own HTTPS listener uses a certificate of a CA the test
//! makes, which aralez trusts through `acme.ca_file`. With helpers to write `acme:` main.yaml
//! lines and to check what aralez serves.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ports::free_port;
use super::tools::{self, Tool};
use super::*;

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
pub struct Running(Child);

impl Running {
    /// Whether the process has not exited (one that could not bind its ports exits).
    fn still_running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a TLS server on `port` of 127.0.0.1 completes a handshake as `localhost` under
/// `config`'s roots.
async fn answers_with_certificate(
    port: u16,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> Option<()> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let name = rustls_pki_types::ServerName::try_from("localhost").ok()?;
    let handshake = tokio_rustls::TlsConnector::from(config).connect(name, stream);
    tokio::time::timeout(Duration::from_secs(2), handshake)
        .await
        .ok()?
        .ok()
        .map(|_| ())
}

/// pebble and its DNS, with the CA pebble's listener is signed by.
pub struct Pebble {
    _dns: Running,
    _server: Running,
    pub directory: String,
    pub management: SocketAddr,
    pub ca_file: std::path::PathBuf,
    pub ca: rustls_pki_types::CertificateDer<'static>,
    /// pebble-challtestsrv's DNS server (what pebble resolves with).
    pub dns: SocketAddr,
    /// pebble-challtestsrv's management API (`/set-txt`, `/clear-txt`).
    pub challtestsrv: SocketAddr,
    /// pebble's own listener certificate and key (for a server standing in front of it).
    pub listener_cert: rustls_pki_types::CertificateDer<'static>,
    pub listener_key_pem: String,
    _dir: tempfile::TempDir,
}

impl Pebble {
    /// pebble validating HTTP-01 on `http_port` of whatever its DNS says (127.0.0.1).
    pub async fn start(http_port: u16) -> Option<Pebble> {
        Pebble::start_on(http_port, free_port()).await
    }

    /// pebble validating TLS-ALPN-01 on `tls_port`.
    pub async fn start_alpn(tls_port: u16) -> Option<Pebble> {
        Pebble::start_on(free_port(), tls_port).await
    }

    pub async fn start_on(http_port: u16, tls_port: u16) -> Option<Pebble> {
        let pebble = tools::find(&PEBBLE)?;
        let challtestsrv = tools::find(&CHALLTESTSRV)?;
        let dir = tempfile::tempdir().expect("temp dir");
        // The test's CA, and pebble's listener certificate signed by it.
        let pki = test_pki(&["127.0.0.1", "localhost"]);
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &pki.ca_pem).expect("write CA");
        std::fs::write(dir.path().join("pebble.crt"), &pki.leaf_pem).expect("write cert");
        std::fs::write(dir.path().join("pebble.key"), &pki.leaf_key_pem).expect("write key");
        // A port picked free may be taken by someone else before pebble binds it (tests run in
        // parallel): a pebble that does not come up is started again on other ports.
        for _attempt in 0..3 {
            let ports = (free_port(), free_port(), free_port(), free_port());
            let Some((dns, server)) = Self::spawn_pair(
                &pebble,
                &challtestsrv,
                dir.path(),
                ports,
                (http_port, tls_port),
                &pki.ca,
            )
            .await
            else {
                continue;
            };
            let (dns_port, acme_port, mgmt_port, cts_mgmt) = ports;
            return Some(Pebble {
                _dns: dns,
                _server: server,
                directory: format!("https://127.0.0.1:{acme_port}/dir"),
                management: ([127, 0, 0, 1], mgmt_port).into(),
                ca_file,
                ca: pki.ca,
                listener_cert: pki.leaf,
                listener_key_pem: pki.leaf_key_pem,
                dns: ([127, 0, 0, 1], dns_port).into(),
                challtestsrv: ([127, 0, 0, 1], cts_mgmt).into(),
                _dir: dir,
            });
        }
        panic!("pebble did not start (3 attempts)");
    }

    /// pebble-challtestsrv and pebble on `ports` (DNS, ACME, management, challtestsrv management),
    /// once pebble answers on its ACME port with the certificate signed by `ca` (within 10 s) and
    /// both are still running; `None` if not. A bare connect is not proof: when another test took
    /// the port first, pebble exits and the connect reaches that test's listener instead (CI saw
    /// a proxy's restart then refuse the ACME client).
    async fn spawn_pair(
        pebble: &std::path::Path,
        challtestsrv: &std::path::Path,
        dir: &std::path::Path,
        (dns_port, acme_port, mgmt_port, cts_mgmt): (u16, u16, u16, u16),
        (http_port, tls_port): (u16, u16),
        ca: &rustls_pki_types::CertificateDer<'static>,
    ) -> Option<(Running, Running)> {
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
        let mut dns = Running(dns);
        let config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{acme_port}"),
            "managementListenAddress": format!("127.0.0.1:{mgmt_port}"),
            "certificate": dir.join("pebble.crt"),
            "privateKey": dir.join("pebble.key"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            // 30 days: a renewal threshold of 60 days makes any certificate due.
            "certificateValidityPeriod": 30 * 86_400,
            "externalAccountBindingRequired": false,
        }});
        let config_file = dir.join("pebble.json");
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
        let mut server = Running(server);
        let trusting_ca = tls_client_config(std::slice::from_ref(ca), &[b"http/1.1"]);
        let up = eventually_async(Duration::from_secs(10), || {
            answers_with_certificate(acme_port, trusting_ca.clone())
        });
        let challtestsrv_up = async {
            eventually_async(Duration::from_secs(10), || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", cts_mgmt))
                    .await
                    .ok()
            })
            .await
        };
        let answered = up.await.is_some() && challtestsrv_up.await.is_some();
        (answered && dns.still_running() && server.still_running()).then_some((dns, server))
    }

    /// pebble's current issuing root (its management API), for checking what aralez serves.
    pub async fn root(&self) -> rustls_pki_types::CertificateDer<'static> {
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
pub fn main_for(
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
pub async fn serves(
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
pub async fn logs(proxy: &ProxyProcess, text: &str) -> bool {
    let said = eventually_async(Duration::from_secs(60), || async {
        proxy.log_text().contains(text).then_some(())
    });
    said.await.is_some()
}

/// pebble, a backend for `acme.test`, and a proxy (on `http`, the port pebble validates on)
/// that pebble has issued `acme.test`'s certificate to.
pub struct Issued {
    pub pebble: Pebble,
    pub backend: Backend,
    pub http: std::net::SocketAddr,
    /// upstreams.yaml and main.yaml of the proxy.
    pub yaml: String,
    pub main: String,
    pub certs: tempfile::TempDir,
    pub state: tempfile::TempDir,
    pub proxy: ProxyProcess,
}

/// [`Issued`], or `None` when pebble is not installed.
pub async fn issued_for_acme_test() -> Option<Issued> {
    issued_after(|_| {}).await
}

/// [`issued_for_acme_test`], with `prepare` done to the state folder before the start.
pub async fn issued_after(prepare: impl FnOnce(&std::path::Path)) -> Option<Issued> {
    let http: std::net::SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let pebble = Pebble::start(http.port()).await?;
    let backend = Backend::start("site").await;
    let yaml = host_route("acme.test", &backend);
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    prepare(state.path());
    let main = main_for(&pebble, certs.path(), state.path(), "");
    let proxy = ProxyProcess::start_on(&yaml, &main, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    Some(Issued {
        pebble,
        backend,
        http,
        yaml,
        main,
        certs,
        state,
        proxy,
    })
}
