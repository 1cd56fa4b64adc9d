//! Operators' defects (issue 19), each through the real binary, each reproducing the failure
//! first: HEAD over HTTP/2 on replies aralez writes itself, log reopening on SIGUSR1 (and
//! SIGUSR2 not killing the process), a failed live upgrade leaving the pid file behind, and
//! SIGHUP silent about a changed main.yaml.

use crate::support;

use std::time::Duration;

use http::Method;
use http_body_util::BodyExt;
use support::*;

/// Routes: `a.test` to a live backend, `auth.test` behind basic auth, `down.test` to nothing.
fn head_routes(backend: &Backend) -> String {
    let live = || Path::servers(&[backend]).healthcheck(false);
    Upstreams::new()
        .host("a.test", Host::new().path("/", live()))
        .host(
            "auth.test",
            Host::new().path("/", live().authorization_data("basic", "u:p")),
        )
        .host(
            "down.test",
            Host::new().path("/", Path::addrs(&["127.0.0.1:9"]).healthcheck(false)),
        )
        .render()
}

/// HEAD answered by aralez itself (404, 401, 502) and by a backend: no body on either protocol,
/// and on HTTP/2 no stream error (curl exits 92 on one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_gets_no_body_over_http2_whoever_answers() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(&head_routes(&backend), "");
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        for (host, want) in [
            ("a.test", 200),
            ("nowhere.test", 404),
            ("auth.test", 401),
            ("down.test", 502),
        ] {
            let resp = c.send(Method::HEAD, Some(host), "/", &[], full("")).await;
            assert_eq!(resp.status(), want, "{proto:?} HEAD {host}");
            let body = resp.into_body().collect().await;
            let body = body.unwrap_or_else(|e| panic!("{proto:?} HEAD {host}: {e}"));
            assert!(
                body.to_bytes().is_empty(),
                "{proto:?} HEAD {host}: a body came back"
            );
        }
    }
}

/// logrotate's way: move the files away, `kill -USR1`, and the proxy writes new ones at the
/// configured path (the app log and the access log share `log_file` here). SIGUSR2 changes
/// nothing but a log line. Both used to kill the process (exit 138/140).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_log_files_and_sigusr2_is_ignored() {
    use nix::sys::signal::Signal;
    let backend = Backend::start("b").await;
    let routes = default_route(&[&backend]);
    let proxy = ProxyProcess::start_logging_to_file(&routes, "access_log: all");
    let log = proxy.path("aralez.log");
    let rotated = proxy.path("aralez.log.1");
    let get = |path: &'static str| {
        let addr = proxy.addr;
        async move {
            let mut c = Client::connect(Proto::H1, addr).await;
            assert_eq!(c.get("a.test", path).await.status(), 200, "{path}");
        }
    };
    let logged = |file: &std::path::Path, needle: &str| {
        std::fs::read_to_string(file).is_ok_and(|text| text.contains(needle))
    };

    get("/before-rotation").await;
    let before = eventually(Duration::from_secs(5), || logged(&log, "/before-rotation"));
    assert!(
        before.await,
        "the first request was not logged in {}",
        log.display()
    );
    std::fs::rename(&log, &rotated).expect("rotate");
    proxy.signal(Signal::SIGUSR1);
    let reopened = eventually(Duration::from_secs(5), || logged(&log, "SIGUSR1: reopened"));
    assert!(reopened.await, "no new aralez.log after SIGUSR1");
    get("/after-rotation").await;
    let after = eventually(Duration::from_secs(5), || logged(&log, "/after-rotation"));
    assert!(after.await, "the access log did not move to the new file");
    assert!(
        !logged(&rotated, "/after-rotation"),
        "still writing to the rotated file"
    );

    proxy.signal(Signal::SIGUSR2);
    let ignored = eventually(Duration::from_secs(5), || logged(&log, "SIGUSR2 ignored"));
    assert!(ignored.await, "SIGUSR2 left no trace");
    get("/after-usr2").await;
}

/// A config for `aralez -d` in its own directory, listening on `listen`, logging to a file.
fn daemon_config(listen: std::net::SocketAddr) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("upstreams.yaml"), unused_route()).expect("upstreams");
    let main = format!(
        "threads: 1\nproxy_address_http: \"{listen}\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"aralez.pid\"\nlog_file: \"aralez.log\"\nupgrade_sock: \"s.sock\"\n"
    );
    std::fs::write(dir.path().join("main.yaml"), main).expect("main");
    dir
}

/// Runs `aralez <args> -c main.yaml` (a command that returns, like `-d`) to its exit, at most
/// 30 s: its status and stderr.
fn run_to_exit(dir: &std::path::Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = std::process::Command::new(binary())
        .args(args)
        .arg("-c")
        .arg(dir.join("main.yaml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn aralez");
    let mut status = None;
    eventually_blocking(Duration::from_secs(30), || {
        status = child.try_wait().expect("wait");
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        panic!("aralez {args:?} did not return within 30 s");
    };
    let mut stderr = String::new();
    use std::io::Read;
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    (status, stderr)
}

/// A local address nothing listens on, that no one else is handed meanwhile.
fn free_addr() -> std::net::SocketAddr {
    ([127, 0, 0, 1], support::ports::free_port()).into()
}

/// Stops the background process named by the pid file in `dir` (SIGTERM, up to 10 s for it to
/// go); whether there was one.
fn stop_daemon(dir: &std::path::Path) -> bool {
    let pid = std::fs::read_to_string(dir.join("aralez.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok());
    let Some(pid) = pid else {
        return false;
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    eventually_blocking(Duration::from_secs(10), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    true
}

/// `-d` used to exit 0 before binding: an address in use went unnoticed but for the log.
#[test]
fn daemon_that_cannot_bind_exits_non_zero_with_the_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dir = daemon_config(taken.local_addr().expect("addr"));
    let (status, stderr) = run_to_exit(dir.path(), &["-d"]);
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    // Said in the foreground, before going to the background, with the port that is taken.
    let port = taken.local_addr().expect("addr").to_string();
    assert!(
        stderr.contains(&format!("{port} is already in use")),
        "the error does not say what failed: {stderr}"
    );
}

/// `-d` returns 0 only once the port serves.
#[test]
fn daemon_returns_once_it_serves() {
    let addr = free_addr();
    let dir = daemon_config(addr);
    let (status, stderr) = run_to_exit(dir.path(), &["-d"]);
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    let served = std::net::TcpStream::connect(addr);
    let had_pid_file = stop_daemon(dir.path());
    assert!(served.is_ok(), "-d returned before the port served");
    assert!(had_pid_file, "no pid file once -d returned");
}

/// A background process's stdout and stderr follow its log file when SIGUSR1 reopens it (and
/// when it rotates itself): they stayed on the file renamed away (panics and stderr's messages
/// went there, and a deleted one kept its disk space).
#[test]
fn a_daemons_stderr_follows_its_log_file() {
    let dir = daemon_config(free_addr());
    let (status, stderr) = run_to_exit(dir.path(), &["-d"]);
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    let pid = std::fs::read_to_string(dir.path().join("aralez.pid")).expect("pid file");
    let pid = pid.trim().to_string();
    let log = dir.path().join("aralez.log");
    let stdio_at = |fd| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).expect("fd");
    let canonical_log = log.canonicalize().expect("log");
    assert_eq!(stdio_at(2), canonical_log);
    std::fs::rename(&log, dir.path().join("aralez.log.1")).expect("rotate");
    let pid_number = nix::unistd::Pid::from_raw(pid.parse().expect("pid"));
    nix::sys::signal::kill(pid_number, nix::sys::signal::Signal::SIGUSR1).expect("SIGUSR1");
    let followed = eventually_blocking(Duration::from_secs(10), || {
        stdio_at(1) == canonical_log && stdio_at(2) == canonical_log
    });
    let (out, err) = (stdio_at(1), stdio_at(2));
    stop_daemon(dir.path());
    assert!(followed, "stdout at {out:?}, stderr at {err:?}");
}

/// A second instance with the same paths and port used to start and share everything with the
/// first (the pid file, the upgrade socket, the port through SO_REUSEPORT, the admin API's port
/// too). Each of them now refuses it, with what to do; `-u` still takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_on_the_same_paths_or_port_is_refused() {
    let backend = Backend::start("b").await;
    let routes = default_route(&[&backend]);
    let admin = free_addr();
    let first = ProxyProcess::start(&routes, &format!("config_address: \"{admin}\""));
    let second = |main: String| {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("upstreams.yaml"), &routes).expect("upstreams");
        std::fs::write(dir.path().join("main.yaml"), main).expect("main");
        // Bounded: a second instance that is not refused serves on and is killed.
        tokio::task::block_in_place(|| run_to_exit(dir.path(), &[]))
    };
    let own = |name: &str| format!("/tmp/aralez-test-{}-{name}", std::process::id());
    let cases = [
        (
            "the same upgrade_sock",
            format!(
                "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{}\"\nupgrade_sock: \"{}\"\n",
                own("a.pid"),
                first.path("aralez.sock").display()
            ),
            "answers on upgrade_sock",
        ),
        (
            "the same pid_file",
            format!(
                "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{}\"\nupgrade_sock: \"{}\"\n",
                first.path("aralez.pid").display(),
                own("b.sock")
            ),
            "names aralez process",
        ),
        (
            "the same port",
            format!(
                "proxy_address_http: \"{}\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{}\"\nupgrade_sock: \"{}\"\n",
                first.addr,
                own("c.pid"),
                own("c.sock")
            ),
            "already in use",
        ),
        (
            "the same admin API port",
            format!(
                "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\npid_file: \"{}\"\nupgrade_sock: \"{}\"\nconfig_address: \"{admin}\"\n",
                own("d.pid"),
                own("d.sock")
            ),
            "already in use",
        ),
    ];
    for (what, main, said) in cases {
        let (status, stderr) = second(main);
        assert_eq!(status.code(), Some(1), "{what}: {stderr}");
        assert!(
            stderr.contains("another instance is running") && stderr.contains(said),
            "{what}: {stderr}"
        );
    }
    let mut c = Client::connect(Proto::H1, first.addr).await;
    assert_eq!(
        c.get("a.test", "/").await.status(),
        200,
        "the first one still serves"
    );
    // The second start's look at upgrade_sock took nothing: the first one handed no socket
    // over, and did not tell the operator to SIGQUIT it (which left nothing listening).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(first.log_count("handed"), 0, "{}", first.log_text());
}

/// A live upgrade whose new process cannot start (here the admin API's certificate, replaced by
/// something that is none) must leave the pid file naming the old process, which serves on. The
/// admin API's failure used to be only logged, the new process serving without it; it now stops
/// the start, before the pid file is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_live_upgrade_gives_the_pid_file_back_to_the_old_process() {
    let backend = Backend::start("b").await;
    let certs = tempfile::tempdir().expect("temp dir");
    write_self_signed(certs.path(), "admin", &["localhost"]);
    let at = |name: &str| certs.path().join(name).display().to_string();
    let main_extra = format!(
        "config_tls_address: \"127.0.0.1:0\"\nconfig_tls_certificate: \"{}\"\nconfig_tls_key_file: \"{}\"",
        at("admin.crt"),
        at("admin.key")
    );
    let old = ProxyProcess::start(&default_route(&[&backend]), &main_extra);
    // The proxy's port accepts before the admin API serves.
    old.wait_log("admin API on https://", Duration::from_secs(10))
        .await;
    let pid_file = old.path("aralez.pid");
    let named = || std::fs::read_to_string(&pid_file).unwrap_or_default();
    assert_eq!(named().trim(), old.pid().to_string());

    // PEM in form (so the config check passes), no certificate inside.
    let broken =
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
    std::fs::write(certs.path().join("admin.crt"), broken).expect("rewrite");
    let (status, stderr) = tokio::task::block_in_place(|| run_to_exit(old.dir.path(), &["-u"]));
    assert_eq!(status.code(), Some(1), "the new process: {stderr}");
    assert!(
        stderr.contains("cannot start the admin API"),
        "the error does not say what failed: {stderr}"
    );
    assert_eq!(named().trim(), old.pid().to_string(), "the pid file");
    let mut c = Client::connect(Proto::H1, old.addr).await;
    assert_eq!(
        c.get("a.test", "/").await.status(),
        200,
        "the old one serves on"
    );
}

/// nginx's HUP re-reads everything; aralez's re-reads the routes, and main.yaml's settings apply
/// on a restart or `-u`. A changed main.yaml used to go unmentioned; SIGHUP now says it changed,
/// and names the errors a restart would meet in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_says_when_main_yaml_changed_and_what_a_restart_would_meet() {
    let backend = Backend::start("b").await;
    // At the default log level: an operator's SIGHUP is answered.
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "");
    let main = proxy.path("main.yaml");
    let changed = "has changed: its settings apply on a restart";
    let with_errors = "has changed and has errors";
    // main.yaml as it started: the routes are re-read, and nothing is said of main.yaml.
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    let reread = "nothing to reload source=\"SIGHUP\"";
    proxy.wait_log(reread, Duration::from_secs(5)).await;

    let text = std::fs::read_to_string(&main).expect("main.yaml");
    std::fs::write(&main, format!("{text}grace_period_seconds: 7\n")).expect("a change");
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy.wait_log(changed, Duration::from_secs(5)).await;

    let line = text.lines().count() + 2;
    std::fs::write(
        &main,
        format!("{text}grace_period_seconds: 7\nthreads: many\n"),
    )
    .expect("an error");
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy.wait_log(with_errors, Duration::from_secs(5)).await;
    let log = proxy.log_text();
    assert_eq!(proxy.log_count(changed), 1, "said more than once:\n{log}");
    assert!(
        log.contains(&format!("main.yaml:{line}:")) && log.contains("`threads`"),
        "the error is not named by file, line and key:\n{log}"
    );
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(c.get("a.test", "/").await.status(), 200, "it serves on");
}

/// systemd's reload in the seed unit stops the old process first, then runs `aralez -u -d`:
/// with nobody on `upgrade_sock`, the new one binds afresh instead of exiting 0 unserved.
#[test]
fn upgrade_with_nobody_to_take_over_from_starts_fresh() {
    let addr = free_addr();
    let dir = daemon_config(addr);
    let (status, stderr) = run_to_exit(dir.path(), &["-u", "-d"]);
    let served = std::net::TcpStream::connect(addr);
    stop_daemon(dir.path());
    assert_eq!(status.code(), Some(0), "aralez -u -d failed: {stderr}");
    assert!(
        served.is_ok(),
        "aralez -u -d returned without serving {addr}"
    );
    let log = std::fs::read_to_string(dir.path().join("aralez.log")).unwrap_or_default();
    assert!(log.contains("binding the listeners afresh"), "{log}");
}

/// `--version` names the version, the commit and what is compiled in; `--help` lists the
/// signals and the environment variables.
#[test]
fn version_and_help_say_what_an_operator_needs() {
    let run = |arg: &str| {
        let out = std::process::Command::new(binary())
            .arg(arg)
            .output()
            .expect("run aralez");
        assert!(out.status.success(), "aralez {arg}: {:?}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let version = run("--version");
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")) && version.contains("(commit "),
        "{version}"
    );
    assert!(
        version.contains("features:") && version.contains("HTTP/2"),
        "{version}"
    );
    // The default build has HTTP/3 (it was left out of the list).
    assert!(version.contains("HTTP/3"), "{version}");
    let help = run("--help");
    for needle in [
        "USR1",
        "HUP",
        "QUIT",
        "RUST_LOG",
        "JWT_KEY",
        "SSL_CERT_FILE",
        "NOTIFY_SOCKET",
    ] {
        assert!(
            help.contains(needle),
            "--help does not mention {needle}:\n{help}"
        );
    }
}

/// Scraping without the key that rewrites the config: `metrics_key` opens `GET|HEAD /metrics`,
/// `GET /status` and the read-only status page `/` (tests/status_page.rs), nothing that
/// writes; the standard `process_*` metrics and
/// `aralez_build_info` are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_key_reads_metrics_and_status_only() {
    let backend = Backend::start("b").await;
    let proxy = ProxyProcess::start(
        &default_route(&[&backend]),
        "config_address: \"127.0.0.1:0\"\nconfig_api_enabled: true\nmaster_key: \"master\"\nmetrics_key: \"scrape\"",
    );
    let admin = proxy.logged_addr("admin API on http://");
    let get = |path: &'static str, key: &'static str| async move {
        let (status, _, body) = http_get(admin, path, &[("x-api-key", key)]).await;
        (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
    };
    let (status, metrics) = get("/metrics", "scrape").await;
    assert_eq!(status, 200, "{metrics}");
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        &format!(
            "aralez_build_info{{version=\"{}\",commit=\"",
            env!("CARGO_PKG_VERSION")
        ),
    ] {
        assert!(metrics.contains(name), "no {name} in:\n{metrics}");
    }
    assert_eq!(get("/status", "scrape").await.0, 200);
    let mut c = Client::connect(Proto::H1, admin).await;
    let head = c
        .send(
            Method::HEAD,
            Some("admin"),
            "/metrics",
            &[("x-api-key", "scrape")],
            full(""),
        )
        .await;
    assert_eq!(head.status(), 200, "HEAD /metrics");
    assert!(
        body_bytes(head).await.is_empty(),
        "HEAD /metrics sent a body"
    );
    // The scrape key cannot push a config; the master key still can do everything.
    let refused = c
        .send(
            Method::POST,
            Some("admin"),
            "/conf",
            &[("x-api-key", "scrape")],
            full("upstreams: {}\n"),
        )
        .await;
    assert_eq!(refused.status(), 403);
    assert_eq!(get("/metrics", "master").await.0, 200);
    assert_eq!(get("/metrics", "wrong").await.0, 403);
}

/// A log line that cannot be written is lost, and the proxy serves on: with stdout and stderr
/// both closed pipes (a daemon's log on a full disk is the same), the first log line made
/// tracing say its failure with `eprintln!`, which panicked, and the process aborted (134).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_cannot_be_written_does_not_stop_the_proxy() {
    let backend = Backend::start("b").await;
    let admin = free_addr();
    let listen = free_addr();
    let main_extra = format!("config_address: \"{admin}\"\nmaster_key: \"k\"\naccess_log: all");
    let (_dir, main) = write_config_listening(
        &default_route(&[&backend]),
        &main_extra,
        &listen.to_string(),
    );
    let child = std::process::Command::new(binary())
        .arg("-c")
        .arg(&main)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn aralez");
    let mut child = KilledOnDrop(child);
    // Until it says it listens: its port accepts before its signal handlers are in place, and a
    // SIGHUP then met the default action (the process ended; CI saw it once).
    let stdout = child.0.stdout.take().expect("stdout");
    let listening = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            if line.contains("listening on") {
                return;
            }
        }
    });
    let serving = eventually(Duration::from_secs(20), || listening.is_finished());
    assert!(serving.await, "the proxy did not start");
    // The readers go: every write to stdout and stderr now fails (EPIPE).
    drop(listening);
    drop(child.0.stderr.take());
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    for round in 1..=3 {
        // An app log line (the SIGHUP's), and an access log line whose failure is said in the
        // app log.
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
        let mut client = Client::connect(Proto::H1, listen).await;
        assert_eq!(client.get("a", "/").await.status(), 200, "round {round}");
        let failed = eventually_async(Duration::from_secs(10), || async {
            let failures = metric(admin, "aralez_logging_errors_total").await;
            failures.filter(|n| *n >= f64::from(round))
        });
        assert!(
            failed.await.is_some(),
            "round {round}: no failed write counted"
        );
    }
    assert!(
        child.0.try_wait().expect("wait").is_none(),
        "the proxy exited"
    );
}

/// A process of the test's own, killed when the test ends however it ends.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy's own shortage of file descriptors is not the backend's fault: connects that
/// failed with EMFILE counted against the backend, three took it out of rotation, and every
/// client got 503 after the burst of connections that used up the descriptors had gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_does_not_take_a_backend_down() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = Backend::start("b").await;
    let listen = free_addr();
    // Health checked (a backend marked down stays down until a probe passes), 30 s apart.
    let pinned = format!("http://{}", backend.addr);
    let route = Path::addrs(&[pinned]).hc_interval(30);
    let routes = Upstreams::new()
        .host("DEFAULT", Host::new().path("/", route))
        .render();
    let (dir, main) = write_config_listening(
        &routes,
        "threads: 1\nupstream_keepalive_pool_size: 0",
        &listen.to_string(),
    );
    let mut command = std::process::Command::new(binary());
    command
        .arg("-c")
        .arg(&main)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr")).expect("stderr"));
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, 64)
                .map_err(std::io::Error::from)
        });
    }
    let _child = KilledOnDrop(command.spawn().expect("spawn aralez"));
    let serving = eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(listen).is_ok()
    });
    assert!(serving.await, "the proxy did not start");
    // More idle clients than descriptors, then a request on each.
    let mut clients = Vec::new();
    for _ in 0..80 {
        clients.push(
            tokio::net::TcpStream::connect(listen)
                .await
                .expect("connect"),
        );
    }
    // Each request holds its backend connection a while: they need descriptors all at once.
    for client in &mut clients {
        let _ = client
            .write_all(b"GET /slow/300 HTTP/1.1\r\nHost: a\r\n\r\n")
            .await;
    }
    let mut refused = 0;
    for client in &mut clients {
        let mut answer = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_millis(500), client.read_exact(&mut answer));
        if let Ok(Ok(_)) = read.await {
            refused += usize::from(answer.starts_with(b"HTTP/1.1 502"));
        }
    }
    assert!(
        refused >= 3,
        "the descriptors were not used up ({refused} refused)"
    );
    drop(clients);
    let mut client = None;
    for _ in 0..50 {
        if let Ok(c) =
            tokio::time::timeout(Duration::from_secs(1), Client::connect(Proto::H1, listen)).await
        {
            client = Some(c);
            break;
        }
    }
    let mut client = client.expect("connect after the burst");
    let status = client.get("a", "/").await.status();
    assert_eq!(status, 200, "the backend was taken out of rotation");
}
