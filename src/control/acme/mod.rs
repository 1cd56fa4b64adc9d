//! Automatic certificates (main.yaml's `acme:`): an ACME account (RFC 8555) kept in
//! `state_dir`, and a certificate for each set of names it manages: the configured `domains`
//! (one certificate), and each upstreams.yaml host with `acme: true` that those do not cover
//! (one each, read from the serving configuration, so a reload adds hosts). A set is ordered
//! whenever its certificate in the certificate directory is missing or due for renewal
//! (`renew_before_days` before it expires, else when a third of its lifetime is left). The
//! challenge is HTTP-01 (answered by the router from [`Challenges`]), TLS-ALPN-01 (by the TLS
//! listener) or DNS-01 (a TXT record through `acme_dns_provider`, [`dns`]). The certificate
//! and its key are written atomically into the watched certificate directory, so the TLS
//! listener serves them with no restart, and a restart does not order again while the
//! certificate is fresh. A failure is logged with the ACME problem and retried with backoff
//! (1 min doubling to 6 h); the serving certificate is never taken away. The sets are looked
//! at when the process starts and every [`LOOK_EVERY`]. Client: instant-acme (the crate
//! Aralez uses).

mod ari;
mod dns;
mod files;
mod order;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{
    Account, AccountBuilder, AccountCredentials, CertificateIdentifier, NewAccount,
};
use tokio::time::Instant;

use crate::config::acme_conf::AcmeConfig;
use crate::vocab::acme_challenges::Challenges;
use crate::vocab::error_text::with_causes;
use files::{cert_path, read_covering, write_atomically};

const FIRST_RETRY: Duration = Duration::from_secs(60);
const LAST_RETRY: Duration = Duration::from_secs(6 * 3600);
/// How often the sets are looked at (a host given `acme: true` by a reload is seen within it).
const LOOK_EVERY: Duration = Duration::from_secs(30);
/// The shortest time between two successful orders of one set (a renewal threshold longer
/// than the lifetime would otherwise order again at once, forever).
const BETWEEN_ORDERS: Duration = Duration::from_secs(3600);
/// The most one order may take, every exchange with the ACME server in it. Its own waits are
/// bounded (the DNS record 120 s, the order 90 s); the exchanges were not, and a server that
/// took a connection and said nothing stopped every set's orders and renewals for good, with
/// no line said.
const ORDER_DEADLINE: Duration = Duration::from_secs(300);
/// The most the renewal information (ARI) may take before the lifetime's threshold is used,
/// and `/acme_create`'s account.
const ADVICE_DEADLINE: Duration = Duration::from_secs(30);

/// Why an order failed.
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error("ACME: {0}")]
    Protocol(#[from] instant_acme::Error),
    /// An exchange with the ACME server failed: which one, and with which server, since a
    /// connection's error names neither.
    #[error("ACME server {server}, {step}: {source}")]
    Exchange {
        server: String,
        step: &'static str,
        source: instant_acme::Error,
    },
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the account file {0} cannot be read: {1}")]
    Account(PathBuf, serde_json::Error),
    #[error("DNS-01 through {0}")]
    Dns(#[from] dns::DnsError),
    #[error("{0}")]
    Order(String),
}

impl AcmeError {
    /// An exchange with the ACME server failed: it could not be reached, or it refused.
    pub fn is_the_servers(&self) -> bool {
        matches!(self, AcmeError::Protocol(_) | AcmeError::Exchange { .. })
    }
}

/// The configured set `domain` belongs to, or the name alone.
fn set_of(sets: Vec<Vec<String>>, domain: String) -> Vec<String> {
    sets.into_iter()
        .find(|set| set.contains(&domain))
        .unwrap_or_else(|| vec![domain])
}

/// Whether the ACME server said it does not know the account (RFC 8555 §7.3.1).
fn is_unknown_account(e: &AcmeError) -> bool {
    match e {
        AcmeError::Protocol(instant_acme::Error::Api(problem))
        | AcmeError::Exchange {
            source: instant_acme::Error::Api(problem),
            ..
        } => problem
            .r#type
            .as_deref()
            .is_some_and(|t| t.ends_with(":accountDoesNotExist")),
        _ => false,
    }
}

/// The names of upstreams.yaml's hosts with `acme: true`, as serving now.
pub type AcmeHosts = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// A set's counters and what its certificate says (for `/metrics`).
#[derive(Clone, Copy, Debug, Default)]
struct SetStats {
    issued: u64,
    failed: u64,
    /// When the certificate on disk expires (seconds since the epoch; 0: none).
    expires: u64,
}

/// When a set may be ordered again, and the backoff that got it there.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    until: Instant,
    backoff: Duration,
}

/// The ACME client of one process.
pub struct Acme {
    cfg: AcmeConfig,
    state_dir: PathBuf,
    certs_dir: PathBuf,
    challenges: Arc<Challenges>,
    hosts: AcmeHosts,
    /// By a set's first name.
    stats: Mutex<BTreeMap<String, SetStats>>,
    /// The ACME server's renewal windows (RFC 9773), when it offers them.
    advisor: ari::Advisor,
    /// The account, once loaded or created.
    account: Mutex<Option<Account>>,
    /// The last attempt to load the account failed (and said so).
    account_failing: std::sync::atomic::AtomicBool,
}

impl Acme {
    pub fn new(cfg: AcmeConfig, certs_dir: PathBuf, hosts: AcmeHosts) -> Acme {
        let state_dir = cfg
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("autoconfigs"));
        Acme {
            cfg,
            state_dir,
            certs_dir,
            challenges: Arc::new(Challenges::default()),
            hosts,
            stats: Mutex::new(BTreeMap::new()),
            advisor: ari::Advisor::default(),
            account: Mutex::new(None),
            account_failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The challenges the router and the TLS listener answer.
    pub fn challenges(&self) -> Arc<Challenges> {
        self.challenges.clone()
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SetStats>> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sets of names to keep a certificate for: `domains`, then each `acme: true` host
    /// that `domains` does not cover (exactly or by a wildcard).
    fn sets(&self) -> Vec<Vec<String>> {
        let domains = &self.cfg.domains;
        let covered = |host: &str| {
            domains.iter().any(|d| match d.strip_prefix("*.") {
                Some(parent) => host.split_once('.').is_some_and(|(_, rest)| rest == parent),
                None => d == host,
            })
        };
        let mut sets = Vec::new();
        if !domains.is_empty() {
            sets.push(domains.clone());
        }
        let mut seen = HashSet::new();
        for host in (self.hosts)() {
            let host = host.to_ascii_lowercase();
            if !covered(&host) && seen.insert(host.clone()) {
                sets.push(vec![host]);
            }
        }
        sets
    }

    /// Keeps every set's certificate fresh for as long as the process runs.
    pub async fn run(self: Arc<Self>) {
        let mut waiting: HashMap<String, Waiting> = HashMap::new();
        let mut announced: HashSet<String> = HashSet::new();
        loop {
            for names in self.sets() {
                let first = names[0].clone();
                if waiting
                    .get(&first)
                    .is_some_and(|w| Instant::now() < w.until)
                {
                    continue;
                }
                match self.due_in(&names).await {
                    Some(wait) if !wait.is_zero() => {
                        if announced.insert(first.clone()) {
                            tracing::info!(domain = %first, "acme: a fresh certificate exists; renewal in {}h", wait.as_secs() / 3600);
                        }
                    }
                    _ => {
                        announced.remove(&first);
                        let outcome = self.order(&names).await;
                        self.after_order(&names, outcome, &mut waiting);
                    }
                }
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Schedules a set after an order: again in an hour when the new certificate is already
    /// due, with a doubled backoff after a failure.
    fn after_order(
        &self,
        names: &[String],
        outcome: Result<(), AcmeError>,
        waiting: &mut HashMap<String, Waiting>,
    ) {
        let first = &names[0];
        match outcome {
            Ok(()) if self.renew_in(names).is_some_and(|w| w.is_zero()) => {
                tracing::warn!(domain = %first, "acme: the new certificate is already due for renewal (renew_before_days is longer than its lifetime); next order in an hour at the earliest");
                let until = Instant::now() + BETWEEN_ORDERS;
                waiting.insert(
                    first.clone(),
                    Waiting {
                        until,
                        backoff: Duration::ZERO,
                    },
                );
            }
            Ok(()) => {
                waiting.remove(first);
            }
            Err(e) => {
                let last = waiting.get(first).map_or(Duration::ZERO, |w| w.backoff);
                let backoff = (last * 2).clamp(FIRST_RETRY, LAST_RETRY);
                tracing::warn!(domain = %first, "acme: order failed, retry in {}s: {}", backoff.as_secs(), with_causes(&e));
                let until = Instant::now() + backoff;
                waiting.insert(first.clone(), Waiting { until, backoff });
            }
        }
    }

    /// How long until the certificate of `names` is due: the lifetime threshold, or the
    /// moment the ACME server's renewal window suggests (an explicit `renew_before_days`
    /// that comes sooner still wins). ARI is only asked with an account already in place.
    async fn due_in(&self, names: &[String]) -> Option<Duration> {
        let threshold = self.renew_in(names)?;
        let asked = async {
            let account = self.existing_account().await?;
            let crt = cert_path(&self.certs_dir, names, "crt");
            self.advisor.advice(&account, &names[0], &crt).await
        };
        let Ok(Some(advice)) = tokio::time::timeout(ADVICE_DEADLINE, asked).await else {
            return Some(threshold);
        };
        let suggested = advice
            .renew_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        Some(match self.cfg.renew_before_days {
            Some(_) => suggested.min(threshold),
            None => suggested,
        })
    }

    /// How long until the certificate of `names` on disk is due for renewal; `None` when
    /// there is none (or it cannot be read, or does not cover every name).
    fn renew_in(&self, names: &[String]) -> Option<Duration> {
        let on_disk = read_covering(&cert_path(&self.certs_dir, names, "crt"), names)?;
        self.stats().entry(names[0].clone()).or_default().expires = on_disk.not_after;
        let lifetime = on_disk.not_after.saturating_sub(on_disk.not_before);
        let before = match self.cfg.renew_before_days {
            Some(days) => days * 86_400,
            None => lifetime / 3,
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
        Some(Duration::from_secs(
            on_disk.not_after.saturating_sub(before).saturating_sub(now),
        ))
    }

    /// Makes an instant-acme error an [`AcmeError::Exchange`] naming `step` and the server.
    fn failed(&self, step: &'static str) -> impl FnOnce(instant_acme::Error) -> AcmeError + '_ {
        move |source| AcmeError::Exchange {
            server: self.cfg.directory.clone(),
            step,
            source,
        }
    }

    fn builder(&self) -> Result<AccountBuilder, AcmeError> {
        Ok(match &self.cfg.ca_file {
            Some(ca) => Account::builder_with_root(ca)?,
            None => Account::builder()?,
        })
    }

    fn cached_account(&self) -> Option<Account> {
        self.account
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn keep_account(&self, account: &Account) {
        self.account_failing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        *self.account.lock().unwrap_or_else(|p| p.into_inner()) = Some(account.clone());
    }

    /// The account, when one was created before (none is created here).
    async fn existing_account(&self) -> Option<Account> {
        if let Some(account) = self.cached_account() {
            return Some(account);
        }
        self.state_dir.join("account.json").exists().then_some(())?;
        match self.account().await {
            Ok(account) => Some(account),
            Err(e) => {
                // Once per failure streak: this is asked every LOOK_EVERY for every set.
                if !self
                    .account_failing
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!("acme: the account cannot be used: {}", with_causes(&e));
                }
                None
            }
        }
    }

    /// [`Acme::account`] within [`ADVICE_DEADLINE`] (`/acme_create`: a server that said
    /// nothing held the admin connection).
    pub async fn account_within(&self) -> Result<Account, AcmeError> {
        self.within(ADVICE_DEADLINE, "answer", self.account()).await
    }

    /// `work` (exchanges with the ACME server) by `deadline`, or an error saying the server did
    /// not `what` in time.
    async fn within<T>(
        &self,
        deadline: Duration,
        what: &str,
        work: impl std::future::Future<Output = Result<T, AcmeError>>,
    ) -> Result<T, AcmeError> {
        let late = || {
            let (server, secs) = (&self.cfg.directory, deadline.as_secs());
            AcmeError::Order(format!(
                "the ACME server ({server}) did not {what} within {secs}s"
            ))
        };
        tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| Err(late()))
    }

    /// The account in `state_dir`, created (and kept there) when there is none.
    pub async fn account(&self) -> Result<Account, AcmeError> {
        if let Some(account) = self.cached_account() {
            return Ok(account);
        }
        let path = self.state_dir.join("account.json");
        let read =
            crate::config::file_bytes::read_regular(&path, crate::config::yaml::MAX_FILE_BYTES);
        if let Some(text) = read.ok().and_then(|bytes| String::from_utf8(bytes).ok()) {
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| AcmeError::Account(path.clone(), e))?;
            let kept_for = json["directory"].as_str().unwrap_or_default().to_string();
            if kept_for == self.cfg.directory || kept_for.is_empty() {
                let creds: AccountCredentials = serde_json::from_value(json)
                    .map_err(|e| AcmeError::Account(path.clone(), e))?;
                let account = self
                    .builder()?
                    .from_credentials(creds)
                    .await
                    .map_err(self.failed("loading the account"))?;
                self.keep_account(&account);
                return Ok(account);
            }
            // Another ACME server's account (the directory changed, e.g. staging to
            // production): kept aside, and an account made on the configured one.
            let aside = self.set_account_aside()?;
            tracing::warn!(was = %kept_for, now = %self.cfg.directory, "acme: account.json was made on another ACME directory; kept as {}, making one on the configured directory", aside.display());
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
            .await
            .map_err(self.failed("registering an account"))?;
        tracing::info!(account = account.id(), "acme: account created");
        // Kept for this process even when it cannot be saved: each retry registered another
        // account at the CA, which limits new accounts (Let's Encrypt: 10 an address in 3 h).
        self.keep_account(&account);
        let json =
            serde_json::to_string(&creds).map_err(|e| AcmeError::Account(path.clone(), e))?;
        if let Err(e) = write_atomically(&path, json.as_bytes(), "the account file") {
            tracing::error!(account = account.id(), "acme: {e}; the account is used until this process ends, and the next start registers another");
        }
        Ok(account)
    }

    /// Moves `account.json` to `account.json.previous` (and forgets the account), for a new one
    /// to be made; where it went.
    fn set_account_aside(&self) -> Result<PathBuf, AcmeError> {
        *self.account.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let path = self.state_dir.join("account.json");
        let aside = path.with_extension("json.previous");
        std::fs::rename(&path, &aside).map_err(|source| AcmeError::File {
            what: "setting aside the account file",
            path,
            source,
        })?;
        Ok(aside)
    }

    /// Orders a certificate for `names` and writes it; counted.
    async fn order(&self, names: &[String]) -> Result<(), AcmeError> {
        let result = self.order_for(names).await;
        let mut stats = self.stats();
        let stats = stats.entry(names[0].clone()).or_default();
        match result {
            Ok(()) => stats.issued += 1,
            Err(_) => stats.failed += 1,
        }
        result
    }

    /// `/acme_order/<domain>` (Aralez's answers): a certificate for `domain` now, unless a
    /// fresh one is there. A name of a configured set orders the whole set, counted as the
    /// set's orders are: ordered alone, it replaced the set's file with a certificate for that
    /// one name, and the set's other names met a certificate not theirs.
    pub async fn order_now(&self, domain: &str) -> Result<String, AcmeError> {
        let names = set_of(self.sets(), domain.to_ascii_lowercase());
        if self.renew_in(&names).is_some_and(|w| !w.is_zero()) {
            return Ok("Fresh certificate exists. Not renewing ! \n".to_string());
        }
        if let Err(e) = self.order(&names).await {
            // Said in the log as the scheduler's failures are: the answer reaches only the
            // caller, and the attempt left no trace an operator could find later.
            tracing::warn!(domain = %names[0], "acme: order asked through the admin API failed: {}", with_causes(&e));
            return Err(e);
        }
        Ok("Certificate is successfully generated \n".to_string())
    }

    /// Orders a certificate for `names` and writes it; with renewal information in use, the
    /// order says which certificate it replaces.
    async fn order_for(&self, names: &[String]) -> Result<(), AcmeError> {
        let order = self.order_unbounded(names);
        self.within(ORDER_DEADLINE, "finish the order", order).await
    }

    /// [`Acme::order_for`] without its deadline.
    async fn order_unbounded(&self, names: &[String]) -> Result<(), AcmeError> {
        let account = self.account().await?;
        // Only a certificate of these very names is replaced.
        let replaces = match self.renew_in(names) {
            Some(_) => self.replaced(names).await,
            None => None,
        };
        match self.order_with(&account, names, replaces).await {
            // The server no longer knows the account (deactivated, or its database reset, as
            // pebble's is at each start): kept aside and a new one made, once. Ordering with it
            // failed for good, every retry, until someone deleted account.json.
            Err(e) if is_unknown_account(&e) => {
                let aside = self.set_account_aside()?;
                tracing::warn!(
                    "acme: the ACME server does not know the account; kept as {}, making a new one",
                    aside.display()
                );
                let account = self.account().await?;
                self.order_with(&account, names, None).await?;
            }
            ordered => ordered?,
        }
        self.advisor.forget(&names[0]);
        Ok(())
    }

    /// The certificate of `names` a new order replaces, when the server offers renewal
    /// information and an account is in place.
    async fn replaced(&self, names: &[String]) -> Option<CertificateIdentifier<'static>> {
        let account = self.existing_account().await?;
        let crt = cert_path(&self.certs_dir, names, "crt");
        let advice = self.advisor.advice(&account, &names[0], &crt).await?;
        Some(advice.id)
    }

    /// `aralez_acme_orders_total{domain,result}` and
    /// `aralez_acme_certificate_expiry_seconds{domain}` (SPEC §14), a series per set.
    pub fn render_prometheus(&self, out: &mut String) {
        let stats = self.stats().clone();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        render_stats(&stats, now, out);
    }
}

/// The ACME series of `stats` at `now` (seconds since the epoch). A set with no certificate
/// yet has no expiry series: a 0 there read as one expired, and set off expiry alerts for a
/// certificate that was never issued (its failed orders say what is wrong).
fn render_stats(stats: &BTreeMap<String, SetStats>, now: u64, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "# HELP aralez_acme_orders_total ACME orders, by result.\n# TYPE aralez_acme_orders_total counter");
    for (domain, s) in stats {
        for (result, n) in [("issued", s.issued), ("failed", s.failed)] {
            let _ = writeln!(
                out,
                "aralez_acme_orders_total{{domain=\"{domain}\",result=\"{result}\"}} {n}"
            );
        }
    }
    let _ = writeln!(out, "# HELP aralez_acme_certificate_expiry_seconds Seconds until the certificate expires.\n# TYPE aralez_acme_certificate_expiry_seconds gauge");
    for (domain, s) in stats.iter().filter(|(_, s)| s.expires != 0) {
        let left = s.expires.saturating_sub(now);
        let _ = writeln!(
            out,
            "aralez_acme_certificate_expiry_seconds{{domain=\"{domain}\"}} {left}"
        );
    }
}

#[cfg(test)]
mod tests;
