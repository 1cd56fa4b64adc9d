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
