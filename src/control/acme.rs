//! Automatic certificates (main.yaml's `acme:`): an ACME account (RFC 8555) kept in
//! `state_dir`, and an order for the configured names whenever the certificate in the
//! certificate directory is missing or due for renewal (`renew_before_days` before it expires,
//! else when a third of its lifetime is left). HTTP-01 challenges are answered by the router
//! from [`Challenges`]. The certificate and its key are written atomically (temporary name, then
//! rename) into the watched certificate directory, so the TLS listener serves them with no
//! restart, and a restart does not order again while the certificate is fresh. A failure is
//! logged with the ACME problem and retried with backoff (1 min doubling to 6 h); the serving
//! certificate is never taken away. The certificate is looked at when the process starts and at
//! least hourly. Client: instant-acme (the crate Aralez uses).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{
    Account, AccountBuilder, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier,
    NewAccount, NewOrder, OrderStatus, RetryPolicy,
};

use rustls::sign::CertifiedKey;

use crate::config::acme_conf::{AcmeConfig, Challenge};
use crate::vocab::acme_challenges::Challenges;

const FIRST_RETRY: Duration = Duration::from_secs(60);
const LAST_RETRY: Duration = Duration::from_secs(6 * 3600);
/// The longest the task sleeps between two looks at the certificate.
const LOOK_EVERY: Duration = Duration::from_secs(3600);
/// The shortest time between two successful orders (a renewal threshold longer than the
/// lifetime would otherwise order again at once, forever).
const BETWEEN_ORDERS: Duration = Duration::from_secs(3600);

/// Why an order failed.
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error("ACME: {0}")]
    Protocol(#[from] instant_acme::Error),
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the account file {0} cannot be read: {1}")]
    Account(PathBuf, serde_json::Error),
    #[error("{0}")]
    Order(String),
}

/// The ACME client of one process.
pub struct Acme {
    cfg: AcmeConfig,
    state_dir: PathBuf,
    certs_dir: PathBuf,
    challenges: Arc<Challenges>,
    /// Orders that failed (for `/metrics`).
    pub failures: AtomicU64,
    /// Certificates issued.
    pub issued: AtomicU64,
    /// When the certificate on disk expires (seconds since the epoch; 0: none).
    expires: AtomicU64,
}

impl Acme {
    pub fn new(cfg: AcmeConfig, certs_dir: PathBuf) -> Acme {
        let state_dir = cfg
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("autoconfigs"));
        Acme {
            cfg,
            state_dir,
            certs_dir,
            challenges: Arc::new(Challenges::default()),
            failures: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            expires: AtomicU64::new(0),
        }
    }

    /// The challenges the router answers.
    pub fn challenges(&self) -> Arc<Challenges> {
        self.challenges.clone()
    }

    /// Where the certificate of `domains` is kept (`<first name>.crt` / `.key`).
    fn cert_path(&self, domains: &[String], ext: &str) -> PathBuf {
        let first = domains.first().map_or("acme", String::as_str);
        self.certs_dir.join(format!("{first}.{ext}"))
    }

    /// Keeps the certificate fresh for as long as the process runs.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Duration::ZERO;
        loop {
            let wait = match self.renew_in() {
                Some(wait) if !wait.is_zero() => {
                    tracing::info!(domain = %self.cfg.domains[0], "acme: a fresh certificate exists; renewal in {}h", wait.as_secs() / 3600);
                    wait.min(LOOK_EVERY)
                }
                _ => match self.order().await {
                    Ok(()) if self.renew_in().is_some_and(|w| w.is_zero()) => {
                        backoff = Duration::ZERO;
                        tracing::warn!(domain = %self.cfg.domains[0], "acme: the new certificate is already due for renewal (renew_before_days is longer than its lifetime); next order in an hour at the earliest");
                        BETWEEN_ORDERS
                    }
                    Ok(()) => {
                        backoff = Duration::ZERO;
                        continue;
                    }
                    Err(e) => {
                        backoff = (backoff * 2).clamp(FIRST_RETRY, LAST_RETRY);
                        tracing::warn!(domain = %self.cfg.domains[0], "acme: order failed, retry in {}s: {e}", backoff.as_secs());
                        backoff
                    }
                },
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// How long until the certificate on disk is due for renewal; `None` when there is none
    /// (or it cannot be read, or does not cover every configured name).
    fn renew_in(&self) -> Option<Duration> {
        self.renew_in_for(&self.cfg.domains)
    }

    /// [`renew_in`](Self::renew_in) for the certificate of `domains`.
    fn renew_in_for(&self, domains: &[String]) -> Option<Duration> {
        let pem = std::fs::read(self.cert_path(domains, "crt")).ok()?;
        let (_, block) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
        let cert = block.parse_x509().ok()?;
        let names: Vec<String> = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => {
                            Some(d.to_ascii_lowercase())
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !domains.iter().all(|d| names.contains(d)) {
            return None;
        }
        let not_before = cert.validity().not_before.timestamp().max(0) as u64;
        let not_after = cert.validity().not_after.timestamp().max(0) as u64;
        self.expires.store(not_after, Ordering::Relaxed);
        let lifetime = not_after.saturating_sub(not_before);
        let before = match self.cfg.renew_before_days {
            Some(days) => days * 86_400,
            None => lifetime / 3,
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
        Some(Duration::from_secs(
            not_after.saturating_sub(before).saturating_sub(now),
        ))
    }

    fn builder(&self) -> Result<AccountBuilder, AcmeError> {
        Ok(match &self.cfg.ca_file {
            Some(ca) => Account::builder_with_root(ca)?,
            None => Account::builder()?,
        })
    }

    /// The account in `state_dir`, created (and kept there) when there is none.
    pub async fn account(&self) -> Result<Account, AcmeError> {
        let path = self.state_dir.join("account.json");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let creds: AccountCredentials =
                serde_json::from_str(&text).map_err(|e| AcmeError::Account(path.clone(), e))?;
            return Ok(self.builder()?.from_credentials(creds).await?);
        }
        let contact = self.cfg.email.as_ref().map(|e| format!("mailto:{e}"));
        let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
        let new = NewAccount {
            contact: &contacts,
            terms_of_service_agreed: true,
            only_return_existing: false,
        };
        let (account, creds) = self
            .builder()?
            .create(&new, self.cfg.directory.clone(), None)
            .await?;
        let json =
            serde_json::to_string(&creds).map_err(|e| AcmeError::Account(path.clone(), e))?;
        write_atomically(&path, json.as_bytes(), "the account file")?;
        tracing::info!(account = account.id(), "acme: account created");
        Ok(account)
    }

    /// Orders a certificate for the configured names and writes it.
    async fn order(&self) -> Result<(), AcmeError> {
        let result = self.order_for(&self.cfg.domains).await;
        let counter = if result.is_ok() {
            &self.issued
        } else {
            &self.failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// `/acme_order/<domain>` (Aralez's answers): a certificate for `domain` now, unless a
    /// fresh one is there.
    pub async fn order_now(&self, domain: &str) -> Result<String, AcmeError> {
        let domains = [domain.to_ascii_lowercase()];
        if self.renew_in_for(&domains).is_some_and(|w| !w.is_zero()) {
            return Ok("Fresh certificate exists. Not renewing ! \n".to_string());
        }
        self.order_for(&domains).await?;
        Ok("Certificate is successfully generated \n".to_string())
    }

    /// Orders a certificate for `domains` and writes it.
    async fn order_for(&self, domains: &[String]) -> Result<(), AcmeError> {
        let account = self.account().await?;
        let identifiers: Vec<Identifier> =
            domains.iter().map(|d| Identifier::Dns(d.clone())).collect();
        let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
        let mut answered = Vec::new();
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz?;
            if authz.status == AuthorizationStatus::Valid {
                continue;
            }
            let name = authz.identifier().to_string();
            let (kind, label) = match self.cfg.challenge {
                Challenge::Http01 => (ChallengeType::Http01, "http-01"),
                Challenge::TlsAlpn01 => (ChallengeType::TlsAlpn01, "tls-alpn-01"),
            };
            let Some(mut challenge) = authz.challenge(kind) else {
                return Err(AcmeError::Order(format!(
                    "the server offers no {label} challenge for {name}"
                )));
            };
            let key_authorization = challenge.key_authorization();
            let answer = match self.cfg.challenge {
                Challenge::Http01 => {
                    self.challenges
                        .put(&challenge.token, key_authorization.as_str());
                    Answered::Token(challenge.token.clone())
                }
                Challenge::TlsAlpn01 => {
                    let cert = alpn_challenge_cert(&name, key_authorization.digest().as_ref())?;
                    self.challenges.put_cert(&name, cert);
                    Answered::Name(name)
                }
            };
            answered.push(answer);
            challenge.set_ready().await?;
        }
        let retries = RetryPolicy::new().timeout(Duration::from_secs(90));
        let status = order.poll_ready(&retries).await;
        for answer in &answered {
            match answer {
                Answered::Token(token) => self.challenges.remove(token),
                Answered::Name(name) => self.challenges.remove_cert(name),
            }
        }
        match status? {
            OrderStatus::Ready => {}
            other => {
                let problems = problems_of(&mut order).await;
                return Err(AcmeError::Order(format!("order {other:?}: {problems}")));
            }
        }
        let key = order.finalize().await?;
        let chain = order.poll_certificate(&retries).await?;
        // The key first: the directory watcher loads a pair once both are there.
        let (key_file, crt_file) = (
            self.cert_path(domains, "key"),
            self.cert_path(domains, "crt"),
        );
        write_atomically(&key_file, key.as_bytes(), "the certificate key")?;
        write_atomically(&crt_file, chain.as_bytes(), "the certificate")?;
        tracing::info!(?domains, "acme: certificate issued");
        Ok(())
    }
}

/// What was put up for a challenge, to take down after.
enum Answered {
    Token(String),
    Name(String),
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

impl Acme {
    /// `aralez_acme_orders_total{domain,result}` and
    /// `aralez_acme_certificate_expiry_seconds{domain}` (SPEC §14).
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let domain = &self.cfg.domains[0];
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP aralez_acme_orders_total ACME orders, by result.\n# TYPE aralez_acme_orders_total counter");
        for (result, n) in [
            ("issued", load(&self.issued)),
            ("failed", load(&self.failures)),
        ] {
            let _ = writeln!(
                out,
                "aralez_acme_orders_total{{domain=\"{domain}\",result=\"{result}\"}} {n}"
            );
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let left = load(&self.expires).saturating_sub(now);
        let _ = writeln!(out, "# HELP aralez_acme_certificate_expiry_seconds Seconds until the certificate expires.\n# TYPE aralez_acme_certificate_expiry_seconds gauge\naralez_acme_certificate_expiry_seconds{{domain=\"{domain}\"}} {left}");
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename (mode 0600).
fn write_atomically(path: &Path, bytes: &[u8], what: &'static str) -> Result<(), AcmeError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |source| AcmeError::File {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let tmp = path.with_extension("acme-tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(failed)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(failed)?;
    std::fs::rename(&tmp, path).map_err(failed)
}
