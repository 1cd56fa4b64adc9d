//! The status page (`GET /` on the admin listener): one self-contained HTML document compiled
//! into the binary (status.html beside this file, inline CSS, script and SVG, no external
//! asset), served with a Content-Security-Policy that lets only its own inline script and style
//! run and lets it fetch only from the admin listener itself. The page polls
//! `/status?history` with the key it was opened with; the key check and the data live in the
//! admin API, not here.

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// The page, as compiled in.
pub const HTML: &str = include_str!("status.html");

/// The page with its security headers.
pub fn response() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(HTML.as_bytes())));
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    let mut set = |name, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    set(header::CONTENT_TYPE, "text/html; charset=utf-8");
    set(header::CONTENT_SECURITY_POLICY, &CSP);
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::CACHE_CONTROL, "no-store");
    // The key may be in the page's address: never send it on as a Referer.
    set(header::REFERRER_POLICY, "no-referrer");
    set(header::X_FRAME_OPTIONS, "DENY");
    resp
}

/// The page's policy, hashed once: the page is a constant.
static CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(content_security_policy);

/// Nothing but the page's own inline script and style (by hash), fetches to this listener,
/// and `data:` images; no frames, forms or base changes.
pub fn content_security_policy() -> String {
    format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash_of(between(HTML, "<script>", "</script>")),
        hash_of(between(HTML, "<style>", "</style>")),
    )
}

/// The text between the first `open` and the `close` after it (empty when absent).
fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    text.split_once(open)
        .and_then(|(_, rest)| rest.split_once(close))
        .map_or("", |(inside, _)| inside)
}

/// A CSP source expression for an inline block: `sha256-<base64 of its SHA-256>`.
fn hash_of(block: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, block.as_bytes());
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_inline_script_and_style_each_covered_by_the_policy() {
        assert_eq!(HTML.matches("<script").count(), 1, "one inline script");
        assert_eq!(HTML.matches("<style").count(), 1, "one inline style");
        assert!(
            !HTML.contains(" style=\""),
            "inline style attributes would be blocked"
        );
        let handler = HTML.split(" on").skip(1).any(|rest| {
            let name = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic());
            name.len() < rest.len() && name.starts_with('=')
        });
        assert!(!handler, "inline event handler attributes would be blocked");
        let csp = content_security_policy();
        assert!(csp.starts_with("default-src 'none'; script-src 'sha256-"));
        assert!(!between(HTML, "<script>", "</script>").is_empty());
        assert!(!between(HTML, "<style>", "</style>").is_empty());
        // The known SHA-256 of "abc".
        assert_eq!(
            hash_of("abc"),
            "sha256-ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        );
    }

    #[test]
    fn the_headers_forbid_sniffing_caching_and_framing() {
        let resp = response();
        let get = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
        assert_eq!(get(header::CONTENT_TYPE), Some("text/html; charset=utf-8"));
        assert_eq!(get(header::X_CONTENT_TYPE_OPTIONS), Some("nosniff"));
        assert_eq!(get(header::CACHE_CONTROL), Some("no-store"));
        assert_eq!(get(header::REFERRER_POLICY), Some("no-referrer"));
        assert_eq!(get(header::X_FRAME_OPTIONS), Some("DENY"));
        let csp = get(header::CONTENT_SECURITY_POLICY).unwrap_or_default();
        assert_eq!(csp, content_security_policy());
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    }
}
