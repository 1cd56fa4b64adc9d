//! DNS-01 (RFC 8555 §8.4) through a DNS provider's API, as Aralez's `acme_dns_provider`
//! names it: Cloudflare, Route 53 or DigitalOcean, each configured by the environment
//! variables Aralez reads. [`DnsApi::publish`] puts up every value of one
//! `_acme-challenge.<name>` TXT record set (a name and its wildcard share one set),
//! [`lookup::wait_visible`] waits until a resolver answers with them, and
//! [`DnsApi::withdraw`] takes them down after the order, whatever its outcome.

mod cloudflare;
mod digitalocean;
pub mod lookup;
mod route53;
mod sigv4;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;

use crate::config::acme_conf::DnsProvider;
use crate::upstream::call::{self, Answer, Target};

/// One call to a provider's API may take this long.
const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// A provider's answer is read up to this many bytes (a DigitalOcean domain list is the
/// largest).
const MAX_ANSWER: usize = 1024 * 1024;
/// The TTL asked for the TXT records.
const TTL: u32 = 60;

/// Why the provider could not publish or withdraw a record.
#[derive(Debug, thiserror::Error)]
#[error("{provider}: {what}")]
pub struct DnsError {
    pub provider: &'static str,
    pub what: String,
}

/// A configured provider's API.
#[derive(Debug)]
pub enum DnsApi {
    Cloudflare(cloudflare::Cloudflare),
    Route53(route53::Route53),
    DigitalOcean(digitalocean::DigitalOcean),
}

/// What was published, to withdraw after the order.
#[derive(Debug)]
pub struct Published {
    /// The record name (`_acme-challenge.example.com`).
    pub name: String,
    values: Vec<String>,
    /// The provider's ids of the records (Cloudflare, DigitalOcean).
    ids: Vec<String>,
    /// DigitalOcean's zone of the record.
    zone: Option<String>,
}

impl DnsApi {
    /// The provider's API as the environment (`env`) configures it.
    pub fn from_env(
        provider: DnsProvider,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<DnsApi, DnsError> {
        let failed = |what: String| DnsError {
            provider: provider.name(),
            what,
        };
        if let Some(names) = provider.env_missing(&env) {
            let names = names.replace('|', " or ");
            return Err(failed(format!("{names} is not set in the environment")));
        }
        let get = |name: &str| env(name).map(|v| v.trim().to_string()).unwrap_or_default();
        let target = |var: &str, default: &str| {
            let url = env(var).unwrap_or_else(|| default.to_string());
            Target::parse(&url).map_err(|e| failed(format!("{var}: {e}")))
        };
        Ok(match provider {
            DnsProvider::Cloudflare => DnsApi::Cloudflare(cloudflare::Cloudflare {
                api: target("CLOUDFLARE_BASE_URL", cloudflare::BASE_URL)?,
                token: get("CLOUDFLARE_API_TOKEN"),
                zone_id: get("CLOUDFLARE_ZONE_ID"),
            }),
            DnsProvider::Route53 => DnsApi::Route53(route53::Route53 {
                api: target("AWS_ENDPOINT_URL_ROUTE_53", route53::BASE_URL)?,
                zone_id: route53::zone_id_of(&get("AWS_HOSTED_ZONE_ID")),
                credentials: sigv4::Credentials {
                    access_key: get("AWS_ACCESS_KEY_ID"),
                    secret_key: get("AWS_SECRET_ACCESS_KEY"),
                    session_token: env("AWS_SESSION_TOKEN").filter(|t| !t.trim().is_empty()),
                },
            }),
            DnsProvider::DigitalOcean => DnsApi::DigitalOcean(digitalocean::DigitalOcean {
                api: target("DIGITALOCEAN_BASE_URL", digitalocean::BASE_URL)?,
                token: env("DIGITALOCEAN_TOKEN")
                    .filter(|t| !t.trim().is_empty())
                    .unwrap_or_else(|| get("DO_AUTH_TOKEN")),
            }),
        })
    }

    fn provider(&self) -> &'static str {
        match self {
            DnsApi::Cloudflare(_) => "cloudflare",
            DnsApi::Route53(_) => "route53",
            DnsApi::DigitalOcean(_) => "digitalocean",
        }
    }

    /// Publishes `values` as the TXT record set `name` (no trailing dot).
    pub async fn publish(&self, name: &str, values: &[String]) -> Result<Published, DnsError> {
        let mut published = Published {
            name: name.to_string(),
            values: values.to_vec(),
            ids: Vec::new(),
            zone: None,
        };
        let outcome = match self {
            DnsApi::Cloudflare(api) => api.publish(&mut published).await,
            DnsApi::Route53(api) => api.change(&published, "UPSERT").await,
            DnsApi::DigitalOcean(api) => api.publish(&mut published).await,
        };
        match outcome {
            Ok(()) => Ok(published),
            Err(what) => {
                // Whatever was created before the failure is taken down again.
                self.withdraw(&published).await;
                Err(self.error(what))
            }
        }
    }

    /// Takes down what [`publish`](Self::publish) put up; a failure is logged, not returned
    /// (the order's outcome does not depend on it).
    pub async fn withdraw(&self, published: &Published) {
        let outcome = match self {
            DnsApi::Cloudflare(api) => api.withdraw(published).await,
            DnsApi::Route53(api) if !published.values.is_empty() => {
                api.change(published, "DELETE").await
            }
            DnsApi::Route53(_) => Ok(()),
            DnsApi::DigitalOcean(api) => api.withdraw(published).await,
        };
        if let Err(what) = outcome {
            let e = self.error(what);
            tracing::warn!(record = %published.name, "acme: the DNS-01 record was not removed: {e}");
        }
    }

    fn error(&self, what: String) -> DnsError {
        DnsError {
            provider: self.provider(),
            what,
        }
    }
}

/// A request to `api` with `headers` and `body`; the answer, whatever its status.
async fn request(
    api: &Target,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, String> {
    let mut req = Request::builder().method(method).uri(api.path(path));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    call::send(api, req, true, CALL_DEADLINE, MAX_ANSWER).await
}

/// A JSON request with a bearer token (Cloudflare, DigitalOcean); the answer's status and
/// JSON (`null` when the body is empty or not JSON).
async fn json_request(
    api: &Target,
    method: Method,
    path: &str,
    token: &str,
    body: Option<serde_json::Value>,
) -> Result<(http::StatusCode, serde_json::Value), String> {
    let bearer = format!("Bearer {token}");
    let mut headers = vec![("authorization", bearer.as_str())];
    let body = match body {
        Some(json) => {
            headers.push(("content-type", "application/json"));
            Bytes::from(json.to_string())
        }
        None => Bytes::new(),
    };
    let answer = request(api, method, path, &headers, body).await?;
    let json = serde_json::from_slice(&answer.body).unwrap_or(serde_json::Value::Null);
    Ok((answer.status, json))
}
