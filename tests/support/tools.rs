//! External tools the judges run: where to find them, and running one with a deadline.
//!
//! A tool is named by an env var (set by `scripts/test.sh` from `scripts/install-judges.sh`),
//! else found where the install script puts it, else on PATH. A missing tool fails the test when
//! `ARALEZ_REQUIRE_JUDGES=1`, and is reported as skipped otherwise. Judges run one at a time per
//! test binary (a lock), so a slow scan never starves another.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::eventually_blocking;

/// One judge at a time: they are timing-sensitive and the machine may have two cores.
pub static ONE_JUDGE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// An external tool: the env var that names it, where the install script puts it, its PATH names.
pub struct Tool {
    pub env: &'static str,
    pub installed: &'static str,
    pub on_path: &'static [&'static str],
}

/// The tool's path; `None` (after saying so) when it is missing and judges are optional.
pub fn find(tool: &Tool) -> Option<PathBuf> {
    let named = std::env::var_os(tool.env).map(PathBuf::from);
    let installed = Path::new(env!("CARGO_MANIFEST_DIR")).join(tool.installed);
    let on_path = tool.on_path.iter().find_map(|name| which(name));
    let found = named
        .into_iter()
        .chain([installed])
        .chain(on_path)
        .find(|p| p.is_file());
    if found.is_none() {
        skipped_unless_required(&format!(
            "{} not found (set {} or run `bash scripts/install-judges.sh`)",
            tool.on_path[0], tool.env
        ));
    }
    found
}

/// Something a test needs is missing (`why`): fails the test when `ARALEZ_REQUIRE_JUDGES=1`
/// (the test command), else says the test is skipped.
pub fn skipped_unless_required(why: &str) {
    assert!(
        std::env::var("ARALEZ_REQUIRE_JUDGES").as_deref() != Ok("1"),
        "ARALEZ_REQUIRE_JUDGES=1 and {why}"
    );
    eprintln!("SKIPPED: {why}");
}

/// Debian's chromium, run headless (tests/status_page.rs).
pub const CHROMIUM: Tool = Tool {
    env: "ARALEZ_CHROMIUM",
    installed: "/usr/bin/chromium", // Debian's package
    on_path: &["chromium", "chromium-browser"],
};

/// Chromium's path; `None` (after saying so) when it is missing and judges are optional.
pub fn chromium() -> Option<PathBuf> {
    find(&CHROMIUM)
}

/// The flags of one headless chromium run with a fresh profile in `profile`: no sandbox (the
/// tests may run as root), no GPU, no first-run or background services, and no name but
/// 127.0.0.1 resolves, so nothing leaves the machine and an external asset could not load.
pub fn headless_chromium_args(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-sync",
        "--metrics-recording-only",
        "--hide-scrollbars",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ]
    .iter()
    .map(|flag| flag.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// What a finished tool left: exit code, stdout and stderr, and how long it took.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

/// Runs `program args` in `dir` (one judge at a time), killing it after `limit`.
pub async fn run(program: PathBuf, args: Vec<String>, dir: PathBuf, limit: Duration) -> Run {
    tokio::task::spawn_blocking(move || {
        let _one = ONE_JUDGE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        run_blocking(&program, &args, &dir, limit)
    })
    .await
    .expect("judge thread")
}

pub fn run_blocking(program: &Path, args: &[String], dir: &Path, limit: Duration) -> Run {
    let (out, err) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let mut status = None;
    eventually_blocking(limit, || {
        status = child.try_wait().expect("wait for judge");
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{} {args:?} still running after {limit:?}; output so far:\n{}",
            program.display(),
            std::fs::read_to_string(&out).unwrap_or_default()
        );
    };
    Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
        took: started.elapsed(),
    }
}
