//! Dropping root after the listeners are bound: supplementary groups cleared, then the group,
//! then the user. Any failure stops the start (never run on as root by accident).

use nix::unistd::{
    getegid, geteuid, getgid, getuid, setgid, setgroups, setuid, Gid, Group, Uid, User,
};

/// Why the privilege drop failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("unknown user `{0}`")]
    NoUser(String),
    #[error("unknown group `{0}`")]
    NoGroup(String),
    #[error("cannot look up `{name}`: {source}")]
    Lookup { name: String, source: nix::Error },
    #[error("cannot {step}: {source} (only root can switch user or group)")]
    Switch {
        step: &'static str,
        source: nix::Error,
    },
    #[error("the switch did not stick: uid {uid}, gid {gid}")]
    Verify { uid: u32, gid: u32 },
}

/// Gives the log files the process keeps writing to (and reopens on SIGUSR1, and rotates) to
/// the user it is about to run as, as nginx hands its logs to its workers' user: created by
/// root at start, they could not be reopened after the drop, and a rotation that needs the
/// folder warns now instead of failing at every size.
pub fn hand_over_logs(
    runuser: Option<&str>,
    rungroup: Option<&str>,
    logs: &[(&std::path::Path, bool)],
) {
    let Some((uid, gid)) = dropping_to(runuser, rungroup) else {
        return;
    };
    for &(path, rotates) in logs {
        if let Err(e) =
            nix::unistd::chown(path, uid, gid)
                .or_else(|e| if path.exists() { Err(e) } else { Ok(()) })
        {
            tracing::warn!(
                "cannot give {} to the user it will run as: {e}",
                path.display()
            );
        }
        let folder = folder_of(path);
        if rotates && !writable_by(folder, uid, gid) {
            tracing::warn!("{} cannot be rotated after the drop to runuser/rungroup: its folder {} is not writable by them (rotation renames the file in it)", path.display(), folder.display());
        }
    }
}

/// Says at start when the files the process removes at exit (the pid file, the upgrade
/// socket) sit in a folder the user it drops to may not remove them from: they were left
/// behind, with a warning only at exit.
pub fn warn_left_behind(runuser: Option<&str>, rungroup: Option<&str>, files: &[&std::path::Path]) {
    let Some((uid, gid)) = dropping_to(runuser, rungroup) else {
        return;
    };
    for path in files {
        let folder = folder_of(path);
        if !writable_by(folder, uid, gid) {
            tracing::warn!("{} will be left behind at exit: its folder {} is not writable by runuser/rungroup (nginx keeps a root master for this; give the folder to that user)", path.display(), folder.display());
        }
    }
}

/// The user and group root is about to drop to (either may stay as it is), when it will drop;
/// `None` otherwise, or when a name is unknown (the drop says why).
fn dropping_to(
    runuser: Option<&str>,
    rungroup: Option<&str>,
) -> Option<(Option<Uid>, Option<Gid>)> {
    if !geteuid().is_root() || (runuser.is_none() && rungroup.is_none()) {
        return None;
    }
    let user = runuser.map(lookup_user).transpose().ok()?;
    let gid = rungroup
        .and_then(|g| lookup_group(g).ok())
        .or(user.as_ref().map(|u| u.gid));
    Some((user.map(|u| u.uid), gid))
}

/// Folders written into after the privileges are dropped (ACME's account and certificates):
/// one `runuser`/`rungroup` cannot write (or, not made yet, whose parent it cannot) fails every
/// order, said at start with its key. It was said only at each order's failure.
pub fn warn_unwritable_folders(
    runuser: Option<&str>,
    rungroup: Option<&str>,
    folders: &[(&str, &std::path::Path)],
) {
    let Some((uid, gid)) = dropping_to(runuser, rungroup) else {
        return;
    };
    for (key, folder) in folders {
        let Some(there) = folder.ancestors().find(|f| f.exists()) else {
            continue;
        };
        if !writable_by(there, uid, gid) {
            tracing::warn!("{key} {}: {} is not writable by runuser/rungroup; ACME orders will fail until it is (the account and the certificates are written there)", folder.display(), there.display());
        }
    }
}

/// Says which of the upstreams file and conf.d's files the user this process now runs as
/// cannot read: they were read at start (as root), and every reload will be refused until
/// they can be. Nothing said so before the first reload failed.
pub fn warn_unreadable_config(upstreams: &std::path::Path) {
    let files =
        std::iter::once(upstreams.to_path_buf()).chain(crate::config::conf_d_files(upstreams));
    let unreadable: Vec<_> = files
        .filter(|file| std::fs::File::open(file).is_err())
        .collect();
    if let Some(first) = unreadable.first() {
        tracing::warn!(
            "{} configuration file(s) cannot be read by runuser/rungroup ({} first): the routes read at start serve, but every reload is refused until they can be",
            unreadable.len(),
            first.display()
        );
    }
}

/// The folder a file is in (`.` for a bare name).
fn folder_of(path: &std::path::Path) -> &std::path::Path {
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    folder.unwrap_or(std::path::Path::new("."))
}

/// Whether the folder's mode lets `uid` (or `gid`) create and rename files in it.
fn writable_by(folder: &std::path::Path, uid: Option<Uid>, gid: Option<Gid>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(folder) else {
        return false;
    };
    let mode = meta.mode();
    let uid = uid.unwrap_or_else(getuid).as_raw();
    let gid = gid.unwrap_or_else(getgid).as_raw();
    uid == 0
        || (meta.uid() == uid && mode & 0o300 == 0o300)
        || (meta.gid() == gid && mode & 0o030 == 0o030)
        || mode & 0o003 == 0o003
}

/// Switches to `runuser` / `rungroup` (either may be absent). With only `runuser`, its primary
/// group is used. Returns what was dropped to, for the log.
pub fn drop_to(
    runuser: Option<&str>,
    rungroup: Option<&str>,
) -> Result<Option<(Uid, Gid)>, PrivilegeError> {
    if runuser.is_none() && rungroup.is_none() {
        return Ok(None);
    }
    let user = runuser.map(lookup_user).transpose()?;
    let gid = match (rungroup, &user) {
        (Some(name), _) => lookup_group(name)?,
        (None, Some(user)) => user.gid,
        (None, None) => getgid(),
    };
    let uid = user.as_ref().map_or_else(getuid, |u| u.uid);
    if uid == getuid() && gid == getgid() && uid == geteuid() && gid == getegid() && !uid.is_root()
    {
        return Ok(Some((uid, gid)));
    }
    setgroups(&[]).map_err(|source| PrivilegeError::Switch {
        step: "clear supplementary groups",
        source,
    })?;
    setgid(gid).map_err(|source| PrivilegeError::Switch {
        step: "set the group",
        source,
    })?;
    if user.is_some() {
        setuid(uid).map_err(|source| PrivilegeError::Switch {
            step: "set the user",
            source,
        })?;
    }
    verify(uid, gid)?;
    Ok(Some((uid, gid)))
}

fn lookup_user(name: &str) -> Result<User, PrivilegeError> {
    User::from_name(name)
        .map_err(|source| PrivilegeError::Lookup {
            name: name.to_string(),
            source,
        })?
        .ok_or_else(|| PrivilegeError::NoUser(name.to_string()))
}

fn lookup_group(name: &str) -> Result<Gid, PrivilegeError> {
    Group::from_name(name)
        .map_err(|source| PrivilegeError::Lookup {
            name: name.to_string(),
            source,
        })?
        .map(|g| g.gid)
        .ok_or_else(|| PrivilegeError::NoGroup(name.to_string()))
}

/// Both real and effective ids must be the targets, and (when we left root) root must be gone
/// for good.
fn verify(uid: Uid, gid: Gid) -> Result<(), PrivilegeError> {
    let ok = getuid() == uid && geteuid() == uid && getgid() == gid && getegid() == gid;
    let regained = !uid.is_root() && setuid(Uid::from_raw(0)).is_ok();
    if ok && !regained {
        return Ok(());
    }
    Err(PrivilegeError::Verify {
        uid: geteuid().as_raw(),
        gid: getegid().as_raw(),
    })
}
