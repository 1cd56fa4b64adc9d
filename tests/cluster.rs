//! Cluster mode through the real binary (Aralez 0.95's `cluster_member`, `worker_nodes`): a
//! master and two workers. The master serves no proxy traffic (400); a `POST /conf` to it changes
//! both workers' routes (checked by requests through each); a bad configuration is refused by the
//! master with its error lines and reaches no worker; a worker that was down during a push gets
//! the configuration once it is back; `GET /status` on the master shows each worker's digest
//! and last push.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::Method;
use support::ports::free_port;
use support::*;

const KEY: &str = "k";

fn routes_to(backend: &Backend) -> String {
    Upstreams::new()
        .host(
            "c.test",
            Host::new().path("/", Path::servers(&[backend]).healthcheck(false)),
        )
        .render()
}

fn worker(backend: &Backend, admin_port: u16) -> ProxyProcess {
    let main = format!(
        "cluster_member: worker\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:{admin_port}\"\n"
    );
    ProxyProcess::start(&routes_to(backend), &main)
}

/// Status and body of a GET of `c.test/` through `proxy`.
async fn get(proxy: SocketAddr) -> (u16, String) {
    let mut c = Client::connect(Proto::H1, proxy).await;
    let resp = c
        .send(
            Method::GET,
            Some("c.test"),
            "/",
            &[],
            full(bytes::Bytes::new()),
        )
        .await;
    let status = resp.status().as_u16();
    (
        status,
        String::from_utf8_lossy(&body_bytes(resp).await).into_owned(),
    )
}

/// The body a GET of `c.test/` gets through `proxy` (the backend's name).
async fn served_by(proxy: SocketAddr) -> String {
    get(proxy).await.1
}

/// Status and body text of an admin request.
async fn admin(addr: SocketAddr, method: Method, path: &str, body: String) -> (u16, String) {
    let mut c = Client::connect(Proto::H1, addr).await;
    let resp = c
        .send(
            method,
            Some("localhost"),
            path,
            &[("x-api-key", KEY)],
            full(body),
        )
        .await;
    let status = resp.status().as_u16();
    (
        status,
        String::from_utf8_lossy(&body_bytes(resp).await).into_owned(),
    )
}

/// `proxy` serves `c.test/` from `name` within 20 s.
async fn comes_to(proxy: SocketAddr, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if served_by(proxy).await.contains(name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_master_pushes_configurations_to_its_workers() {
    let (a, b, c) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
        Backend::start("backend-c").await,
    );
    let ports = [free_port(), free_port()];
    let mut workers = vec![worker(&a, ports[0]), worker(&a, ports[1])];
    let nodes = format!(
        "\"http://127.0.0.1:{}, http://127.0.0.1:{}\"",
        ports[0], ports[1]
    );
    let master = ProxyProcess::start(
        &routes_to(&a),
        &format!("cluster_member: master\nworker_nodes: {nodes}\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n"),
    );
    let master_admin = master.logged_addr("admin API on http://");
    for w in &workers {
        assert!(served_by(w.addr).await.contains("backend-a"));
    }
    // The master serves no proxy traffic.
    assert_eq!(get(master.addr).await.0, 400);

    // A push reaches both workers.
    let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&b)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer.matches(": 200 applied").count(), 2, "{answer}");
    for w in &workers {
        assert!(served_by(w.addr).await.contains("backend-b"));
    }

    // An empty body (curl's `--data-binary @typo` sends one) changes nothing anywhere.
    let (status, answer) = admin(master_admin, Method::POST, "/conf", String::new()).await;
    assert_eq!(status, 400, "{answer}");
    for w in &workers {
        assert!(served_by(w.addr).await.contains("backend-b"));
    }

    // A bad configuration is refused by the master, with its lines, and reaches no worker.
    let bad = "upstreams:\n  c.test:\n    paths:\n      \"/\":\n        servers: [\"nowhere\"]\n";
    let (status, answer) = admin(master_admin, Method::POST, "/conf", bad.to_string()).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains(":5:") && answer.contains("servers"),
        "{answer}"
    );
    assert!(!answer.contains("workers:"), "{answer}");
    for w in &workers {
        assert!(served_by(w.addr).await.contains("backend-b"));
    }

    // The second worker is down during the next push: the master says so, and sends the
    // configuration again once the worker is back (restarted from its own file: backend-a).
    drop(workers.pop());
    let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&c)).await;
    assert_eq!(status, 502, "{answer}");
    assert!(answer.contains("unreachable"), "{answer}");
    assert!(served_by(workers[0].addr).await.contains("backend-c"));
    workers.push(worker(&a, ports[1]));
    assert!(
        comes_to(workers[1].addr, "backend-c").await,
        "the returning worker got the push"
    );

    // `?save` goes on too: each worker writes what it took to its own upstreams file.
    let (status, answer) = admin(master_admin, Method::POST, "/conf?save", routes_to(&b)).await;
    assert_eq!(
        (status, answer.matches(": 200 applied and saved").count()),
        (200, 2),
        "{answer}"
    );
    for w in &workers {
        let saved = std::fs::read_to_string(w.path("upstreams.yaml")).expect("upstreams file");
        assert!(saved.contains(&b.addr.to_string()), "{saved}");
        assert!(served_by(w.addr).await.contains("backend-b"));
    }

    // The master's status shows each worker's digest and last push.
    let (status, json) = admin(master_admin, Method::GET, "/status", String::new()).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    let listed = json["workers"].as_array().expect("workers").clone();
    assert_eq!(listed.len(), 2, "{json}");
    let worker_admin = workers[0].logged_addr("admin API on http://");
    let (_, own) = admin(worker_admin, Method::GET, "/status?digest", String::new()).await;
    let own: serde_json::Value = serde_json::from_str(&own).expect("worker status JSON");
    for w in &listed {
        assert_eq!(w["pushed_digest"], own["config_digest"], "{w} / {own}");
        assert_eq!(w["current"], true, "{w}");
        assert_eq!(w["config_digest"], w["pushed_digest"], "{w}");
        assert!(
            w["last_push"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{w}"
        );
    }

    // An edit to the master's own upstreams.yaml goes on to the workers as a push does (it was
    // applied on the master only, and the workers still shown current).
    write_atomically(&master.path("upstreams.yaml"), &routes_to(&c));
    for w in &workers {
        assert!(
            comes_to(w.addr, "backend-c").await,
            "the master's file edit did not reach a worker; {}",
            master.log_text()
        );
    }
    // A write the master refuses is not passed on (the file was read again when the change was
    // seen, and what it held then was pushed, refused or not).
    let bad = "upstreams:\n  c.test:\n    paths:\n      \"/\": { servers: [] }\n";
    write_atomically(&master.path("upstreams.yaml"), bad);
    assert!(
        master
            .wait_log_count("reload rejected", 1, Duration::from_secs(10))
            .await
    );
    for w in &workers {
        assert!(served_by(w.addr).await.contains("backend-c"));
    }
    // The next good edit goes on, and it is the second passed on: the refused one was not.
    write_atomically(&master.path("upstreams.yaml"), &routes_to(&b));
    for w in &workers {
        assert!(comes_to(w.addr, "backend-b").await, "{}", master.log_text());
    }
    assert_eq!(
        master.log_count("passing it on to the workers"),
        2,
        "{}",
        master.log_text()
    );
}

#[test]
fn check_config_names_what_a_master_lacks_and_bad_cluster_values() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("upstreams.yaml"), "upstreams: {}\n").expect("write");
    let base = "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\n";
    for (extra, want) in [
        ("cluster_member: master\nworker_nodes: \"http://10.0.0.2:3000\"\nconfig_api_enabled: true\n", "main.yaml:3:"),
        ("cluster_member: master\nmaster_key: \"k\"\nconfig_api_enabled: true\n", "worker_nodes"),
        ("limits_store: \"memcached://x:1\"\n", "main.yaml:3:"),
        ("worker_nodes: \"10.0.0.2:3000\"\n", "not http://host:port"),
    ] {
        let main = dir.path().join("main.yaml");
        std::fs::write(&main, format!("{base}{extra}")).expect("write");
        let out = std::process::Command::new(binary())
            .args(["check-config", "-c"])
            .arg(&main)
            .output()
            .expect("run check-config");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra}: {text}");
        assert!(text.contains(want), "{extra}: {text}");
    }
}

/// A master pushes to an `https://` worker whose certificate it can verify (its CA given by
/// `SSL_CERT_FILE`, its name the URL's), and never sends the key to one it cannot.
#[tokio::test]
async fn a_master_pushes_to_a_worker_over_https_only_when_its_certificate_checks_out() {
    let (a, b) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
    );
    let pki = test_pki(&["localhost"]);
    let certs = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = certs.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (crt, key) = (
        write("admin.crt", &pki.leaf_pem),
        write("admin.key", &pki.leaf_key_pem),
    );
    let ca = write("ca.pem", &pki.ca_pem);
    let port = free_port();
    let worker = ProxyProcess::start(
        &routes_to(&a),
        &format!(
            "cluster_member: worker\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_tls_address: \"127.0.0.1:{port}\"\nconfig_tls_certificate: \"{crt}\"\nconfig_tls_key_file: \"{key}\"\n"
        ),
    );
    worker.logged_addr("admin API on https://");
    let master_of = |url: &str, env: &[(&str, &str)]| {
        let main = format!("cluster_member: master\nworker_nodes: [\"{url}\"]\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n");
        ProxyProcess::start_env(&routes_to(&a), &main, env)
    };
    // Not trusted (no CA given), then trusted but reached by a name the certificate lacks.
    let stranger = master_of(&format!("https://localhost:{port}"), &[]);
    let misnamed = master_of(
        &format!("https://127.0.0.1:{port}"),
        &[("SSL_CERT_FILE", &ca)],
    );
    for master in [&stranger, &misnamed] {
        let master_admin = master.logged_addr("admin API on http://");
        let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&b)).await;
        assert_eq!(status, 502, "{answer}");
        assert!(served_by(worker.addr).await.contains("backend-a"));
    }
    let trusted = master_of(
        &format!("https://localhost:{port}"),
        &[("SSL_CERT_FILE", &ca)],
    );
    let master_admin = trusted.logged_addr("admin API on http://");
    let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&b)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(served_by(worker.addr).await.contains("backend-b"));
}

/// A master listed among its own workers takes its push once and does not pass it on again:
/// it went round 64 times, until the admin API's connection cap stopped it.
#[tokio::test]
async fn a_master_among_its_own_workers_does_not_push_round_in_circles() {
    let (a, b) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
    );
    let port = free_port();
    let master = ProxyProcess::start(
        &routes_to(&a),
        &format!("cluster_member: master\nworker_nodes: [\"http://127.0.0.1:{port}\"]\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:{port}\"\n"),
    );
    let master_admin = master.logged_addr("admin API on http://");
    let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&b)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer.matches("workers:").count(), 1, "{answer}");
    assert!(answer.contains("not passed on"), "{answer}");
    // Said at start, with the key.
    let log = master.log_text();
    assert!(log.contains("is this master's own admin API"), "{log}");
}

/// Two masters that list one worker replace each other's configuration on it every check, for
/// good: each says so once it has seen it twice (nothing said it, and the worker's routes
/// flipped every few seconds). Masters whose checks fall at the same moment each find their own
/// configuration every other check, and were never said to take turns when counted in a row.
#[tokio::test]
async fn two_masters_of_one_worker_say_that_they_take_turns() {
    let (a, b, c) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
        Backend::start("backend-c").await,
    );
    let port = free_port();
    let _worker = worker(&a, port);
    let master = |backend: &Backend| {
        ProxyProcess::start(
            &routes_to(backend),
            &format!("cluster_member: master\nworker_nodes: [\"http://127.0.0.1:{port}\"]\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n"),
        )
    };
    let (one, two) = (master(&b), master(&c));
    for (m, backend) in [(&one, &b), (&two, &c)] {
        let admin_addr = m.logged_addr("admin API on http://");
        let (status, answer) = admin(admin_addr, Method::POST, "/conf", routes_to(backend)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let said = "replaced by another than this master's";
    // Each master checks every 5 s; whichever way their checks fall, the second turn is
    // within four checks.
    let turns = one.wait_log(said, Duration::from_secs(60));
    turns.await;
}

/// `JWT_KEY` stands for `master_key` on a master as everywhere else (the admin API's key, the
/// pushes' key): a master with only `JWT_KEY` was refused at start.
#[tokio::test]
async fn a_master_keyed_by_jwt_key_alone_pushes() {
    let (a, b) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
    );
    let port = free_port();
    let worker = worker(&a, port);
    let master = ProxyProcess::start_env(
        &routes_to(&a),
        &format!("cluster_member: master\nworker_nodes: [\"http://127.0.0.1:{port}\"]\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n"),
        &[("JWT_KEY", KEY)],
    );
    let master_admin = master.logged_addr("admin API on http://");
    let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(&b)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(": 200 applied"), "{answer}");
    assert!(served_by(worker.addr).await.contains("backend-b"));
    // The worker says which master pushed (with two masters, it could not be told).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim();
    let named = format!("pushed by master {host} (admin API http://{master_admin})");
    worker.wait_log(&named, Duration::from_secs(10)).await;
}

/// A worker that answers every request with a 500 whose body spans lines, the second made to
/// look like a log line of the master's.
async fn forging_worker() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 64 * 1024];
                let _ = s.read(&mut buf).await;
                let body = "internal error\nINJECTED 2026-12-07T00:00:00Z  INFO forged line\n";
                let answer = format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// The master's file served again by SIGHUP after a `POST /conf` (which did not save) goes on to
/// the workers: its text was the one passed on before the POST, taken for a conf.d change and
/// not passed on, and the workers kept the POST's routes while the master's status called them
/// current. A worker's answer is one line of the master's log however many its text has.
#[tokio::test]
async fn the_masters_file_served_again_after_a_push_reaches_the_workers() {
    let (a, b, c) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
        Backend::start("backend-c").await,
    );
    let port = free_port();
    let w = worker(&a, port);
    let forging = forging_worker().await;
    let nodes = format!("\"http://127.0.0.1:{port}, http://127.0.0.1:{forging}\"");
    let master = ProxyProcess::start(
        &routes_to(&a),
        &format!("cluster_member: master\nworker_nodes: {nodes}\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n"),
    );
    let master_admin = master.logged_addr("admin API on http://");
    for pushed in [&b, &c] {
        let (status, answer) = admin(master_admin, Method::POST, "/conf", routes_to(pushed)).await;
        assert_eq!(status, 502, "the forging worker fails it: {answer}");
        assert!(served_by(w.addr).await.contains(pushed.name), "{answer}");
        master.signal(nix::sys::signal::Signal::SIGHUP);
        assert!(
            comes_to(w.addr, "backend-a").await,
            "the master's file did not reach the worker again; {}",
            master.log_text()
        );
    }
    let log = master.log_text();
    assert!(
        log.contains("INJECTED"),
        "the worker's answer is shown: {log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("INJECTED")),
        "a worker's text began a line of the master's log: {log}"
    );
}

/// Two `POST /conf` at once: what the master serves is what it pushed last, so its workers end
/// on the master's configuration. Applied in one order and pushed in the other, they stayed on
/// the other one for good, the master's status calling them current (1 round in 6 to 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pushes_at_once_leave_the_workers_on_what_the_master_serves() {
    let (a, b, c) = (
        Backend::start("backend-a").await,
        Backend::start("backend-b").await,
        Backend::start("backend-c").await,
    );
    let port = free_port();
    let _w = worker(&a, port);
    let master = ProxyProcess::start(
        &routes_to(&a),
        &format!("cluster_member: master\nworker_nodes: \"http://127.0.0.1:{port}\"\nmaster_key: \"{KEY}\"\nconfig_api_enabled: true\nconfig_address: \"127.0.0.1:0\"\n"),
    );
    let master_admin = master.logged_addr("admin API on http://");
    for round in 0..20 {
        let (first, second) = tokio::join!(
            admin(master_admin, Method::POST, "/conf", routes_to(&b)),
            admin(master_admin, Method::POST, "/conf", routes_to(&c)),
        );
        assert_eq!((first.0, second.0), (200, 200), "{first:?} {second:?}");
        let (_, own) = admin(master_admin, Method::GET, "/status?digest", String::new()).await;
        let own: serde_json::Value = serde_json::from_str(&own).expect("status JSON");
        let (_, status) = admin(master_admin, Method::GET, "/status", String::new()).await;
        let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
        assert_eq!(
            status["workers"][0]["pushed_digest"], own["config_digest"],
            "round {round}: pushed one configuration, serves another"
        );
    }
}
