//! Live upgrades (SPEC §12) that change main.yaml's listeners: the new process keeps the
//! inherited listeners its configuration still names and binds the others; an upgrade that finds
//! no instance on its `upgrade_sock` while another holds the ports is refused instead of sharing
//! them. Through the binary.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::ports::free_port;
use support::*;
use tokio::net::TcpStream;

fn upstreams_for(backend: &Backend) -> String {
    Upstreams::new()
        .host("x.test", Host::new().path("/", Path::servers(&[backend])))
        .render()
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The old process listens on HTTP port A and TLS port T; the new main.yaml moves HTTP to port
/// B and drops TLS. The new process used to keep A and T (T accepting and never answering) and
/// never bind B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_applies_the_new_listen_addresses() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    write_self_signed(dir.path(), "x", &["x.test"]);
    let (a, b, t) = (local(free_port()), local(free_port()), local(free_port()));
    let extra = format!(
        "proxy_address_tls: \"{t}\"\nproxy_certificates: \"{}\"\ngrace_period_seconds: 5",
        dir.path().display()
    );
    let mut old = ProxyProcess::start_on(&upstreams_for(&backend), &extra, a);
    old.logged_addr("listening on https://");
    let conf = old.path("main.yaml");
    let text = std::fs::read_to_string(&conf).unwrap();
    let moved: String = text
        .replace(&a.to_string(), &b.to_string())
        .lines()
        .filter(|l| !l.starts_with("proxy_address_tls") && !l.starts_with("proxy_certificates"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&conf, moved).unwrap();
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    new.wait_log("live upgrade: received", Duration::from_secs(10))
        .await;
    assert_eq!(new.addr, b, "{}", new.log_text());
    old.signal(Signal::SIGQUIT);
    old.expect_clean_exit(Duration::from_secs(15), "the old process");
    let mut client = Client::connect(Proto::H1, b).await;
    assert_eq!(client.get("x.test", "/").await.status(), 200);
    assert!(refused(a).await, "the old HTTP port is still open");
    assert!(refused(t).await, "the dropped TLS port is still open");
    let log = new.log_text();
    assert!(log.contains("not in the configuration"), "{log}");
}

/// `-u` with an `upgrade_sock` nobody answers on (a typo), while another instance serves the
/// same ports: refused, as a plain start is. It used to bind beside that instance, the two
/// sharing the port through SO_REUSEPORT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_finds_no_instance_does_not_share_another_ones_ports() {
    let backend = Backend::start("b").await;
    let port = local(free_port());
    let running = ProxyProcess::start_on(&upstreams_for(&backend), "", port);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), upstreams_for(&backend)).unwrap();
    let main = format!(
        "proxy_address_http: \"{port}\"\nupstreams_conf: upstreams.yaml\n\
         upgrade_sock: \"{0}/typo.sock\"\npid_file: \"{0}/other.pid\"\n",
        dir.path().display()
    );
    std::fs::write(dir.path().join("main.yaml"), main).unwrap();
    let mut upgrade = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
        .args(["-u", "-c"])
        .arg(dir.path().join("main.yaml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = eventually(Duration::from_secs(10), || {
        upgrade.try_wait().ok().flatten().is_some()
    })
    .await;
    if !exited {
        let _ = upgrade.kill();
    }
    let out = upgrade.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        exited,
        "the upgrade kept running beside the other instance: {text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("already in use"), "{text}");
    let mut client = Client::connect(Proto::H1, port).await;
    assert_eq!(client.get("x.test", "/").await.status(), 200);
    drop(running);
}

/// An upgrade rolled back by stopping the new process (nginx's `.oldbin`): the old one takes
/// upgrades again. The new process removed its socket file on the way out, so the next
/// `aralez -u` found no instance, and the old one, counting the sockets as taken, drained at
/// once on SIGQUIT with nobody serving after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rollback_the_old_process_takes_the_next_upgrade() {
    let backend = Backend::start("b").await;
    let mut old = ProxyProcess::start(&upstreams_for(&backend), "grace_period_seconds: 5");
    let conf = old.path("main.yaml");
    let pid_file = old.path("aralez.pid");
    let named = || std::fs::read_to_string(&pid_file).unwrap_or_default();
    let mut rolled_back = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    rolled_back
        .wait_log("live upgrade: received", Duration::from_secs(10))
        .await;
    rolled_back.signal(Signal::SIGTERM);
    rolled_back.expect_clean_exit(Duration::from_secs(15), "the rolled-back process");
    assert_eq!(
        named().trim(),
        old.pid().to_string(),
        "the pid file goes back"
    );
    old.wait_log("takes upgrades again", Duration::from_secs(10))
        .await;
    let mut next = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    next.wait_log("live upgrade: received", Duration::from_secs(10))
        .await;
    old.signal(Signal::SIGQUIT);
    old.expect_clean_exit(Duration::from_secs(15), "the old process");
    assert_eq!(named().trim(), next.pid().to_string());
    let mut c = Client::connect(Proto::H1, next.addr).await;
    assert_eq!(
        c.get("x.test", "/").await.status(),
        200,
        "the next one serves"
    );
    next.signal(Signal::SIGTERM);
    next.expect_clean_exit(Duration::from_secs(15), "the next process");
}

/// A live upgrade whose certificate directory has a pair that does not load is refused: the
/// running process serves that name with its last good copy, and the new one would have served
/// it another certificate, or none. The old process keeps serving it, and the next upgrade,
/// once the file is fixed, goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_with_a_certificate_that_does_not_load_is_refused() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let root = write_self_signed(dir.path(), "x", &["x.test"]);
    let t = local(free_port());
    let extra = format!(
        "proxy_address_tls: \"{t}\"\nproxy_certificates: \"{}\"\ngrace_period_seconds: 5",
        dir.path().display()
    );
    let mut old = ProxyProcess::start(&upstreams_for(&backend), &extra);
    old.logged_addr("listening on https://");
    let good = std::fs::read(dir.path().join("x.crt")).unwrap();
    std::fs::write(dir.path().join("x.crt"), "garbage\n").unwrap();
    let conf = old.path("main.yaml");
    let upgrade = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
        .args(["-u", "-c"])
        .arg(&conf)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = tokio::task::block_in_place(|| upgrade.wait_with_output()).unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("do not load (said above): x;"), "{text}");
    assert!(text.contains("the live upgrade is refused"), "{text}");
    let served = || async {
        let tls = tls_client_config(std::slice::from_ref(&root), &[b"http/1.1"]);
        let mut client = Client::connect_tls(t, "x.test", tls).await;
        client.get("x.test", "/").await.status().as_u16()
    };
    assert_eq!(served().await, 200, "{}", old.log_text());

    std::fs::write(dir.path().join("x.crt"), good).unwrap();
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    new.wait_log("live upgrade: received", Duration::from_secs(10))
        .await;
    old.signal(Signal::SIGQUIT);
    old.expect_clean_exit(Duration::from_secs(15), "the old process");
    assert_eq!(served().await, 200, "{}", new.log_text());
}
