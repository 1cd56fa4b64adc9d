//! `POST /cache/purge` (master key): drops stored answers, by URL (`{"url":
//! "http://host/path?query"}`: that entry and all its `Vary` variants) or by host and path
//! prefix (`{"host": "host", "prefix": "/path"}`: both schemes, whole segments). Answers 200
//! with `{"purged": N}`, the number of stored answers removed; 503 with the count and an
//! `error` when Redis, the shared tier, did not answer (the purge is not whole: run it again).

use http::StatusCode;
use serde::Deserialize;

use crate::layers::cache::{key_for, Store};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Purge {
    url: Option<String>,
    host: Option<String>,
    prefix: Option<String>,
}

/// Runs a purge request's JSON `body` against `store`: the status and the JSON to answer.
pub async fn purge(store: Option<&Store>, body: &[u8]) -> (StatusCode, String) {
    let Some(store) = store else {
        return refuse(
            StatusCode::NOT_FOUND,
            "no cache is configured (main.yaml `cache:`)",
        );
    };
    let request: Purge = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                &format!("expected JSON {{url}} or {{host, prefix}}: {e}"),
            )
        }
    };
    let purged = match (request.url, request.host) {
        (Some(url), None) => match url_key(&url) {
            Some(key) => store.purge_key(&key).await,
            None => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "url must be http(s)://host/path[?query]",
                )
            }
        },
        (None, Some(host)) => {
            let mut buf = [0u8; crate::vocab::normalise::MAX_HOST];
            let Some(host) = crate::vocab::normalise::host(host.as_bytes(), &mut buf) else {
                return refuse(StatusCode::BAD_REQUEST, "host is not a host name");
            };
            let prefix = request.prefix.unwrap_or_else(|| "/".to_string());
            if !prefix.starts_with('/') {
                return refuse(StatusCode::BAD_REQUEST, "prefix must start with /");
            }
            store.purge_prefix(host, &prefix).await
        }
        _ => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "give either url, or host (and prefix)",
            )
        }
    };
    if purged.shared_unreached {
        let error = "Redis, the cache's shared tier, did not answer: the answers stored there, \
                     and in the other instances' memory, may still be served; purge again";
        tracing::warn!("cache purge: {error}");
        let body = serde_json::json!({ "purged": purged.removed, "error": error });
        return (StatusCode::SERVICE_UNAVAILABLE, body.to_string());
    }
    (
        StatusCode::OK,
        serde_json::json!({ "purged": purged.removed }).to_string(),
    )
}

fn url_key(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let https = match uri.scheme_str()? {
        "https" => true,
        "http" => false,
        _ => return None,
    };
    let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
    key_for(https, uri.authority()?.as_str().as_bytes(), target)
}

fn refuse(status: StatusCode, why: &str) -> (StatusCode, String) {
    (status, serde_json::json!({ "error": why }).to_string())
}
