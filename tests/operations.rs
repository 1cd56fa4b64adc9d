//! Operations end to end (issue 6): graceful stop, live upgrade under load, daemon mode,
//! privilege drop, access log and metrics. The real binary, real sockets on 127.0.0.1.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::ports::free_port;
use support::*;
use tokio::net::TcpStream;

fn upstreams_for(backend: &Backend) -> String {
    Upstreams::new()
        .host("x.test", Host::new().path("/", Path::servers(&[backend])))
        .render()
}

async fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let backend = Backend::start("slow").await;
    let mut proxy = ProxyProcess::start(&upstreams_for(&backend), "grace_period_seconds: 20");
    let pid_file = proxy.path("aralez.pid");
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        proxy.pid().to_string()
    );
    let addr = proxy.addr;
    let mut inflight = Vec::new();
    for _ in 0..20 {
        inflight.push(tokio::spawn(async move {
            let mut client = Client::connect(Proto::H1, addr).await;
            let resp = client.get("x.test", "/slow/2000").await;
            (resp.status(), body_bytes(resp).await)
        }));
    }
    let requests = backend.requests.clone();
    let all_sent = eventually(Duration::from_secs(10), || {
        requests.load(Ordering::SeqCst) >= 20
    });
    assert!(all_sent.await, "the 20 requests did not reach the backend");
    let signalled = Instant::now();
    proxy.signal(Signal::SIGTERM);
    let refused_seen = eventually_async(Duration::from_millis(1500), || async {
        refused(addr).await.then_some(())
    })
    .await;
    assert!(
        refused_seen.is_some(),
        "new connections were still accepted after SIGTERM"
    );
    for task in inflight {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(&body[..], b"slow");
    }
    assert!(
        signalled.elapsed() >= Duration::from_millis(1500),
        "finished too early"
    );
    proxy.expect_clean_exit(Duration::from_secs(15), "after SIGTERM");
    assert!(!pid_file.exists(), "pid file left behind");
    assert!(refused(addr).await);
}

/// Counts of a load run.
#[derive(Default)]
struct Load {
    ok: AtomicUsize,
    failed: AtomicUsize,
    refused: AtomicUsize,
    reconnects: AtomicUsize,
}

/// One keep-alive connection sending requests until `stop`; reconnects when the server closed it
/// between requests. A request that got an error or a non-200 after being sent is a failure.
async fn client_loop(addr: SocketAddr, stop: Arc<AtomicBool>, load: Arc<Load>) {
    let mut conn: Option<hyper::client::conn::http1::SendRequest<ClientBody>> = None;
    while !stop.load(Ordering::Relaxed) {
        let reusable = match conn.take() {
            Some(mut s) => s.ready().await.is_ok().then_some(s),
            None => None,
        };
        let mut send = match reusable {
            Some(s) => s,
            None => match TcpStream::connect(addr).await {
                Ok(stream) => {
                    load.reconnects.fetch_add(1, Ordering::Relaxed);
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let (send, task) = hyper::client::conn::http1::handshake(io).await.unwrap();
                    tokio::spawn(task);
                    send
                }
                Err(_) => {
                    load.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    continue;
                }
            },
        };
        let req = http::Request::get("/")
            .header("host", "x.test")
            .body(full(bytes::Bytes::new()))
            .unwrap();
        let outcome = match send.send_request(req).await {
            Ok(resp) if resp.status() == 200 => {
                use http_body_util::BodyExt;
                resp.into_body().collect().await.is_ok()
            }
            _ => false,
        };
        let counter = if outcome { &load.ok } else { &load.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        conn = Some(send);
    }
}

async fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    eventually(limit, &mut check).await
}

/// SIGQUIT to `old` (an upgraded-from process): it drains and exits 0 within 15 s.
fn quit_cleanly(old: &mut ProxyProcess, what: &str) {
    old.signal(Signal::SIGQUIT);
    old.expect_clean_exit(Duration::from_secs(15), what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_upgrade_under_load_loses_nothing_three_times() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("upgrade.sock");
    let extra = format!(
        "upgrade_sock: \"{}\"\ngrace_period_seconds: 20",
        sock.display()
    );
    let mut old = ProxyProcess::start(&upstreams_for(&backend), &extra);
    let conf = old.path("main.yaml");
    let pid_file = old.path("aralez.pid");
    let addr = old.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let clients: Vec<_> = (0..30)
        .map(|_| tokio::spawn(client_loop(addr, stop.clone(), load.clone())))
        .collect();
    let mut kept = Vec::new();
    for round in 0..3 {
        let before = load.ok.load(Ordering::Relaxed);
        assert!(
            wait_until(Duration::from_secs(10), || load.ok.load(Ordering::Relaxed)
                > before + 1000)
            .await
        );
        let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
        assert_eq!(
            new.addr, addr,
            "round {round}: the new process serves elsewhere"
        );
        let pid_now = || std::fs::read_to_string(&pid_file).unwrap_or_default();
        assert_eq!(
            pid_now().trim(),
            new.pid().to_string(),
            "round {round}: pid file"
        );
        quit_cleanly(&mut old, &format!("round {round}"));
        let after = load.ok.load(Ordering::Relaxed);
        assert!(
            wait_until(Duration::from_secs(10), || load.ok.load(Ordering::Relaxed)
                > after + 1000)
            .await,
            "round {round}: no traffic after the old process left"
        );
        assert!(std::path::Path::new(&format!("/proc/{}", new.pid())).exists());
        kept.push(std::mem::replace(&mut old, new));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (ok, failed, refused) = (
        load.ok.load(Ordering::Relaxed),
        load.failed.load(Ordering::Relaxed),
        load.refused.load(Ordering::Relaxed),
    );
    println!(
        "upgrade load: {ok} ok, {failed} failed, {refused} refused, {} connections",
        load.reconnects.load(Ordering::Relaxed)
    );
    assert_eq!(
        (failed, refused),
        (0, 0),
        "log of the last process:\n{}",
        old.log_text()
    );
    assert!(
        load.reconnects.load(Ordering::Relaxed) >= 30 * 4,
        "connections were not handed over"
    );
    assert!(old.log_text().contains("live upgrade: received"));
}

/// Aralez's systemd unit sends SIGQUIT first, then starts `aralez -u -d`: the old process keeps
/// its listeners open and served until the new one takes them. It closed them at once, and the
/// connections made before the new process bound afresh were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_before_the_new_process_keeps_serving_until_it_takes_over() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("upgrade.sock");
    let extra = format!("upgrade_sock: \"{}\"", sock.display());
    let mut old = ProxyProcess::start(&upstreams_for(&backend), &extra);
    let conf = old.path("main.yaml");
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let clients: Vec<_> = (0..8)
        .map(|_| tokio::spawn(client_loop(old.addr, stop.clone(), load.clone())))
        .collect();
    old.signal(Signal::SIGQUIT);
    old.wait_log("serving on until `aralez -u` does", Duration::from_secs(10))
        .await;
    // Served meanwhile.
    let before = load.ok.load(Ordering::Relaxed);
    assert!(
        wait_until(Duration::from_secs(5), || load.ok.load(Ordering::Relaxed)
            > before + 200)
        .await,
        "nothing served between SIGQUIT and the new process"
    );
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    old.expect_clean_exit(Duration::from_secs(15), "the old process once handed over");
    let after = load.ok.load(Ordering::Relaxed);
    assert!(
        wait_until(Duration::from_secs(10), || load.ok.load(Ordering::Relaxed)
            > after + 200)
        .await,
        "nothing served by the new process"
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (failed, refused) = (
        load.failed.load(Ordering::Relaxed),
        load.refused.load(Ordering::Relaxed),
    );
    assert_eq!((failed, refused), (0, 0), "{}", new.log_text());
    assert!(new.log_text().contains("live upgrade: received"));
    // SIGQUIT has come already: the hand-over's line does not ask for it again.
    let said = old.log_text();
    assert!(said.contains("live upgrade: handed"), "{said}");
    assert!(!said.contains("send SIGQUIT to this one"), "{said}");
}

/// A live upgrade hands the admin API's listeners over with the proxy's, plain and TLS: the new
/// process takes the old one's sockets (a second one bound beside it would reset the connections
/// queued on the old one's when it closed, and cannot be bound at all when the old one belongs to
/// another user), and serves them once the old one has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_upgrade_hands_the_admin_listeners_over() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let root = write_self_signed(dir.path(), "admin", &["admin.local"]);
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin_tls = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let extra = format!(
        "upgrade_sock: \"{0}/upgrade.sock\"\nconfig_address: \"{admin}\"\nmaster_key: \"k\"\n\
         config_tls_address: \"{admin_tls}\"\nconfig_tls_certificate: \"{0}/admin.crt\"\n\
         config_tls_key_file: \"{0}/admin.key\"",
        dir.path().display()
    );
    let mut old = ProxyProcess::start(&upstreams_for(&backend), &extra);
    let conf = old.path("main.yaml");
    let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
    new.wait_log("live upgrade: received", Duration::from_secs(10))
        .await;
    let log = new.log_text();
    assert!(log.contains("\"admin\""), "admin not handed over:\n{log}");
    assert!(
        log.contains("\"admin-tls\""),
        "admin-tls not handed over:\n{log}"
    );
    assert!(!log.contains("unused inherited"), "{log}");
    quit_cleanly(&mut old, "the old process");
    let tls = tls_client_config(&[root], &[b"http/1.1"]);
    for client in [
        Client::connect(Proto::H1, admin).await,
        Client::connect_tls(admin_tls, "admin.local", tls).await,
    ] {
        let mut client = client;
        let resp = client
            .send(
                http::Method::GET,
                Some("admin.local"),
                "/status",
                &[("x-api-key", "k")],
                full(String::new()),
            )
            .await;
        assert_eq!(resp.status().as_u16(), 200, "{}", new.log_text());
    }
}

/// A SIGTERM sent the moment the proxy says it listens (a supervisor that waits for that line)
/// drains and stops, 10 times out of 10: the handlers are in place before the line is logged.
#[test]
fn sigterm_right_after_listening_is_a_clean_stop() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), unused_route()).unwrap();
    let main =
        "threads: 1\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\n";
    std::fs::write(dir.path().join("main.yaml"), main).unwrap();
    for round in 0..10 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
            .arg("-c")
            .arg(dir.path().join("main.yaml"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut log = String::new();
        for line in stdout.lines().map_while(Result::ok) {
            let listening = line.contains("listening on");
            log.push_str(&line);
            log.push('\n');
            if listening {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
            }
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "round {round}: {status:?}\n{log}");
        assert!(log.contains("stopped"), "round {round}:\n{log}");
    }
}

/// A SIGHUP sent the moment the port accepts (a supervisor that polls the port, as many do)
/// leaves the proxy serving, 10 times out of 10: the handlers are in place before
/// the bind. Before, the port accepted while the pid file was written and the privileges
/// dropped, and a SIGHUP then ended the process.
#[test]
fn sighup_as_soon_as_the_port_accepts_leaves_the_proxy_serving() {
    for round in 0..10 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let (_dir, main) = write_config_listening(&unused_route(), "", &addr.to_string());
        let mut child = std::process::Command::new(binary())
            .arg("-c")
            .arg(&main)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        // No pause between attempts: the signal follows the first accept as closely as can be.
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "round {round}: the port never accepted"
            );
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
        let ended = eventually_blocking(Duration::from_millis(500), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        let serving = std::net::TcpStream::connect(addr).is_ok();
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert!(
            !ended && serving,
            "round {round}: SIGHUP ended the proxy: {status:?}"
        );
    }
}

#[test]
fn daemon_returns_at_once_and_cleans_its_pid_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("aralez.log");
    let pid_file = dir.path().join("aralez.pid");
    std::fs::write(dir.path().join("upstreams.yaml"), unused_route()).unwrap();
    let main = format!(
        "threads: 1\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{}\"\nlog_file: \"{}\"\nupgrade_sock: \"{}\"\n",
        pid_file.display(),
        log.display(),
        dir.path().join("s.sock").display()
    );
    std::fs::write(dir.path().join("main.yaml"), main).unwrap();
    let started = Instant::now();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
        .args(["-d", "-c"])
        .arg(dir.path().join("main.yaml"))
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "-d did not return at once"
    );
    let mut pid = None;
    eventually_blocking(Duration::from_secs(10), || {
        pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        pid.is_some()
    });
    let pid = pid.expect("no pid file from the daemon");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ppid_line = status.lines().find(|l| l.starts_with("PPid:")).unwrap();
    assert_ne!(
        ppid_line.split_whitespace().nth(1),
        Some(std::process::id().to_string().as_str())
    );
    let sid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let session: i32 = sid
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(session, pid, "the daemon did not start its own session");
    let text_has = |s: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(s)
    };
    assert!(
        eventually_blocking(Duration::from_secs(10), || text_has("listening on")),
        "the daemon's log went elsewhere"
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(10), || !pid_file.exists()),
        "SIGTERM left the pid file"
    );
    assert!(text_has("stopped"));
}

#[test]
fn pid_file_write_replaces_a_symlink_instead_of_following_it() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    let link = dir.path().join("aralez.pid");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let written = aralez::process::pidfile::PidFile::write(&link).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        aralez::process::pidfile::read_pid(&link),
        Some(std::process::id())
    );
    written.remove();
    assert!(!link.exists());
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A system user made for the test and removed afterwards.
struct TempUser(String);

impl TempUser {
    /// A system user and group of the same name, unique to this process and `tag`.
    fn create(tag: char) -> TempUser {
        let name = format!("aralez{tag}{}", std::process::id() % 100_000);
        let status = std::process::Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(&name)
            .status()
            .expect("useradd");
        assert!(status.success(), "useradd failed");
        TempUser(name)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel").arg(&self.0).status();
    }
}

/// The ids `key` lists for every thread of `pid`, if all threads agree; panics if not (a
/// thread made before the privilege drop must have changed user with the rest).
fn status_ids(pid: u32, key: &str) -> Vec<String> {
    let mut seen: Vec<Vec<String>> = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        seen.push(
            line.split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect(),
        );
    }
    seen.dedup();
    assert_eq!(seen.len(), 1, "threads of {pid} differ in {key} {seen:?}");
    seen.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_to_runuser_after_binding_a_low_port() {
    if !is_root() {
        println!("SKIPPED drops_to_runuser_after_binding_a_low_port: needs root (useradd, a port below 1024)");
        return;
    }
    let user = TempUser::create('t');
    let uid = nix::unistd::User::from_name(&user.0)
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    let gid = nix::unistd::Group::from_name(&user.0)
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let backend = Backend::start("low").await;
    // Aralez's README names Pingora's `user`/`group`; aralez reads both spellings.
    for (user_key, group_key) in [("runuser", "rungroup"), ("user", "group")] {
        let port = (600..1000)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free low port");
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(dir.path().join("upstreams.yaml"), upstreams_for(&backend)).unwrap();
        // A file only root may read: read at start, and every reload would fail.
        std::fs::set_permissions(
            dir.path().join("upstreams.yaml"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        // An access log that rotates, and ACME's folders, in folders only root may write to.
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        let main = format!(
            "threads: 2\nproxy_address_http: \"127.0.0.1:{port}\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{1}/p.pid\"\nupgrade_sock: \"{1}/u.sock\"\n{user_key}: \"{0}\"\n{group_key}: \"{0}\"\naccess_log: all\naccess_log_file: \"{1}/access.log, 1, 2\"\nproxy_certificates: \"{1}/certs\"\nacme:\n  directory: \"https://127.0.0.1:1/dir\"\n  domains: [\"low.test\"]\n",
            user.0,
            dir.path().display()
        );
        std::fs::write(dir.path().join("main.yaml"), main).unwrap();
        let proxy = ProxyProcess::spawn_args(&dir.path().join("main.yaml"), &[]);
        assert_eq!(proxy.addr.port(), port);
        let uids = status_ids(proxy.pid(), "Uid:");
        let gids = status_ids(proxy.pid(), "Gid:");
        assert_eq!(
            uids,
            vec![uid.to_string(); 4],
            "real, effective, saved, fs uid"
        );
        assert_eq!(
            gids,
            vec![gid.to_string(); 4],
            "real, effective, saved, fs gid"
        );
        assert!(
            status_ids(proxy.pid(), "Groups:").is_empty(),
            "supplementary groups kept"
        );
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get("x.test", "/").await;
        assert_eq!(resp.status(), 200, "{}", proxy.log_text());
        // The log the process keeps writing (and reopens on SIGUSR1) is the user's, and a
        // rotation the folder will refuse is said at start, not at every size.
        use std::os::unix::fs::MetadataExt;
        let access = std::fs::metadata(dir.path().join("access.log")).expect("access.log");
        assert_eq!(
            (access.uid(), access.gid()),
            (uid, gid),
            "access.log still root's"
        );
        assert!(
            proxy
                .log_text()
                .contains("cannot be rotated after the drop"),
            "{}",
            proxy.log_text()
        );
        // So is a configuration file the user cannot read.
        let unreadable = format!(
            "configuration file(s) cannot be read by runuser/rungroup ({}/upstreams.yaml first)",
            dir.path().display()
        );
        assert!(
            proxy.log_text().contains(&unreadable),
            "{}",
            proxy.log_text()
        );
        // So is a pid file that the user cannot remove at exit.
        let pid_file = format!("{}/p.pid will be left behind at exit", dir.path().display());
        assert!(proxy.log_text().contains(&pid_file), "{}", proxy.log_text());
        // And ACME's folders, which every order would fail to write (it was said at each
        // order's failure only).
        for key in ["acme.state_dir", "proxy_certificates"] {
            let said = format!("{key} {}", dir.path().display());
            let line = proxy
                .log_text()
                .lines()
                .find(|l| l.contains(&said))
                .map(String::from);
            assert!(
                line.is_some_and(|l| l.contains("is not writable by runuser/rungroup")),
                "{key}: {}",
                proxy.log_text()
            );
        }
        // No reload nobody made is refused for the unreadable file (the file watch's check at
        // start made one, 40-70 ms in).
        let refused = eventually(Duration::from_millis(500), || {
            proxy.log_text().contains("reload rejected")
        });
        assert!(!refused.await, "{}", proxy.log_text());
    }
}

/// A live upgrade of a process that dropped to `runuser`, twice. The old process (the user by
/// then) may not signal the new one (root until it drops too), and took that for the new one's
/// end: it took the upgrade socket back from a live process, its SIGQUIT then waited 10 s for a
/// taker, and leaving it removed the socket, so the next `aralez -u` was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_upgrade_under_runuser_hands_over_and_the_next_one_too() {
    if !is_root() {
        println!("SKIPPED a_live_upgrade_under_runuser_hands_over_and_the_next_one_too: needs root (useradd)");
        return;
    }
    let user = TempUser::create('u');
    let owner = nix::unistd::User::from_name(&user.0).unwrap().unwrap();
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(dir.path(), mode).unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), upstreams_for(&backend)).unwrap();
    // The folder of the pid file and the socket is the user's, as the README advises.
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    nix::unistd::chown(&run, Some(owner.uid), Some(owner.gid)).unwrap();
    let main = format!(
        "threads: 1\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{1}/p.pid\"\nupgrade_sock: \"{1}/u.sock\"\nrunuser: \"{0}\"\nrungroup: \"{0}\"\ngrace_period_seconds: 2\n",
        user.0,
        run.display()
    );
    let conf = dir.path().join("main.yaml");
    std::fs::write(&conf, main).unwrap();
    let mut old = ProxyProcess::spawn_args(&conf, &[]);
    for round in 0..2 {
        let new = tokio::task::block_in_place(|| ProxyProcess::spawn_args(&conf, &["-u"]));
        assert_eq!(new.addr, old.addr, "round {round}");
        let lost = eventually(Duration::from_millis(1500), || {
            old.log_text().contains("has ended")
        });
        assert!(!lost.await, "round {round}: {}", old.log_text());
        old.signal(Signal::SIGQUIT);
        let quit = format!("round {round}: the old process, handed over");
        old.expect_clean_exit(Duration::from_secs(5), &quit);
        let said = old.log_text();
        assert!(!said.contains("no new process has taken"), "{said}");
        let mut client = Client::connect(Proto::H1, new.addr).await;
        let resp = client.get("x.test", "/").await;
        assert_eq!(resp.status(), 200, "round {round}: {}", new.log_text());
        old = new;
    }
}

#[test]
fn refuses_to_start_when_the_user_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstreams.yaml"), unused_route()).unwrap();
    let main = format!(
        "threads: 1\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{0}/p.pid\"\nupgrade_sock: \"{0}/s.sock\"\nrunuser: \"no-such-user-aralez\"\n",
        dir.path().display()
    );
    std::fs::write(dir.path().join("main.yaml"), main).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aralez"))
        .arg("-c")
        .arg(dir.path().join("main.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-such-user-aralez"), "{stderr}");
}

#[tokio::test]
async fn the_open_files_limit_is_raised_to_the_hard_limit() {
    let backend = Backend::start("a").await;
    let proxy = ProxyProcess::start_after(&default_route(&[&backend]), "", "ulimit -Sn 256");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", proxy.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open files line");
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers[0], numbers[1], "soft limit not raised: {line}");
    assert_ne!(numbers[0], "256", "{line}");
}

/// A SIGHUP or SIGUSR1 sent as a start begins (a supervisor signalling the child it has just
/// made) is held until its handler is installed: by default each ended the process in its
/// first tens of milliseconds (exit 129, 138). The test watches the process's signal
/// dispositions and signals it while that signal is held (ignored), before any handler is in
/// place. (It watched SIGHUP's for both, and once sent SIGUSR1 in the moment between the two
/// being held: killed, exit by signal 10.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_or_reopen_asked_as_the_start_begins_does_not_end_it() {
    let backend = Backend::start("b").await;
    let (_dir, conf) = write_config(&upstreams_for(&backend), "");
    let mask = |status: &str, key: &str| {
        let line = status.lines().find(|l| l.starts_with(key))?;
        u64::from_str_radix(line[key.len()..].trim(), 16).ok()
    };
    for signal in [Signal::SIGHUP, Signal::SIGUSR1] {
        let bit = 1u64 << (signal as i32 - 1);
        let mut child = std::process::Command::new(binary())
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let status_file = format!("/proc/{pid}/status");
        let deadline = Instant::now() + Duration::from_secs(5);
        let held = loop {
            let status = std::fs::read_to_string(&status_file).unwrap_or_default();
            if mask(&status, "SigIgn:").is_some_and(|m| m & bit != 0) {
                break true;
            }
            if mask(&status, "SigCgt:").is_some_and(|m| m & bit != 0) || Instant::now() > deadline {
                break false;
            }
            std::hint::spin_loop();
        };
        assert!(
            held,
            "{signal}: never held before its handler was installed"
        );
        nix::sys::signal::kill(pid, signal).unwrap();
        let output = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(output)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(addr) = address_after(&line, "listening on http://") {
                    let _ = tx.send(addr);
                }
            }
        });
        let listening = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(10)));
        let status = child.try_wait().unwrap();
        let Ok(addr) = listening else {
            panic!("{signal}: ended before it listened: {status:?}");
        };
        assert!(answered_200(addr).await, "{signal}: not served");
        assert!(child.try_wait().unwrap().is_none(), "{signal}: ended");
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A second start of a running instance's configuration is refused before it opens that
/// instance's log: it wrote a "configuration loaded" of a start that never happened there (and,
/// with -d, its own refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_second_start_leaves_the_running_instances_log_alone() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start_logging_to_file(&upstreams_for(&backend), "");
    let log = proxy.path("aralez.log");
    let loaded = |text: &str| text.matches("configuration loaded").count();
    let wrote = eventually(Duration::from_secs(5), || {
        loaded(&std::fs::read_to_string(&log).unwrap_or_default()) == 1
    });
    assert!(wrote.await, "{:?}", std::fs::read_to_string(&log));
    let before = std::fs::read_to_string(&log).unwrap();
    for args in [&[][..], &["-d"][..]] {
        let out = std::process::Command::new(binary())
            .args(args)
            .arg("-c")
            .arg(proxy.path("main.yaml"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {said}");
        assert!(
            said.contains("another instance is running"),
            "{args:?}: {said}"
        );
    }
    // Nothing of theirs: the log neither started over nor got their lines. (The running
    // instance may still be logging its own start, its backend's protocol detection, when the
    // machine is busy: a test that compared the whole text failed on that.)
    let after = std::fs::read_to_string(&log).unwrap();
    assert!(after.starts_with(&before), "{after}");
    let added = &after[before.len()..];
    for theirs in [
        "configuration loaded",
        "another instance",
        "listening on",
        "stopped",
    ] {
        assert!(!added.contains(theirs), "{added}");
    }
}

/// Whether a GET of `x.test` on its own connection gets a 200.
async fn answered_200(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return false;
    };
    let ask = b"GET / HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n";
    let mut answer = Vec::new();
    stream.write_all(ask).await.is_ok()
        && stream.read_to_end(&mut answer).await.is_ok()
        && answer.starts_with(b"HTTP/1.1 200")
}

/// Whatever the open-files limit, the process serves every connection it accepts or exits 1
/// with a message, never a panic. At 8 tokio's signal set-up panicked (exit 134); at about 24 a
/// worker whose runtime could not be built was only logged, and its listener, bound and never
/// served, held the connections the kernel handed it (they hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_open_files_limit_serves_or_exits_1() {
    let backend = Backend::start("b").await;
    let (_dir, conf) = write_config(&upstreams_for(&backend), "threads: 2");
    let (mut served, mut refused) = (0, 0);
    for limit in [
        5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 32, 40, 48, 64, 96,
    ] {
        let mut command = std::process::Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "exec 2>&1; ulimit -n {limit} && exec \"$0\" -c \"$1\""
            ))
            .arg(binary())
            .arg(&conf)
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        let output = child.stdout.take().unwrap();
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(output)
                    .lines()
                    .map_while(Result::ok)
                {
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            })
        };
        let said = || log.lock().unwrap().clone();
        let ended_with_1 = |child: &mut std::process::Child, what: &str| {
            let status = (0..250).find_map(|_| {
                let status = child.try_wait().unwrap();
                if status.is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                status
            });
            let code = status.and_then(|s| s.code());
            assert_eq!(code, Some(1), "ulimit -n {limit}: {what}:\n{}", said());
        };
        let listening = eventually(Duration::from_secs(10), || {
            said().contains("listening on http://") || child.try_wait().unwrap().is_some()
        });
        assert!(
            listening.await,
            "ulimit -n {limit}: neither served nor ended:\n{}",
            said()
        );
        let addr = said()
            .lines()
            .find_map(|l| address_after(l, "listening on http://"));
        let mut all_answered = addr.is_some();
        for _ in 0..8 {
            let Some(addr) = addr.filter(|_| all_answered) else {
                break;
            };
            let asked = tokio::time::timeout(Duration::from_secs(3), answered_200(addr));
            all_answered = matches!(asked.await, Ok(true));
        }
        if all_answered {
            served += 1;
            let _ = child.kill();
            let _ = child.wait();
        } else {
            tokio::task::block_in_place(|| ended_with_1(&mut child, "not served"));
            refused += 1;
        }
        reader.join().unwrap();
        assert!(
            !said().contains("panicked"),
            "ulimit -n {limit}:\n{}",
            said()
        );
    }
    assert!(
        served > 0 && refused > 0,
        "{served} served, {refused} refused"
    );
}

#[tokio::test]
async fn accept_failures_are_logged_at_a_bounded_rate() {
    // Out of descriptors (hard limit 64, so it cannot be raised): every accept fails while the
    // clients wait. The warning comes at most once a second, with a count, not once per try.
    let backend = Backend::start("a").await;
    let proxy = ProxyProcess::start_after(&default_route(&[&backend]), "", "ulimit -n 64");
    let mut clients = Vec::new();
    for _ in 0..120 {
        if let Ok(s) = TcpStream::connect(proxy.addr).await {
            clients.push(s);
        }
    }
    let failing = proxy
        .wait_log_count("accept failed", 1, Duration::from_secs(5))
        .await;
    assert!(failing, "descriptors never ran out:\n{}", proxy.log_text());
    let first = Instant::now();
    // Real time is the point: the rate is per wall-clock second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Each of the two workers' accept loops reports at most once a second (unthrottled, each
    // would log every 20 ms retry: about 250 lines here).
    let lines = proxy.log_count("accept failed");
    assert!(
        lines <= 2 * (2 + first.elapsed().as_secs() as usize),
        "{lines} accept warnings in {:?}:\n{}",
        first.elapsed(),
        proxy.log_text()
    );
    assert!(proxy.log_text().contains("more since the last report"));
    drop(clients);
}

/// A second SIGTERM (or Ctrl-C) during the drain ends the process at once instead of waiting
/// out the grace period for the requests in flight; it was ignored, and only SIGKILL helped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_signal_ends_the_drain_at_once() {
    let backend = Backend::start("slow").await;
    let mut proxy = ProxyProcess::start(&upstreams_for(&backend), "grace_period_seconds: 60");
    // A request in flight for 30 s, on a connection the test holds.
    let mut inflight = TcpStream::connect(proxy.addr).await.unwrap();
    let request = b"GET /slow/30000 HTTP/1.1\r\nHost: x.test\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut inflight, request)
        .await
        .unwrap();
    let requests = backend.requests.clone();
    assert!(
        eventually(Duration::from_secs(10), || requests.load(Ordering::SeqCst)
            >= 1)
        .await
    );
    proxy.signal(Signal::SIGTERM);
    proxy.wait_log("draining", Duration::from_secs(10)).await;
    let signalled = Instant::now();
    proxy.signal(Signal::SIGINT);
    let status = tokio::task::block_in_place(|| proxy.wait_exit(Duration::from_secs(10)));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{}",
        proxy.log_text()
    );
    assert!(signalled.elapsed() < Duration::from_secs(10));
    drop(inflight);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_readable_by_root_only_load_before_privileges_drop() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        println!("SKIPPED certificates_readable_by_root_only_load_before_privileges_drop: needs root (useradd)");
        return;
    }
    let user = TempUser::create('c');
    let backend = Backend::start("tls").await;
    let certs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(certs.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let roots = vec![write_self_signed(
        certs.path(),
        "default",
        &["default.local"],
    )];
    // As certbot's privkey.pem and /etc/ssl/private keep them.
    let key = certs.path().join("default.key");
    std::fs::set_permissions(&key, PermissionsExt::from_mode(0o600)).unwrap();
    let main = format!(
        "runuser: \"{0}\"\nrungroup: \"{0}\"\nproxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{1}\"",
        user.0,
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&default_route(&[&backend]), &main);
    let tls = proxy.logged_addr("listening on https://");
    let config = tls_client_config(&roots, &[b"http/1.1"]);
    let mut client = Client::connect_tls(tls, "default.local", config).await;
    let resp = client.get("default.local", "/").await;
    assert_eq!(resp.status(), 200, "{}", proxy.log_text());
    assert!(
        proxy
            .log_text()
            .contains("cannot be read by the user this process runs as"),
        "{}",
        proxy.log_text()
    );
}
