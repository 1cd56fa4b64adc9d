//! What main.yaml names must exist: checked when it is read, so `aralez -t`, `check-config` and
//! a start agree (as `nginx -t` opens the files it names). Certificate and key files, the
//! certificate directory, the file server's folder, Pingora's `ca_file`, the `runuser` and
//! `rungroup` accounts, and the directories of the files the process creates at start (the pid
//! file, the app log, the access log when it is on). The admin API's certificate and key, when
//! its TLS listener is on, must also hold what their keys say in PEM, as the start reads them
//! (whether the key suits the certificate is the start's to find). Each problem is an error at
//! the key that names the thing.

use std::path::{Path, PathBuf};

use super::reader::Reader;
use super::yaml::KeyPositions;

/// What main.yaml names, as read and resolved.
pub struct Named<'a> {
    /// The TLS listener is on (so the certificate directory is needed).
    pub tls: bool,
    pub certificates_dir: Option<&'a Path>,
    pub config_tls_certificate: Option<&'a Path>,
    pub config_tls_key_file: Option<&'a Path>,
    /// `config_tls_address` is set (so the two above are read at start).
    pub admin_tls: bool,
    pub file_server_folder: Option<&'a Path>,
    pub ca_file: Option<&'a Path>,
    pub runuser: Option<&'a str>,
    pub rungroup: Option<&'a str>,
    pub pid_file: &'a Path,
    pub upgrade_sock: &'a Path,
    pub log_file: Option<&'a Path>,
    /// `access_log_file`, when the access log is on (it is not opened otherwise).
    pub access_log_file: Option<&'a Path>,
    /// Whether `log_file` and `access_log_file` rotate themselves (a size is given).
    pub log_rotates: bool,
    pub access_log_rotates: bool,
    /// main.yaml and upstreams.yaml: no file the process writes may be one of them.
    pub config_files: [&'a Path; 2],
}

/// What kind of thing a path must be.
#[derive(Clone, Copy)]
enum Kind {
    File,
    Directory,
}

/// Checks everything main.yaml names; false if something is missing (each reported).
pub fn check(named: &Named<'_>, at: &KeyPositions<'_>, r: &mut Reader) -> bool {
    let mut ok = true;
    let mut path = |key: &str, path: Option<&Path>, kind: Kind| {
        if let (Some(path), Some(pos)) = (path, at.of(key)) {
            if let Some(problem) = problem(path, kind) {
                r.error(pos, key, format!("`{}` {problem}", path.display()));
                ok = false;
            }
        }
    };
    if named.tls {
        let key = if at.of("proxy_certificates").is_some() {
            "proxy_certificates"
        } else {
            "proxy_configs"
        };
        path(key, named.certificates_dir, Kind::Directory);
    }
    path(
        "config_tls_certificate",
        named.config_tls_certificate,
        Kind::File,
    );
    path("config_tls_key_file", named.config_tls_key_file, Kind::File);
    path(
        "file_server_folder",
        named.file_server_folder,
        Kind::Directory,
    );
    path("ca_file", named.ca_file, Kind::File);
    if named.admin_tls {
        ok &= admin_pem(named, at, r);
    }
    ok &= accounts(named, at, r);
    ok &= created_files(named, at, r);
    ok
}

/// The admin API's certificate file holds a PEM certificate, and its key file a PEM private key.
fn admin_pem(named: &Named<'_>, at: &KeyPositions<'_>, r: &mut Reader) -> bool {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut ok = true;
    let mut check = |key: &str, path: Option<&Path>, holds: fn(&[u8]) -> bool, what: &str| {
        let (Some(path), Some(pos)) = (path, at.of(key)) else {
            return;
        };
        // Unreadable is the start's to report, with the reason.
        let Ok(bytes) = super::file_bytes::read_regular(path, super::yaml::MAX_FILE_BYTES) else {
            return;
        };
        if !holds(&bytes) {
            r.error(
                pos,
                key,
                format!("`{}` holds no PEM {what}", path.display()),
            );
            ok = false;
        }
    };
    let certificate = |b: &[u8]| CertificateDer::pem_slice_iter(b).any(|c| c.is_ok());
    let private_key = |b: &[u8]| PrivateKeyDer::from_pem_slice(b).is_ok();
    check(
        "config_tls_certificate",
        named.config_tls_certificate,
        certificate,
        "certificate",
    );
    check(
        "config_tls_key_file",
        named.config_tls_key_file,
        private_key,
        "private key",
    );
    ok
}

/// The files a start creates (or appends to) must have a directory to go in, and must not be
/// directories themselves. Only where main.yaml names them: the defaults are in `/tmp`.
fn created_files(named: &Named<'_>, at: &KeyPositions<'_>, r: &mut Reader) -> bool {
    let mut ok = true;
    for (keys, path, rotates) in [
        (&["pid_file"][..], Some(named.pid_file), false),
        // `log_file` wins over `error_log` (main.yaml's reading).
        (
            &["log_file", "error_log"][..],
            named.log_file,
            named.log_rotates,
        ),
        (
            &["access_log_file"][..],
            named.access_log_file,
            named.access_log_rotates,
        ),
    ] {
        let Some(path) = path else {
            continue;
        };
        let Some((key, pos)) = at.first_of(keys) else {
            continue;
        };
        let problem = cannot_create(path)
            .or_else(|| overwrites_config(path, &named.config_files))
            .or_else(|| rotates.then(|| cannot_rotate(path)).flatten());
        if let Some(problem) = problem {
            r.error(pos, key, problem);
            ok = false;
        } else if let Some(problem) = not_writable(path) {
            // A warning: the check may run as another user than the service (in CI). As root
            // (the user a service starts as, before it drops privileges) it is certain: a file
            // root cannot write (a read-only mount, an immutable file) fails every start.
            if nix::unistd::geteuid().is_root() {
                r.error(pos, key, problem);
                ok = false;
            } else {
                r.warn(pos, key, problem);
            }
        }
    }
    let shared = named
        .log_file
        .zip(named.access_log_file)
        .filter(|(app, access)| same_file(app, access));
    if let (Some(_), Some(pos)) = (shared, at.of("access_log_file")) {
        if named.log_rotates || named.access_log_rotates {
            let why =
                "the same file as log_file, and one of them rotates it: each would rotate it \
                       on its own and one's lines would end up in a file the other deletes \
                       (leave access_log_file out: the access log then shares log_file)";
            r.error(pos, "access_log_file", why);
            ok = false;
        }
    }
    // The start goes on without it (a warning then too): only live upgrades need it.
    if let (Some(pos), Some(problem)) = (at.of("upgrade_sock"), cannot_create(named.upgrade_sock)) {
        r.warn(
            pos,
            "upgrade_sock",
            format!("{problem}: live upgrades (`aralez -u`) will not be possible"),
        );
    }
    ok
}

/// Rotation renames the file and opens a new one at its path: a symbolic link, a device or a
/// FIFO there (`/dev/stdout`, a link to `/dev/null`) would be renamed away and replaced.
fn cannot_rotate(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    (!meta.file_type().is_file()).then(|| {
        format!(
            "{} is not a regular file, and rotation (a size given) would rename it away: \
             give no size, or a file of its own",
            path.display()
        )
    })
}

/// Whether two paths name one file: the same text, or (both existing) the same inode.
/// Whether two paths are one file: the same inode when both exist; otherwise the same name in
/// the same directory, however each is spelled (relative or absolute, `..`, links to the
/// directory), as the first start would create it.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    if a == b {
        return true;
    }
    match (id(a), id(b)) {
        (Some(x), Some(y)) => x == y,
        _ => where_created(a).is_some_and(|x| Some(x) == where_created(b)),
    }
}

/// The file `path` names, as its directory resolved (`None` when that directory is not there:
/// nothing could be created in it).
fn where_created(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(name))
}

/// A file the process writes that is one of its configuration files (a pid file written
/// over main.yaml, a log appended to upstreams.yaml) would destroy it at the first start.
fn overwrites_config(path: &Path, config_files: &[&Path]) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let written = id(path)?;
    let config = config_files.iter().find(|c| id(c) == Some(written))?;
    Some(format!(
        "`{}` is the configuration file {}: the process would write over it",
        path.display(),
        config.display()
    ))
}

fn cannot_create(path: &Path) -> Option<String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Some(format!("`{shown}` is a directory, not a file")),
        Ok(_) => return None,
        Err(_) => {}
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let kernel = std::fs::canonicalize(dir)
        .ok()
        .filter(|d| d.starts_with("/proc") || d.starts_with("/sys"));
    if let Some(kernel) = kernel {
        let why = format!("`{shown}` cannot be created: `{}` is a kernel file system (/proc, /sys), where no file can be made", kernel.display());
        return Some(why);
    }
    let problem = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return None,
        Ok(_) => "is not a directory",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
        Err(_) => "cannot be read",
    };
    Some(format!(
        "`{shown}` cannot be created: its directory `{}` {problem}",
        dir.display()
    ))
}

/// Whether this user could not write `path` (or create it in its directory): the start fails
/// then, as nginx -t fails on a log it cannot open.
fn not_writable(path: &Path) -> Option<String> {
    use nix::unistd::{access, AccessFlags};
    let (at, flags) = match path.exists() {
        true => (path, AccessFlags::W_OK),
        false => (
            path.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
            AccessFlags::W_OK | AccessFlags::X_OK,
        ),
    };
    let Err(e) = access(at, flags) else {
        return None;
    };
    let uid = nix::unistd::geteuid();
    Some(format!(
        "`{}` cannot be written by this user (uid {uid}: {e}): a start as this user fails",
        path.display()
    ))
}

fn problem(path: &Path, kind: Kind) -> Option<&'static str> {
    match (std::fs::metadata(path), kind) {
        (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
        (Err(_), _) => Some("cannot be read"),
        (Ok(meta), Kind::File) if meta.is_dir() => Some("is a directory, not a file"),
        (Ok(meta), Kind::Directory) if !meta.is_dir() => Some("is not a directory"),
        (Ok(_), _) => None,
    }
}

/// `runuser` and `rungroup` (or Pingora's `user` and `group`) must name accounts of this system,
/// looked up by name as the privilege drop at start does.
fn accounts(named: &Named<'_>, at: &KeyPositions<'_>, r: &mut Reader) -> bool {
    use nix::unistd::{Group, User};
    let user = named
        .runuser
        .map(|name| (name, matches!(User::from_name(name), Ok(Some(_)))));
    let group = named
        .rungroup
        .map(|name| (name, matches!(Group::from_name(name), Ok(Some(_)))));
    let mut ok = true;
    for (keys, what, looked_up) in [
        (["runuser", "user"], "user", user),
        (["rungroup", "group"], "group", group),
    ] {
        let Some((name, false)) = looked_up else {
            continue;
        };
        if let Some((key, pos)) = at.first_of(&keys) {
            r.error(pos, key, format!("no {what} `{name}` on this system"));
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_spellings_of_a_file_not_made_yet_are_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(root, root.join("link")).unwrap();
        let log = root.join("x.log");
        assert!(same_file(&log, &root.join("sub/../x.log")));
        assert!(same_file(&log, &root.join("link/x.log")));
        assert!(!same_file(&log, &root.join("y.log")));
        assert!(!same_file(&log, &root.join("sub/x.log")));
        assert!(
            !same_file(&log, &root.join("gone/x.log")),
            "no such directory"
        );
        std::fs::write(&log, "").unwrap();
        assert!(same_file(&log, &root.join("link/x.log")), "once made");
    }
}
