//! Files a start writes that this user cannot: `-t` and check-config said 0 errors and the start
//! then failed (`cannot write the pid file ... Permission denied`). A warning now, as the check
//! may run as another user than the service (in CI); `nginx -t` fails on such a log too.

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
