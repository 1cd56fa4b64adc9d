//! Ports a test must name before a process listens on them (pebble's validation port, HAProxy's
//! frontends, a redis or gRPC server told its port on the command line).
//!
//! They come from below the kernel's ephemeral range (32768-60999 on Linux): there, neither another
//! test's `bind(0)` nor an outgoing connection's local port can take one between the moment it is
//! picked and the moment the process binds it. (With `bind(0)`, a port released for a process to
//! take was handed out again: CI saw aralez refuse a port held by someone else.) A counter in the
//! test process never hands one out twice; cargo runs test binaries one after another, and the
//! start is spread by pid so a binary does not reuse a port the previous one left in TIME_WAIT.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

const FIRST: u32 = 20_000;
const COUNT: u32 = 12_000;

/// A port no one listens on now, and that no other caller in this process was given.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(997) % COUNT,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..COUNT {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % COUNT) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + COUNT)
}
