//! Patched in by aralez: requests a server refuses before they become requests.
//!
//! h2 answers some request heads itself, and they never reach the caller's service: a header
//! block over `max_header_list_size` gets a 431, a malformed one (a missing pseudo-header, a
//! connection-specific field, a `content-length` that cannot be) a `RST_STREAM` with
//! `PROTOCOL_ERROR`. A server that logs and counts its requests would miss them. It serves a
//! connection inside [`scope`], and each such refusal on that connection is told to the note it
//! gave, as the HTTP status it stands for (431, or 400 for a reset).

use std::future::Future;

/// Told the status of each request head refused on the connection.
pub type Note = Box<dyn Fn(u16) + Send + Sync>;

tokio::task_local! {
    static NOTE: Option<Note>;
}

/// Runs `serving` (a server connection's future) with `note` told of its refusals.
pub fn scope<F: Future>(note: Option<Note>, serving: F) -> impl Future<Output = F::Output> {
    NOTE.scope(note, serving)
}

/// A request head was refused with `status`.
pub(crate) fn refused(status: u16) {
    let _ = NOTE.try_with(|note| {
        if let Some(note) = note {
            note(status);
        }
    });
}
