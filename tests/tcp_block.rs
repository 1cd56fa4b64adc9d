//! Aralez 0.95's `tcp:` block through the binary: keep-alive from the block (over the top-level
//! key, read back from the kernel's connection table), `so_reuseport: false` keeping a second
//! binder out, `tcp_fastopen` set (its socket option is read back in `server::listener`'s unit
//! test), connections handed over with their first bytes unless `tcp_defer_accept: false`
//! (read back from the kernel's connection table), and `check-config` naming bad network keys (`tcp`, `proxy_protocol`,
//! `trusted_proxies`) with file, line and key.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use support::{body_bytes, default_route, full, Backend, Client, Proto, ProxyProcess};
use tokio::net::TcpStream;

/// Status of a GET `/`.
async fn get(c: &mut Client) -> u16 {
    let resp = c
        .send(Method::GET, Some("app.test"), "/", &[], full(Bytes::new()))
        .await;
    let status = resp.status().as_u16();
    body_bytes(resp).await;
    status
}

/// The fields of /proc/net/tcp's line for the proxy's side of the connection from `client` to
/// `proxy` (1: local address, 2: remote, 3: state, 5: timer).
fn proxy_side_fields(proxy: SocketAddr, client: SocketAddr) -> Option<Vec<String>> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let f: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let ours = port_of(f.get(1)?)? == proxy.port() && port_of(f.get(2)?)? == client.port();
        ours.then_some(f)
    })
}

/// The keep-alive timer (`tr` 2) of the proxy's side of the connection from `client` to
/// `proxy`, in seconds, if one runs.
fn keepalive_timer(proxy: SocketAddr, client: SocketAddr) -> Option<f64> {
    let fields = proxy_side_fields(proxy, client)?;
    let (kind, when) = fields.get(5)?.split_once(':')?;
    (kind == "02").then(|| u64::from_str_radix(when, 16).ok().map(|t| t as f64 / 100.0))?
}

/// The state (`st`: 01 established, 03 SYN received) of the proxy's side of the connection
/// from `client` to `proxy`.
fn proxy_side_state(proxy: SocketAddr, client: SocketAddr) -> Option<u8> {
    u8::from_str_radix(proxy_side_fields(proxy, client)?.get(3)?, 16).ok()
}

/// Connects to `proxy` without sending anything: the proxy's side's state at once.
async fn state_of_a_silent_connection(proxy: SocketAddr) -> (Option<u8>, TcpStream) {
    let silent = TcpStream::connect(proxy).await.unwrap();
    let state = proxy_side_state(proxy, silent.local_addr().unwrap());
    (state, silent)
}

const ESTABLISHED: u8 = 0x01;
const SYN_RECEIVED: u8 = 0x03;

#[tokio::test]
async fn the_tcp_block_is_applied() {
    let backend = Backend::start("b").await;
    let main =
        "tcp_keepalive_idle: 500\ntcp:\n  tcp_keepalive_idle: 7\n  tcp_keepalive_interval: 2\n  \
                so_reuseport: false\n  tcp_fastopen: true\n  tcp_defer_accept: false";
    let proxy = ProxyProcess::start(&default_route(&[&backend]), main);
    proxy
        .wait_log(
            "is also given at the top of main.yaml",
            Duration::from_secs(5),
        )
        .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let local = stream.local_addr().unwrap();
    let mut c = Client::handshake(Proto::H1, stream).await;
    assert_eq!(get(&mut c).await, 200, "the proxy serves");
    // Keep-alive from the block (7 s), not from the top level (500 s).
    let timer = support::eventually_some(Duration::from_secs(5), || {
        keepalive_timer(proxy.addr, local)
    })
    .await;
    assert!(
        timer.is_some_and(|t| t > 0.0 && t <= 7.0),
        "keep-alive timer: {timer:?}"
    );
    // One listener without SO_REUSEPORT: another binder cannot join the port.
    let joiner =
        aralez::server::listener::bind_one(proxy.addr, aralez::server::ListenOptions::default());
    assert_eq!(
        joiner.map(drop).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::AddrInUse)
    );
    // Without defer-accept a connection is the proxy's as soon as its handshake ends.
    let (state, _silent) = state_of_a_silent_connection(proxy.addr).await;
    assert_eq!(state, Some(ESTABLISHED));
    // The proxy still serves, its workers on the one shared socket.
    for _ in 0..6 {
        let mut c = Client::connect(Proto::H1, proxy.addr).await;
        assert_eq!(get(&mut c).await, 200);
    }
    // By default (SO_REUSEPORT listeners) a binder of the same user could join; keep-alive off.
    let other = ProxyProcess::start(&default_route(&[&backend]), "");
    let joiner =
        aralez::server::listener::bind_one(other.addr, aralez::server::ListenOptions::default());
    assert!(
        joiner.is_ok(),
        "SO_REUSEPORT listeners let a second binder in"
    );
    drop(joiner);
    let stream = TcpStream::connect(other.addr).await.unwrap();
    let local = stream.local_addr().unwrap();
    let mut c = Client::handshake(Proto::H1, stream).await;
    assert_eq!(get(&mut c).await, 200);
    assert_eq!(keepalive_timer(other.addr, local), None);
    // By default the kernel keeps a connection until its first bytes come (TCP_DEFER_ACCEPT):
    // the proxy's side is not established yet.
    let (state, _silent) = state_of_a_silent_connection(other.addr).await;
    assert_eq!(state, Some(SYN_RECEIVED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_upgrade_sets_tcp_defer_accept_on_the_listeners_it_receives() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "upgrade_sock: \"{}\"",
        dir.path().join("upgrade.sock").display()
    );
    let old = ProxyProcess::start(&default_route(&[&backend]), &extra);
    let (state, _silent) = state_of_a_silent_connection(old.addr).await;
    assert_eq!(state, Some(SYN_RECEIVED), "deferred by default");
    let conf = old.path("main.yaml");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}\ntcp:\n  tcp_defer_accept: false\n")).unwrap();
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    assert_eq!(new.addr, old.addr, "the listener is handed over");
    let (state, _silent) = state_of_a_silent_connection(new.addr).await;
    assert_eq!(state, Some(ESTABLISHED), "the new setting applies");
}

/// `aralez check-config --format json` on a main.yaml: its issues as (severity, line, key,
/// message).
fn check(main: &str) -> (i32, Vec<(String, u64, String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), support::unused_route()).unwrap();
    let path: PathBuf = dir.path().join("main.yaml");
    std::fs::write(&path, main).unwrap();
    let out = Command::new(support::binary())
        .args(["check-config", "--format", "json", "-c"])
        .arg(&path)
        .output()
        .expect("run check-config");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let issues = json["issues"].as_array().cloned().unwrap_or_default();
    let issues = issues
        .iter()
        .map(|i| {
            assert!(
                i["file"].as_str().unwrap_or("").ends_with("main.yaml"),
                "{i}"
            );
            (
                i["severity"].as_str().unwrap_or("").to_string(),
                i["line"].as_u64().unwrap_or(0),
                i["key"].as_str().unwrap_or("").to_string(),
                i["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap_or(-1), issues)
}

#[test]
fn check_config_names_bad_network_keys() {
    let main = "\
proxy_address_http: \"127.0.0.1:0\"
upstreams_conf: upstreams.yaml
proxy_protocol: maybe
trusted_proxies:
  - 10.0.0.0/8
  - 10.0.0.1/8
  - \"2001:db8::/200\"
tcp_keepalive_count: 5
tcp:
  tcp_fastopen: 70000
  so_reuseport: sometimes
  tcp_keepalive_count: 0
  tcp_keepalive_idel: 5
  tcp_defer_accept: 1s
";
    let (code, issues) = check(main);
    assert_eq!(code, 1, "{issues:?}");
    let want = [
        ("error", 3, "proxy_protocol", "true or false"),
        ("error", 6, "trusted_proxies[1]", "did you mean 10.0.0.0/8"),
        ("error", 7, "trusted_proxies[2]", "out of range"),
        ("error", 10, "tcp.tcp_fastopen", "between 0 and 65535"),
        ("error", 11, "tcp.so_reuseport", "true or false"),
        ("error", 12, "tcp.tcp_keepalive_count", "between 1 and 100"),
        (
            "warning",
            12,
            "tcp.tcp_keepalive_count",
            "also given at the top",
        ),
        (
            "warning",
            13,
            "tcp.tcp_keepalive_idel",
            "did you mean `tcp_keepalive_idle`",
        ),
        ("error", 14, "tcp.tcp_defer_accept", "true or false"),
    ];
    for (sev, line, key, msg) in want {
        assert!(
            issues
                .iter()
                .any(|(s, l, k, m)| s == sev && *l == line && k == key && m.contains(msg)),
            "missing {sev} {line} {key} {msg}: {issues:#?}"
        );
    }
    let (code, issues) =
        check("proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\ntcp: [1, 2]\n");
    assert_eq!(code, 1);
    assert!(
        issues
            .iter()
            .any(|(_, l, k, m)| *l == 3 && k == "tcp" && m.contains("mapping")),
        "{issues:?}"
    );
    let valid = "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
                 proxy_protocol: true\ntrusted_proxies: \"192.0.2.0/24\"\n\
                 tcp:\n  tcp_fastopen: 256\n  so_reuseport: true\n  tcp_keepalive_idle: 30\n  \
                 tcp_defer_accept: true\n";
    let (code, issues) = check(valid);
    assert_eq!((code, issues.len()), (0, 0), "{issues:?}");
}
