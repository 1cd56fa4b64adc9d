//! `jwt` auth (SPEC §8.2): an HS256 token from `Authorization: Bearer` or the `araleztoken` query
//! parameter, with `exp` required and checked (no leeway). `alg: none`, RS256 and every other
//! algorithm are refused. The secret is the rule's `data`, else the process master key
//! (`JWT_KEY`, else `master_key`) from the [`Keys`] built at start and handed to every compile.
//!
//! The `araleztoken` parameter is removed from the target before the request goes on, so a
//! backend never sees the token in its URL.

use http::header;
use http::uri::Uri;
use http::Request;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::jwt_cache;

use super::keys::Keys;
use crate::vocab::ProxyError;

use crate::vocab::token_param::{strip_query_param, QUERY_PARAM};

/// The claim we read back: when the token stops being valid. A NumericDate is any JSON number
/// (RFC 7519 §2): `exp: 1700000000.5`, as issuers that add a lifetime to a clock's fraction
/// write it, was refused when read as a whole number.
#[derive(serde::Deserialize)]
struct Expiry {
    exp: f64,
}

impl Expiry {
    /// The last whole second the token is valid before (as the cache of verified tokens keeps
    /// it); a fraction is cut, so a token is never held valid longer than it says.
    fn whole_seconds(&self) -> u64 {
        self.exp.floor() as u64
    }
}

enum Secret {
    /// The rule's own secret (or the master key) and its fingerprint.
    Key(DecodingKey, u64),
    /// No `data` and no master key: every request is refused with [`ProxyError::NoJwtSecret`].
    Missing,
}

/// A compiled `jwt` rule.
pub struct Jwt {
    secret: Secret,
    validation: Validation,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let has_key = matches!(self.secret, Secret::Key(..));
        f.debug_struct("Jwt").field("has_key", &has_key).finish()
    }
}

impl Jwt {
    /// A rule checking with `secret`, else with the master key of `keys`.
    pub fn new(secret: Option<&str>, keys: &Keys) -> Jwt {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        // A token is not valid before its `nbf`, when it has one.
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        let secret = match (secret, keys.jwt_master()) {
            (Some(s), _) => Secret::Key(
                DecodingKey::from_secret(s.as_bytes()),
                jwt_cache::fingerprint(s.as_bytes()),
            ),
            (None, Some((key, fingerprint))) => Secret::Key(key.clone(), fingerprint),
            (None, None) => Secret::Missing,
        };
        Jwt { secret, validation }
    }

    /// Accepts the request or says why not; strips `araleztoken` from an accepted request.
    pub fn check<B>(&self, req: &mut Request<B>) -> Result<(), ProxyError> {
        let (key, fingerprint) = match &self.secret {
            Secret::Key(key, fingerprint) => (key, *fingerprint),
            Secret::Missing => {
                tracing::error!("a jwt route has no secret: set its data, master_key or JWT_KEY");
                return Err(ProxyError::NoJwtSecret);
            }
        };
        let token = bearer(req).or_else(|| query_token(req.uri()));
        let Some(token) = token else {
            return Err(ProxyError::TokenRequired);
        };
        let now = jwt_cache::unix_now();
        if !jwt_cache::is_verified(fingerprint, token, now) {
            match jsonwebtoken::decode::<Expiry>(token, key, &self.validation) {
                Ok(_) if names_critical_extensions(token) => {
                    tracing::debug!("token refused: it names critical extensions (`crit`)");
                    return Err(ProxyError::TokenRequired);
                }
                // jsonwebtoken passes `exp == now`; RFC 7519 §4.1.4 wants now before it, as
                // the cache of verified tokens checks.
                Ok(data) if data.claims.exp <= now as f64 => {
                    tracing::debug!("token refused: it expires this second");
                    return Err(ProxyError::TokenRequired);
                }
                Ok(data) => jwt_cache::remember(fingerprint, token, data.claims.whole_seconds()),
                Err(e) => {
                    tracing::debug!("token refused: {e}");
                    return Err(ProxyError::TokenRequired);
                }
            }
        }
        if let Some(stripped) = strip_query_param(req.uri(), QUERY_PARAM) {
            *req.uri_mut() = stripped;
        }
        Ok(())
    }
}

/// Whether a (verified) token's header has `crit`: extensions it says must be understood,
/// none of which this checker knows, so the token must be refused (RFC 7515 §4.1.11).
fn names_critical_extensions(token: &str) -> bool {
    use base64::Engine as _;
    let Some(header) = token.split('.').next() else {
        return true;
    };
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return true;
    };
    match serde_json::from_slice::<serde_json::Value>(&json) {
        Ok(header) => header.get("crit").is_some(),
        Err(_) => true,
    }
}

fn bearer<B>(req: &Request<B>) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn query_token(uri: &Uri) -> Option<&str> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(QUERY_PARAM)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine as _;
    use jsonwebtoken::{encode, EncodingKey, Header};

    pub fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    /// An HS256 token with the given claims JSON.
    pub fn hs256(secret: &str, claims: &serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    /// A token with a hand-written header (for `alg: none` and RS256), signed with HMAC anyway.
    pub fn forged(alg: &str, claims: &serde_json::Value, signature: &str) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(format!("{{\"alg\":\"{alg}\",\"typ\":\"JWT\"}}"));
        let body = b64.encode(claims.to_string());
        format!("{header}.{body}.{signature}")
    }

    fn check(jwt: &Jwt, uri: &str, auth: Option<&str>) -> (Result<(), ProxyError>, String) {
        let mut req = Request::builder().uri(uri);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let mut req = req.body(()).unwrap();
        let result = jwt.check(&mut req);
        (result, req.uri().to_string())
    }

    #[test]
    fn tokens_accepted_and_refused() {
        let jwt = Jwt::new(Some("k1"), &Keys::for_tests(None));
        let exp = now() + 600;
        let good = hs256("k1", &serde_json::json!({"sub": "ann", "exp": exp}));
        let other_secret = hs256("k2", &serde_json::json!({"exp": exp}));
        let expired = hs256("k1", &serde_json::json!({"exp": now() - 5}));
        let expiring = hs256("k1", &serde_json::json!({"exp": now()}));
        let early = hs256("k1", &serde_json::json!({"exp": exp, "nbf": now() + 300}));
        let begun = hs256("k1", &serde_json::json!({"exp": exp, "nbf": now() - 5}));
        let no_exp = hs256("k1", &serde_json::json!({"sub": "ann"}));
        let none = forged("none", &serde_json::json!({"exp": exp}), "");
        let rs256 = {
            let signed = hs256("k1", &serde_json::json!({"exp": exp}));
            let sig = signed.rsplit('.').next().unwrap().to_string();
            forged("RS256", &serde_json::json!({"exp": exp}), &sig)
        };
        let critical = {
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let header = b64.encode(r#"{"alg":"HS256","typ":"JWT","crit":["x-new"],"x-new":1}"#);
            let body = b64.encode(serde_json::json!({"exp": exp}).to_string());
            let signed = format!("{header}.{body}");
            let key = EncodingKey::from_secret(b"k1");
            let signature = jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256);
            format!("{signed}.{}", signature.unwrap())
        };
        let bearer = |t: &str| format!("Bearer {t}");
        assert_eq!(check(&jwt, "/", Some(&bearer(&good))).0, Ok(()));
        assert_eq!(check(&jwt, "/", Some(&bearer(&begun))).0, Ok(()));
        // A NumericDate with a fraction (RFC 7519 §2) is a date like any other.
        let fraction = hs256("k1", &serde_json::json!({"exp": exp as f64 + 0.5}));
        assert_eq!(check(&jwt, "/", Some(&bearer(&fraction))).0, Ok(()));
        let past_fraction = hs256("k1", &serde_json::json!({"exp": now() as f64 - 3.5}));
        let refused = check(&jwt, "/", Some(&bearer(&past_fraction))).0;
        assert_eq!(
            refused,
            Err(ProxyError::TokenRequired),
            "expired, with a fraction"
        );
        for (name, token) in [
            ("wrong secret", &other_secret),
            ("expired", &expired),
            ("expiring this second", &expiring),
            ("not yet valid", &early),
            ("no exp", &no_exp),
            ("alg none", &none),
            ("RS256", &rs256),
            ("crit", &critical),
        ] {
            assert_eq!(
                check(&jwt, "/", Some(&bearer(token))).0,
                Err(ProxyError::TokenRequired),
                "{name}"
            );
        }
        assert_eq!(check(&jwt, "/", None).0, Err(ProxyError::TokenRequired));
        assert_eq!(
            check(&jwt, "/", Some("Bearer ")).0,
            Err(ProxyError::TokenRequired)
        );
    }

    #[test]
    fn query_token_is_accepted_and_stripped() {
        let jwt = Jwt::new(Some("k1"), &Keys::for_tests(None));
        let good = hs256("k1", &serde_json::json!({"exp": now() + 60}));
        let (res, uri) = check(&jwt, &format!("/a?x=1&araleztoken={good}&y=2"), None);
        assert_eq!(res, Ok(()));
        assert_eq!(uri, "/a?x=1&y=2");
        let (res, uri) = check(&jwt, &format!("/a?araleztoken={good}"), None);
        assert_eq!((res, uri.as_str()), (Ok(()), "/a"));
        let (res, _) = check(&jwt, "/a?araleztoken=nope", None);
        assert_eq!(res, Err(ProxyError::TokenRequired));
    }

    #[test]
    fn strip_keeps_lookalikes() {
        let uri: Uri = "/p?araleztokenx=1&araleztoken&b=2".parse().unwrap();
        assert_eq!(
            strip_query_param(&uri, QUERY_PARAM).unwrap().to_string(),
            "/p?araleztokenx=1&b=2"
        );
        assert!(strip_query_param(&"/p?a=1".parse().unwrap(), QUERY_PARAM).is_none());
        assert!(strip_query_param(&"/p".parse().unwrap(), QUERY_PARAM).is_none());
    }
}
