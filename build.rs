//! Build script: records the git commit the binary is built from, for `aralez --version` and the
//! `aralez_build_info` metric ("unknown" outside a git checkout, e.g. in a container build).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ARALEZ_COMMIT={commit}");
    for path in [".git/HEAD", ".git/index"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
