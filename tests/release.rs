//! Release packaging: the Dockerfile's HEALTHCHECK command (the binary's own `healthcheck`, as
//! a `scratch` image has no curl) run as Docker would run it against live and dead proxies, and
//! the release workflow checked by actionlint (an independent linter of GitHub Actions files)
//! and for the four targets and the image it must publish on a tag.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::tools::{find, run_blocking, Tool};
use support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The exec-form arguments of the Dockerfile's `HEALTHCHECK ... CMD [...]`.
fn dockerfile_healthcheck() -> Vec<String> {
    let text = std::fs::read_to_string(format!("{ROOT}/Dockerfile")).expect("Dockerfile");
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.trim_start().starts_with("HEALTHCHECK"))
        .expect("the Dockerfile has a HEALTHCHECK");
    let cmd = line
        .split_once("CMD")
        .expect("HEALTHCHECK ... CMD")
        .1
        .trim();
    serde_json::from_str(cmd).unwrap_or_else(|e| panic!("CMD is not exec form ({e}): {cmd}"))
}

/// Runs the HEALTHCHECK with this build's binary and `conf` in place of the image's paths.
fn run_healthcheck(conf: &std::path::Path, extra: &[&str]) -> (Output, Duration) {
    let args = dockerfile_healthcheck();
    assert_eq!(args[0], "/usr/local/bin/aralez", "{args:?}");
    let args: Vec<String> = args[1..]
        .iter()
        .map(|a| {
            if a == "/etc/aralez/main.yaml" {
                conf.display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    let started = Instant::now();
    let out = Command::new(binary())
        .args(&args)
        .args(extra)
        .output()
        .expect("run healthcheck");
    (out, started.elapsed())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dockerfile_healthcheck_tells_a_serving_proxy_from_a_dead_one() {
    let backend = Backend::start("alpha").await;
    let ups = Upstreams::new()
        .host(
            "localhost",
            Host::new().path("/", Path::servers(&[&backend])),
        )
        .render();
    // A fixed port in main.yaml (the probe reads it from there).
    let mut proxy = ProxyProcess::start_logging_to_file(&ups, "");
    let conf = proxy.path("main.yaml");
    let (out, _) = run_healthcheck(&conf, &[]);
    // The proxy's log says why, should it have stopped listening (a port taken, say).
    let log = std::fs::read_to_string(proxy.path("aralez.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}{}\naralez.log:\n{log}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), "healthy: HTTP/1.1 200 OK");

    proxy.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(proxy.wait_exit(Duration::from_secs(20)).is_some());
    let (out, _) = run_healthcheck(&conf, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("unhealthy: cannot reach 127.0.0.1:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn healthcheck_fails_on_silence_and_on_what_is_not_http() {
    // A port that accepts and never answers: unhealthy once the timeout is over, not later.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", silent.local_addr().unwrap());
    let started = Instant::now();
    let out = Command::new(binary())
        .args(["healthcheck", "--url", &url, "--timeout", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("did not answer within 1s"),
        "{}",
        text(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // Something that answers, but not HTTP.
    let ssh = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", ssh.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut stream, _) = ssh.accept().unwrap();
        let mut buf = [0u8; 512];
        let _ = stream.read(&mut buf);
        let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
    });
    let out = Command::new(binary())
        .args(["healthcheck", "--url", &url, "--timeout", "5"])
        .output()
        .unwrap();
    server.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not HTTP: \"SSH-2.0"),
        "{}",
        text(&out.stderr)
    );
}

const ACTIONLINT: Tool = Tool {
    env: "ARALEZ_ACTIONLINT",
    installed: "target/judges/bin/actionlint",
    on_path: &["actionlint"],
};

#[test]
fn release_workflow_passes_actionlint_and_publishes_every_target() {
    let workflow = format!("{ROOT}/.github/workflows/release.yml");
    if let Some(actionlint) = find(&ACTIONLINT) {
        let dir = tempfile::tempdir().unwrap();
        let args = vec!["-color=false".to_string(), workflow.clone()];
        let run = run_blocking(&actionlint, &args, dir.path(), Duration::from_secs(60));
        assert_eq!(
            run.code,
            Some(0),
            "actionlint:\n{}{}",
            run.stdout,
            run.stderr
        );
    }
    let yaml = std::fs::read_to_string(&workflow).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&yaml).expect("workflow YAML");
    let tags = &doc["on"]["push"]["tags"];
    assert_eq!(tags, &serde_json::json!(["v*"]), "released on version tags");
    let matrix = doc["jobs"]["binaries"]["strategy"]["matrix"]["include"]
        .as_array()
        .expect("a target matrix");
    let mut targets: Vec<&str> = matrix.iter().filter_map(|m| m["target"].as_str()).collect();
    targets.sort();
    assert_eq!(
        targets,
        [
            "aarch64-unknown-linux-gnu",
            "aarch64-unknown-linux-musl",
            "x86_64-unknown-linux-gnu",
            "x86_64-unknown-linux-musl"
        ]
    );
    // Every target is built natively, so the script can smoke-test what it packs.
    for m in matrix {
        let (target, runner) = (m["target"].as_str().unwrap(), m["runner"].as_str().unwrap());
        assert_eq!(
            target.starts_with("aarch64"),
            runner.ends_with("-arm"),
            "{target} on {runner}"
        );
    }
    let steps = doc["jobs"]["binaries"]["steps"].to_string();
    assert!(steps.contains("bash scripts/release.sh"), "{steps}");
    let image = &doc["jobs"]["image"];
    assert!(image["if"]
        .as_str()
        .unwrap_or_default()
        .contains("refs/tags/v"));
    let push = image["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("docker/build-push-action"))
        })
        .expect("the image is built and pushed");
    assert_eq!(push["with"]["platforms"], "linux/amd64,linux/arm64");
    assert_eq!(push["with"]["push"], true);
}
