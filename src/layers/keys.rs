//! The secrets policies derive from, built once at start and handed to every snapshot compile
//! (never read from a process-wide static): the JWT master key and the sticky-cookie key.
//!
//! The master secret is `JWT_KEY` from the environment, else `master_key` from `main.yaml`. The
//! sticky-cookie key is derived from it (never the secret itself), so cookies stay valid across
//! restarts, live upgrades and instances sharing the secret; without one it is random per
//! process.

use aws_lc_rs::hmac;
use jsonwebtoken::DecodingKey;

use super::jwt_cache;

/// What was derived from the process's master secret.
pub struct Keys {
    /// The master secret itself (the admin API compares against it and signs with it).
    master: Option<String>,
    jwt_master: Option<(DecodingKey, u64)>,
    sticky: hmac::Key,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("master", &self.master.is_some())
            .finish()
    }
}

impl Keys {
    /// `JWT_KEY` (when set and not empty) overrides `master_key`.
    pub fn from_config(master_key: Option<&str>) -> Keys {
        let env_key = std::env::var("JWT_KEY").ok().filter(|k| !k.is_empty());
        Keys::new(env_key.or_else(|| master_key.map(str::to_string)))
    }

    /// Keys from an explicit master secret (none: JWT rules need their own `data`, and the
    /// sticky-cookie key is random).
    pub fn new(master: Option<String>) -> Keys {
        let jwt_master = master.as_ref().map(|m| {
            (
                DecodingKey::from_secret(m.as_bytes()),
                jwt_cache::fingerprint(m.as_bytes()),
            )
        });
        let sticky = match &master {
            Some(m) => derived_sticky_key(m),
            None => random_sticky_key(),
        };
        Keys {
            master,
            jwt_master,
            sticky,
        }
    }

    /// Keys for unit tests.
    pub fn for_tests(master: Option<&str>) -> Keys {
        Keys::new(master.map(str::to_string))
    }

    pub fn master(&self) -> Option<&str> {
        self.master.as_deref()
    }

    /// Whether there is a master secret for JWT rules without their own.
    pub fn has_jwt_master(&self) -> bool {
        self.jwt_master.is_some()
    }

    pub(super) fn jwt_master(&self) -> Option<(&DecodingKey, u64)> {
        self.jwt_master.as_ref().map(|(k, f)| (k, *f))
    }

    pub(super) fn sticky(&self) -> &hmac::Key {
        &self.sticky
    }
}

/// A key of its own for cookies, derived from the master secret.
fn derived_sticky_key(master: &str) -> hmac::Key {
    let derive = hmac::Key::new(hmac::HMAC_SHA256, master.as_bytes());
    let derived = hmac::sign(&derive, b"aralez sticky-session cookie key v1");
    hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())
}

fn random_sticky_key() -> hmac::Key {
    let mut secret = [0u8; 32];
    if aws_lc_rs::rand::fill(&mut secret).is_err() {
        // No system randomness: fall back to the OS-seeded hasher keys std uses.
        use std::hash::{BuildHasher, RandomState};
        for (i, chunk) in secret.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&RandomState::new().hash_one(i).to_le_bytes());
        }
        tracing::warn!("system randomness unavailable; sticky cookie key from hasher seeds");
    }
    hmac::Key::new(hmac::HMAC_SHA256, &secret)
}
