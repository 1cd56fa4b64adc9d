//! Live binary upgrade over `upgrade_sock` (SPEC §12).
//!
//! A running process listens on the unix socket `upgrade_sock` (mode 0600). A new process started
//! with `-u` connects; the old one answers with one message carrying duplicates of all its
//! listening sockets (SCM_RIGHTS) and their names (`http`, `tls`, `files`, `quic`, `admin`,
//! `admin-tls`). Both processes now accept on the very same sockets, so no connection is refused;
//! the new one takes over `upgrade_sock` for the next upgrade. SIGQUIT then tells the old one to stop accepting, drain and exit: its
//! descriptors close, but the sockets stay open in the new process.

use std::io::{IoSlice, IoSliceMut, Read};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Name of the proxy's plain HTTP listeners in the hand-over.
pub const HTTP: &str = "http";
/// Name of the file server's listener in the hand-over.
pub const FILES: &str = "files";
/// Name of the TLS proxy listeners in the hand-over.
pub const TLS: &str = "tls";
/// Name of HTTP/3's UDP socket in the hand-over.
pub const QUIC: &str = "quic";
/// Name of the admin API's plain listener in the hand-over.
pub const ADMIN: &str = "admin";
/// Name of the admin API's TLS listener in the hand-over.
pub const ADMIN_TLS: &str = "admin-tls";

const MAGIC: &str = "aralez-upgrade/1";
/// What a new process says before the running one hands anything over: a bare connection (a
/// second start checking whether an instance runs) gets nothing. It used to get the sockets,
/// and the log told the operator to SIGQUIT the running process, which left nothing listening.
const ASK: &[u8] = b"aralez-upgrade/1 take\n";
/// How long the running process waits for [`ASK`] on a connection.
const ASK_WAIT: Duration = Duration::from_secs(5);
/// At most this many sockets are handed over (the kernel's SCM_MAX_FD is 253).
const MAX_FDS: usize = 250;

/// Why the hand-over failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("cannot reach the running instance on {path}: {source} (is it running with this upgrade_sock?)")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("receiving the sockets failed: {0}")]
    Receive(String),
    #[error("cannot listen on upgrade_sock {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
}

/// Listening sockets with their names, in the order they were handed over, and the process
/// that handed them (when they were received).
#[derive(Debug, Default)]
pub struct Sockets(Vec<(String, OwnedFd)>, Option<i32>);

impl Sockets {
    /// Adds a duplicate of `listener` under `name`.
    pub fn add(&mut self, name: &str, listener: &std::net::TcpListener) -> std::io::Result<()> {
        let dup = listener.try_clone()?;
        self.0.push((name.to_string(), OwnedFd::from(dup)));
        Ok(())
    }

    /// Adds a duplicate of the UDP `socket` under `name`.
    pub fn add_udp(&mut self, name: &str, socket: &std::net::UdpSocket) -> std::io::Result<()> {
        let dup = socket.try_clone()?;
        self.0.push((name.to_string(), OwnedFd::from(dup)));
        Ok(())
    }

    /// Takes the UDP socket named `name`.
    pub fn take_udp(&mut self, name: &str) -> Option<std::net::UdpSocket> {
        let at = self.0.iter().position(|(n, _)| n == name)?;
        Some(std::net::UdpSocket::from(self.0.remove(at).1))
    }

    /// The process the sockets came from.
    pub fn from_pid(&self) -> Option<i32> {
        self.1
    }

    /// Takes every socket named `name`.
    pub fn take(&mut self, name: &str) -> Vec<std::net::TcpListener> {
        let (taken, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.0)
            .into_iter()
            .partition(|(n, _)| n == name);
        self.0 = rest;
        taken
            .into_iter()
            .map(|(_, fd)| std::net::TcpListener::from(fd))
            .collect()
    }

    /// Takes every socket named `name` that listens where the configuration now says (`want`;
    /// its port 0 takes any port); one elsewhere, or with nowhere configured, is closed: a live
    /// upgrade applies main.yaml's addresses, as nginx's binary upgrade keeps only the
    /// listeners its new configuration still names.
    pub fn take_at(&mut self, name: &str, want: Option<SocketAddr>) -> Vec<std::net::TcpListener> {
        let mut taken = self.take(name);
        taken.retain(|listener| {
            let local = listener.local_addr().ok();
            let kept = local.zip(want).is_some_and(|(l, w)| same_place(l, w));
            if !kept {
                let at = local.map_or_else(|| "?".to_string(), |l| l.to_string());
                let now = want.map_or_else(|| "none".to_string(), |w| w.to_string());
                tracing::warn!(
                    "live upgrade: the inherited {name} listener on {at} is not in the configuration (now {now}); closed"
                );
            }
            kept
        });
        taken
    }

    /// [`Self::take_udp`] where the configuration now says, as [`Self::take_at`].
    pub fn take_udp_at(
        &mut self,
        name: &str,
        want: Option<SocketAddr>,
    ) -> Option<std::net::UdpSocket> {
        let socket = self.take_udp(name)?;
        let local = socket.local_addr().ok();
        if local.zip(want).is_some_and(|(l, w)| same_place(l, w)) {
            return Some(socket);
        }
        tracing::warn!(
            "live upgrade: the inherited {name} socket is not on the configured address; closed"
        );
        None
    }

    /// Names of the sockets not taken.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// The sockets a running process offers, until it stops (then they are dropped at once, so a
/// stopped process no longer keeps its ports open).
pub type Offer = Arc<Mutex<Option<Sockets>>>;

/// Whether a new process has taken the sockets, and a wake-up for who waits for that.
#[derive(Default)]
pub struct Handovers {
    taken: std::sync::atomic::AtomicBool,
    woken: tokio::sync::Notify,
    /// SIGQUIT came before a new process took the sockets: the hand-over ends this one.
    quitting: std::sync::atomic::AtomicBool,
}

/// How often a process that handed its sockets over looks whether the taker still runs.
const TAKER_CHECK: Duration = Duration::from_secs(1);

impl Handovers {
    /// Whether a new process has taken the sockets.
    pub fn any(&self) -> bool {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until a new process takes the sockets.
    pub async fn next(&self) {
        let woken = self.woken.notified();
        if self.any() {
            return;
        }
        woken.await;
    }

    /// SIGQUIT arrived: this process drains and exits once the sockets are taken.
    pub fn quit_asked(&self) {
        self.quitting
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn took(&self) {
        self.taken.store(true, std::sync::atomic::Ordering::Relaxed);
        self.woken.notify_waiters();
    }

    /// The taker is gone: a SIGQUIT waits for the next one again.
    fn given_back(&self) {
        self.taken
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Returns once the process `taker` has ended (polled every [`TAKER_CHECK`]); never for none.
async fn taker_ended(taker: Option<i32>) {
    let Some(pid) = taker else {
        return std::future::pending().await;
    };
    let pid = nix::unistd::Pid::from_raw(pid);
    while still_runs(nix::sys::signal::kill(pid, None)) {
        tokio::time::sleep(TAKER_CHECK).await;
    }
}

/// Whether a process runs, by what signal 0 to it gave: only "no such process" says it ended.
/// A process that dropped to `runuser` may not signal the one that took over from it, which is
/// root until it drops too (EPERM): that was taken for an end, and the old process took the
/// upgrade socket back from a live one, and later handed its listeners to no one.
fn still_runs(signalled: nix::Result<()>) -> bool {
    signalled != Err(nix::errno::Errno::ESRCH)
}

/// Connects to the running instance and receives its listening sockets. The socket file and the
/// process answering on it must belong to this user (or root): anyone else could hand us
/// listeners of their choosing.
pub fn receive(path: &Path) -> Result<Sockets, UpgradeError> {
    let bad = |what: String| UpgradeError::Receive(what);
    let owner = std::fs::symlink_metadata(path)
        .map_err(|source| UpgradeError::Connect {
            path: path.display().to_string(),
            source,
        })?
        .uid();
    if !trusted_uid(owner) {
        return Err(bad(format!(
            "{} belongs to uid {owner}, not to this user or root",
            path.display()
        )));
    }
    let mut stream = UnixStream::connect(path).map_err(|source| UpgradeError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| bad(format!("cannot read the peer's credentials: {e}")))?;
    if !trusted_uid(peer.uid()) {
        return Err(bad(format!(
            "the process on {} runs as uid {}, not as this user or root",
            path.display(),
            peer.uid()
        )));
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| bad(e.to_string()))?;
    std::io::Write::write_all(&mut stream, ASK).map_err(|e| bad(e.to_string()))?;
    let mut buf = vec![0u8; 8192];
    let (len, fds) = receive_message(&stream, &mut buf).map_err(bad)?;
    buf.truncate(len);
    stream
        .read_to_end(&mut buf)
        .map_err(|e| bad(e.to_string()))?;
    let text = String::from_utf8(buf).map_err(|_| bad("the message is not text".into()))?;
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(bad("the peer does not speak this upgrade protocol".into()));
    }
    let names: Vec<&str> = lines.collect();
    if names.len() != fds.len() {
        return Err(bad(format!(
            "{} names for {} sockets",
            names.len(),
            fds.len()
        )));
    }
    let pairs = names.into_iter().map(str::to_string).zip(fds).collect();
    Ok(Sockets(pairs, Some(peer.pid())))
}

/// One `recvmsg`: the payload length and the descriptors that came with it.
fn receive_message(stream: &UnixStream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), String> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    for cmsg in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            raw.extend(fds);
        }
    }
    let fds = own_received(raw);
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err("the descriptor list was truncated".into());
    }
    Ok((msg.bytes, fds))
}

#[allow(unsafe_code)]
fn own_received(raw: Vec<RawFd>) -> Vec<OwnedFd> {
    raw.into_iter()
        // SAFETY: the kernel has just installed these descriptors in our table for this
        // message (SCM_RIGHTS); nothing else in the process knows or owns them, so each is
        // owned exactly once, here, and closed when its OwnedFd drops.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}

/// The listening end of `upgrade_sock`, removed on exit if it is still ours.
pub struct UpgradeSock {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's, to tell ours from a newer process's; a new one after a rollback.
    inode: Arc<std::sync::atomic::AtomicU64>,
}

impl UpgradeSock {
    /// Listens on `path` (replacing a stale socket file or the old process's one after an
    /// upgrade), readable and writable by this user only.
    pub fn bind(path: &Path) -> Result<UpgradeSock, UpgradeError> {
        let (listener, inode) = bind_file(path)?;
        Ok(UpgradeSock {
            listener,
            path: path.to_path_buf(),
            inode: Arc::new(inode.into()),
        })
    }

    /// Answers every connecting `aralez -u` with the offered sockets; spawn it on a runtime.
    /// When the process that took them ends while this one still runs (the upgrade rolled
    /// back by stopping it, as nginx's `.oldbin`), this one listens on `upgrade_sock` again
    /// (the taker removed its socket file on the way out) and a SIGQUIT waits for a taker
    /// once more: the next `aralez -u` found no socket, and a SIGQUIT drained at once.
    pub fn serve(
        &self,
        offer: Offer,
        handovers: Arc<Handovers>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let listener = self.listener.try_clone();
        let (path, inode) = (self.path.clone(), self.inode.clone());
        async move {
            let mut listener = match listener.and_then(tokio::net::UnixListener::from_std) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("upgrade socket: {e}; live upgrade unavailable");
                    return;
                }
            };
            let mut taker = None;
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = taker_ended(taker) => {
                        taker = None;
                        match listen_again(&path, &inode) {
                            Ok(again) => {
                                listener = again;
                                handovers.given_back();
                                tracing::warn!("live upgrade: the process that took the sockets has ended while this one runs (rolled back?); this one takes upgrades again on {}", path.display());
                            }
                            Err(e) => tracing::error!("live upgrade: the process that took the sockets has ended, and {e}: no further live upgrade from this one"),
                        }
                        continue;
                    }
                };
                let mut stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("upgrade socket: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if !peer_allowed(&stream) {
                    tracing::warn!("upgrade socket: refused a peer of another user");
                    continue;
                }
                if !asks_for_the_sockets(&mut stream).await {
                    tracing::debug!(
                        "upgrade socket: a connection that did not ask for the sockets (another start looking for a running instance?)"
                    );
                    continue;
                }
                let quitting = handovers
                    .quitting
                    .load(std::sync::atomic::Ordering::Relaxed);
                if answer(&stream, &offer, quitting) {
                    handovers.took();
                    taker = stream.peer_cred().ok().and_then(|cred| cred.pid());
                }
            }
        }
    }

    /// Removes the socket file unless another process has replaced it.
    pub fn remove(self) {
        let inode = self.inode.load(std::sync::atomic::Ordering::Relaxed);
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Listens on `path` (mode 0600), replacing a socket file there; the listener and the file's
/// inode.
fn bind_file(path: &Path) -> Result<(UnixListener, u64), UpgradeError> {
    let fail = |source| UpgradeError::Bind {
        path: path.display().to_string(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(fail(std::io::Error::other(
                "the path exists and is not a socket",
            )));
        }
        std::fs::remove_file(path).map_err(fail)?;
    }
    let listener = UnixListener::bind(path).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    listener.set_nonblocking(true).map_err(fail)?;
    let inode = std::fs::symlink_metadata(path).map_err(fail)?.ino();
    Ok((listener, inode))
}

/// [`bind_file`] again after a rollback, noting the new file's inode for [`UpgradeSock::remove`].
fn listen_again(
    path: &Path,
    inode: &std::sync::atomic::AtomicU64,
) -> Result<tokio::net::UnixListener, UpgradeError> {
    let (listener, new_inode) = bind_file(path)?;
    let listener =
        tokio::net::UnixListener::from_std(listener).map_err(|source| UpgradeError::Bind {
            path: path.display().to_string(),
            source,
        })?;
    inode.store(new_inode, std::sync::atomic::Ordering::Relaxed);
    Ok(listener)
}

/// Whether the peer asks for the sockets ([`ASK`]) within [`ASK_WAIT`].
async fn asks_for_the_sockets(stream: &mut tokio::net::UnixStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut asked = [0u8; ASK.len()];
    let read = tokio::time::timeout(ASK_WAIT, stream.read_exact(&mut asked)).await;
    matches!(read, Ok(Ok(_))) && asked == ASK
}

/// Hands the sockets over; whether they went. `quitting`: SIGQUIT has come already, so the
/// log does not ask for it.
fn answer(stream: &tokio::net::UnixStream, offer: &Offer, quitting: bool) -> bool {
    match hand_over(stream, offer) {
        Ok(n) if quitting => {
            tracing::info!("live upgrade: handed {n} listening socket(s) to a new process");
            true
        }
        Ok(n) => {
            tracing::info!(
                "live upgrade: handed {n} listening socket(s) to a new process; \
                 send SIGQUIT to this one (pid {}) to let it drain and exit",
                std::process::id()
            );
            true
        }
        Err(e) => {
            tracing::error!("live upgrade: hand-over failed: {e}");
            false
        }
    }
}

/// Root, or the user this process runs as.
fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Only root or our own user may take our sockets (the file mode already says so).
fn peer_allowed(stream: &tokio::net::UnixStream) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    stream
        .peer_cred()
        .is_ok_and(|cred| cred.uid() == 0 || cred.uid() == me)
}

fn hand_over(stream: &tokio::net::UnixStream, offer: &Offer) -> Result<usize, String> {
    let guard = offer
        .lock()
        .map_err(|_| "state lock poisoned".to_string())?;
    let Some(sockets) = guard.as_ref() else {
        return Err("this process is stopping".into());
    };
    let mut payload = String::from(MAGIC);
    for (name, _) in &sockets.0 {
        payload.push('\n');
        payload.push_str(name);
    }
    let raw: Vec<RawFd> = sockets.0.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(payload.as_bytes())];
    let sent = sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(|e| e.to_string())?;
    if sent != payload.len() {
        return Err(format!("sent {sent} of {} bytes", payload.len()));
    }
    Ok(raw.len())
}

/// Whether a socket bound at `local` is the one configured as `want` (port 0: any port).
fn same_place(local: SocketAddr, want: SocketAddr) -> bool {
    local.ip() == want.ip() && (want.port() == 0 || local.port() == want.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_this_user_are_trusted() {
        let me = nix::unistd::geteuid().as_raw();
        assert!(trusted_uid(0));
        assert!(trusted_uid(me));
        let stranger = if me == 65534 { 65533 } else { 65534 };
        assert!(!trusted_uid(stranger));
    }

    #[test]
    fn a_socket_file_of_another_user_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("upgrade.sock");
        let _listener = UnixListener::bind(&path).expect("bind");
        let stranger = nix::unistd::Uid::from_raw(65534);
        match nix::unistd::chown(&path, Some(stranger), None) {
            Ok(()) => {
                let refused = receive(&path)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(refused.contains("uid 65534"), "{refused}");
            }
            // Not root: only root can give a file away; the check is then covered above.
            Err(e) => assert_ne!(nix::unistd::geteuid().as_raw(), 0, "chown failed: {e}"),
        }
    }
}
