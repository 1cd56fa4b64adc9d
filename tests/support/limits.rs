//! Process limits a test with thousands of connections raises: the open-file limit, inherited
//! by the proxy it starts.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises this process's open-file limit (inherited by the proxy) to `wanted`, past the hard
/// limit when allowed (root), else to the hard limit; the limit it got.
pub fn raise_nofile(wanted: u64) -> u64 {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let above = wanted.max(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, above, above).is_ok() {
        return above;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    hard
}
