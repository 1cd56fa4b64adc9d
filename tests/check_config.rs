//! A corpus of broken (and a few valid) config files run through the real binary:
//! `aralez check-config --format json` must name file, line, key and reason for every problem,
//! `aralez -t` must agree, and `aralez -c` must refuse to start on a broken config without panicking.

use crate::support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_aralez");

mod corpus;
mod unwritable;

use corpus::*;

/// What a finished (or killed) child left.
struct Outcome {
    /// `None`: killed after the timeout, or ended by a signal.
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn run(args: &[&std::ffi::OsStr], timeout: Duration) -> Outcome {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aralez");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let mut exited = None;
    support::eventually_blocking(timeout, || {
        exited = child.try_wait().expect("wait");
        exited.is_some()
    });
    let timed_out = exited.is_none();
    let status = exited.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait after kill")
    });
    let elapsed = started.elapsed();
    Outcome {
        code: if timed_out { None } else { status.code() },
        timed_out,
        stdout: String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned(),
        elapsed,
    }
}

fn check_config(main: &Path, extra: &[&str]) -> Outcome {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["check-config".as_ref(), "-c".as_ref(), main.as_os_str()];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    run(&args, Duration::from_secs(30))
}

fn check_json(main: &Path) -> (Outcome, Value) {
    let out = check_config(main, &["--format", "json"]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check-config printed no JSON ({e}):\nstdout: {}\nstderr: {}",
            out.stdout, out.stderr
        )
    });
    (out, json)
}

fn describe(issues: &[Value]) -> String {
    issues
        .iter()
        .map(|i| {
            format!(
                "  {}:{}:{}: {}: `{}`: {}",
                i["file"].as_str().unwrap_or("?"),
                i["line"],
                i["column"],
                i["severity"].as_str().unwrap_or("?"),
                i["key"].as_str().unwrap_or("?"),
                i["message"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn matches(issue: &Value, want: &Expect) -> bool {
    issue["severity"] == want.sev.as_str()
        && issue["file"]
            .as_str()
            .is_some_and(|f| f.ends_with(&format!("/{}", want.file)))
        && issue["line"].as_u64() == Some(want.line)
        && issue["key"].as_str() == Some(want.key.as_str())
        && issue["message"]
            .as_str()
            .is_some_and(|m| want.msgs.iter().all(|s| m.contains(s)))
}

#[test]
fn corpus_reports_file_line_key_and_reason() {
    let cases = cases();
    let broken = cases.iter().filter(|c| c.exit == 1).count();
    assert!(broken >= 32, "only {broken} broken cases");
    let mut failures = Vec::new();
    for case in &cases {
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        let issues = json["issues"].as_array().cloned().unwrap_or_default();
        let mut problems = Vec::new();
        if out.code != Some(case.exit) {
            problems.push(format!("exit {:?}, expected {}", out.code, case.exit));
        }
        if out.stderr.contains("panicked") {
            problems.push(format!("panicked: {}", out.stderr));
        }
        let want_errors = case.issues.iter().filter(|e| e.sev == Sev::Error).count();
        let want_warnings = case.issues.len() - want_errors;
        if json["errors"].as_u64() != Some(want_errors as u64)
            || json["warnings"].as_u64() != Some(want_warnings as u64)
        {
            problems.push(format!(
                "{} error(s) and {} warning(s), expected {want_errors} and {want_warnings}",
                json["errors"], json["warnings"]
            ));
        }
        if json["ok"] != (want_errors == 0) {
            problems.push(format!("\"ok\" is {}", json["ok"]));
        }
        for want in &case.issues {
            if !issues.iter().any(|i| matches(i, want)) {
                problems.push(format!(
                    "missing {} at {}:{} `{}` containing {:?}",
                    want.sev.as_str(),
                    want.file,
                    want.line,
                    want.key,
                    want.msgs
                ));
            }
        }
        for issue in &issues {
            let line = issue["line"].as_u64().unwrap_or(0);
            let column = issue["column"].as_u64().unwrap_or(0);
            if line == 0 || column == 0 {
                problems.push(format!("issue without a position: {issue}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{}]\n  {}\n reported:\n{}",
                case.name,
                problems.join("\n  "),
                describe(&issues)
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn several_errors_in_one_file_are_reported_together() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "several_errors_in_one_file")
        .unwrap();
    let (_dir, main) = case.write();
    let (out, json) = check_json(&main);
    assert_eq!(out.code, Some(1));
    let issues = json["issues"].as_array().unwrap();
    assert!(issues.len() >= 3, "{}", describe(issues));
    let mut lines: Vec<u64> = issues.iter().filter_map(|i| i["line"].as_u64()).collect();
    lines.sort_unstable();
    assert_eq!(lines, vec![6, 8, 9, 10, 11, 12, 16], "{}", describe(issues));
}

#[test]
fn hostile_files_are_refused_quickly() {
    for name in ["alias_bomb", "fifty_megabytes"] {
        let case = cases().into_iter().find(|c| c.name == name).unwrap();
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        assert_eq!(out.code, Some(1), "{name}");
        assert_eq!(json["errors"], 1, "{name}");
        // A bound on unbounded work, not a speed target: refused, each takes milliseconds;
        // expanded or parsed, the alias bomb runs out of memory and 50 MB of YAML takes
        // minutes in a debug build. Generous, so a loaded CI machine cannot fail it.
        assert!(
            out.elapsed < Duration::from_secs(10),
            "{name}: check-config took {:?}",
            out.elapsed
        );
    }
}

/// A FIFO or a device where a config file should be: check-config waited for a writer for good
/// (a FIFO) or read until memory ran out (`/dev/zero`).
#[test]
fn special_files_are_refused_instead_of_waited_on_or_read() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("main.yaml");
    let yaml = "proxy_address_http: \"127.0.0.1:6193\"\nupstreams_conf: \"upstreams.yaml\"\n";
    std::fs::write(&main, yaml).unwrap();
    let upstreams = dir.path().join("upstreams.yaml");
    let fifo = || nix::unistd::mkfifo(&upstreams, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let device = || std::os::unix::fs::symlink("/dev/zero", &upstreams).unwrap();
    for (what, make) in [("a FIFO", &fifo as &dyn Fn()), ("/dev/zero", &device)] {
        let _ = std::fs::remove_file(&upstreams);
        make();
        let (out, json) = check_json(&main);
        assert!(!out.timed_out, "{what}: check-config never ended");
        assert_eq!(out.code, Some(1), "{what}: {}", out.stdout);
        let issues = json["issues"].as_array().cloned().unwrap_or_default();
        let refused = issues.iter().any(|i| {
            i["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("/upstreams.yaml"))
                && i["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not a regular file"))
        });
        assert!(refused, "{what}:\n{}", describe(&issues));
    }
}

#[test]
fn broken_configs_never_panic_and_the_proxy_refuses_to_start() {
    let mut failures = Vec::new();
    for case in cases().iter().filter(|c| c.exit == 1) {
        let (_dir, main) = case.write();
        for format in ["text", "json"] {
            let out = check_config(&main, &["--format", format]);
            if out.code != Some(1) || out.stderr.contains("panicked") {
                failures.push(format!(
                    "[{}] check-config --format {format}: exit {:?}\n{}",
                    case.name, out.code, out.stderr
                ));
            }
        }
        let t = run(
            &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
            Duration::from_secs(30),
        );
        if t.code != Some(1) || t.stderr.contains("panicked") {
            failures.push(format!(
                "[{}] -t: exit {:?}\n{}",
                case.name, t.code, t.stderr
            ));
        }
        let proxy = run(&["-c".as_ref(), main.as_os_str()], Duration::from_secs(10));
        if proxy.timed_out {
            failures.push(format!(
                "[{}] the proxy started on a broken config (killed after {:?})",
                case.name, proxy.elapsed
            ));
            continue;
        }
        if proxy.code != Some(1) || proxy.stderr.contains("panicked") {
            failures.push(format!(
                "[{}] proxy: exit {:?} (expected 1)\n{}",
                case.name, proxy.code, proxy.stderr
            ));
            continue;
        }
        for want in case.issues.iter().filter(|e| e.sev == Sev::Error) {
            let place = format!("{}:{}:", want.file, want.line);
            if !proxy.stderr.contains(&place) || !proxy.stderr.contains("error:") {
                failures.push(format!(
                    "[{}] proxy stderr does not name {place}:\n{}",
                    case.name, proxy.stderr
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn warnings_pass_unless_denied() {
    for case in cases().iter().filter(|c| c.exit == 0) {
        let (_dir, main) = case.write();
        let out = check_config(&main, &["--format", "json"]);
        assert_eq!(out.code, Some(0), "[{}] {}", case.name, out.stdout);
        let out = check_config(&main, &["--format", "json", "--deny-warnings"]);
        assert_eq!(
            out.code,
            Some(1),
            "[{}] --deny-warnings: {}",
            case.name,
            out.stdout
        );
        let t = run(
            &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
            Duration::from_secs(30),
        );
        assert_eq!(t.code, Some(0), "[{}] -t: {}", case.name, t.stdout);
    }
}

/// Writes a valid config (with optional conf.d files) and checks it: 0 errors, 0 warnings.
fn assert_valid(upstreams: &str, conf_d: &[(&'static str, &str)], shape: Value) -> Value {
    let mut case = Case::broken("valid", MAIN_OK, upstreams, Vec::new());
    for (name, text) in conf_d {
        case = case.with_conf_d(name, text);
    }
    let (_dir, main) = case.write();
    let (out, json) = check_json(&main);
    let issues = json["issues"].as_array().cloned().unwrap_or_default();
    assert_eq!(out.code, Some(0), "{}", describe(&issues));
    assert_eq!(json["ok"], true);
    assert_eq!(json["errors"], 0, "{}", describe(&issues));
    assert_eq!(json["warnings"], 0, "{}", describe(&issues));
    assert_eq!(json["shape"], shape);
    json
}

#[test]
fn current_shape_loads_cleanly() {
    let ups = r#"
provider: file
sticky_sessions: 3600
to_https: false
rate_limit: 1000
server_headers: ["X-Proxy:aralez"]
client_headers: ["Server:aralez"]
upstreams:
  DEFAULT:
    paths:
      "/": { servers: ["127.0.0.1:9000"] }
  Example.com:
    rate_limit: 100
    paths:
      "/":
        servers: ["127.0.0.1:8000", "backend.local:8001", "[::1]:8002", "h2c://127.0.0.1:8003"]
        healthcheck: false
      "/api":
        servers: ["https://10.0.0.5:9443"]
        rate_limit: 20
        x4xx_limit: 10
        authorization: { type: jwt, data: "secret" }
        server_headers: ["X-From:aralez"]
        client_headers: ["X-Frame-Options:DENY"]
      "/login":
        servers: ["127.0.0.1:8000"]
        authorization: { type: forward, data: "http://auth.local/check" }
      "/old":
        redirect_to: "https://www.example.com"
"#;
    let json = assert_valid(
        ups,
        &[(
            "extra.yaml",
            "b.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8010\"]}\n",
        )],
        Value::from("upstreams"),
    );
    let files: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files[2].ends_with("conf.d/extra.yaml"), "{files:?}");
}

#[test]
fn older_readme_shape_loads_cleanly() {
    let ups = r#"
provider: "file"
sticky_sessions: false
to_https: false
headers:
  - "Access-Control-Allow-Origin:*"
authorization:
  type: basic
  creds: "user:pass"
myip.mydomain.com:
  paths:
    "/":
      to_https: false
      headers: ["X-Some-Thing:Yaaaaaaaaaaaaaaa"]
      servers:
        - "127.0.0.1:8000"
        - "127.0.0.2:8000"
    "/foo":
      servers: ["127.0.0.4:8443"]
polo.mydomain.com:
  paths:
    "/":
      authorization: { type: apikey, creds: "5ecbf799" }
      servers: ["192.168.1.1:8000"]
"#;
    // Valid; its one warning says that polo's own apikey applies there, where Aralez let the
    // global basic auth override it.
    let case = Case::broken("older", MAIN_OK, ups, Vec::new());
    let (_dir, main) = case.write();
    let (out, json) = check_json(&main);
    let issues = json["issues"].as_array().cloned().unwrap_or_default();
    assert_eq!(out.code, Some(0), "{}", describe(&issues));
    assert_eq!(
        (json["errors"].clone(), json["warnings"].clone()),
        (Value::from(0), Value::from(1)),
        "{}",
        describe(&issues)
    );
    assert!(
        describe(&issues).contains("polo.mydomain.com.paths./.authorization"),
        "{}",
        describe(&issues)
    );
    assert_eq!(json["shape"], Value::from("top-level"));
}

/// An empty upstreams file is valid (a proxy may start with no route yet), with a warning: it
/// may be a template that rendered nothing.
#[test]
fn empty_upstreams_file_is_valid() {
    for text in ["", "\n\n", "# nothing configured yet\n"] {
        let case = Case::broken("empty", MAIN_OK, text, Vec::new());
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        assert_eq!(out.code, Some(0), "{text:?}: {}", out.stdout);
        assert_eq!(json["errors"], 0, "{text:?}");
        assert_eq!(json["warnings"], 1, "{text:?}");
        assert!(out.stdout.contains("the file is empty"), "{}", out.stdout);
    }
}

#[test]
fn dash_t_agrees_with_check_config() {
    let good = Case::broken("good", MAIN_OK, UPS_OK, Vec::new());
    let (_dir, main) = good.write();
    let out = run(
        &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("0 error(s), 0 warning(s)"),
        "{}",
        out.stdout
    );

    let bad = Case::path("bad", "        servers: [\"127.0.0.1:0\"]\n", Vec::new());
    let (_dir2, main) = bad.write();
    let out = run(
        &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("upstreams.yaml:5:"), "{}", out.stdout);
}

#[test]
fn text_format_names_file_line_and_column() {
    let case = Case::path(
        "text",
        "        servers: [\"127.0.0.1:70000\"]\n        rate_limt: 3\n",
        Vec::new(),
    );
    let (_dir, main) = case.write();
    let out = check_config(&main, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    let ups = main.with_file_name("upstreams.yaml");
    let error_line = format!(
        "{}:5:19: error: `upstreams.a.com.paths./.servers[0]`: `127.0.0.1:70000`: port 70000 is out of range",
        ups.display()
    );
    assert!(out.stdout.contains(&error_line), "{}", out.stdout);
    let warning_line = format!(
        "{}:6:9: warning: `upstreams.a.com.paths./.rate_limt`: unknown key `rate_limt`, did you mean `rate_limit`?",
        ups.display()
    );
    assert!(out.stdout.contains(&warning_line), "{}", out.stdout);
    let summary = out.stdout.lines().last().unwrap_or("");
    assert!(summary.starts_with("checked "), "{summary}");
    assert!(
        summary.contains("1 error(s), 1 warning(s); upstreams shape:"),
        "{summary}"
    );
}

/// A broken conf.d file leaves the shape upstreams.yaml was read in said (it was "not
/// determined", as SPEC §3.1 has check-config note the shape).
#[test]
fn the_shape_is_said_beside_a_broken_conf_d_file() {
    let case = Case::broken("shape", MAIN_OK, UPS_OK, Vec::new())
        .with_conf_d("10-b.yaml", "b.com:\n  paths: {\"/\": {servers: []}}\n");
    let (_dir, main) = case.write();
    let out = check_config(&main, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    let summary = out.stdout.lines().last().unwrap_or("");
    assert!(
        summary.ends_with("upstreams shape: routes under `upstreams:` (Aralez v0.92 shape)"),
        "{}",
        out.stdout
    );
}

/// Guards the start check above: on a valid config the proxy does start, and `run` sees it running.
#[test]
fn the_proxy_starts_on_a_valid_config() {
    let case = Case::broken("valid", MAIN_OK, UPS_OK, Vec::new());
    let (dir, main) = case.write();
    let d = dir.path().display();
    let text =
        format!("{MAIN_OK}pid_file: \"{d}/aralez.pid\"\nupgrade_sock: \"{d}/aralez.sock\"\n");
    std::fs::write(&main, text).unwrap();
    let out = run(&["-c".as_ref(), main.as_os_str()], Duration::from_secs(2));
    assert!(
        out.timed_out,
        "the proxy exited {:?} on a valid config:\n{}{}",
        out.code, out.stdout, out.stderr
    );
}

/// The certificates main.yaml names are loaded as the start loads them: a pair the certificate
/// directory would skip (a key of another certificate, a `.crt` that is not PEM) is a warning at
/// `proxy_certificates`, an admin API pair that does not load (the start fails on it) an error
/// at `config_tls_certificate`. Both passed with no issue.
#[test]
fn certificates_are_checked_as_the_start_loads_them() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let pair = |name: &str| rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
    let (one, two) = (pair("a.test"), pair("b.test"));
    let (one_key, two_key) = (
        one.signing_key.serialize_pem(),
        two.signing_key.serialize_pem(),
    );
    let write = |path: std::path::PathBuf, text: &str| std::fs::write(path, text).unwrap();
    write(certs.join("good.crt"), &one.cert.pem());
    write(certs.join("good.key"), &one_key);
    write(certs.join("mismatch.crt"), &one.cert.pem());
    write(certs.join("mismatch.key"), &two_key);
    write(certs.join("garbage.crt"), "not a certificate\n");
    write(certs.join("garbage.key"), &two_key);
    write(dir.path().join("admin.crt"), &two.cert.pem());
    write(dir.path().join("admin.key"), &one_key);
    write(dir.path().join("upstreams.yaml"), UPS_OK);
    let d = dir.path().display();
    let main = format!(
        "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
         proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{d}/certs\"\n\
         config_tls_address: \"127.0.0.1:0\"\nconfig_tls_certificate: \"{d}/admin.crt\"\n\
         config_tls_key_file: \"{d}/admin.key\"\nmaster_key: \"0123456789abcdef\"\n"
    );
    write(dir.path().join("main.yaml"), &main);
    let (out, json) = check_json(&dir.path().join("main.yaml"));
    let issues = json["issues"].as_array().cloned().unwrap_or_default();
    let listed = describe(&issues);
    assert_eq!(out.code, Some(1), "{listed}");
    // The two pairs the start would skip are said each, and are an error together (the check
    // passed on them: their names would get another certificate).
    assert_eq!(
        (json["errors"].as_u64(), json["warnings"].as_u64()),
        (Some(2), Some(2)),
        "{listed}"
    );
    assert!(
        issue_says(
            &issues,
            "proxy_certificates",
            "do not load (said above): garbage, mismatch"
        ),
        "{listed}"
    );
    let found = |key: &str, line: u64, text: &str| {
        issues.iter().any(|i| {
            i["key"] == key
                && i["line"] == line
                && i["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    assert!(
        found("config_tls_certificate", 6, "does not match"),
        "{listed}"
    );
    assert!(found("proxy_certificates", 4, "mismatch"), "{listed}");
    assert!(found("proxy_certificates", 4, "garbage"), "{listed}");

    // An error elsewhere in main.yaml hides the folder's pairs no longer (they came out only
    // once it was mended, one CI run later). The admin API's pair waits for a valid file: its
    // files' own problems are said with the file's.
    let bad_port = main.replace("tls: \"127.0.0.1:0\"", "tls: \"127.0.0.1:99999\"");
    let broken = [
        (format!("{main}hc_interval: 0\n"), "hc_interval"),
        (bad_port, "proxy_address_tls"),
    ];
    for (text, key) in broken {
        write(dir.path().join("main.yaml"), &text);
        let (out, json) = check_json(&dir.path().join("main.yaml"));
        let issues = json["issues"].as_array().cloned().unwrap_or_default();
        let listed = describe(&issues);
        assert_eq!(out.code, Some(1), "{listed}");
        assert_eq!(
            (json["errors"].as_u64(), json["warnings"].as_u64()),
            (Some(2), Some(2)),
            "{key}: {listed}"
        );
        assert!(issues.iter().any(|i| i["key"] == key), "{listed}");
        assert!(
            issue_says(&issues, "proxy_certificates", "garbage, mismatch"),
            "{key}: {listed}"
        );
    }
}

/// Whether an issue at `key` says `text`.
fn issue_says(issues: &[serde_json::Value], key: &str, text: &str) -> bool {
    issues
        .iter()
        .any(|i| i["key"] == key && i["message"].as_str().is_some_and(|m| m.contains(text)))
}

/// A report that cannot be written (a full disk, a pipe closed by `head`) is an error exit with
/// a line saying so, not a panic (exit 134).
#[test]
fn a_report_that_cannot_be_written_is_an_error_not_a_panic() {
    let case = Case::broken("good", MAIN_OK, UPS_OK, Vec::new());
    let (_dir, main) = case.write();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(BIN)
        .args(["check-config".as_ref(), "-c".as_ref(), main.as_os_str()])
        .stdout(full)
        .output()
        .expect("run aralez");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write the report"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
