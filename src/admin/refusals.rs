//! The admin API's log of refused requests (a missing or wrong key, a body too large or too
//! slow), with the client's address: at most one line a second for a listener, with how many
//! more were refused since. Guessing the master key left no trace.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::vocab::said_every::SaidEvery;

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
        &self,
        peer: SocketAddr,
        (method, path): &(Method, String),
        status: StatusCode,
    ) {
        if !REFUSED.contains(&status) {
            return;
        }
        let Some(since) = self.0.due_note(Instant::now()) else {
            return;
        };
        tracing::warn!("admin API: {method} {path:?} from {peer} refused ({status}){since}");
    }
}
