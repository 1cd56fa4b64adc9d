//! The certificate directory (SPEC §7.1): `{NAME}.crt` (chain) + `{NAME}.key`, indexed by SAN and
//! CN (wildcards allowed). SNI picks the certificate; no SNI or no match falls back to
//! `default.crt`, else the first pair by name. A name may have a pair of each key type
//! (ECDSA and RSA): the client gets one it can verify ([`super::index`]).
//!
//! Reloading keeps the last good copy of a pair that turns broken, so a half-written file never
//! takes a name offline. Handshakes read one immutable index through `ArcSwap`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::file_bytes::{read_regular, FileProblem};
use crate::config::yaml::MAX_FILE_BYTES;

use super::index::Index;
pub use super::index::LoadedPair;
use super::pem_text;

/// Why a pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: FileProblem },
    #[error("{path}: no PEM certificate found{hint}")]
    NoCertificate { path: PathBuf, hint: &'static str },
    #[error("{path}: certificate {number} of the chain is not valid PEM ({reason})")]
    BadChain {
        path: PathBuf,
        number: usize,
        reason: String,
    },
    #[error("{path}: no usable PEM private key ({reason})")]
    BadKey { path: PathBuf, reason: String },
    #[error("{key}: the key does not match the certificate of {crt}{hint}")]
    Mismatch {
        crt: PathBuf,
        key: PathBuf,
        /// What the chain's first certificate says, when it explains the mismatch.
        hint: &'static str,
    },
}

/// Loads `dir/name.crt` + `dir/name.key`.
pub fn load_pair(dir: &Path, name: &str) -> Result<LoadedPair, PairError> {
    load_pair_files(
        &dir.join(format!("{name}.crt")),
        &dir.join(format!("{name}.key")),
    )
}

/// Loads a certificate chain and its key from two PEM files.
pub fn load_pair_files(crt: &Path, key_path: &Path) -> Result<LoadedPair, PairError> {
    let (crt, key_path) = (crt.to_path_buf(), key_path.to_path_buf());
    let crt_bytes = read_pem(&crt)?;
    // A damaged certificate in the chain fails the pair (nginx -t refuses it too): served
    // without its intermediate, the leaf fails on clients that do not fetch it.
    let mut chain: Vec<CertificateDer<'static>> = Vec::new();
    for (at, der) in CertificateDer::pem_slice_iter(&crt_bytes).enumerate() {
        let der = der.map_err(|e| PairError::BadChain {
            path: crt.clone(),
            number: at + 1,
            reason: pem_text::certificate_reason(&e),
        })?;
        chain.push(der);
    }
    if chain.is_empty() {
        let hint = pem_text::no_certificate_hint(&crt_bytes);
        return Err(PairError::NoCertificate { path: crt, hint });
    }
    let key_bytes = read_pem(&key_path)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| PairError::BadKey {
        path: key_path.clone(),
        reason: pem_text::key_reason(&key_bytes, &e),
    })?;
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key_der).map_err(|e| {
        PairError::BadKey {
            path: key_path.clone(),
            reason: pem_text::signer_reason(&chain[0], &e),
        }
    })?;
    let (names, valid) = leaf_facts(&chain[0]);
    // A CA's certificate first in a chain of several: the chain is in the wrong order. Alone,
    // it is a self-signed one (`openssl req -x509` marks them CA) whose key is another.
    let first_is_ca = chain.len() > 1
        && x509_parser::parse_x509_certificate(chain[0].as_ref())
            .is_ok_and(|(_, cert)| cert.is_ca());
    let certified = CertifiedKey::new(chain, signer);
    if certified.keys_match().is_err() {
        let hint = match first_is_ca {
            true => " (its first certificate is a CA's: the server's own must come first, then the intermediates)",
            false => "",
        };
        return Err(PairError::Mismatch {
            crt,
            key: key_path,
            hint,
        });
    }
    Ok(LoadedPair {
        key: Arc::new(certified),
        names,
        valid,
    })
}

/// A PEM file's bytes, without the UTF-8 byte order mark an editor on Windows may put first
/// (OpenSSL reads past it; the PEM parser took the first block after it for text before one).
fn read_pem(path: &Path) -> Result<Vec<u8>, PairError> {
    let mut bytes = read_regular(path, MAX_FILE_BYTES).map_err(|source| PairError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.starts_with(b"\xef\xbb\xbf") {
        bytes.drain(..3);
    }
    Ok(bytes)
}

/// The leaf's names (see [`LoadedPair::names`]) and validity.
fn leaf_facts(cert: &CertificateDer<'_>) -> (Vec<String>, (i64, i64)) {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return (Vec::new(), (i64::MIN, i64::MAX));
    };
    let validity = parsed.validity();
    let valid = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    (cert_names(&parsed), valid)
}

fn cert_names(parsed: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for general in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = general {
                names.push(dns.to_ascii_lowercase());
            }
        }
    }
    for cn in parsed.subject().iter_common_name() {
        if let Ok(text) = cn.as_str() {
            names.push(text.to_ascii_lowercase());
        }
    }
    names.dedup();
    names
}

/// The live certificate set of one directory.
pub struct CertStore {
    pub dir: PathBuf,
    index: ArcSwap<Index>,
    /// Last good copy of each pair, by NAME (control plane only).
    pairs: Mutex<BTreeMap<String, LoadedPair>>,
    /// The directory as the last reload found it.
    read_as: Mutex<DirPrint>,
    /// When a pair read last becomes valid or expires (seconds since the Unix epoch;
    /// `i64::MAX`: none will), which changes what the index would choose.
    next_change: AtomicI64,
    /// The sessions made under these pairs, ended when a reload changes them.
    resumption: std::sync::OnceLock<Arc<crate::tls::Resumption>>,
}

/// Entries of a directory looked at for its print.
const MAX_PRINTED: usize = 16_384;

/// What a directory's entries lead to: each name with the device, inode, size and change time
/// of the file it reads as (links followed). Equal prints: nothing a reload reads has changed.
#[derive(Debug, Default, PartialEq, Eq)]
struct DirPrint(Vec<(std::ffi::OsString, u64, u64, u64, i64, i64)>);

impl DirPrint {
    /// `dir`'s print; a directory that cannot be read prints empty.
    fn of(dir: &Path) -> DirPrint {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return DirPrint::default();
        };
        let mut print: Vec<_> = entries
            .filter_map(Result::ok)
            .take(MAX_PRINTED)
            .filter_map(|entry| {
                let m = std::fs::metadata(entry.path()).ok()?;
                let (name, at) = (entry.file_name(), (m.mtime(), m.mtime_nsec()));
                Some((name, m.dev(), m.ino(), m.size(), at.0, at.1))
            })
            .collect();
        print.sort_unstable();
        DirPrint(print)
    }
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore").field("dir", &self.dir).finish()
    }
}

impl CertStore {
    /// Loads every pair of `dir`; problems are returned, the good pairs serve.
    pub fn open(dir: &Path) -> (Arc<CertStore>, Vec<String>) {
        let store = Arc::new(CertStore {
            dir: dir.to_path_buf(),
            index: ArcSwap::from_pointee(Index::default()),
            pairs: Mutex::new(BTreeMap::new()),
            read_as: Mutex::new(DirPrint::default()),
            next_change: AtomicI64::new(i64::MAX),
            resumption: std::sync::OnceLock::new(),
        });
        let problems = store.reload();
        (store, problems)
    }

    /// Ends `resumption`'s sessions whenever a reload changes the pairs serving.
    pub fn ends_sessions_of(&self, resumption: Arc<crate::tls::Resumption>) {
        let _ = self.resumption.set(resumption);
    }

    /// The pairs of the directory that did not load and have no last good copy serving: the
    /// names they were for get another certificate.
    pub fn pairs_not_loaded(&self) -> Vec<String> {
        let pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        let names = pair_names(&self.dir).unwrap_or_default();
        names
            .into_iter()
            .filter(|n| !pairs.contains_key(n))
            .collect()
    }

    /// How many pairs are serving.
    pub fn len(&self) -> usize {
        self.pairs.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pairs' files this process cannot open (it may run as another user than the one that
    /// loaded them).
    pub fn unreadable_files(&self) -> Vec<PathBuf> {
        pair_names(&self.dir)
            .unwrap_or_default()
            .iter()
            .flat_map(|name| ["crt", "key"].map(|ext| self.dir.join(format!("{name}.{ext}"))))
            .filter(|path| std::fs::File::open(path).is_err())
            .collect()
    }

    /// Whether the directory has changed since the last reload read it (a change made before
    /// it was watched).
    pub fn changed_since_read(&self) -> bool {
        let read_as = self.read_as.lock().unwrap_or_else(|p| p.into_inner());
        DirPrint::of(&self.dir) != *read_as
    }

    /// How long until a pair read last becomes valid or expires (a second after, so that it
    /// has); `None` if none will.
    pub fn until_validity_change(&self) -> Option<std::time::Duration> {
        let next = self.next_change.load(Ordering::Relaxed);
        let left = u64::try_from(next.saturating_sub(unix_now())).unwrap_or(0);
        (next != i64::MAX).then(|| std::time::Duration::from_secs(left.saturating_add(1)))
    }

    /// Whether a pair has become valid or expired since the directory was last read: the
    /// index should be made again.
    pub fn validity_changed(&self) -> bool {
        self.next_change.load(Ordering::Relaxed) <= unix_now()
    }

    /// Re-reads the directory. A pair that fails keeps its last good copy; a deleted pair goes.
    /// A directory that cannot be read (gone while it is replaced) changes nothing.
    pub fn reload(&self) -> Vec<String> {
        *self.read_as.lock().unwrap_or_else(|p| p.into_inner()) = DirPrint::of(&self.dir);
        let mut pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        let names = match pair_names(&self.dir) {
            Ok(names) => names,
            Err(e) => {
                let dir = self.dir.display();
                let kept = pairs.len();
                return vec![format!(
                    "cannot read {dir}: {e}; the {kept} pair(s) loaded keep serving"
                )];
            }
        };
        let before = serving_print(&pairs);
        let mut problems: Vec<String> = pem_text::not_pair_files(&self.dir).into_iter().collect();
        let gone: Vec<String> = pairs
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(pair) = pairs.remove(&name) {
                problems.extend(self.pair_gone(&name, &pair));
            }
        }
        for name in &names {
            match load_pair(&self.dir, name) {
                Ok(pair) => {
                    pairs.insert(name.clone(), pair);
                }
                Err(e) => {
                    let kept = if pairs.contains_key(name) {
                        "; its last good copy keeps serving"
                    } else {
                        "; skipped"
                    };
                    problems.push(format!("{e}{kept}"));
                }
            }
        }
        for (name, _) in pairs
            .iter()
            .filter(|(name, pair)| only_addresses(name, pair))
        {
            problems.push(format!(
                "{}: the certificate names no DNS name (an IP address is never a TLS client's server name): it serves only clients no other pair matches, and only as the default pair (name it default.crt for that)",
                self.dir.join(format!("{name}.crt")).display()
            ));
        }
        let now = unix_now();
        for (name, pair) in pairs.iter().filter(|(_, pair)| !pair.valid_at(now)) {
            let when = if now < pair.valid.0 {
                "is not valid yet"
            } else {
                "has expired"
            };
            problems.push(format!(
                "{}: the certificate {when}; a valid one for its names, if any, is served instead",
                self.dir.join(format!("{name}.crt")).display()
            ));
        }
        if serving_print(&pairs) != before {
            if let Some(resumption) = self.resumption.get() {
                resumption.forget();
                tracing::info!("certificates changed: sessions made under the old ones are not resumed (new session ticket keys)");
            }
        }
        self.index.store(Arc::new(Index::build(&pairs, now)));
        let next = next_validity_change(pairs.values(), now).unwrap_or(i64::MAX);
        self.next_change.store(next, Ordering::Relaxed);
        problems
    }
}

impl CertStore {
    /// `aralez_certificate_not_after_seconds{pair}`: when each serving pair's certificate
    /// expires (Unix time), hand-managed and ACME's alike, for an alert on
    /// `aralez_certificate_not_after_seconds - time()` (Traefik's `tls_certs_not_after`).
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let name = "aralez_certificate_not_after_seconds";
        let help = "When the certificate of each pair serving from the certificate directory expires (Unix time).";
        crate::metrics::family_header(out, name, "gauge", help);
        let pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        for (pair, loaded) in pairs.iter() {
            let pair = crate::metrics::escape_label_value(pair);
            let _ = writeln!(out, "{name}{{pair=\"{pair}\"}} {}", loaded.valid.1);
        }
    }

    /// Says that pair `name`, serving until this reload, is gone. A `.key` left without its
    /// `.crt` is a problem (a file deleted by mistake, or half of a renewal); both gone is said
    /// at info, naming what the pair served.
    fn pair_gone(&self, name: &str, pair: &LoadedPair) -> Option<String> {
        let served = pair.names.join(", ");
        let key = self.dir.join(format!("{name}.key"));
        if key.exists() {
            return Some(format!(
                "{} is gone but {} is still there: pair {name} ({served}) no longer serves; its names get another certificate, if any",
                self.dir.join(format!("{name}.crt")).display(),
                key.display()
            ));
        }
        tracing::info!("certificates: pair {name} removed ({served}); its names get another certificate, if any");
        None
    }
}

/// A pair other than `default` whose certificate names no DNS name (IP addresses only, or a
/// subject name that is none, `My Server`): no client's SNI selects it.
fn only_addresses(name: &str, pair: &LoadedPair) -> bool {
    let server_name = |n: &String| {
        let dns = n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._*".contains(&b));
        !n.is_empty() && dns && n.parse::<std::net::IpAddr>().is_err()
    };
    name != "default" && !pair.names.iter().any(server_name)
}

/// When the first of `pairs` becomes valid or expires after `now`: what the index chooses may
/// change then.
fn next_validity_change<'a>(pairs: impl Iterator<Item = &'a LoadedPair>, now: i64) -> Option<i64> {
    let moments = pairs.flat_map(|pair| [pair.valid.0, pair.valid.1.saturating_add(1)]);
    moments.filter(|&at| now < at && at < i64::MAX).min()
}

/// Seconds since the Unix epoch.
fn unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// NAMEs that have a `.crt` (their `.key` is checked when loading), less CA certificates
/// without a key.
fn pair_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = std::fs::read_dir(dir)?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            (path.extension()? == "crt").then(|| path.file_stem()?.to_str().map(str::to_string))?
        })
        .filter(|name| !is_ca_without_key(dir, name))
        .collect();
    names.sort();
    Ok(names)
}

/// Whether `dir/NAME.crt`, with no `NAME.key` beside it, holds a CA certificate: one to verify
/// with, not to serve (a cert-manager Secret mounted as the directory holds `ca.crt` beside
/// `tls.crt` and `tls.key`), so no pair is missing its key.
fn is_ca_without_key(dir: &Path, name: &str) -> bool {
    if dir.join(format!("{name}.key")).exists() {
        return false;
    }
    let Ok(pem) = read_regular(&dir.join(format!("{name}.crt")), MAX_FILE_BYTES) else {
        return false;
    };
    let first = CertificateDer::pem_slice_iter(&pem).find_map(Result::ok);
    let is_ca = first.is_some_and(|der| {
        x509_parser::parse_x509_certificate(der.as_ref()).is_ok_and(|(_, cert)| cert.is_ca())
    });
    if is_ca {
        tracing::debug!("certificates: {name}.crt is a CA certificate without a key; not served");
    }
    is_ca
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.index
            .load()
            .find(hello.server_name(), hello.signature_schemes())
    }
}

#[cfg(test)]
mod tests;

/// What the pairs serving are, to tell a reload that changed them: each name with a hash of
/// its chain.
fn serving_print(pairs: &BTreeMap<String, LoadedPair>) -> Vec<(String, u64)> {
    use std::hash::{Hash, Hasher};
    let chain_hash = |pair: &LoadedPair| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for cert in &pair.key.cert {
            cert.as_ref().hash(&mut hasher);
        }
        hasher.finish()
    };
    pairs
        .iter()
        .map(|(name, pair)| (name.clone(), chain_hash(pair)))
        .collect()
}
