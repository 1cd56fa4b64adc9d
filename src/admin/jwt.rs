//! `POST /jwt`: issues HS256 tokens signed with the master key, for routes with `jwt` auth.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, EncodingKey, Header};

/// The request body: `{master_key, owner, valid}` (`exp` accepted for `valid`), minutes.
#[derive(serde::Deserialize)]
pub struct TokenRequest {
    pub master_key: String,
    pub owner: String,
    pub valid: Option<u64>,
    pub exp: Option<u64>,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    sub: &'a str,
    owner: &'a str,
    iat: u64,
    exp: u64,
}

/// The longest a token may be valid: a year, in minutes.
const MAX_MINUTES: u64 = 365 * 24 * 60;

/// How many minutes the token `req` asks for is valid: 60 when it does not say; a number out of
/// 1 to a year is refused (the answer's text says the range), not quietly changed.
pub fn valid_minutes(req: &TokenRequest) -> Result<u64, String> {
    match req.valid.or(req.exp).unwrap_or(60) {
        minutes @ 1..=MAX_MINUTES => Ok(minutes),
        other => Err(format!(
            "`valid` is in minutes, from 1 to {MAX_MINUTES} (a year); found {other}"
        )),
    }
}

/// Signs a token for `req`'s owner, valid for `minutes`.
pub fn issue(req: &TokenRequest, minutes: u64, secret: &str) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let claims = Claims {
        sub: &req.owner,
        owner: &req.owner,
        iat: now,
        exp: now + minutes * 60,
    };
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .map_err(|e| e.to_string())
}
