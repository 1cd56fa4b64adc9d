//! Looking up a backend's host name without holding up the caller for long. A backend is made
//! while a configuration is built: at start, on a reload, or when discovery hands over new
//! instances, on the control plane's one thread, which also runs the health checks, the admin
//! API and the signals. A lookup there that waited for an unanswering resolver (10-40 s a name)
//! held all of them. Each lookup runs on a thread of its own; the caller waits for it at most
//! [`WAIT`] (a working resolver answers well within it, so a new backend has its addresses
//! before its first request), and a later answer is stored when it comes. Until then the
//! backend has no address: its requests go to the route's other backends, or fail at once.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

use super::Backend;
use crate::config::values::ServerSpec;
use crate::vocab::CountedSlot;

/// How long the caller waits for a lookup.
pub const WAIT: Duration = Duration::from_secs(1);
/// Lookups running at once, at most; past that, a name waits for the periodic one
/// (`control::resolve`).
pub const MAX_RUNNING: usize = 64;

/// The addresses of a server entry: the literal IP, or what the host name resolves to now
/// (blocking; none when the lookup fails).
pub fn resolve(spec: &ServerSpec) -> Box<[SocketAddr]> {
    match spec.ip_addr() {
        Some(addr) => Box::new([addr]),
        None => (spec.host.as_str(), spec.port)
            .to_socket_addrs()
            .map(|it| it.collect())
            .unwrap_or_default(),
    }
}

/// Looks `backend`'s name up with `lookup` on a thread of its own, counted in `running`,
/// waiting for it at most `wait`; the answer is stored in the backend whenever it comes (an
/// empty one is not). Whether the backend has its addresses on return.
pub fn first_lookup(
    backend: &Arc<Backend>,
    running: &Arc<AtomicUsize>,
    lookup: impl FnOnce() -> Box<[SocketAddr]> + Send + 'static,
    wait: Duration,
) -> bool {
    let Some(counted) = CountedSlot::reserve(running, MAX_RUNNING) else {
        tracing::warn!(backend = %backend.label, "{MAX_RUNNING} host name lookups already running; this one waits for the next round");
        return false;
    };
    let (told, answer) = mpsc::channel::<()>();
    let target: Weak<Backend> = Arc::downgrade(backend);
    let spawned = std::thread::Builder::new()
        .name("aralez-lookup".into())
        .spawn(move || {
            let fresh = lookup();
            if let Some(backend) = target.upgrade() {
                backend.take_first_addrs(fresh);
            }
            drop(counted);
            let _ = told.send(());
        });
    if let Err(e) = spawned {
        tracing::warn!(backend = %backend.label, "cannot start a host name lookup: {e}");
        return false;
    }
    if answer.recv_timeout(wait).is_err() {
        tracing::warn!(backend = %backend.label, "its host name is not resolved after {wait:?}; its requests go elsewhere until it is");
    }
    !backend.addrs().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_server;
    use crate::upstream::Registry;
    use std::sync::atomic::Ordering;

    fn named_backend(reg: &Registry) -> Arc<Backend> {
        reg.backend_unresolved(&parse_server("slow.invalid:80").unwrap(), false)
    }

    #[test]
    fn a_slow_lookup_holds_the_caller_only_for_the_wait_and_is_stored_when_it_comes() {
        let reg = Registry::for_tests(1, Duration::from_secs(60));
        let backend = named_backend(&reg);
        let running = Arc::new(AtomicUsize::new(0));
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let (release, released) = mpsc::channel::<()>();
        let slow = move || {
            let _ = released.recv();
            Box::new([addr]) as Box<[SocketAddr]>
        };
        let started = std::time::Instant::now();
        assert!(!first_lookup(
            &backend,
            &running,
            slow,
            Duration::from_millis(50)
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(backend.addrs().is_empty());
        release.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while backend.addrs().is_empty() && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(&**backend.addrs(), &[addr]);
    }

    #[test]
    fn a_quick_lookup_is_there_on_return_and_an_empty_answer_is_not_stored() {
        let reg = Registry::for_tests(1, Duration::from_secs(60));
        let running = Arc::new(AtomicUsize::new(0));
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let backend = named_backend(&reg);
        let quick = move || Box::new([addr]) as Box<[SocketAddr]>;
        assert!(first_lookup(
            &backend,
            &running,
            quick,
            Duration::from_secs(10)
        ));
        let other = named_backend(&Registry::for_tests(1, Duration::from_secs(60)));
        let failed = || Box::new([]) as Box<[SocketAddr]>;
        assert!(!first_lookup(
            &other,
            &running,
            failed,
            Duration::from_secs(10)
        ));
        assert_eq!(running.load(Ordering::Relaxed), 0);
    }
}
