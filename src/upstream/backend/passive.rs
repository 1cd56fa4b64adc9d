//! A backend's passive health, as nginx's `max_fails=3 fail_timeout=hc_interval` counts failed
//! connects: three in a row take it out of rotation for `hc_interval`. When that lapses, one
//! request tries it (the others pass it by) until that one's connect says whether it is back:
//! every request of its round-robin share had waited for its own connect timeout each time the
//! mark lapsed. A failed trial doubles the mark, up to [`LONGEST_MARK`]: without health checks
//! (`healthcheck: false`) a dead backend cost one request a connect timeout every
//! `hc_interval`, for as long as it stayed dead (nginx's every 10 s). Exchanges that fail once
//! connected (a reset, no answer in time) do not count: they are as often one URL's (a slow
//! report, a handler that crashes) or a client's that left, and counted, one slow page took the
//! backend out for every route (HAProxy counts them only with `observe layer7`).

use std::sync::atomic::Ordering;

use std::time::Duration;

use super::{Backend, FAILS_BEFORE_DOWN};

/// The longest a passive mark lasts (unless `hc_interval` is longer): a backend back after a
/// long outage is tried again within this.
pub const LONGEST_MARK: Duration = Duration::from_secs(30);

impl Backend {
    /// Passive health only (for routes with `healthcheck: false`).
    pub fn passive_up(&self) -> bool {
        let until = self.health.down_until_ms.load(Ordering::Relaxed);
        until == 0 || self.health.now_ms() >= until
    }

    /// Marked down by failed connects, lapsed or not: out of rotation until a connect, an
    /// answer or a health check says it is back (what `/metrics` and `/status` show).
    pub fn passively_marked(&self) -> bool {
        self.health.consecutive_failures.load(Ordering::Relaxed) >= FAILS_BEFORE_DOWN
    }

    /// Whether this request may be sent here, passive health permitting: always while the
    /// backend is not marked; once a mark has lapsed, for the one request that claims the
    /// trial. The mark is set again meanwhile, for as long as the trial's connect may take
    /// (`connect_within`) at least: a second trial had begun while the first still waited.
    /// The trial's outcome clears the mark or renews it.
    pub fn claim_trial(&self, connect_within: Duration) -> bool {
        let until = self.health.down_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        let now = self.health.now_ms();
        if now < until {
            return false;
        }
        let mark = self.health.mark_ms.load(Ordering::Relaxed);
        let held = mark.max(connect_within.as_millis() as u64 + 1000).max(1);
        let claimed = self.health.down_until_ms.compare_exchange(
            until,
            now + held,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if claimed.is_ok() {
            self.health.trial_out.store(true, Ordering::Relaxed);
        }
        claimed.is_ok()
    }

    /// Records a failed connect; enough of them in a row take the backend out of rotation, and
    /// its protocol is detected again.
    pub fn connect_failed(&self) {
        if self.failed_in_a_row() >= FAILS_BEFORE_DOWN {
            self.forget_detection();
        }
    }

    /// A handshake that ended on the backend's certificate (`upstream_tls_verify`): a failed
    /// connect, but of a backend known to speak TLS. Detected again, it was every few seconds,
    /// each time said in the log, while the certificate stayed what it was.
    pub fn certificate_refused(&self) {
        self.failed_in_a_row();
    }

    /// Counts a failed connect (out of rotation from [`FAILS_BEFORE_DOWN`] in a row); the
    /// failures in a row.
    fn failed_in_a_row(&self) -> u32 {
        let fails = self
            .health
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if fails >= FAILS_BEFORE_DOWN {
            // A failed trial doubles the mark; the connects that were already out when it was
            // made fail within it, and leave it as it is (eight at once took a first mark
            // straight to the longest).
            let first = fails == FAILS_BEFORE_DOWN;
            let trial_failed = self.health.trial_out.swap(false, Ordering::Relaxed);
            let mark = if first || trial_failed {
                self.next_mark(first)
            } else {
                self.health.mark_ms.load(Ordering::Relaxed)
            };
            let until = self.health.now_ms() + mark;
            self.health
                .down_until_ms
                .fetch_max(until, Ordering::Relaxed);
            if fails == FAILS_BEFORE_DOWN {
                tracing::warn!(backend = %self.label, "backend marked down after {fails} failed connects");
            }
        }
        fails
    }

    /// How long the mark now made lasts: `hc_interval` for a first one, twice the last one
    /// after a failed trial, [`LONGEST_MARK`] at most (or `hc_interval`, when longer).
    fn next_mark(&self, first: bool) -> u64 {
        let down_for = self.health.down_for_ms.load(Ordering::Relaxed).max(1);
        let longest = (LONGEST_MARK.as_millis() as u64).max(down_for);
        let last = self.health.mark_ms.load(Ordering::Relaxed);
        let mark = if first {
            down_for
        } else {
            last.saturating_mul(2).min(longest)
        };
        self.health.mark_ms.store(mark, Ordering::Relaxed);
        mark
    }

    /// Records a successful connect, or an answer: over a pooled connection too, it shows the
    /// backend reachable, and ends a trial (one over a pooled connection had left the mark on,
    /// one request let through each `hc_interval`).
    pub fn connect_succeeded(&self) {
        if self.health.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.health.consecutive_failures.store(0, Ordering::Relaxed);
            self.health.down_until_ms.store(0, Ordering::Relaxed);
            self.health.trial_out.store(false, Ordering::Relaxed);
        }
    }
}
