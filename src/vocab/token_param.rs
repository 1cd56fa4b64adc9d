//! The `araleztoken` query parameter (SPEC §6.2, §8.2): a JWT may travel in it, and it is
//! removed from every request's target before the request goes on, so a token never reaches a
//! backend's URL.

use http::uri::{PathAndQuery, Uri};

/// Query parameter that may carry the token.
pub const QUERY_PARAM: &str = "araleztoken";

/// `uri` without every `name=...` (or bare `name`) query parameter; `None` if it had none.
pub fn strip_query_param(uri: &Uri, name: &str) -> Option<Uri> {
    let query = uri.query()?;
    let is_param =
        |pair: &str| pair == name || pair.strip_prefix(name).is_some_and(|r| r.starts_with('='));
    if !query.split('&').any(is_param) {
        return None;
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !is_param(p)).collect();
    let mut path_and_query = uri.path().to_string();
    if !kept.is_empty() {
        path_and_query.push('?');
        path_and_query.push_str(&kept.join("&"));
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = PathAndQuery::try_from(path_and_query).ok();
    Uri::from_parts(parts).ok()
}

/// Removes the token parameter from `uri`. The common case (no such text in the query) costs one
/// scan, inlined into the request path.
#[inline]
pub fn strip_from(uri: &mut Uri) {
    if uri.query().is_some_and(|q| q.contains(QUERY_PARAM)) {
        if let Some(stripped) = strip_query_param(uri, QUERY_PARAM) {
            *uri = stripped;
        }
    }
}
