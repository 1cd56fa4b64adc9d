//! JWT extraction and verification on arbitrary requests: a token in `Authorization: Bearer`,
//! in `?araleztoken=` or both, made of the fuzzer's bytes. Nothing may panic, and a request is
//! accepted only with a token signed by the route's secret that has not expired.
#![no_main]

use aralez::layers::jwt::Jwt;
use aralez::layers::keys::Keys;
use http::{header, HeaderValue, Request, Uri};
use libfuzzer_sys::fuzz_target;

const SECRET: &str = "fuzz-secret";

fuzz_target!(|data: &[u8]| {
    let Some((&how, token)) = data.split_first() else {
        return;
    };
    let jwt = Jwt::new(Some(SECRET), &Keys::new(None));
    let mut req = Request::new(());
    if how & 1 == 1 {
        let Ok(value) = HeaderValue::from_bytes(&[b"Bearer ", token].concat()) else {
            return;
        };
        req.headers_mut().insert(header::AUTHORIZATION, value);
    }
    if how & 2 == 2 {
        let target = [b"/p?a=1&araleztoken=", token].concat();
        let Ok(uri) = Uri::try_from(target) else {
            return;
        };
        *req.uri_mut() = uri;
    }
    // What the request presents: the header as sent, and the query as the URI parser kept it (a
    // `#fragment` is not part of it, so the fuzzer's bytes after a `#` never reach the check).
    let presented = [
        req.headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec()),
        req.uri().query().map(|q| q.as_bytes().to_vec()),
    ];
    if jwt.check(&mut req).is_ok() {
        // Only a real signature gets here, and the fuzzer cannot forge HMAC-SHA256.
        assert!(
            presented
                .iter()
                .flatten()
                .any(|p| std::str::from_utf8(p).is_ok_and(|t| t.matches('.').count() >= 2)),
            "accepted a request with no JWT in it: {presented:?}"
        );
        // No `araleztoken` parameter is left (the text may still appear inside another
        // parameter's value).
        let left = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .any(|p| p == "araleztoken" || p.starts_with("araleztoken="));
        assert!(!left, "the accepted token was left in the query");
    }
});
