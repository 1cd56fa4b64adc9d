//! AWS Signature Version 4 for the Route 53 calls: the canonical request, the string to sign
//! and the derived signing key (HMAC-SHA256 over date, region, service), from the access key
//! pair in the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, and
//! `AWS_SESSION_TOKEN` for temporary credentials). Signs `host`, `x-amz-date` and, when set,
//! `x-amz-security-token`.

use aws_lc_rs::{digest, hmac};

use crate::utc::UtcTime;

/// An access key pair.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, secret hidden)", self.access_key)
    }
}

/// What is signed.
pub struct Signing<'a> {
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub payload: &'a [u8],
    pub region: &'a str,
    pub service: &'a str,
}

/// The headers to send with the request: `x-amz-date`, `x-amz-security-token` (with a session
/// token) and `authorization`.
pub fn sign(what: &Signing<'_>, creds: &Credentials, now: UtcTime) -> Vec<(&'static str, String)> {
    let date = format!("{:04}{:02}{:02}", now.year, now.month, now.day);
    let amz_date = format!("{date}T{:02}{:02}{:02}Z", now.hour, now.minute, now.second);
    let mut headers = vec![
        ("host", what.host.to_string()),
        ("x-amz-date", amz_date.clone()),
    ];
    if let Some(token) = &creds.session_token {
        headers.push(("x-amz-security-token", token.clone()));
    }
    let signed_headers: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
    let signed_headers = signed_headers.join(";");
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{}\n", value.trim()))
        .collect();
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        what.method,
        encode_path(what.path),
        what.query,
        hex(digest::digest(&digest::SHA256, what.payload).as_ref()),
    );
    let scope = format!("{date}/{}/{}/aws4_request", what.region, what.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let key = [date.as_str(), what.region, what.service, "aws4_request"]
        .iter()
        .fold(
            format!("AWS4{}", creds.secret_key).into_bytes(),
            |key, part| mac(&key, part.as_bytes()),
        );
    let signature = hex(&mac(&key, string_to_sign.as_bytes()));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key
    );
    headers.remove(0); // `host` is sent by the caller.
    headers.push(("authorization", authorization));
    headers
}

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The path with every byte outside RFC 3986's unreserved set (and `/`) percent-encoded.
fn encode_path(path: &str) -> String {
    use std::fmt::Write as _;
    path.bytes()
        .fold(String::with_capacity(path.len()), |mut s, b| {
            if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                s.push(b as char);
            } else {
                let _ = write!(s, "%{b:02X}");
            }
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature computed independently (botocore's `SigV4Auth`, the AWS SDK for Python's
    /// signer) for the same request, keys and moment.
    #[test]
    fn signs_as_the_aws_sdk_does() {
        let creds = Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let body = b"<ChangeResourceRecordSetsRequest/>";
        let what = Signing {
            method: "POST",
            host: "route53.amazonaws.com",
            path: "/2013-04-01/hostedzone/Z1D633PJN98FT9/rrset/",
            query: "",
            payload: body,
            region: "us-east-1",
            service: "route53",
        };
        let now =
            UtcTime::of(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160));
        let headers = sign(&what, &creds, now);
        assert_eq!(headers[0], ("x-amz-date", "20150830T123600Z".to_string()));
        assert_eq!(
            headers[1].1,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/route53/aws4_request, SignedHeaders=host;x-amz-date, Signature=452e3acefda6f400123bae60bc6356947a4b053bd4b86590ce2c9027782d6802"
        );
    }
}
