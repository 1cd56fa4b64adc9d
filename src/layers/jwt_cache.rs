//! A per-worker memory of tokens already verified, so a client that sends the same token on
//! every request pays for the HMAC once, not on every request.
//!
//! Safety: an entry is found by a keyed hash (SipHash with a per-process random key) of the
//! secret's fingerprint and the token, and then the token itself is compared in full, so only the
//! exact token verified under the same secret hits. `exp` is checked on every hit. Each worker
//! has its own table (no lock, no shared cache line); it is cleared when it reaches its bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Entries per worker before the table is cleared.
const MAX_ENTRIES: usize = 4096;

struct Entry {
    secret: u64,
    token: Box<str>,
    exp: u64,
}

thread_local! {
    static VERIFIED: RefCell<HashMap<u64, Entry>> = RefCell::new(HashMap::new());
}

fn keyed() -> &'static std::collections::hash_map::RandomState {
    static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEY.get_or_init(std::collections::hash_map::RandomState::new)
}

/// A fingerprint of a secret, for telling rules apart (never the secret itself).
pub fn fingerprint(secret: &[u8]) -> u64 {
    keyed().hash_one(secret)
}

fn slot(secret: u64, token: &str) -> u64 {
    let mut h = keyed().build_hasher();
    secret.hash(&mut h);
    token.hash(&mut h);
    h.finish()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `token` was verified under `secret` and has not expired at `now`.
pub fn is_verified(secret: u64, token: &str, now: u64) -> bool {
    VERIFIED.with(|table| {
        let table = table.borrow();
        table
            .get(&slot(secret, token))
            .is_some_and(|e| e.secret == secret && now < e.exp && *e.token == *token)
    })
}

/// Remembers a token that just passed full verification.
pub fn remember(secret: u64, token: &str, exp: u64) {
    VERIFIED.with(|table| {
        let mut table = table.borrow_mut();
        if table.len() >= MAX_ENTRIES {
            table.clear();
        }
        table.insert(
            slot(secret, token),
            Entry {
                secret,
                token: token.into(),
                exp,
            },
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_token_under_the_same_secret_before_exp() {
        let (a, b) = (fingerprint(b"secret-a"), fingerprint(b"secret-b"));
        remember(a, "tok.en.1", 1_000);
        assert!(is_verified(a, "tok.en.1", 999));
        assert!(!is_verified(a, "tok.en.1", 1_000), "expired");
        assert!(!is_verified(b, "tok.en.1", 10), "other secret");
        assert!(!is_verified(a, "tok.en.2", 10), "other token");
    }

    #[test]
    fn the_table_is_bounded() {
        let s = fingerprint(b"s");
        for i in 0..(MAX_ENTRIES + 10) {
            remember(s, &format!("t{i}"), u64::MAX);
        }
        VERIFIED.with(|t| assert!(t.borrow().len() <= MAX_ENTRIES));
    }
}
