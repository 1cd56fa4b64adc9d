//! Who may use the admin API: the master key, compared in constant time.

use http::{header, Request};

use crate::layers::auth::ct_eq;

/// The key a request presents: `x-api-key`, `Authorization: Bearer`, or (old clients) `?key=`.
pub fn presented_key<B>(req: &Request<B>) -> Option<String> {
    if let Some(v) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.to_string());
    }
    if let Some(v) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        // The scheme's name is case-insensitive (RFC 9110 §11.1), as the jwt layer reads it.
        let (scheme, token) = v.split_once(' ').unwrap_or((v, ""));
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(token.trim().to_string());
        }
    }
    req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("key="))
            .map(percent_decode)
    })
}

/// A query value: `+` is a space, then every `%XX` decoded.
fn percent_decode(text: &str) -> String {
    let decoded = crate::vocab::normalise::percent_decode(&text.replace('+', " "));
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The outcome of checking a request's key.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    Granted,
    /// No master key is configured: the API refuses everything that needs one.
    NoMasterKey,
    Denied,
}

pub fn check<B>(req: &Request<B>, master_key: Option<&str>) -> Access {
    let Some(master) = master_key else {
        return Access::NoMasterKey;
    };
    match presented_key(req) {
        Some(key) if ct_eq(key.as_bytes(), master.as_bytes()) => Access::Granted,
        _ => Access::Denied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_from_each_place() {
        let req = |f: fn(http::request::Builder) -> http::request::Builder| {
            f(Request::builder().uri("/status")).body(()).unwrap()
        };
        assert_eq!(
            check(&req(|b| b.header("x-api-key", "s3cret")), Some("s3cret")),
            Access::Granted
        );
        assert_eq!(
            check(
                &req(|b| b.header("authorization", "Bearer s3cret")),
                Some("s3cret")
            ),
            Access::Granted
        );
        assert_eq!(
            check(
                &req(|b| b.header("authorization", "BEARER s3cret")),
                Some("s3cret")
            ),
            Access::Granted,
            "the scheme's name in any case"
        );
        let by_query = Request::builder()
            .uri("/status?all&key=s3%63ret")
            .body(())
            .unwrap();
        assert_eq!(check(&by_query, Some("s3cret")), Access::Granted);
        assert_eq!(
            check(&req(|b| b.header("x-api-key", "wrong")), Some("s3cret")),
            Access::Denied
        );
        assert_eq!(check(&req(|b| b), Some("s3cret")), Access::Denied);
        assert_eq!(
            check(&req(|b| b.header("x-api-key", "x")), None),
            Access::NoMasterKey
        );
    }
}
