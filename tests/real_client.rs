//! Real client addresses through the binary: HAProxy (Debian's) in front of aralez with
//! `proxy_protocol: true`, in mode tcp and http, sending PROXY v1 and v2, to the plain and the
//! TLS listener; hand-written v1/v2 headers (TLVs, IPv6, LOCAL, a header in pieces); connections
//! without a valid header closed; `trusted_proxies` deciding whose `X-Forwarded-For` the access
//! log believes; `X-Request-Id` made, replaced, kept, unique, seen by the backend and logged.
//!
//! Clients connect from other loopback addresses (127.0.0.2, ...) than HAProxy's (127.0.0.1),
//! so the real client address and the connection's peer differ.

use crate::policies_support;
use crate::support;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use policies_support::connect_from;
use support::ports::free_port;
use support::tools::{self, Tool};
use support::{body_bytes, default_route, full, header, Backend, Client, Proto, ProxyProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HAPROXY: Tool = Tool {
    env: "ARALEZ_HAPROXY",
    installed: "/usr/sbin/haproxy",
    on_path: &["haproxy"],
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// HAProxy running `config` in the foreground, killed on drop.
struct Haproxy {
    child: Child,
    dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts it and waits until every port in `ports` accepts.
    fn start(program: &std::path::Path, config: &str, ports: &[u16]) -> Haproxy {
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config).expect("write haproxy.cfg");
        let log = std::fs::File::create(dir.path().join("haproxy.log")).expect("log file");
        let child = Command::new(program)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn haproxy");
        let mut haproxy = Haproxy { child, dir };
        let up = support::eventually_blocking(Duration::from_secs(10), || {
            ports.iter().all(|p| {
                let addr = SocketAddr::from(([127, 0, 0, 1], *p));
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            })
        });
        if !up {
            let _ = haproxy.child.kill();
            panic!("haproxy did not start:\n{}", haproxy.log());
        }
        haproxy
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HAProxy frontend on `port` passing to `server` with `send` (`send-proxy`, ...).
fn frontend(name: &str, mode: &str, port: u16, server: SocketAddr, send: &str) -> String {
    format!(
        "frontend {name}\n    mode {mode}\n    bind 127.0.0.1:{port}\n    default_backend {name}_out\n\
         backend {name}_out\n    mode {mode}\n    server s1 {server} {send}\n"
    )
}

/// The proxy with `proxy_protocol: true`, a plain and a TLS listener and the access log on,
/// sending everything to `backend`; returns it, its TLS address and the client TLS config.
fn proxy_behind_a_balancer(
    backend: &Backend,
    extra: &str,
) -> (
    ProxyProcess,
    SocketAddr,
    Arc<rustls::ClientConfig>,
    tempfile::TempDir,
) {
    let certs = tempfile::tempdir().expect("cert dir");
    let der = support::write_self_signed(certs.path(), "localhost", &["localhost"]);
    let main = format!(
        "proxy_protocol: true\naccess_log: all\nproxy_address_tls: \"127.0.0.1:0\"\n\
         proxy_certificates: \"{}\"\n{extra}",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&default_route(&[backend]), &main);
    let tls = proxy.logged_addr("listening on https://");
    let config = support::tls_client_config(&[der], &[b"h2", b"http/1.1"]);
    (proxy, tls, config, certs)
}

async fn tcp_from(source: IpAddr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
        .expect("bind source");
    let stream = socket.connect(to).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    stream
}

async fn tls_from(source: IpAddr, to: SocketAddr, config: Arc<rustls::ClientConfig>) -> Client {
    let stream = tcp_from(source, to).await;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .expect("TLS handshake through haproxy");
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Client::handshake(if h2 { Proto::H2c } else { Proto::H1 }, tls).await
}

/// GET `/` with `headers`: (status, x-seen-xff, x-seen-request-id, the response's id).
async fn get(c: &mut Client, headers: &[(&str, &str)]) -> (u16, String, String, String) {
    let resp = c
        .send(
            Method::GET,
            Some("app.test"),
            "/",
            headers,
            full(Bytes::new()),
        )
        .await;
    let out = (
        resp.status().as_u16(),
        header(&resp, "x-seen-xff"),
        header(&resp, "x-seen-request-id"),
        header(&resp, "x-request-id"),
    );
    body_bytes(resp).await;
    out
}

#[tokio::test]
async fn haproxy_in_front_gives_the_real_client_address() {
    let Some(haproxy) = tools::find(&HAPROXY) else {
        return;
    };
    let backend = Backend::start("b").await;
    let (proxy, tls_addr, tls_config, _certs) = proxy_behind_a_balancer(&backend, "");
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let config = [
        "global\n    maxconn 200\ndefaults\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n".to_string(),
        frontend("tcp_v1", "tcp", ports[0], proxy.addr, "send-proxy"),
        frontend("tcp_v2", "tcp", ports[1], proxy.addr, "send-proxy-v2"),
        frontend("http_v1", "http", ports[2], proxy.addr, "send-proxy"),
        frontend("tls_v2", "tcp", ports[3], tls_addr, "send-proxy-v2"),
    ]
    .concat();
    let lb = Haproxy::start(&haproxy, &config, &ports);
    let cases = [
        ("tcp_v1", ports[0], "127.0.0.2", Proto::H1),
        ("tcp_v2", ports[1], "127.0.0.3", Proto::H2c),
        ("http_v1", ports[2], "127.0.0.4", Proto::H1),
    ];
    let mut ids = Vec::new();
    for (name, port, client, proto) in cases {
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        let mut c = connect_from(proto, to, ip(client)).await;
        for _ in 0..2 {
            let (status, xff, seen_id, id) = get(&mut c, &[]).await;
            assert_eq!(status, 200, "{name}; haproxy:\n{}", lb.log());
            assert_eq!(
                xff, client,
                "{name}: the backend sees the client, not haproxy"
            );
            assert_eq!(id.len(), 32, "{name}: an id is made");
            assert_eq!(seen_id, id, "{name}: the backend got the id the client got");
            ids.push((client, id));
        }
    }
    let mut c = tls_from(
        ip("127.0.0.5"),
        SocketAddr::from(([127, 0, 0, 1], ports[3])),
        tls_config,
    )
    .await;
    let resp = c.get("localhost", "/").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-seen-xff"),
        "127.0.0.5",
        "TLS behind PROXY v2"
    );
    assert_eq!(header(&resp, "x-seen-proto"), "https");
    ids.push(("127.0.0.5", header(&resp, "x-request-id")));
    body_bytes(resp).await;
    // The access log names the real client, with the id the client got.
    for (client, id) in &ids {
        let line = format!("client={client} ");
        proxy.wait_log(&line, Duration::from_secs(10)).await;
        proxy
            .wait_log(&format!("request_id={id} "), Duration::from_secs(10))
            .await;
        let log = proxy.log_text();
        let logged = log
            .lines()
            .find(|l| l.contains(&format!("request_id={id} ")));
        assert!(logged.is_some_and(|l| l.contains(&line)), "{id}: {log}");
    }
    assert_eq!(
        proxy.log_count("client=127.0.0.1 "),
        0,
        "haproxy itself is never the client"
    );
}

/// Sends `bytes` (a PROXY header and a request) and reads the whole answer.
async fn exchange(addr: SocketAddr, parts: &[&[u8]]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            // Give each part its own segment, so the proxy meets a header in pieces.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        if stream.write_all(part).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the proxy neither answered nor closed");
    String::from_utf8_lossy(&answer).into_owned()
}

fn seen(answer: &str, name: &str) -> String {
    answer
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or("")
        .to_string()
}

fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.extend_from_slice(&[0x20 | cmd, family]);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn v2_inet(src: [u8; 4], tlvs: &[u8]) -> Vec<u8> {
    let mut body = src.to_vec();
    body.extend_from_slice(&[127, 0, 0, 1]);
    body.extend_from_slice(&40000u16.to_be_bytes());
    body.extend_from_slice(&80u16.to_be_bytes());
    body.extend_from_slice(tlvs);
    v2(1, 0x11, &body)
}

fn v2_inet6(src: std::net::Ipv6Addr) -> Vec<u8> {
    let mut body = src.octets().to_vec();
    body.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    body.extend_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
    v2(1, 0x21, &body)
}

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn hand_written_headers_are_read_and_bad_ones_refused() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(
        &default_route(&[&backend]),
        "proxy_protocol: true\naccess_log: all",
    );
    // An ALPN TLV, a CRC32C-sized one and an empty NOOP: skipped.
    let tlvs = [
        0x01, 0x00, 0x02, b'h', b'2', 0x03, 0x00, 0x04, 1, 2, 3, 4, 0x04, 0x00, 0x00,
    ];
    let v6: std::net::Ipv6Addr = "2001:db8::9".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "v1 TCP4",
            b"PROXY TCP4 198.51.100.7 127.0.0.1 4000 80\r\n".to_vec(),
            "198.51.100.7",
        ),
        (
            "v1 TCP6",
            b"PROXY TCP6 2001:db8::7 ::1 4000 80\r\n".to_vec(),
            "2001:db8::7",
        ),
        ("v1 UNKNOWN", b"PROXY UNKNOWN\r\n".to_vec(), "127.0.0.1"),
        (
            "v2 INET with TLVs",
            v2_inet([203, 0, 113, 9], &tlvs),
            "203.0.113.9",
        ),
        ("v2 INET6", v2_inet6(v6), "2001:db8::9"),
        ("v2 LOCAL", v2(0, 0x00, &[]), "127.0.0.1"),
        ("v2 AF_UNIX", v2(1, 0x31, &[0; 216]), "127.0.0.1"),
    ];
    for (name, head, client) in &cases {
        // The header and the request in one write: nothing past the header may be lost.
        let together = [head.as_slice(), REQUEST].concat();
        let answer = exchange(proxy.addr, &[&together]).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{name}: {answer}");
        assert_eq!(seen(&answer, "x-seen-xff"), *client, "{name}");
        // The header in pieces, the request after it.
        let (a, b) = head.split_at(head.len() / 2);
        let (b, c) = b.split_at(b.len() - 1);
        let answer = exchange(proxy.addr, &[a, b, c, REQUEST]).await;
        assert_eq!(
            seen(&answer, "x-seen-xff"),
            *client,
            "{name} in pieces: {answer}"
        );
    }
    proxy
        .wait_log("client=2001:db8::9 ", Duration::from_secs(10))
        .await;
    let served = backend.requests();
    let refused: [(&str, Vec<u8>); 6] = [
        ("no header", REQUEST.to_vec()),
        ("garbage", b"HELLO THERE\r\n\r\n".to_vec()),
        ("bad v1", b"PROXY TCP9 1.2.3.4 1.2.3.4 1 1\r\n".to_vec()),
        (
            "v1 too long",
            [b"PROXY UNKNOWN ".as_slice(), &[b'x'; 120]].concat(),
        ),
        ("v2 version 1", {
            let mut h = v2_inet([1, 2, 3, 4], &[]);
            h[12] = 0x11;
            h
        }),
        (
            "TLS without a header",
            b"\x16\x03\x01\x00\x05hello".to_vec(),
        ),
    ];
    for (name, bytes) in refused {
        let answer = exchange(proxy.addr, &[&bytes, REQUEST]).await;
        assert_eq!(answer, "", "{name}: closed without an answer");
    }
    assert_eq!(
        backend.requests(),
        served,
        "nothing refused reached the backend"
    );
}

#[tokio::test]
async fn request_ids_and_forwarded_for_follow_trust() {
    let backend = Backend::start("b").await;
    let main = "trusted_proxies: [\"127.0.0.2\", \"10.0.0.0/8\"]\naccess_log: all";
    let proxy = ProxyProcess::start(&default_route(&[&backend]), main);
    let (trusted, outsider) = (ip("127.0.0.2"), ip("127.0.0.3"));
    for proto in [Proto::H1, Proto::H2c] {
        // From a trusted peer: its id is kept, its X-Forwarded-For believed.
        let mut lb = connect_from(proto, proxy.addr, trusted).await;
        let kept_id = format!("lb-{proto:?}-42");
        let (status, xff, seen_id, id) = get(
            &mut lb,
            &[
                ("x-request-id", &kept_id),
                ("x-forwarded-for", "203.0.113.50, 10.1.2.3"),
            ],
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            (seen_id.as_str(), id.as_str()),
            (kept_id.as_str(), kept_id.as_str())
        );
        assert_eq!(
            xff, "203.0.113.50, 10.1.2.3, 127.0.0.2",
            "the peer is appended as always"
        );
        proxy
            .wait_log("client=203.0.113.50 ", Duration::from_secs(10))
            .await;
        // A trusted peer's insane id is replaced.
        let (_, _, seen_id, id) = get(&mut lb, &[("x-request-id", "has space")]).await;
        assert_eq!(id.len(), 32);
        assert_eq!(seen_id, id);
        // From anyone else: the id is replaced, the header not believed.
        let mut c = connect_from(proto, proxy.addr, outsider).await;
        let (_, xff, seen_id, id) = get(
            &mut c,
            &[
                ("x-request-id", "forged"),
                ("x-forwarded-for", "198.51.100.66"),
            ],
        )
        .await;
        assert_ne!(id, "forged");
        assert_eq!(id.len(), 32);
        assert_eq!(seen_id, id, "the backend sees the replacement");
        assert_eq!(xff, "198.51.100.66, 127.0.0.3");
        proxy
            .wait_log(&format!("request_id={id} "), Duration::from_secs(10))
            .await;
        let log = proxy.log_text();
        let line = log
            .lines()
            .find(|l| l.contains(&format!("request_id={id} ")));
        assert!(
            line.is_some_and(|l| l.contains("client=127.0.0.3 ")),
            "{log}"
        );
    }
    // Ids are unique across requests, connections and workers.
    let mut seen_ids = HashSet::new();
    for round in 0..8 {
        let proto = if round % 2 == 0 {
            Proto::H1
        } else {
            Proto::H2c
        };
        let mut c = connect_from(proto, proxy.addr, outsider).await;
        for _ in 0..10 {
            let (_, _, _, id) = get(&mut c, &[]).await;
            assert!(seen_ids.insert(id.clone()), "{id} given twice");
        }
    }
    assert_eq!(
        proxy.log_count("client=198.51.100.66"),
        0,
        "an outsider's XFF is not believed"
    );
}

/// A TLS-terminating balancer in `trusted_proxies` says its client came over TLS with
/// `X-Forwarded-Proto: https`: a `to_https` route serves the request (a redirect would loop) and
/// the backend hears `https`. From anyone else the field is not believed and the route redirects.
#[tokio::test]
async fn to_https_believes_a_trusted_balancers_forwarded_proto() {
    let backend = Backend::start("b").await;
    let routes = every_host_to(support::upstreams::Path::servers(&[&backend]).to_https(true));
    let proxy = ProxyProcess::start(&routes, "trusted_proxies: [\"127.0.0.2\"]");
    for proto in [Proto::H1, Proto::H2c] {
        let mut lb = connect_from(proto, proxy.addr, ip("127.0.0.2")).await;
        let resp = send_a(&mut lb, &[("x-forwarded-proto", "https")]).await;
        assert_eq!(resp.status(), 200, "{proto:?}: served, not redirected");
        assert_eq!(header(&resp, "x-seen-proto"), "https", "{proto:?}");
        body_bytes(resp).await;
        let resp = send_a(&mut lb, &[]).await;
        assert_eq!(resp.status(), 301, "{proto:?}: no field, a plain request");
        assert_eq!(header(&resp, "location"), "https://app.test/a?b=1");
        body_bytes(resp).await;
        let mut outsider = connect_from(proto, proxy.addr, ip("127.0.0.3")).await;
        let resp = send_a(&mut outsider, &[("x-forwarded-proto", "https")]).await;
        assert_eq!(
            resp.status(),
            301,
            "{proto:?}: an outsider's field is not believed"
        );
        body_bytes(resp).await;
    }
    assert_eq!(backend.requests(), 2);
}

/// What only a proxy in front may say of a request (`Forwarded`, the other `X-Forwarded-*`,
/// `X-Real-IP`, `True-Client-IP`) and the target and host overrides some frameworks obey (`X-Original-URL`,
/// `X-Rewrite-URL`, `X-Host`) reach the backend from a trusted balancer only: from anyone else
/// they passed unchanged, so a backend building links from `Forwarded: host=` took a client's
/// word for it, and a cached answer built so was served to everyone.
#[tokio::test]
async fn only_a_trusted_balancer_says_what_a_proxy_says() {
    let backend = Backend::start("b").await;
    let routes = every_host_to(support::upstreams::Path::servers(&[&backend]));
    let proxy = ProxyProcess::start(&routes, "trusted_proxies: [\"127.0.0.2\"]");
    let claims = [
        ("forwarded", "host=evil.test;proto=https"),
        ("x-forwarded-port", "8443"),
        ("x-forwarded-prefix", "/evil"),
        ("x-real-ip", "198.51.100.7"),
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("x-host", "evil.test"),
        ("x_real_ip", "198.51.100.8"),
        ("x-forwarded-uri", "/admin"),
        ("x-forwarded-client-cert", "Hash=forged"),
        ("true-client-ip", "198.51.100.9"),
        ("x-app", "kept"),
    ];
    // The proxy's own fields spelled with `_`: a CGI-style backend joins them with the proxy's
    // (`HTTP_X_FORWARDED_HOST: evil.test, app.test`), so they go from everyone's requests.
    let shadows = [
        ("x_forwarded_host", "evil.test"),
        ("x_forwarded_for", "6.6.6.6"),
        ("x-forwarded_proto", "https"),
        ("x_request_id", "forged"),
    ];
    let sent: Vec<(&str, &str)> = claims.iter().chain(&shadows).copied().collect();
    for proto in [Proto::H1, Proto::H2c] {
        let mut outsider = connect_from(proto, proxy.addr, ip("127.0.0.3")).await;
        let resp = send_a(&mut outsider, &sent).await;
        let names = header(&resp, "x-seen-headers");
        assert!(names.contains("x-app"), "{proto:?}: {names}");
        for (name, _) in claims[..11].iter().chain(&shadows) {
            assert!(
                !names.split(',').any(|n| n == *name),
                "{proto:?}: {name} in {names}"
            );
        }
        body_bytes(resp).await;
        let mut lb = connect_from(proto, proxy.addr, ip("127.0.0.2")).await;
        let resp = send_a(&mut lb, &sent).await;
        let names = header(&resp, "x-seen-headers");
        for (name, _) in &claims {
            assert!(
                names.split(',').any(|n| n == *name),
                "{proto:?}: {name} not in {names}"
            );
        }
        for (name, _) in &shadows {
            assert!(
                !names.split(',').any(|n| n == *name),
                "{proto:?}: {name} from a trusted balancer in {names}"
            );
        }
        body_bytes(resp).await;
    }
}

/// Routes sending every host's `/` to `path`, unprobed.
fn every_host_to(path: support::upstreams::Path) -> String {
    support::upstreams::Upstreams::new()
        .host(
            "DEFAULT",
            support::upstreams::Host::new().path("/", path.healthcheck(false)),
        )
        .render()
}

async fn send_a(c: &mut Client, headers: &[(&str, &str)]) -> http::Response<hyper::body::Incoming> {
    c.send(
        Method::GET,
        Some("app.test"),
        "/a?b=1",
        headers,
        full(Bytes::new()),
    )
    .await
}
