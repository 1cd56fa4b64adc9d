//! One ACME order (RFC 8555 §7.4) for a set of names: each pending authorization's challenge
//! put up (HTTP-01 token, TLS-ALPN-01 certificate, or DNS-01 TXT record through the provider,
//! waited for until a resolver sees it), the challenges marked ready, the order polled, then
//! finalized and the certificate written, key first. Whatever was put up comes down again,
//! whether the order succeeded or not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, CertificateIdentifier, ChallengeType, Identifier, NewOrder,
    OrderStatus, RetryPolicy,
};
use rustls::sign::CertifiedKey;

use super::dns::{lookup, DnsApi, Published};
use super::files::{cert_path, write_atomically};
use super::{Acme, AcmeError};
use crate::config::acme_conf::Challenge;

/// How long the ACME server may take to validate and issue.
const ORDER_WITHIN: Duration = Duration::from_secs(90);
/// How long a DNS-01 record may take to become visible.
const VISIBLE_WITHIN: Duration = Duration::from_secs(120);

/// What was put up for a challenge, to take down after.
enum PutUp {
    Token(String),
    Name(String),
    Record(Published),
}

impl Acme {
    /// Orders a certificate for `names` with `account` and writes it.
    pub(super) async fn order_with(
        &self,
        account: &Account,
        names: &[String],
        replaces: Option<CertificateIdentifier<'static>>,
    ) -> Result<(), AcmeError> {
        let identifiers: Vec<Identifier> =
            names.iter().map(|d| Identifier::Dns(d.clone())).collect();
        let new = NewOrder::new(&identifiers);
        let new = match replaces {
            Some(id) => new.replaces(id),
            None => new,
        };
        let mut order = account
            .new_order(&new)
            .await
            .map_err(self.failed("placing the order"))?;
        let dns = match self.cfg.challenge {
            Challenge::Dns01 => Some(self.dns_api()?),
            _ => None,
        };
        let mut put_up = Vec::new();
        let answered = self
            .answer_challenges(&mut order, dns.as_ref(), &mut put_up)
            .await;
        let status = match answered {
            Ok(()) => order
                .poll_ready(&RetryPolicy::new().timeout(ORDER_WITHIN))
                .await
                .map_err(self.failed("waiting for the validation")),
            Err(e) => Err(e),
        };
        self.take_down(put_up, dns.as_ref()).await;
        match status? {
            OrderStatus::Ready => {}
            other => {
                let problems = problems_of(&mut order).await;
                return Err(AcmeError::Order(format!("order {other:?}: {problems}")));
            }
        }
        let key = order
            .finalize()
            .await
            .map_err(self.failed("finalizing the order"))?;
        let chain = order
            .poll_certificate(&RetryPolicy::new().timeout(ORDER_WITHIN))
            .await
            .map_err(self.failed("downloading the certificate"))?;
        // The key first: the directory watcher loads a pair once both are there.
        let dir = &self.certs_dir;
        write_atomically(
            &cert_path(dir, names, "key"),
            key.as_bytes(),
            "the certificate key",
        )?;
        write_atomically(
            &cert_path(dir, names, "crt"),
            chain.as_bytes(),
            "the certificate",
        )?;
        tracing::info!(?names, "acme: certificate issued");
        Ok(())
    }

    fn dns_api(&self) -> Result<DnsApi, AcmeError> {
        let provider = self
            .cfg
            .dns_provider
            .ok_or_else(|| AcmeError::Order("dns-01 needs acme_dns_provider".to_string()))?;
        Ok(DnsApi::from_env(provider, |name| std::env::var(name).ok())?)
    }

    /// Puts up every pending authorization's challenge, then marks them ready. DNS-01 records
    /// of one name (a name and its wildcard) go up as one set before anything is marked ready.
    async fn answer_challenges(
        &self,
        order: &mut instant_acme::Order,
        dns: Option<&DnsApi>,
        put_up: &mut Vec<PutUp>,
    ) -> Result<(), AcmeError> {
        let kind = match self.cfg.challenge {
            Challenge::Http01 => ChallengeType::Http01,
            Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
            Challenge::Dns01 => ChallengeType::Dns01,
        };
        let mut records: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(self.failed("reading an authorization"))?;
            if authz.status == AuthorizationStatus::Valid {
                continue;
            }
            let name = authz.identifier().to_string();
            let Some(challenge) = authz.challenge(kind.clone()) else {
                return Err(AcmeError::Order(format!(
                    "the server offers no {kind:?} challenge for {name}"
                )));
            };
            let key_authorization = challenge.key_authorization();
            match self.cfg.challenge {
                Challenge::Http01 => {
                    self.challenges
                        .put(&challenge.token, key_authorization.as_str());
                    put_up.push(PutUp::Token(challenge.token.clone()));
                }
                Challenge::TlsAlpn01 => {
                    let cert = alpn_challenge_cert(&name, key_authorization.digest().as_ref())?;
                    self.challenges.put_cert(&name, cert);
                    put_up.push(PutUp::Name(name));
                }
                Challenge::Dns01 => {
                    let base = name.trim_start_matches("*.");
                    let record = format!("_acme-challenge.{base}");
                    records
                        .entry(record)
                        .or_default()
                        .push(key_authorization.dns_value());
                }
            }
        }
        if let Some(dns) = dns {
            self.publish_records(dns, records, put_up).await?;
        }
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(self.failed("reading an authorization"))?;
            if authz.status != AuthorizationStatus::Pending {
                continue;
            }
            if let Some(mut challenge) = authz.challenge(kind.clone()) {
                challenge
                    .set_ready()
                    .await
                    .map_err(self.failed("marking a challenge ready"))?;
            }
        }
        Ok(())
    }

    /// Publishes each record set and waits until the resolver answers with it.
    async fn publish_records(
        &self,
        dns: &DnsApi,
        records: BTreeMap<String, Vec<String>>,
        put_up: &mut Vec<PutUp>,
    ) -> Result<(), AcmeError> {
        let resolver = self.cfg.dns_resolver.or_else(lookup::system_resolver);
        for (name, values) in records {
            let published = dns.publish(&name, &values).await?;
            put_up.push(PutUp::Record(published));
            tracing::info!(record = %name, values = values.len(), "acme: DNS-01 record published");
            if let Some(resolver) = resolver {
                lookup::wait_visible(resolver, &name, &values, VISIBLE_WITHIN)
                    .await
                    .map_err(AcmeError::Order)?;
            }
        }
        Ok(())
    }

    async fn take_down(&self, put_up: Vec<PutUp>, dns: Option<&DnsApi>) {
        for item in put_up {
            match item {
                PutUp::Token(token) => self.challenges.remove(&token),
                PutUp::Name(name) => self.challenges.remove_cert(&name),
                PutUp::Record(published) => {
                    if let Some(dns) = dns {
                        dns.withdraw(&published).await;
                    }
                }
            }
        }
    }
}

/// The TLS-ALPN-01 certificate for `name` (RFC 8737 §3): self-signed, the name its one SAN,
/// the SHA-256 of the key authorization in a critical `acmeIdentifier` extension.
fn alpn_challenge_cert(name: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, AcmeError> {
    let failed =
        |e: &dyn std::fmt::Display| AcmeError::Order(format!("tls-alpn-01 certificate: {e}"));
    let mut params =
        rcgen::CertificateParams::new(vec![name.to_string()]).map_err(|e| failed(&e))?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
    let cert = params.self_signed(&key).map_err(|e| failed(&e))?;
    let der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing =
        rustls::crypto::aws_lc_rs::sign::any_supported_type(&der).map_err(|e| failed(&e))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

/// The problem documents of a failed order: its own, and each failed challenge's with its name.
async fn problems_of(order: &mut instant_acme::Order) -> String {
    let mut problems: Vec<String> = order
        .state()
        .error
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut authorizations = order.authorizations();
    while let Some(Ok(authz)) = authorizations.next().await {
        let name = authz.identifier().to_string();
        for challenge in &authz.challenges {
            if let Some(problem) = &challenge.error {
                problems.push(format!("{name}: {problem}"));
            }
        }
    }
    if problems.is_empty() {
        "no problem document".to_string()
    } else {
        problems.join("; ")
    }
}
