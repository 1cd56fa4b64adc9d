//! DigitalOcean's domain records API (v2): `DIGITALOCEAN_TOKEN` (or lego's `DO_AUTH_TOKEN`),
//! `DIGITALOCEAN_BASE_URL` for another endpoint. The record's zone is the longest of the
//! account's domains (`GET /domains`) that the name falls under; one record per value, `POST
//! /domains/<zone>/records` with the name relative to the zone, removed with `DELETE
//! /domains/<zone>/records/<id>`.

use http::{Method, StatusCode};
use serde_json::json;

use super::{json_request, Published, TTL};
use crate::upstream::call::Target;

pub const BASE_URL: &str = "https://api.digitalocean.com/v2";

#[derive(Debug)]
pub struct DigitalOcean {
    pub api: Target,
    pub token: String,
}

impl DigitalOcean {
    pub async fn publish(&self, published: &mut Published) -> Result<(), String> {
        let zone = self.zone_of(&published.name).await?;
        let relative = relative_name(&published.name, &zone);
        let path = format!("/domains/{zone}/records");
        published.zone = Some(zone);
        for value in &published.values {
            let record = json!({ "type": "TXT", "name": relative, "data": value, "ttl": TTL });
            let (status, answer) =
                json_request(&self.api, Method::POST, &path, &self.token, Some(record)).await?;
            let id = &answer["domain_record"]["id"];
            let id = id
                .as_u64()
                .map(|n| n.to_string())
                .or_else(|| id.as_str().map(str::to_string));
            match id {
                Some(id) if status.is_success() => published.ids.push(id),
                _ => {
                    return Err(format!(
                        "creating {}: {status} {}",
                        published.name,
                        message(&answer)
                    ))
                }
            }
        }
        Ok(())
    }

    pub async fn withdraw(&self, published: &Published) -> Result<(), String> {
        let Some(zone) = &published.zone else {
            return Ok(());
        };
        for id in &published.ids {
            let path = format!("/domains/{zone}/records/{id}");
            let (status, answer) =
                json_request(&self.api, Method::DELETE, &path, &self.token, None).await?;
            if !status.is_success() && status != StatusCode::NOT_FOUND {
                return Err(format!(
                    "deleting record {id}: {status} {}",
                    message(&answer)
                ));
            }
        }
        Ok(())
    }

    /// The longest of the account's domains that `name` is in.
    async fn zone_of(&self, name: &str) -> Result<String, String> {
        let (status, answer) = json_request(
            &self.api,
            Method::GET,
            "/domains?per_page=200",
            &self.token,
            None,
        )
        .await?;
        if !status.is_success() {
            return Err(format!("listing domains: {status} {}", message(&answer)));
        }
        let domains = answer["domains"].as_array().cloned().unwrap_or_default();
        domains
            .iter()
            .filter_map(|d| d["name"].as_str())
            .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
            .filter(|zone| name == zone || name.ends_with(&format!(".{zone}")))
            .max_by_key(String::len)
            .ok_or_else(|| format!("no domain of this account holds {name}"))
    }
}

/// `name` relative to `zone` (`@` for the zone itself).
fn relative_name(name: &str, zone: &str) -> String {
    match name.strip_suffix(zone).and_then(|n| n.strip_suffix('.')) {
        Some(relative) if !relative.is_empty() => relative.to_string(),
        _ => "@".to_string(),
    }
}

/// DigitalOcean's error `message`.
fn message(answer: &serde_json::Value) -> String {
    answer["message"]
        .as_str()
        .unwrap_or("(no message)")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_relative_to_their_zone() {
        assert_eq!(
            relative_name("_acme-challenge.a.example.com", "example.com"),
            "_acme-challenge.a"
        );
        assert_eq!(relative_name("example.com", "example.com"), "@");
    }
}
