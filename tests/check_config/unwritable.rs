//! Files a start writes that this user cannot: `-t` and check-config said 0 errors and the start
//! then failed (`cannot write the pid file ... Permission denied`). A warning when the check runs
//! as another user than root, as it may run as another user than the service (in CI); an error
//! as root, who starts a service; `nginx -t` fails on such a log too.

use super::*;

/// check-config as a user who cannot write `dir` (`nobody` through setpriv when the tests run as
/// root, who can write anywhere; this user otherwise).
fn check_as_unprivileged(main: &Path) -> std::process::Output {
    let root = nix::unistd::geteuid().is_root();
    let mut command = match root {
        true => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
            c
        }
        false => Command::new(BIN),
    };
    command
        .args(["check-config".as_ref(), "-c".as_ref(), main.as_os_str()])
        .output()
        .expect("run check-config")
}

#[test]
fn a_pid_file_and_log_this_user_cannot_write_are_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let case = Case::broken("good", MAIN_OK, UPS_OK, Vec::new());
    let (dir, main) = case.write();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("taken.log"), "").unwrap();
    let mut text = std::fs::read_to_string(&main).unwrap();
    text.push_str(&format!(
        "pid_file: \"{0}/aralez.pid\"\nlog_file: \"{0}/taken.log\"\n",
        locked.display()
    ));
    std::fs::write(&main, text).unwrap();
    // Readable by everyone, writable by none but root.
    let open = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(dir.path(), open.clone()).unwrap();
    for file in [main.clone(), dir.path().join("upstreams.yaml")] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(
        locked.join("taken.log"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let out = check_as_unprivileged(&main);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "a warning: {stdout}");
    for file in ["aralez.pid", "taken.log"] {
        let said = format!("{file}` cannot be written by this user");
        assert!(stdout.contains(&said), "{file}: {stdout}");
    }
    std::fs::set_permissions(&locked, open).unwrap();
}

/// As root, the user a service starts as, a file root cannot write is certain to fail the
/// start: an error (exit 1), where it was a warning and `-t` passed (an immutable log file, a
/// read-only mount). A pid file or log under /proc or /sys can never be made: an error for
/// anyone (it was no finding at all).
#[test]
fn files_no_start_can_write_are_errors() {
    let case = Case::broken("good", MAIN_OK, UPS_OK, Vec::new());
    let (dir, main) = case.write();
    let base = std::fs::read_to_string(&main).unwrap();
    let check = |extra: &str| {
        std::fs::write(&main, format!("{base}{extra}")).unwrap();
        let out = Command::new(BIN)
            .args(["check-config".as_ref(), "-c".as_ref(), main.as_os_str()])
            .output()
            .expect("run check-config");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), stdout)
    };
    let (code, said) = check("pid_file: \"/sys/aralez-check.pid\"\n");
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is a kernel file system"), "{said}");
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED files_no_start_can_write_are_errors (immutable file): needs root");
        return;
    }
    let log = dir.path().join("frozen.log");
    std::fs::write(&log, "").unwrap();
    let frozen = Command::new("chattr").arg("+i").arg(&log).status();
    if !frozen.is_ok_and(|s| s.success()) {
        println!(
            "SKIPPED files_no_start_can_write_are_errors (immutable file): chattr +i refused here"
        );
        return;
    }
    let (code, said) = check(&format!("log_file: \"{}\"\n", log.display()));
    let _ = Command::new("chattr").arg("-i").arg(&log).status();
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("frozen.log` cannot be written by this user"),
        "{said}"
    );
}
