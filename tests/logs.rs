//! The operators' log keys through the binary: `log_file`'s rotation form (size, keep, gzip),
//! `access_log_file` with `access_log_format: json` and the fields operators use (user agent,
//! referer, request id, upstream address and time, TLS version and SNI, bytes in and out),
//! `log_pattern` for app log lines, and SIGUSR1 reopening the access log's own file.

use crate::support;

use std::io::Read;
use std::path::Path as FsPath;
use std::time::Duration;

use http::Method;
use support::*;

fn upstreams_for(backend: &Backend) -> String {
    Upstreams::new()
        .host("x.test", Host::new().path("/", Path::servers(&[backend])))
        .render()
}

fn read(path: &FsPath) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn gunzip(path: &FsPath) -> String {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{} is not whole gzip: {e}", path.display()));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_file_rotates_by_size_keeps_two_and_gzips_them() {
    let backend = Backend::start("alpha").await;
    let proxy = ProxyProcess::start_logging_to(
        &upstreams_for(&backend),
        "aralez.log, 1, 2, true",
        "access_log: all",
    );
    let dir = proxy.dir.path().to_path_buf();
    // About 3.4 MB of access lines: three rotations, of which two files are kept.
    let padding = "p".repeat(3000);
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for i in 0..1100 {
        let resp = client.get("x.test", &format!("/r{i}?{padding}")).await;
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
    }
    let one = dir.join("aralez.log.1.gz");
    let two = dir.join("aralez.log.2.gz");
    let rotated = eventually(Duration::from_secs(10), || {
        one.exists() && two.exists() && !dir.join("aralez.log.1").exists()
    });
    assert!(
        rotated.await,
        "files: {:?}",
        std::fs::read_dir(&dir).unwrap().collect::<Vec<_>>()
    );
    assert!(!dir.join("aralez.log.3.gz").exists(), "only two are kept");
    for archive in [&one, &two] {
        let text = gunzip(archive);
        assert!(
            text.len() >= 1 << 20,
            "{} holds {} bytes",
            archive.display(),
            text.len()
        );
        assert!(text.ends_with('\n'), "whole lines only");
        for line in text.lines() {
            assert!(
                line.starts_with("access ") && line.contains("status=200"),
                "{line}"
            );
        }
    }
    // The newest requests are in the live file or the newest archive, never lost between them.
    let live = read(&dir.join("aralez.log"));
    assert!(
        live.len() < (1 << 20) + 4096,
        "live file is {} bytes",
        live.len()
    );
    let last = "target=\"/r1099?";
    let newest = format!("{live}{}", gunzip(&one));
    assert!(
        eventually(Duration::from_secs(5), || read(&dir.join("aralez.log"))
            .contains(last)
            || newest.contains(last))
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_file_in_json_has_the_operators_fields() {
    let backend = Backend::start("alpha").await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "x.test", &["x.test"]);
    let extra = format!(
        "access_log: all\naccess_log_file: \"access.json\"\naccess_log_format: json\n\
         proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&upstreams_for(&backend), &extra);
    let tls = proxy.logged_addr("listening on https://");
    let config = tls_client_config(&[root], &[b"h2", b"http/1.1"]);
    let mut over_tls = Client::connect_tls(tls, "x.test", config).await;
    let headers = [
        ("user-agent", "probe/1.0 (ops)"),
        ("referer", "https://ref.test/a?b=\"c\""),
    ];
    let resp = over_tls
        .send(Method::GET, Some("x.test"), "/tls", &headers, full(""))
        .await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;
    let mut plain = Client::connect(Proto::H1, proxy.addr).await;
    let resp = plain
        .send(
            Method::POST,
            Some("x.test"),
            "/upload",
            &[],
            full(vec![b'u'; 1234]),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let sent_back = body_bytes(resp).await.len();
    // A streamed upload (chunked, no Content-Length), echoed back by the backend: counted as it
    // passes, and the line waits for its end.
    let resp = plain
        .send(
            Method::PUT,
            Some("x.test"),
            "/echo",
            &[],
            generated_body(300_001),
        )
        .await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;

    let path = proxy.dir.path().join("access.json");
    assert!(eventually(Duration::from_secs(5), || read(&path).lines().count() >= 3).await);
    let lines: Vec<serde_json::Value> = read(&path)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let get = &lines[0];
    assert_eq!(get["target"], "/tls");
    assert_eq!(get["version"], "HTTP/2.0");
    assert_eq!(get["tls"], "TLSv1.3");
    assert_eq!(get["sni"], "x.test");
    assert_eq!(get["user_agent"], "probe/1.0 (ops)");
    assert_eq!(get["referer"], "https://ref.test/a?b=\"c\"");
    assert_eq!(get["backend"], backend.addr.to_string());
    assert_eq!(get["status"], 200);
    assert!(get["upstream_ms"].as_f64().is_some(), "{get}");
    assert!(
        get["upstream_ms"].as_f64() <= get["duration_ms"].as_f64(),
        "{get}"
    );
    let post = &lines[1];
    assert_eq!(post["method"], "POST");
    assert_eq!(post["bytes_in"], 1234);
    assert_eq!(post["bytes"], sent_back as u64);
    assert_eq!(post["tls"], serde_json::Value::Null);
    assert_eq!(post["client"], "127.0.0.1");
    assert_eq!(get["bytes_in"], 0);
    assert_eq!(lines[2]["method"], "PUT");
    assert_eq!(lines[2]["bytes_in"], 300_001);
    assert_eq!(lines[2]["bytes"], 300_001, "the echo sent it all back");
    // The app log stays on stdout, with no access lines in it.
    assert!(
        !proxy.log_text().contains("\"target\""),
        "{}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_access_logs_own_file() {
    let backend = Backend::start("alpha").await;
    let extra = "access_log: all\naccess_log_file: \"access.log\"";
    let proxy = ProxyProcess::start(&upstreams_for(&backend), extra);
    let dir = proxy.dir.path().to_path_buf();
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    body_bytes(client.get("x.test", "/before").await).await;
    let path = dir.join("access.log");
    assert!(eventually(Duration::from_secs(5), || read(&path).contains("/before")).await);
    std::fs::rename(&path, dir.join("access.log.old")).unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGUSR1);
    proxy
        .wait_log("SIGUSR1: access log reopening", Duration::from_secs(5))
        .await;
    // Its writer says when it has (only a failure was said).
    let reopened = format!("access log: reopened {}", path.display());
    proxy.wait_log(&reopened, Duration::from_secs(5)).await;
    body_bytes(client.get("x.test", "/after").await).await;
    assert!(eventually(Duration::from_secs(5), || read(&path).contains("/after")).await);
    assert!(!read(&dir.join("access.log.old")).contains("/after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_pattern_shapes_app_log_lines() {
    let backend = Backend::start("alpha").await;
    let extra = "log_pattern: \"{d(%Y-%m-%d %H:%M:%S%.3f)} [{l:<5}] pid={P} {m}{n}\"";
    let proxy = ProxyProcess::start(&upstreams_for(&backend), extra);
    let pid = proxy.pid();
    // The address is handed over before the line reaches the captured log: wait for the line.
    proxy
        .wait_log("listening on http://", Duration::from_secs(5))
        .await;
    let log = proxy.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("listening on http://"))
        .unwrap_or_else(|| panic!("{log}"));
    // `2026-11-23 10:11:12.345 [INFO ] pid=123 listening on http://...`
    let (date, rest) = line.split_at(23);
    let shape: String = date
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_eq!(shape, "9999-99-99 99:99:99.999", "{line}");
    assert!(
        rest.starts_with(&format!(" [INFO ] pid={pid} listening on http://")),
        "{line}"
    );
}

/// An access log that cannot be written (a full disk) is said in the app log, once for a burst
/// of lines, besides `aralez_logging_errors_total`: nginx logs its failed `write()`, and the
/// counter alone told no one why lines were missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_log_that_cannot_be_written_is_said_in_the_app_log() {
    let backend = Backend::start("a").await;
    let proxy = ProxyProcess::start(
        &upstreams_for(&backend),
        "access_log: all\naccess_log_file: \"/dev/full\"",
    );
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    for _ in 0..20 {
        let resp = client.get("x.test", "/").await;
        assert_eq!(resp.status(), 200);
        body_bytes(resp).await;
    }
    let said = "access log: write failed";
    let logged = eventually(Duration::from_secs(5), || proxy.log_count(said) >= 1);
    assert!(logged.await, "{}", proxy.log_text());
    assert_eq!(
        proxy.log_count(said),
        1,
        "once a minute: {}",
        proxy.log_text()
    );
}
