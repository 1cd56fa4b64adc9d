//! External judges against the real binary's TLS listener: tools written by others decide whether
//! the TLS and HTTP/2 setup is right, so our own idea of "right" is not the only one checked.
//!
//! - sslyze `--mozilla_config=intermediate` must call both the `medium` and the `high` grade
//!   compliant (the JSON report is also read: versions and suites per grade, every scan completed);
//! - testssl.sh against `high` must report nothing HIGH or CRITICAL, except the ids in
//!   [`TESTSSL_ALLOWED`], each there because of the test certificate, not the proxy;
//! - h2spec (all 145 default cases) over TLS must pass at least [`H2SPEC_MIN_PASSED`], and a failed
//!   case must be one of the timing-dependent ones ([`h2spec_timing_dependent`]); every failed case
//!   is printed by id and name.
//!
//! The tools come from `scripts/install-judges.sh` (which `scripts/test.sh` runs) and are found
//! through `ARALEZ_SSLYZE`, `ARALEZ_TESTSSL`, `ARALEZ_H2SPEC`, then `target/judges/`, then PATH
//! (see `support::tools`).
//! A missing tool fails the test when `ARALEZ_REQUIRE_JUDGES=1`, and is reported as skipped
//! otherwise. The judges run one at a time (a lock), so a slow scan never starves another.

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::tools::{find, run, Run, Tool};
use support::*;

/// h2spec cases that must pass, of the 145 it runs by default, as the issue asks (hyper's own h2
/// server passes 143). The proxy usually passes all 145; what it may lose is in
/// [`h2spec_timing_dependent`], and a failure anywhere else fails the test whatever the count.
const H2SPEC_MIN_PASSED: usize = 143;

/// One race, two families of cases. h2spec opens a request with a body, then sends a frame
/// that breaks it: a frame after its own RST_STREAM ("closed: Sends a ... frame after sending
/// RST_STREAM frame"), or a malformed end of the body (trailers without END_STREAM, a pseudo-header
/// in trailers, a body that does not add up to its `content-length`). When the backend's answer
/// to the request is on the wire before the proxy reads that frame (the proxy answers in well
/// under a millisecond, the test backend does not wait for request bodies, and h2spec writes its
/// frames one by one), h2spec reads the answer first and fails the case, although RFC 9113 §8.1
/// lets a server answer before the request is complete. Only a failure whose frame read instead
/// of the error is that answer (a DATA frame ending stream 1) counts as the race. Seen in about
/// one full run in ten, more often since plain backends are spoken to from the request's own task
/// (`upstream::inline`, faster); under two busy loops 3 in 15 runs of h2spec alone.
fn h2spec_timing_dependent(case: &Case) -> bool {
    let answered_first = matches!(&case.outcome, Outcome::Failed(actual)
        if actual.trim_end().ends_with("DATA Frame (length:0, flags:0x01, stream_id:1)"));
    let after_reset =
        case.id.starts_with("http2/5.1/") && case.name.contains("after sending RST_STREAM frame");
    let malformed_body_end = matches!(
        case.id.as_str(),
        "http2/8.1/1" | "http2/8.1.2.1/3" | "http2/8.1.2.6/1" | "http2/8.1.2.6/2"
    );
    answered_first && (after_reset || malformed_body_end)
}

/// testssl.sh ids allowed at HIGH or CRITICAL, each due to the test certificate, not the proxy.
/// Trust findings (`cert_chain_of_trust`, `cert_trust`) are not here: the test CA is given to
/// testssl.sh with `--add-ca` and the leaf names 127.0.0.1, so those must come out OK.
const TESTSSL_ALLOWED: &[(&str, &str)] = &[(
    // "Neither CRL nor OCSP URI provided" (HIGH): the test CA runs no CRL or OCSP service, so
    // its leaf names none; a public CA's certificate carries them. Nothing the proxy serves.
    "cert_revocation",
    "the test certificate names no CRL or OCSP URI",
)];

// ---- The tools ----

const SSLYZE: Tool = Tool {
    env: "ARALEZ_SSLYZE",
    installed: "target/judges/venv/bin/sslyze",
    on_path: &["sslyze"],
};
const TESTSSL: Tool = Tool {
    env: "ARALEZ_TESTSSL",
    installed: "/usr/bin/testssl", // Debian's package
    on_path: &["testssl", "testssl.sh"],
};
const H2SPEC: Tool = Tool {
    env: "ARALEZ_H2SPEC",
    installed: "target/judges/bin/h2spec",
    on_path: &["h2spec"],
};

// ---- The proxy and its certificate ----

/// The proxy with a TLS listener on a certificate signed by a test CA, and a backend behind "/".
struct Target {
    _proxy: ProxyProcess,
    _backend: Backend,
    _certs: tempfile::TempDir,
    tls: SocketAddr,
    /// The test CA, PEM, for the tools that accept one; outside the certificate directory.
    ca_file: PathBuf,
    work: tempfile::TempDir,
}

async fn start(grade: &str) -> Target {
    let backend = Backend::start("a").await;
    let certs = tempfile::tempdir().expect("cert dir");
    let work = tempfile::tempdir().expect("work dir");
    let ca_file = work.path().join("test-ca.pem");
    write_ca_signed_pair(certs.path(), &ca_file);
    let (proxy, tls) = start_tls_proxy(&backend, certs.path(), grade);
    Target {
        _proxy: proxy,
        _backend: backend,
        _certs: certs,
        tls,
        ca_file,
        work,
    }
}

/// Writes a test CA (PEM, to `ca_file`) and `default.crt`/`default.key` in `dir`: an ECDSA P-256
/// leaf for `localhost` and 127.0.0.1, valid 90 days, signed by that CA (served alone, as a
/// public CA's leaf would be with its intermediates: the root is the client's to have).
fn write_ca_signed_pair(dir: &Path, ca_file: &Path) {
    let pki = test_pki(&["localhost", "127.0.0.1"]);
    std::fs::write(dir.join("default.crt"), &pki.leaf_pem).expect("write default.crt");
    std::fs::write(dir.join("default.key"), &pki.leaf_key_pem).expect("write key");
    std::fs::write(ca_file, &pki.ca_pem).expect("write CA file");
}

fn read_json(path: &Path, run: &Run) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e}); stdout:\n{}\nstderr:\n{}",
            path.display(),
            run.stdout,
            run.stderr
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

// ---- sslyze ----

/// sslyze's verdict on `grade` against Mozilla's intermediate profile, and its JSON report.
async fn sslyze(grade: &str) -> Option<(Run, Value, SocketAddr)> {
    let program = find(&SSLYZE)?;
    let t = start(grade).await;
    let report = t.work.path().join("sslyze.json");
    let args = vec![
        "--mozilla_config=intermediate".to_string(),
        format!("--certinfo_ca_file={}", t.ca_file.display()),
        format!("--json_out={}", report.display()),
        t.tls.to_string(),
    ];
    let run = run(
        program,
        args,
        t.work.path().into(),
        Duration::from_secs(180),
    )
    .await;
    let json = read_json(&report, &run);
    eprintln!("sslyze on grade {grade}: took {:.1?}", run.took);
    Some((run, json, t.tls))
}

/// Asserts sslyze's own verdict: exit 0 and "OK - Compliant." (else its reasons are shown).
fn assert_compliant(grade: &str, run: &Run, addr: SocketAddr) {
    let checked = run
        .stdout
        .contains("Checking results against Mozilla's \"intermediate\" configuration");
    let compliant = run.stdout.contains(&format!("{addr}: OK - Compliant."));
    if checked && compliant && run.code == Some(0) {
        return;
    }
    let reasons: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| !l.contains("COMPLIANCE AGAINST TLS CONFIGURATION"))
        .collect();
    panic!(
        "sslyze: grade {grade} is not compliant with Mozilla intermediate (exit {:?}):\n{}\nstderr:\n{}",
        run.code,
        reasons.join("\n"),
        run.stderr
    );
}

/// The TLS versions sslyze saw accepted, and the suites accepted per version.
fn accepted(scan: &Value) -> Vec<(&'static str, Vec<String>)> {
    let versions = [
        ("SSLv2", "ssl_2_0_cipher_suites"),
        ("SSLv3", "ssl_3_0_cipher_suites"),
        ("TLSv1.0", "tls_1_0_cipher_suites"),
        ("TLSv1.1", "tls_1_1_cipher_suites"),
        ("TLSv1.2", "tls_1_2_cipher_suites"),
        ("TLSv1.3", "tls_1_3_cipher_suites"),
    ];
    let mut out = Vec::new();
    for (version, key) in versions {
        let result = &scan[key]["result"];
        if result["is_tls_version_supported"] != Value::Bool(true) {
            continue;
        }
        let suites = result["accepted_cipher_suites"].as_array();
        let names = suites.into_iter().flatten().map(|s| {
            s["cipher_suite"]["name"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        });
        out.push((version, names.collect()));
    }
    out
}

/// Checks the JSON report: every scheduled scan completed, only TLS 1.2 and 1.3 accepted, and the
/// TLS 1.2 suites are the grade's (SPEC 7.2).
fn assert_report(grade: &str, json: &Value) {
    let server = &json["server_scan_results"][0];
    assert_eq!(server["scan_status"], "COMPLETED", "sslyze: {server:#}");
    let scan = &server["scan_result"];
    for (name, attempt) in scan.as_object().expect("scan_result object") {
        let status = attempt["status"].as_str().unwrap_or("?");
        assert!(
            status == "COMPLETED" || status == "NOT_SCHEDULED",
            "sslyze scan {name} on grade {grade}: {status}: {}",
            attempt["error_reason"]
        );
    }
    let accepted = accepted(scan);
    eprintln!("sslyze on grade {grade}: accepted {accepted:?}");
    let versions: Vec<&str> = accepted.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, ["TLSv1.2", "TLSv1.3"], "grade {grade}");
    let tls12 = &accepted[0].1;
    let strong =
        |s: &String| s.contains("ECDHE") && (s.contains("AES_256_GCM") || s.contains("CHACHA20"));
    match grade {
        "high" => assert!(tls12.iter().all(strong), "high offers {tls12:?}"),
        _ => assert!(
            tls12.iter().any(|s| s.contains("AES_128_GCM")),
            "medium offers {tls12:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslyze_calls_grade_medium_mozilla_intermediate_compliant() {
    let Some((run, json, addr)) = sslyze("medium").await else {
        return;
    };
    assert_compliant("medium", &run, addr);
    assert_report("medium", &json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslyze_calls_grade_high_mozilla_intermediate_compliant() {
    let Some((run, json, addr)) = sslyze("high").await else {
        return;
    };
    assert_compliant("high", &run, addr);
    assert_report("high", &json);
}

// ---- testssl.sh ----

/// testssl.sh's default run (protocols, ciphers, forward secrecy, server defaults, headers,
/// vulnerabilities, client simulation) against `grade`; its flat JSON findings.
async fn testssl(grade: &str) -> Option<(Run, Vec<Value>)> {
    let program = find(&TESTSSL)?;
    let t = start(grade).await;
    let report = t.work.path().join("testssl.json");
    // No DNS at all (the target is an IP), and bounded waits so a hang fails instead of stalling.
    let fixed =
        "--quiet --color 0 --warnings off --nodns none --connect-timeout 10 --openssl-timeout 10";
    let mut args: Vec<String> = fixed.split(' ').map(String::from).collect();
    args.extend([
        format!("--add-ca={}", t.ca_file.display()),
        format!("--jsonfile={}", report.display()),
        t.tls.to_string(),
    ]);
    let limit = Duration::from_secs(300);
    let run = run(program, args, t.work.path().into(), limit).await;
    eprintln!("testssl.sh on grade {grade}: took {:.1?}", run.took);
    let findings = read_json(&report, &run).as_array().cloned();
    let findings = findings.expect("testssl.sh JSON is an array of findings");
    Some((run, findings))
}

/// Fails on any HIGH or CRITICAL finding not in [`TESTSSL_ALLOWED`], and on FATAL (a broken
/// scan); prints every finding above OK/INFO either way.
fn assert_no_serious_findings(grade: &str, run: &Run, findings: &[Value]) {
    let text = |f: &Value, key: &str| f[key].as_str().unwrap_or("").to_string();
    let offered = findings
        .iter()
        .any(|f| text(f, "id") == "TLS1_3" && text(f, "finding").starts_with("offered"));
    assert!(
        offered,
        "testssl.sh did not see TLS 1.3 offered: no real scan?\n{}",
        run.stdout
    );
    let mut failing = Vec::new();
    for f in findings {
        let (id, severity) = (text(f, "id"), text(f, "severity"));
        if matches!(severity.as_str(), "OK" | "INFO" | "DEBUG") {
            continue;
        }
        let allowed = TESTSSL_ALLOWED.iter().find(|(a, _)| *a == id);
        let line = format!("{severity} {id}: {}", text(f, "finding"));
        match (severity.as_str(), allowed) {
            ("HIGH" | "CRITICAL", Some((_, why))) => {
                eprintln!("testssl.sh: allowed {line} ({why})")
            }
            ("HIGH" | "CRITICAL" | "FATAL", None) => failing.push(line),
            _ => eprintln!("testssl.sh: {line}"),
        }
    }
    assert!(
        failing.is_empty(),
        "testssl.sh on grade {grade}: findings at HIGH/CRITICAL (or FATAL):\n  {}",
        failing.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testssl_finds_nothing_high_or_critical_on_grade_high() {
    let Some((run, findings)) = testssl("high").await else {
        return;
    };
    assert_no_serious_findings("high", &run, &findings);
}

// ---- h2spec ----

/// One h2spec case from its JUnit report: `http2/5.1/3`-style id, its description, and the
/// failure text if it failed (`skipped` cases are neither passed nor failed).
struct Case {
    id: String,
    name: String,
    outcome: Outcome,
}

#[derive(PartialEq)]
enum Outcome {
    Passed,
    Skipped,
    Failed(String),
}

/// The cases of h2spec's JUnit report, in order; ids number each section's cases from 1, as
/// h2spec's own console output does (`http2/3.5/2` is "3.5. ... 2: Sends invalid ...").
fn parse_junit(xml: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for chunk in xml.split("<testcase ").skip(1) {
        let end = chunk.find("</testcase>").unwrap_or(chunk.len());
        let (head, body) = chunk[..end].split_once('>').unwrap_or((&chunk[..end], ""));
        let section = attribute(head, "package");
        let n = 1 + cases
            .iter()
            .filter(|c| c.id.rsplit_once('/').map(|p| p.0) == Some(&section))
            .count();
        let outcome = if body.contains("<failure") || body.contains("<error") {
            Outcome::Failed(unescape(&strip_tags(body)))
        } else if body.contains("<skipped") {
            Outcome::Skipped
        } else {
            Outcome::Passed
        };
        cases.push(Case {
            id: format!("{section}/{n}"),
            name: attribute(head, "classname"),
            outcome,
        });
    }
    cases
}

fn attribute(head: &str, name: &str) -> String {
    let value = head.split(&format!("{name}=\"")).nth(1).unwrap_or("");
    unescape(value.split('"').next().unwrap_or(""))
}

fn strip_tags(body: &str) -> String {
    let mut out = String::new();
    for part in body.split('<') {
        out.push_str(part.split_once('>').map_or(part, |(_, text)| text));
    }
    out.trim().replace('\n', " / ")
}

fn unescape(text: &str) -> String {
    [
        ("&#34;", "\""),
        ("&#39;", "'"),
        ("&quot;", "\""),
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&#xA;", "\n"),
        ("&#x9;", "\t"),
        ("&amp;", "&"),
    ]
    .iter()
    .fold(text.to_string(), |t, (from, to)| t.replace(from, to))
}

/// Runs h2spec over TLS against the proxy (grade `high`, a backend behind "/"); its cases.
async fn h2spec() -> Option<(Run, Vec<Case>)> {
    let program = find(&H2SPEC)?;
    let t = start("high").await;
    let report = t.work.path().join("h2spec.xml");
    let port = t.tls.port().to_string();
    let path = report.display().to_string();
    // A 1,000-byte answer (the backend's /big/), so the flow-control cases have data to hold
    // back; with a 1-byte body h2spec skips 6.9.2/2.
    let fixed = "-h 127.0.0.1 -P /big/1000 -t -k";
    let mut args: Vec<String> = fixed.split(' ').map(String::from).collect();
    args.extend(["-p".into(), port, "-j".into(), path]);
    let limit = Duration::from_secs(120);
    let run = run(program, args, t.work.path().into(), limit).await;
    eprintln!("h2spec: took {:.1?}, exit {:?}", run.took, run.code);
    let xml = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "no h2spec report ({e}); stdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        )
    });
    Some((run, parse_junit(&xml)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_over_tls_failing_only_timing_dependent_cases() {
    let Some((run, cases)) = h2spec().await else {
        return;
    };
    let passed = cases
        .iter()
        .filter(|c| c.outcome == Outcome::Passed)
        .count();
    eprintln!("h2spec: {passed}/{} passed", cases.len());
    for case in &cases {
        match &case.outcome {
            Outcome::Failed(why) => {
                eprintln!("h2spec: FAILED {} \"{}\": {why}", case.id, case.name)
            }
            Outcome::Skipped => eprintln!("h2spec: skipped {} \"{}\"", case.id, case.name),
            Outcome::Passed => {}
        }
    }
    assert_eq!(cases.len(), 145, "h2spec ran a different set of cases");
    // The report as read here agrees with h2spec's own closing line.
    let summary = format!("145 tests, {passed} passed");
    assert!(
        run.stdout.contains(&summary),
        "not `{summary}`:\n{}",
        run.stdout
    );
    assert!(
        passed >= H2SPEC_MIN_PASSED,
        "h2spec: {passed}/{} passed, fewer than {H2SPEC_MIN_PASSED} (failures listed above)",
        cases.len()
    );
    let unexpected: Vec<&str> = cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Failed(_)) && !h2spec_timing_dependent(c))
        .map(|c| c.id.as_str())
        .collect();
    assert!(
        unexpected.is_empty(),
        "h2spec failures that no timing explains: {unexpected:?} (listed above)"
    );
}
