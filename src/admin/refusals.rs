//! The admin API's log of refused requests (a missing or wrong key, a body too large or too
//! slow), with the client's address: at most one line a second for a listener, with how many
//! more were refused since. Guessing the master key left no trace.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

/// How often at most a refusal is said; the rest in between are counted.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The statuses that are refusals of who asked or how.
const REFUSED: [StatusCode; 3] = [
    StatusCode::FORBIDDEN,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::REQUEST_TIMEOUT,
];

/// When the last refusal was said, and how many were counted since.
#[derive(Default)]
pub(super) struct RefusalLog(Mutex<Option<(Instant, u64)>>);

impl RefusalLog {
    /// Logs the request `asked` by `peer` if `status` refused it and a line is due.
    pub(super) fn note(
        &self,
        peer: SocketAddr,
        (method, path): &(Method, String),
        status: StatusCode,
    ) {
        if !REFUSED.contains(&status) {
            return;
        }
        let Some(more) = self.due(Instant::now()) else {
            return;
        };
        let since = match more {
            0 => String::new(),
            n => format!(" ({n} more refused since the last report)"),
        };
        tracing::warn!("admin API: {method} {path:?} from {peer} refused ({status}){since}");
    }

    /// Counts a refusal at `now`: how many went unsaid before it when a line is due, none when
    /// the last line was said less than [`REPORT_EVERY`] ago.
    fn due(&self, now: Instant) -> Option<u64> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let more = match &mut *last {
            Some((at, quiet)) if now.duration_since(*at) < REPORT_EVERY => {
                *quiet += 1;
                return None;
            }
            Some((_, quiet)) => *quiet,
            None => 0,
        };
        *last = Some((now, 0));
        Some(more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_a_second_then_the_count_of_the_rest() {
        let log = RefusalLog::default();
        assert_eq!(log.due(Instant::now()), Some(0), "the first is said");
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(150)).await;
            assert_eq!(log.due(Instant::now()), None, "within the second: counted");
        }
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(
            log.due(Instant::now()),
            Some(5),
            "a second on: said, with the five"
        );
        assert_eq!(log.due(Instant::now()), None);
        tokio::time::advance(REPORT_EVERY).await;
        assert_eq!(log.due(Instant::now()), Some(1), "the count starts again");
    }
}
