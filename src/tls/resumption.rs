//! Session resumption that ends with the certificates it was made under ([`Resumption`]): the
//! ticket keys (TLS 1.2 and 1.3 tickets) and the TLS 1.2 session-ID cache are made anew when the
//! certificate directory's pairs change. A resumed session skips the certificate: after a key
//! was replaced in a hurry (a leak), clients kept resuming sessions the old key had
//! authenticated for up to the tickets' 12 hours. nginx starts over at its reload, as its new
//! configuration has new ticket keys; a reload that changes nothing keeps them here.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};

/// Session-ID cache entries (rustls's default size).
const SESSION_IDS: usize = 256;

/// The ticket keys and session-ID cache a server config resumes sessions with.
pub struct Resumption {
    tickets: ArcSwap<Tickets>,
    sessions: ArcSwap<Sessions>,
}

struct Tickets(Arc<dyn ProducesTickets>);
struct Sessions(Arc<ServerSessionMemoryCache>);

impl Resumption {
    pub fn new() -> Result<Arc<Resumption>, rustls::Error> {
        Ok(Arc::new(Resumption {
            tickets: ArcSwap::from_pointee(Tickets(rustls::crypto::aws_lc_rs::Ticketer::new()?)),
            sessions: ArcSwap::from_pointee(Sessions(ServerSessionMemoryCache::new(SESSION_IDS))),
        }))
    }

    /// Ends every session made so far: new ticket keys, an empty session-ID cache. Keys that
    /// cannot be made (no randomness) leave the old ones in place, said.
    pub fn forget(&self) {
        match rustls::crypto::aws_lc_rs::Ticketer::new() {
            Ok(keys) => self.tickets.store(Arc::new(Tickets(keys))),
            Err(e) => {
                tracing::warn!("TLS: cannot make new session ticket keys ({e}); the old ones stay")
            }
        }
        let ids = ServerSessionMemoryCache::new(SESSION_IDS);
        self.sessions.store(Arc::new(Sessions(ids)));
    }
}

impl std::fmt::Debug for Resumption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resumption")
    }
}

impl ProducesTickets for Resumption {
    fn enabled(&self) -> bool {
        self.tickets.load().0.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.tickets.load().0.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.tickets.load().0.encrypt(plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.tickets.load().0.decrypt(cipher)
    }
}

impl StoresServerSessions for Resumption {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.sessions.load().0.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.sessions.load().0.get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.sessions.load().0.take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_ends_tickets_and_session_ids_made_before() {
        let resumption = Resumption::new().unwrap();
        let ticket = resumption.encrypt(b"session").unwrap();
        assert_eq!(
            resumption.decrypt(&ticket).as_deref(),
            Some(&b"session"[..])
        );
        assert!(resumption.put(b"id".to_vec(), b"state".to_vec()));
        resumption.forget();
        assert_eq!(resumption.decrypt(&ticket), None);
        assert_eq!(resumption.get(b"id"), None);
        let again = resumption.encrypt(b"session").unwrap();
        assert_eq!(resumption.decrypt(&again).as_deref(), Some(&b"session"[..]));
    }
}
