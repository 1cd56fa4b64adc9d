//! Cloudflare's DNS records API (v4): `CLOUDFLARE_API_TOKEN` (a bearer token with DNS edit
//! rights) and `CLOUDFLARE_ZONE_ID`, as Aralez reads them; `CLOUDFLARE_BASE_URL` for another
//! endpoint. One record per value: `POST /zones/<zone>/dns_records`, removed with `DELETE
//! /zones/<zone>/dns_records/<id>`; an answer's `success: false` carries `errors`.

use http::Method;
use serde_json::json;

use super::{json_request, Published, TTL};
use crate::upstream::call::Target;

pub const BASE_URL: &str = "https://api.cloudflare.com/client/v4";

#[derive(Debug)]
pub struct Cloudflare {
    pub api: Target,
    pub token: String,
    pub zone_id: String,
}

impl Cloudflare {
    pub async fn publish(&self, published: &mut Published) -> Result<(), String> {
        let path = format!("/zones/{}/dns_records", self.zone_id);
        for value in &published.values {
            let record =
                json!({ "type": "TXT", "name": published.name, "content": value, "ttl": TTL });
            let (status, answer) =
                json_request(&self.api, Method::POST, &path, &self.token, Some(record)).await?;
            let id = answer["result"]["id"]
                .as_str()
                .filter(|_| succeeded(&answer));
            let Some(id) = id else {
                return Err(format!(
                    "creating {}: {status} {}",
                    published.name,
                    errors(&answer)
                ));
            };
            published.ids.push(id.to_string());
        }
        Ok(())
    }

    pub async fn withdraw(&self, published: &Published) -> Result<(), String> {
        for id in &published.ids {
            let path = format!("/zones/{}/dns_records/{id}", self.zone_id);
            let (status, answer) =
                json_request(&self.api, Method::DELETE, &path, &self.token, None).await?;
            if !succeeded(&answer) && status != http::StatusCode::NOT_FOUND {
                return Err(format!(
                    "deleting record {id}: {status} {}",
                    errors(&answer)
                ));
            }
        }
        Ok(())
    }
}

fn succeeded(answer: &serde_json::Value) -> bool {
    answer["success"].as_bool() == Some(true)
}

/// Cloudflare's `errors` as `code message` pairs.
fn errors(answer: &serde_json::Value) -> String {
    let listed: Vec<String> = answer["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| format!("{} {}", e["code"], e["message"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        "(no error listed)".to_string()
    } else {
        listed.join("; ")
    }
}
