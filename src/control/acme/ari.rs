//! ACME Renewal Information (RFC 9773): when the ACME server's directory offers
//! `renewalInfo`, each certificate's suggested renewal window is asked for (by its
//! `<keyIdentifier>.<serial>` identifier), a moment inside the window is picked (the same one
//! for as long as the window stays), and the window is asked for again after the server's
//! `Retry-After` (kept between a minute and six hours). A renewal then says which certificate
//! it replaces. A server without ARI, or an answer that fails, leaves the lifetime threshold
//! in charge.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use instant_acme::{Account, CertificateIdentifier};
use tokio::time::Instant;

use crate::utc::rfc3339;

const RECHECK_AT_LEAST: Duration = Duration::from_secs(60);
const RECHECK_AT_MOST: Duration = Duration::from_secs(6 * 3600);

/// What the server suggested for one certificate.
#[derive(Clone, Debug)]
pub struct Advice {
    /// The certificate it is about.
    pub id: CertificateIdentifier<'static>,
    /// When to renew: a moment inside the suggested window.
    pub renew_at: SystemTime,
    /// When to ask again.
    recheck: Instant,
}

/// The advice per set of names (by its first name); `None`: the server has no ARI.
#[derive(Debug, Default)]
pub struct Advisor {
    advice: Mutex<HashMap<String, (Option<Advice>, Instant)>>,
}

impl Advisor {
    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Option<Advice>, Instant)>> {
        self.advice.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets what was said about `first`'s certificate (it was just replaced).
    pub fn forget(&self, first: &str) {
        self.cache().remove(first);
    }

    /// The server's advice for the certificate at `crt` (of the set named `first`), asked
    /// again when due.
    pub async fn advice(&self, account: &Account, first: &str, crt: &Path) -> Option<Advice> {
        let id = certificate_id(crt)?;
        if let Some((advice, until)) = self.cache().get(first) {
            let same = advice.as_ref().is_none_or(|a| a.id == id);
            if same && Instant::now() < *until {
                return advice.clone();
            }
        }
        let (advice, until) = match account.renewal_info(&id).await {
            Ok((info, retry_after)) => {
                let window = &info.suggested_window;
                let (start, end) = (SystemTime::from(window.start), SystemTime::from(window.end));
                let recheck = Instant::now() + retry_after.clamp(RECHECK_AT_LEAST, RECHECK_AT_MOST);
                let renew_at = pick(start, end, &id);
                tracing::info!(domain = %first, "acme: the server suggests renewing between {} and {}", rfc3339(start), rfc3339(end));
                (
                    Some(Advice {
                        id,
                        renew_at,
                        recheck,
                    }),
                    recheck,
                )
            }
            Err(instant_acme::Error::Unsupported(_)) => (None, Instant::now() + RECHECK_AT_MOST),
            Err(e) => {
                tracing::warn!(domain = %first, "acme: renewal information not available: {e}");
                (None, Instant::now() + RECHECK_AT_LEAST)
            }
        };
        let recheck = advice.as_ref().map_or(until, |a| a.recheck);
        self.cache()
            .insert(first.to_string(), (advice.clone(), recheck));
        advice
    }
}

/// A moment in `[start, end]`, spread by the certificate's serial (the same for one window,
/// different across certificates, so many instances do not renew together).
fn pick(start: SystemTime, end: SystemTime, id: &CertificateIdentifier<'_>) -> SystemTime {
    let span = end.duration_since(start).unwrap_or_default();
    if span.is_zero() {
        return start;
    }
    let spread = id
        .serial
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    start + Duration::from_secs(spread % span.as_secs().max(1))
}

/// RFC 9773 §4.1's identifier: the AKI `keyIdentifier` and the serial's DER content, each
/// base64url without padding.
pub fn certificate_id(crt: &Path) -> Option<CertificateIdentifier<'static>> {
    super::files::with_certificate(crt, identifier)
}

fn identifier(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Option<CertificateIdentifier<'static>> {
    let aki = cert
        .extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        })?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    Some(CertificateIdentifier {
        authority_key_identifier: b64.encode(aki).into(),
        serial: b64.encode(cert.raw_serial()).into(),
    })
}
