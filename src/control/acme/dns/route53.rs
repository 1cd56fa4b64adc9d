//! Amazon Route 53's REST API (2013-04-01), signed with SigV4: `AWS_HOSTED_ZONE_ID` (as Aralez
//! reads it) and the access keys; `AWS_ENDPOINT_URL_ROUTE_53` for another endpoint, as the AWS
//! SDKs read it. A record set's values go up in one `UPSERT` change (`POST
//! /2013-04-01/hostedzone/<zone>/rrset/`), which is waited for until `INSYNC` (`GET
//! /2013-04-01/change/<id>`), and come down with a `DELETE` of the same set.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::Method;

use super::sigv4::{self, Credentials, Signing};
use super::{request, Published, TTL};
use crate::upstream::call::{Answer, Target};
use crate::utc::UtcTime;

pub const BASE_URL: &str = "https://route53.amazonaws.com";
/// Route 53 is signed for us-east-1 whatever the caller's region.
const REGION: &str = "us-east-1";
/// How long a change may take to reach every Route 53 server.
const INSYNC_WITHIN: Duration = Duration::from_secs(120);
const POLL_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct Route53 {
    pub api: Target,
    pub zone_id: String,
    pub credentials: Credentials,
}

/// `Z123` from `Z123` or `/hostedzone/Z123`.
pub fn zone_id_of(text: &str) -> String {
    text.trim().trim_start_matches("/hostedzone/").to_string()
}

impl Route53 {
    /// One change of the record set (`UPSERT` or `DELETE`); an `UPSERT` returns once in sync.
    pub async fn change(&self, published: &Published, action: &str) -> Result<(), String> {
        let path = format!("/2013-04-01/hostedzone/{}/rrset/", self.zone_id);
        let body = change_batch(action, &published.name, &published.values);
        let answer = self.signed(Method::POST, &path, Bytes::from(body)).await?;
        if !answer.status.is_success() {
            let what = format!("{action} {}", published.name);
            return Err(format!("{what}: {} {}", answer.status, aws_error(&answer)));
        }
        if action == "DELETE" {
            return Ok(());
        }
        let text = answer.text();
        let id = tag_text(&text, "Id").ok_or("the change's answer has no Id")?;
        let id = id.trim_start_matches("/change/").to_string();
        self.wait_insync(&id).await
    }

    async fn wait_insync(&self, id: &str) -> Result<(), String> {
        let path = format!("/2013-04-01/change/{id}");
        let deadline = tokio::time::Instant::now() + INSYNC_WITHIN;
        loop {
            let answer = self.signed(Method::GET, &path, Bytes::new()).await?;
            let text = answer.text();
            if answer.status.is_success() && tag_text(&text, "Status") == Some("INSYNC") {
                return Ok(());
            }
            if !answer.status.is_success() {
                return Err(format!(
                    "change {id}: {} {}",
                    answer.status,
                    aws_error(&answer)
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("change {id} not in sync within {INSYNC_WITHIN:?}"));
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    async fn signed(&self, method: Method, path: &str, body: Bytes) -> Result<Answer, String> {
        let what = Signing {
            method: method.as_str(),
            host: self.api.host_header(),
            path: &self.api.path(path),
            query: "",
            payload: &body,
            region: REGION,
            service: "route53",
        };
        let signed = sigv4::sign(&what, &self.credentials, UtcTime::of(SystemTime::now()));
        let mut headers: Vec<(&str, &str)> = signed.iter().map(|(n, v)| (*n, v.as_str())).collect();
        if !body.is_empty() {
            headers.push(("content-type", "text/xml"));
        }
        request(&self.api, method, path, &headers, body).await
    }
}

/// A `ChangeResourceRecordSetsRequest` of one change to the TXT set `name`.
fn change_batch(action: &str, name: &str, values: &[String]) -> String {
    let records: String = values
        .iter()
        .map(|v| {
            format!(
                "<ResourceRecord><Value>\"{}\"</Value></ResourceRecord>",
                escape(v)
            )
        })
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ChangeResourceRecordSetsRequest xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><ChangeBatch><Comment>aralez ACME DNS-01</Comment><Changes><Change><Action>{action}</Action><ResourceRecordSet><Name>{}.</Name><Type>TXT</Type><TTL>{TTL}</TTL><ResourceRecords>{records}</ResourceRecords></ResourceRecordSet></Change></Changes></ChangeBatch></ChangeResourceRecordSetsRequest>",
        escape(name)
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The text of the first `<tag>...</tag>` in `xml`.
fn tag_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{tag}>"))?;
    Some(xml[start..start + end].trim())
}

/// An AWS error answer's `Code: Message`.
fn aws_error(answer: &Answer) -> String {
    let text = answer.text();
    match (tag_text(&text, "Code"), tag_text(&text, "Message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => text.chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_batches_and_answers() {
        let xml = change_batch(
            "UPSERT",
            "_acme-challenge.a.test",
            &["v1".into(), "v2".into()],
        );
        assert!(xml.contains("<Action>UPSERT</Action>"));
        assert!(xml.contains("<Name>_acme-challenge.a.test.</Name>"));
        assert!(xml.contains(
            "<Value>\"v1\"</Value></ResourceRecord><ResourceRecord><Value>\"v2\"</Value>"
        ));
        let answer = "<ChangeResourceRecordSetsResponse><ChangeInfo><Id>/change/C2682N5HXP0BZ4</Id><Status>PENDING</Status></ChangeInfo></ChangeResourceRecordSetsResponse>";
        assert_eq!(tag_text(answer, "Id"), Some("/change/C2682N5HXP0BZ4"));
        assert_eq!(zone_id_of("/hostedzone/Z1D633PJN98FT9"), "Z1D633PJN98FT9");
    }
}
