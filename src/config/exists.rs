//! What main.yaml names must exist: checked when it is read, so `aralez -t`, `check-config` and
//! a start agree (as `nginx -t` opens the files it names). Certificate and key files, the
//! certificate directory, the file server's folder, Pingora's `ca_file`, and the `runuser` and
//! `rungroup` accounts. Each problem is an error at the key that names the thing.

use std::path::Path;

use super::main_conf::MainConfig;
use super::reader::Reader;
use super::yaml::Pos;

/// Keys whose positions [`check`] needs (recorded while main.yaml is read).
pub const NAMING_KEYS: &[&str] = &[
    "proxy_certificates",
    "proxy_configs",
    "config_tls_certificate",
    "config_tls_key_file",
    "file_server_folder",
    "ca_file",
    "runuser",
    "rungroup",
];

/// Where each key of [`NAMING_KEYS`] was found.
#[derive(Default)]
pub struct Positions(Vec<(&'static str, Pos)>);

impl Positions {
    pub fn note(&mut self, key: &str, pos: Pos) {
        if let Some(known) = NAMING_KEYS.iter().find(|k| **k == key) {
            self.0.push((known, pos));
        }
    }

    fn of(&self, key: &str) -> Option<Pos> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, p)| *p)
    }
}

/// What kind of thing a path must be.
#[derive(Clone, Copy)]
enum Kind {
    File,
    Directory,
}

/// Checks everything `cfg` names; false if something is missing (each reported).
pub fn check(cfg: &MainConfig, ca_file: Option<&Path>, at: &Positions, r: &mut Reader) -> bool {
    let mut ok = true;
    let mut path = |key: &str, path: Option<&Path>, kind: Kind| {
        if let (Some(path), Some(pos)) = (path, at.of(key)) {
            if let Some(problem) = problem(path, kind) {
                r.error(pos, key, format!("`{}` {problem}", path.display()));
                ok = false;
            }
        }
    };
    if cfg.proxy_address_tls.is_some() {
        let key = if at.of("proxy_certificates").is_some() {
            "proxy_certificates"
        } else {
            "proxy_configs"
        };
        path(key, cfg.certificates_dir.as_deref(), Kind::Directory);
    }
    path(
        "config_tls_certificate",
        cfg.config_tls_certificate.as_deref(),
        Kind::File,
    );
    path(
        "config_tls_key_file",
        cfg.config_tls_key_file.as_deref(),
        Kind::File,
    );
    path(
        "file_server_folder",
        cfg.file_server_folder.as_deref(),
        Kind::Directory,
    );
    path("ca_file", ca_file, Kind::File);
    ok &= accounts(cfg, at, r);
    ok
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

/// `runuser` and `rungroup` must name accounts of this system (names or numeric ids).
fn accounts(cfg: &MainConfig, at: &Positions, r: &mut Reader) -> bool {
    use nix::unistd::{Gid, Group, Uid, User};
    let mut ok = true;
    if let (Some(name), Some(pos)) = (&cfg.runuser, at.of("runuser")) {
        let found = match name.parse::<u32>() {
            Ok(id) => User::from_uid(Uid::from_raw(id)),
            Err(_) => User::from_name(name),
        };
        if !matches!(found, Ok(Some(_))) {
            r.error(pos, "runuser", format!("no user `{name}` on this system"));
            ok = false;
        }
    }
    if let (Some(name), Some(pos)) = (&cfg.rungroup, at.of("rungroup")) {
        let found = match name.parse::<u32>() {
            Ok(id) => Group::from_gid(Gid::from_raw(id)),
            Err(_) => Group::from_name(name),
        };
        if !matches!(found, Ok(Some(_))) {
            r.error(pos, "rungroup", format!("no group `{name}` on this system"));
            ok = false;
        }
    }
    ok
}
