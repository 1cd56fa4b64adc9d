//! The process's share of the kernel's resources, settled at start: the open-files limit
//! (raised, and checked to leave room to serve), and transparent huge pages (off).

/// Raises the soft limit on open files to the hard limit: every client connection, backend
/// connection and TLS session holds a descriptor, and the usual soft limit (1024) is what an
/// attacker exhausts first.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!("open files limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("cannot raise the open files limit from {soft}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}

/// Descriptors the control runtime takes (its epoll, its waker, tokio's signal pair and a copy
/// of its reader), checked before it is built (the control plane's start).
pub const CONTROL_RUNTIME_DESCRIPTORS: usize = 8;

/// How many file descriptors this process may still open, counted up to `enough` by opening
/// them (reading /proc/self/fd takes one itself, and fails when none is left); `enough` when
/// they cannot be counted so.
pub fn descriptors_free(enough: usize) -> usize {
    let mut taken = Vec::with_capacity(enough);
    while taken.len() < enough {
        match std::fs::File::open("/dev/null") {
            Ok(file) => taken.push(file),
            Err(e) if e.raw_os_error() == Some(nix::libc::EMFILE) => break,
            Err(_) => return enough,
        }
    }
    taken.len()
}

/// Descriptors a started process must have left to serve at all: a client's connection and
/// its backend's for a few requests at once, a health probe, a file watch's read.
const DESCRIPTORS_TO_SERVE: usize = 16;

/// Below this open-files limit a start is said to be short of descriptors.
const DESCRIPTORS_WARNED_UNDER: u64 = 1024;

/// Whether the open-files limit leaves room to serve once everything has started. Started with
/// a limit that left none (`ulimit -n 26`), the process listened and accepted nothing: every
/// connection waited in the backlog. A limit under [`DESCRIPTORS_WARNED_UNDER`] is said, with
/// about how many connections it carries, as nginx warns of `worker_connections` over it.
pub fn descriptors_left_to_serve() -> std::io::Result<()> {
    use nix::sys::resource::{getrlimit, Resource};
    let Ok((limit, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Ok(());
    };
    let left = descriptors_free(DESCRIPTORS_TO_SERVE);
    if left < DESCRIPTORS_TO_SERVE {
        let why = format!("the open-files limit ({limit}) leaves {left} descriptors free once started, under the {DESCRIPTORS_TO_SERVE} it takes to serve: raise it (ulimit -n, systemd's LimitNOFILE)");
        return Err(std::io::Error::other(why));
    }
    if limit < DESCRIPTORS_WARNED_UNDER {
        let open = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
        let carried = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(open)
            / 2;
        tracing::warn!("the open-files limit is {limit} ({open} open once started): about {carried} proxied connections at once, past which accepts fail and requests get 502; raise it (ulimit -n, systemd's LimitNOFILE)");
    }
    Ok(())
}

/// Turns transparent huge pages off for this process. The allocator asks for them on its
/// arenas, and then each 2 MiB region becomes resident whole at its first touch: every idle
/// client connection cost about 41 KiB of RSS with them and 31 KiB without (10,000 keep-alive
/// connections, bench/RESULTS.md), and the process starts 10 MB smaller. A proxy's working set
/// is small and scattered over many connections, which is where huge pages waste the most.
pub fn no_huge_pages() -> nix::Result<()> {
    nix::sys::prctl::set_thp_disable(true)
}
