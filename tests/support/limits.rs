//! What a test with thousands of connections needs: the open-file limit (inherited by the proxy
//! it starts) raised, and its connections opened in batches.

use std::future::Future;

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises this process's open-file limit (inherited by the proxy) to `wanted`, past the hard
/// limit when allowed (root), else to the hard limit; the limit it got.
fn raise_nofile(wanted: u64) -> u64 {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let above = wanted.max(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, above, above).is_ok() {
        return above;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    hard
}

/// Raises the open-file limit for `connections` client connections (and the proxy's side of
/// them); fails the test when the hard limit is too low.
pub fn allow_connections(connections: usize) {
    let limit = raise_nofile(connections as u64 + 1_000);
    assert!(
        limit > connections as u64 + 500,
        "open-file hard limit {limit} is too low for {connections} connections"
    );
}

/// `count` results of `open_one`, run `batch` at a time as tasks; the `n`th call gets `n`.
pub async fn open_in_batches<T, Fut>(
    count: usize,
    batch: usize,
    open_one: impl Fn(usize) -> Fut,
) -> Vec<T>
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let mut open = Vec::with_capacity(count);
    while open.len() < count {
        let mut set = tokio::task::JoinSet::new();
        for n in open.len()..count.min(open.len() + batch) {
            set.spawn(open_one(n));
        }
        while let Some(done) = set.join_next().await {
            open.push(done.expect("connection task"));
        }
    }
    open
}
