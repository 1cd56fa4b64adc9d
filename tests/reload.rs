//! Hot reload of upstreams.yaml: under load, with broken files, bursts of writes, and SIGHUP.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use support::*;

/// `RUST_LOG` showing aralez's debug lines (the proxy's own filter otherwise).
const DEBUG_LOG: &str = "info,aralez=debug,h2=warn,hyper=warn";

/// What a reload logs (at debug) when it finds the files as they were.
const UNCHANGED: &str = "configuration files unchanged";

fn routes(set: &[&Backend]) -> String {
    Upstreams::new()
        .host("DEFAULT", Host::new().path("/", Path::servers(set)))
        .render()
}

async fn backend_of(client: &mut Client) -> (u16, String) {
    let resp = client.get("any", "/").await;
    let status = resp.status().as_u16();
    let name = header(&resp, "x-backend");
    body_bytes(resp).await;
    (status, name)
}

/// Polls until the proxy answers from `want` (a backend name), or panics after 5 s.
async fn wait_for_backend(proxy: &ProxyProcess, want: &str) {
    wait_for_host_backend(proxy, "any", want).await;
}

/// Polls until the proxy answers `host`'s requests from `want`, or panics after 5 s.
async fn wait_for_host_backend(proxy: &ProxyProcess, host: &str, want: &str) {
    let live = eventually_async(Duration::from_secs(5), || async {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        let resp = client.get(host, "/").await;
        (header(&resp, "x-backend") == want).then_some(())
    })
    .await;
    assert!(
        live.is_some(),
        "{host}: {want} never became live; log:\n{}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_rewrites_under_load_lose_no_request() {
    // `s` stays in both sets: its pooled connections must survive every reload.
    let (a1, s, b1) = (
        Backend::start("a1").await,
        Backend::start("s").await,
        Backend::start("b1").await,
    );
    let set_a = routes(&[&a1, &s]);
    let set_b = routes(&[&b1, &s]);
    let proxy = ProxyProcess::start(&set_a, "");
    let file = proxy.path("upstreams.yaml");
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for i in 0..50 {
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2c };
        let mut client = Client::connect(proto, proxy.addr).await;
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut seen: HashMap<String, usize> = HashMap::new();
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let resp = client
                    .try_send(Method::GET, Some("any"), "/", &[], full(Bytes::new()))
                    .await;
                let resp = match resp {
                    Ok(resp) => resp,
                    Err(error) => {
                        failures.push(format!("{proto:?} client: {error:?}"));
                        break;
                    }
                };
                let status = resp.status().as_u16();
                let name = header(&resp, "x-backend");
                if let Err(error) = resp.into_body().collect().await {
                    failures.push(format!("{proto:?} body from {name}: {error:?}"));
                    break;
                }
                if status != 200 {
                    failures.push(format!("{status} from {name:?}"));
                }
                *seen.entry(name).or_default() += 1;
            }
            (seen, failures)
        }));
    }
    // 200 rewrites, and more (at most 10 s) until 10 have really been applied: how many writes
    // one reload absorbs depends on how busy the two cores are, and the point is reloads under
    // load, not a count of writes. Even writes are set B, odd ones set A; the last is set A.
    let applied = || proxy.log_text().matches("configuration applied").count();
    let started = Instant::now();
    let mut writes = 0;
    while writes < 200
        || writes % 2 == 1
        || (applied() < 10 && started.elapsed() < Duration::from_secs(10))
    {
        write_atomically(&file, if writes % 2 == 0 { &set_b } else { &set_a });
        writes += 1;
        // Kept: the writes are spread over time on purpose, so reloads happen throughout the load.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The last write (set A) must end up live.
    wait_for_backend(&proxy, "a1").await;
    stop.store(true, Ordering::Relaxed);
    let mut totals: HashMap<String, usize> = HashMap::new();
    let mut failures = Vec::new();
    for w in workers {
        let (seen, f) = w.await.unwrap();
        failures.extend(f);
        for (k, v) in seen {
            *totals.entry(k).or_default() += v;
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed requests, e.g. {:?}; log:\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        proxy.log_text()
    );
    let names: Vec<&String> = totals.keys().collect();
    assert!(
        totals
            .keys()
            .all(|n| ["a1", "s", "b1"].contains(&n.as_str())),
        "unknown backends: {names:?}"
    );
    let from_b = totals.get("b1").copied().unwrap_or(0);
    let total: usize = totals.values().sum();
    assert!(
        from_b > 0 && from_b < total,
        "both sets served during the run: {totals:?}"
    );
    let reloads = applied();
    assert!(
        reloads >= 10,
        "only {reloads} reloads happened in {writes} writes"
    );
    // The backend that stayed kept its pooled connections across 200 reloads.
    let accepts = s.accepts.load(Ordering::SeqCst);
    let served = totals.get("s").copied().unwrap_or(0);
    assert!(
        served > 1000 && accepts <= 64,
        "{accepts} connections to the staying backend for {served} requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_keeps_the_old_routes_until_fixed() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    let file = proxy.path("upstreams.yaml");
    let broken = format!("upstreams:\n  DEFAULT:\n    paths:\n      \"/\":\n        servers: [\"{}\", \"127.0.0.1:99999\"]\n", b.addr);
    write_atomically(&file, &broken);
    let logged = eventually(Duration::from_secs(5), || {
        proxy.log_text().contains("reload rejected")
    })
    .await;
    assert!(logged, "no rejection logged:\n{}", proxy.log_text());
    let log = proxy.log_text();
    let line = log.lines().find(|l| l.contains("reload rejected")).unwrap();
    assert!(
        line.contains("upstreams.yaml:5:")
            && line.contains("servers[1]")
            && line.contains("out of range"),
        "{line}"
    );
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..20 {
        assert_eq!(backend_of(&mut client).await, (200, "a".to_string()));
    }
    write_atomically(&file, &routes(&[&b]));
    wait_for_backend(&proxy, "b").await;
    // The same broken file again, after a good one: a new mistake, said again (it was taken
    // for the watcher's second look at the bytes already refused, and nothing was said).
    write_atomically(&file, &broken);
    let said_again = proxy.wait_log_count("reload rejected", 2, Duration::from_secs(5));
    assert!(said_again.await, "{}", proxy.log_text());
    assert_eq!(backend_of(&mut client).await, (200, "b".to_string()));
}

/// A FIFO put where upstreams.yaml was: the reload waited for a writer that never came, and no
/// later change was ever applied (the watch waits for each reload), nor was SIGTERM heard while a
/// SIGHUP's reload hung. It is refused at once now, and the next real file is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_the_file_is_refused_and_the_next_file_applied() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    proxy.wait_log("for changes", Duration::from_secs(5)).await;
    let file = proxy.path("upstreams.yaml");
    let fifo = proxy.path("upstreams.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::rename(&fifo, &file).unwrap();
    proxy
        .wait_log("is not a regular file", Duration::from_secs(10))
        .await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(backend_of(&mut client).await, (200, "a".to_string()));
    write_atomically(&file, &routes(&[&b]));
    wait_for_backend(&proxy, "b").await;
}

/// A file rewritten in place (`generate > upstreams.yaml`) is empty from its truncation to its
/// writer's first bytes. The watcher used to reload it empty meanwhile: every route dropped, 404s
/// until the write came. It now keeps the routes while the file is empty, for up to a second,
/// and then refuses it, the file watch and SIGHUP alike (an emptying that lasted was taken as
/// meant, and SIGHUP took it at once: a failed template render took every route away);
/// `upstreams: {}` removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_for_a_rewrite_keeps_its_routes_until_written() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    let file = proxy.path("upstreams.yaml");
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(backend_of(&mut client).await, (200, "a".to_string()));

    std::fs::write(&file, "").expect("truncate");
    let waiting = "upstreams.yaml is empty: the reload waits for its content";
    proxy.wait_log(waiting, Duration::from_secs(5)).await;
    // The file is still empty: the routes are still served.
    assert_eq!(backend_of(&mut client).await, (200, "a".to_string()));
    std::fs::write(&file, routes(&[&b])).expect("the write");
    wait_for_backend(&proxy, "b").await;
    assert!(
        !proxy
            .log_text()
            .contains("hosts removed: DEFAULT; backends added: none"),
        "the routes were dropped meanwhile:\n{}",
        proxy.log_text()
    );

    // Emptied for good: refused once the grace is over, and by SIGHUP too.
    std::fs::write(&file, "# nothing rendered\n").expect("empty");
    let refused = "reload rejected, previous configuration kept";
    assert!(
        proxy
            .wait_log_count(refused, 1, Duration::from_secs(5))
            .await
    );
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    assert!(
        proxy
            .wait_log_count(refused, 2, Duration::from_secs(5))
            .await
    );
    assert!(proxy
        .log_text()
        .contains("the file is empty; the running routes are kept"));
    assert_eq!(backend_of(&mut client).await, (200, "b".to_string()));
    // A template's leftovers around nothing parse to no route as well: refused alike (they
    // were applied, every route gone).
    // So do a leftover host with nothing under it and a bare `{}`: only `upstreams: {}` says
    // "no routes" in so many words.
    let leftovers = ["---\n", "~\n", "upstreams: ~\n", "foo.example: ~\n", "{}\n"];
    for (n, leftover) in leftovers.into_iter().enumerate() {
        std::fs::write(&file, leftover).expect("leftover");
        let times = 3 + n;
        assert!(
            proxy
                .wait_log_count(refused, times, Duration::from_secs(5))
                .await,
            "{leftover:?}:\n{}",
            proxy.log_text()
        );
        assert_eq!(backend_of(&mut client).await, (200, "b".to_string()));
    }
    // Said as meant: every route goes.
    std::fs::write(&file, "upstreams: {}\n").expect("no routes");
    let dropped = eventually_async(Duration::from_secs(5), || async {
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        (backend_of(&mut client).await.0 == 404).then_some(())
    });
    assert!(
        dropped.await.is_some(),
        "`upstreams: {{}}` never applied:\n{}",
        proxy.log_text()
    );
}

/// An upstreams.yaml emptied (or routing nothing for a misspelt key) while conf.d routes other
/// hosts is refused as one emptied alone is: the merged routes were not empty, so the emptying was applied after the rewrite grace
/// (and at once by SIGHUP), and upstreams.yaml's own hosts answered 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_file_beside_conf_d_hosts_is_refused_too() {
    let (a, c) = (Backend::start("a").await, Backend::start("c").await);
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    std::fs::create_dir_all(proxy.path("conf.d")).unwrap();
    let extra = Upstreams::new()
        .host("c.example", Host::new().path("/", Path::servers(&[&c])))
        .render_conf_d();
    write_atomically(&proxy.path("conf.d/c.yaml"), &extra);
    wait_for_host_backend(&proxy, "c.example", "c").await;
    let refused = "reload rejected, previous configuration kept";
    // The last: a misspelt wrapper, only its warning said, took upstreams.yaml's hosts away.
    let misspelt = "upstrems:\n  any:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:1\"]}\n";
    for (n, emptied) in ["", "# comment\n---\n", "upstreams:\n", misspelt]
        .into_iter()
        .enumerate()
    {
        std::fs::write(proxy.path("upstreams.yaml"), emptied).expect("emptied");
        proxy.signal(nix::sys::signal::Signal::SIGHUP);
        let said = proxy.wait_log_count(refused, n + 1, Duration::from_secs(5));
        assert!(said.await, "{emptied:?}:\n{}", proxy.log_text());
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        assert_eq!(
            backend_of(&mut client).await,
            (200, "a".to_string()),
            "{emptied:?}"
        );
    }
    assert!(proxy
        .log_text()
        .contains("the file is empty; the running routes are kept"));
    // conf.d's own changes still apply while upstreams.yaml is left as it was.
    std::fs::write(proxy.path("upstreams.yaml"), routes(&[&a])).expect("back");
    let back = Upstreams::new()
        .host("c.example", Host::new().path("/", Path::servers(&[&a])))
        .render_conf_d();
    write_atomically(&proxy.path("conf.d/c.yaml"), &back);
    wait_for_host_backend(&proxy, "c.example", "a").await;
    // A file that said `upstreams: {}` routed nothing of its own: emptying it loses nothing and
    // is applied (refused, it held every later conf.d change back).
    std::fs::write(proxy.path("upstreams.yaml"), "upstreams: {}\n").expect("no routes");
    wait_for_host_backend(&proxy, "any", "").await; // no route: no backend answers
    std::fs::write(proxy.path("upstreams.yaml"), "").expect("emptied");
    let again = Upstreams::new()
        .host("c.example", Host::new().path("/", Path::servers(&[&c])))
        .render_conf_d();
    write_atomically(&proxy.path("conf.d/c.yaml"), &again);
    wait_for_host_backend(&proxy, "c.example", "c").await;
    // Beside conf.d's hosts an empty file is no "every request gets 404".
    assert!(
        !proxy.log_text().contains("every request gets 404"),
        "{}",
        proxy.log_text()
    );
}

/// A file written in place by a slow writer (a generator's output redirected to it) is read
/// once its writer has closed it. Its first half is a valid file with fewer hosts, and was
/// reloaded as such meanwhile: 404s for the hosts not written yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_slowly_in_place_is_read_once_closed() {
    use std::io::Write;
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let two_hosts = |backend: &Backend| {
        Upstreams::new()
            .host("one.test", Host::new().path("/", Path::servers(&[backend])))
            .host("two.test", Host::new().path("/", Path::servers(&[backend])))
            .render()
    };
    let proxy = ProxyProcess::start(&two_hosts(&a), "");
    // A write before the watch begins is read by the check that follows it, whole or not.
    proxy.wait_log("for changes", Duration::from_secs(5)).await;
    let text = two_hosts(&b);
    let second = text.find("two.test").expect("the second host");
    let cut = text[..second].rfind('\n').map_or(0, |n| n + 1);
    let mut writer = std::fs::File::create(proxy.path("upstreams.yaml")).expect("truncate");
    writer
        .write_all(&text.as_bytes()[..cut])
        .expect("the first half");
    proxy
        .wait_log("upstreams.yaml is being written", Duration::from_secs(5))
        .await;
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for host in ["one.test", "two.test"] {
        let resp = client.get(host, "/").await;
        assert_eq!(
            header(&resp, "x-backend"),
            "a",
            "{host}: {}",
            proxy.log_text()
        );
        body_bytes(resp).await;
    }
    writer.write_all(&text.as_bytes()[cut..]).expect("the rest");
    drop(writer);
    wait_for_host_backend(&proxy, "two.test", "b").await;
    wait_for_host_backend(&proxy, "one.test", "b").await;
    let log = proxy.log_text();
    assert!(!log.contains("hosts removed: two.test"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_quick_writes_the_second_wins() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    let file = proxy.path("upstreams.yaml");
    for _ in 0..5 {
        write_atomically(&file, &routes(&[&b]));
        // Kept (this pause and the next): the writes are 50 ms apart, more than the watcher's coalescing
        // delay, and afterwards no stale reload may come within 200 ms; real time is the point.
        tokio::time::sleep(Duration::from_millis(50)).await;
        write_atomically(&file, &routes(&[&c]));
        wait_for_backend(&proxy, "c").await;
        // And it stays: no late reload of the first write.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut client = Client::connect(Proto::H1, proxy.addr).await;
        assert_eq!(backend_of(&mut client).await.1, "c");
        write_atomically(&file, &routes(&[&a]));
        wait_for_backend(&proxy, "a").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_d_hosts_are_merged_and_sighup_with_unchanged_files_swaps_nothing() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    // Debug logs for aralez: a reload that finds the files unchanged says so.
    let proxy = ProxyProcess::start_env(&routes(&[&a]), "", &[("RUST_LOG", DEBUG_LOG)]);
    // A conf.d host appears through the watcher.
    std::fs::create_dir_all(proxy.path("conf.d")).unwrap();
    let extra = Upstreams::new()
        .host("extra.example", Host::new().path("/", Path::servers(&[&b])))
        .render_conf_d();
    write_atomically(&proxy.path("conf.d/10-extra.yaml"), &extra);
    wait_for_host_backend(&proxy, "extra.example", "b").await;
    // The snapshot is served before its "configuration applied" line reaches the log: wait for
    // the line, or the count below may miss it and see it arrive after the SIGHUP.
    let logged = eventually(Duration::from_secs(5), || {
        proxy
            .log_text()
            .lines()
            .any(|l| l.contains("configuration applied") && l.contains("extra.example"))
    });
    assert!(
        logged.await,
        "no log line for the conf.d host:\n{}",
        proxy.log_text()
    );
    // SIGHUP with unchanged files does not swap anything; with a change, it applies it.
    let before = proxy.log_text().matches("configuration applied").count();
    let pid = proxy.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let sighup_unchanged = format!("{UNCHANGED}; nothing to reload source=\"SIGHUP\"");
    proxy
        .wait_log(&sighup_unchanged, Duration::from_secs(5))
        .await;
    assert_eq!(
        proxy.log_text().matches("configuration applied").count(),
        before
    );
    assert!(
        proxy.log_text().contains("extra.example"),
        "the change log names the added host"
    );
}

/// Writes `content` as `file` of a Kubernetes ConfigMap mount in `dir`, as the kubelet updates
/// one: a new version directory, a new `..data` link renamed over the old one, the old version
/// deleted. The first call makes the mount: `..data`, and `file` linked to `..data/file`.
fn update_config_map(dir: &std::path::Path, file: &str, version: u32, content: &str) {
    let old = std::fs::read_link(dir.join("..data")).ok();
    let new = format!("..v{version}");
    std::fs::create_dir_all(dir.join(&new)).expect("version dir");
    std::fs::write(dir.join(&new).join(file), content).expect("version file");
    std::os::unix::fs::symlink(&new, dir.join("..data_tmp")).expect("new ..data");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    match old {
        Some(old) => std::fs::remove_dir_all(dir.join(old)).expect("old version"),
        None => {
            std::os::unix::fs::symlink(std::path::Path::new("..data").join(file), dir.join(file))
                .expect("file link")
        }
    }
}

/// upstreams.yaml and conf.d mounted from ConfigMaps: every update applies. Only the first one
/// used to: the watch was on the version directory the file resolved to at start, which the first
/// update deletes, and a swap of `..data` never named a file the watcher looked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_mounts_apply_every_update() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    // The mount is made before the start, as in a pod: upstreams.yaml is a link from the start.
    let mount = r#"d=$(dirname "$1") && mkdir "$d/..v0" && mv "$d/upstreams.yaml" "$d/..v0/" && ln -s ..v0 "$d/..data" && ln -s ..data/upstreams.yaml "$d/upstreams.yaml""#;
    let proxy = ProxyProcess::start_after(&routes(&[&a]), "", mount);
    let dir = proxy.path("");
    for (version, backend) in [(1, &b), (2, &c), (3, &a), (4, &b)] {
        update_config_map(&dir, "upstreams.yaml", version, &routes(&[backend]));
        wait_for_backend(&proxy, backend.name).await;
    }

    let conf_d = proxy.path("conf.d");
    std::fs::create_dir(&conf_d).expect("conf.d");
    for (version, backend) in [(1, &a), (2, &c), (3, &b)] {
        let extra = Upstreams::new()
            .host(
                "extra.example",
                Host::new().path("/", Path::servers(&[backend])),
            )
            .render_conf_d();
        update_config_map(&conf_d, "extra.yaml", version, &extra);
        wait_for_host_backend(&proxy, "extra.example", backend.name).await;
    }
    // The watch library's note on each deleted version directory stays out of the log.
    assert!(
        !proxy.log_text().contains("watch descriptor"),
        "{}",
        proxy.log_text()
    );
}

/// A release swap (Capistrano's `current` -> `releases/N`, replaced by renaming a new link over
/// it) with upstreams.yaml read through the link: the new release applies, and its edits after.
/// The swap changed no watched directory: nothing applied until a SIGHUP, and after one the
/// watches stayed on the old release (its edits reloaded, the live one's ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_swap_of_a_directory_link_is_followed() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let dir = tempfile::tempdir().unwrap();
    for release in ["1", "2"] {
        let at = dir.path().join("releases").join(release);
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(at.join("upstreams.yaml"), routes(&[&a])).unwrap();
    }
    std::os::unix::fs::symlink("releases/1", dir.path().join("current")).unwrap();
    let main = dir.path().join("main.yaml");
    let at = |name: &str| dir.path().join(name).display().to_string();
    let text = format!(
        "threads: 2\nproxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"current/upstreams.yaml\"\nlog_level: debug\npid_file: \"{}\"\nupgrade_sock: \"{}\"\n",
        at("aralez.pid"),
        at("aralez.sock")
    );
    std::fs::write(&main, text).unwrap();
    let proxy = ProxyProcess::spawn_args(&main, &[]);
    wait_for_backend(&proxy, "a").await;
    // An edit of the release in use applies: the watcher is past its look at start-up (which
    // would read a swap made before it as any change).
    write_atomically(
        &dir.path().join("releases/1/upstreams.yaml"),
        &routes(&[&b]),
    );
    wait_for_backend(&proxy, "b").await;
    // ... and past the look its later events bring (a swap before that look would be read as
    // any change is): it finds the files unchanged.
    let settled = eventually(Duration::from_secs(5), || {
        let log = proxy.log_text();
        let applied = log.rfind("configuration applied");
        applied.is_some_and(|at| log[at..].contains(UNCHANGED))
    });
    assert!(settled.await, "{}", proxy.log_text());
    std::fs::write(dir.path().join("releases/2/upstreams.yaml"), routes(&[&a])).unwrap();
    let swap = dir.path().join("current.tmp");
    std::os::unix::fs::symlink("releases/2", &swap).unwrap();
    std::fs::rename(&swap, dir.path().join("current")).unwrap();
    wait_for_backend(&proxy, "a").await;
    let live = dir.path().join("releases/2/upstreams.yaml");
    write_atomically(&live, &routes(&[&b]));
    wait_for_backend(&proxy, "b").await;
}

/// `POST /conf?save` whose file cannot be written (a directory where its temporary file goes)
/// answers 500, changes nothing, and is logged and counted as any refused configuration: it was
/// answered and nothing more, on the instance where it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_that_fails_is_logged_and_counted() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let admin = "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\nconfig_api_enabled: true";
    let proxy = ProxyProcess::start(&routes(&[&a]), admin);
    let admin = proxy.logged_addr("admin API on http://");
    let blocker = proxy.path(&format!(".upstreams.yaml.tmp-{}", proxy.pid()));
    std::fs::create_dir(&blocker).unwrap();
    let mut client = Client::connect(Proto::H1, admin).await;
    let key = [("x-api-key", "k")];
    let body = full(Bytes::from(routes(&[&b])));
    let resp = client
        .send(Method::POST, Some("localhost"), "/conf?save", &key, body)
        .await;
    assert_eq!(resp.status(), 500);
    let text = String::from_utf8_lossy(&body_bytes(resp).await).into_owned();
    assert!(text.starts_with("not applied: cannot save"), "{text}");
    proxy
        .wait_log(
            "configuration not applied: cannot save",
            Duration::from_secs(5),
        )
        .await;
    let failed = "aralez_config_reloads_total{source=\"api\",result=\"rejected\"}";
    assert_eq!(metric(admin, failed).await, Some(1.0));
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(backend_of(&mut c).await, (200, "a".to_string()));
}

/// A reload is checked against main.yaml as the start is: a `to_https` with no TLS listener to
/// send clients to is warned of (check-config and the start said so; a reload, by the file
/// watch or `POST /conf`, did not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_warns_of_what_main_yaml_makes_pointless() {
    let a = Backend::start("a").await;
    let proxy = ProxyProcess::start(&routes(&[&a]), "");
    let redirecting = Upstreams::new()
        .host(
            "DEFAULT",
            Host::new().path("/", Path::servers(&[&a]).to_https(true)),
        )
        .render();
    std::fs::write(proxy.path("upstreams.yaml"), redirecting).expect("rewrite");
    let said = "`to_https: true` but main.yaml has no `proxy_address_tls`";
    proxy.wait_log(said, Duration::from_secs(5)).await;
}
