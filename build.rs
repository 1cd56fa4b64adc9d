//! Build script: records the git commit the binary is built from, for `aralez --version` and the
//! `aralez_build_info` metric ("unknown" outside this project's own checkout, e.g. in a container
//! build or a source archive unpacked inside some other repository).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git args`' trimmed output, when git runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let same = |a: &Path, b: &Path| a.canonicalize().ok() == b.canonicalize().ok();
    let ours = match (git(&["rev-parse", "--show-toplevel"]), &manifest) {
        (Some(top), Some(manifest)) => same(Path::new(&top), manifest),
        _ => false,
    };
    let commit = ours
        .then(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .flatten()
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ARALEZ_COMMIT={commit}");
    if !ours {
        return;
    }
    // What moves when a commit is made or checked out: HEAD, the branch it names (loose or
    // packed), and the index. Only files that exist are watched (a missing one would rerun this
    // script on every build). `--git-path` finds them in worktrees too.
    let mut watched = vec![
        "HEAD".to_string(),
        "index".to_string(),
        "packed-refs".to_string(),
    ];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
