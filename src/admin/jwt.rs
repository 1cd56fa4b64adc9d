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

/// Signs a token for `req`, valid for its minutes (default 60, at most a year).
pub fn issue(req: &TokenRequest, secret: &str) -> Result<String, String> {
    let minutes = req.valid.or(req.exp).unwrap_or(60).clamp(1, 365 * 24 * 60);
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
