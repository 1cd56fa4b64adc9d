//! The admin API's log of refused requests (a missing or wrong key, a body too large or too
//! slow), with the client's address: at most one line a second for a listener, with how many
//! more were refused since (told a second on when none follows). Guessing the master key left
//! no trace.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::vocab::said_every::{more_words, Said, SaidEvery};

/// The statuses that are refusals of who asked or how.
const REFUSED: [StatusCode; 3] = [
    StatusCode::FORBIDDEN,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::REQUEST_TIMEOUT,
];

/// A listener's refusals, said at most once a second.
pub(super) struct RefusalLog(SaidEvery);

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog(SaidEvery::new(Duration::from_secs(1)))
    }
}

impl RefusalLog {
    /// Logs the request `asked` by `peer` if `status` refused it and a line is due.
    pub(super) fn note(
        self: &Arc<Self>,
        peer: SocketAddr,
        (method, path): &(Method, String),
        status: StatusCode,
    ) {
        if !REFUSED.contains(&status) {
            return;
        }
        match self.0.note(Instant::now()) {
            Said::Due(more) => {
                let since = more_words(more);
                tracing::warn!(
                    "admin API: {method} {path:?} from {peer} refused ({status}){since}"
                );
            }
            Said::FirstUnsaid => {
                // Told a second on if no line is due meanwhile: a burst of guesses that then
                // stopped had shown as one refusal.
                let log = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(log.0.period()).await;
                    if let Some(more) = log.0.unsaid_due(Instant::now()) {
                        tracing::warn!(
                            "admin API: {more} more requests refused since the last report"
                        );
                    }
                });
            }
            Said::Counted => {}
        }
    }
}
