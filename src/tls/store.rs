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
        });
        let problems = store.reload();
        (store, problems)
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
        let mut problems: Vec<String> = pem_text::not_pair_files(&self.dir).into_iter().collect();
        pairs.retain(|name, _| names.contains(name));
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
        self.index.store(Arc::new(Index::build(&pairs, now)));
        let next = next_validity_change(pairs.values(), now).unwrap_or(i64::MAX);
        self.next_change.store(next, Ordering::Relaxed);
        problems
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
mod tests {
    use super::*;
    use rustls::SignatureScheme;

    /// A CA's self-signed certificate (its key thrown away).
    fn self_signed_ca() -> rcgen::Certificate {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.self_signed(&ca_key).expect("ca")
    }

    /// A certificate for IP addresses only is never chosen by SNI: said, unless it is the
    /// default pair.
    #[test]
    fn a_pair_naming_only_addresses_is_said() {
        let dir = tempfile::tempdir().expect("temp dir");
        write_pair(dir.path(), "ip", "127.0.0.1", (0, i64::from(i32::MAX)));
        write_pair(dir.path(), "default", "::1", (0, i64::from(i32::MAX)));
        write_pair(dir.path(), "named", "a.example", (0, i64::from(i32::MAX)));
        let (store, problems) = CertStore::open(dir.path());
        assert_eq!(store.len(), 3);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("ip.crt: the certificate names no DNS name"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_ca_certificate_without_a_key_is_no_problem_a_leaf_one_is() {
        // A cert-manager Secret: tls.crt and tls.key, and the issuer's ca.crt.
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = self_signed_ca();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("ca.crt");
        let leaf = rcgen::generate_simple_self_signed(vec!["a.example".into()]).expect("leaf");
        std::fs::write(dir.path().join("tls.crt"), leaf.cert.pem()).expect("tls.crt");
        std::fs::write(dir.path().join("tls.key"), leaf.signing_key.serialize_pem()).expect("key");
        // A server certificate whose key is missing is still reported.
        let lonely = rcgen::generate_simple_self_signed(vec!["b.example".into()]).expect("b");
        std::fs::write(dir.path().join("lonely.crt"), lonely.cert.pem()).expect("lonely.crt");
        let (store, problems) = CertStore::open(dir.path());
        assert_eq!(store.len(), 1);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("lonely.key"), "{problems:?}");
    }

    #[test]
    fn a_mismatch_names_both_files_and_a_chain_in_the_wrong_order_says_so() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = self_signed_ca();
        let leaf = rcgen::generate_simple_self_signed(vec!["a.example".into()]).expect("leaf");
        let other = rcgen::generate_simple_self_signed(vec!["b.example".into()]).expect("b");
        let at = |name: &str| dir.path().join(name);
        // The intermediate first, the server's own certificate second.
        std::fs::write(at("wrong.crt"), ca.pem() + &leaf.cert.pem()).expect("crt");
        std::fs::write(at("wrong.key"), leaf.signing_key.serialize_pem()).expect("key");
        std::fs::write(at("mixed.crt"), leaf.cert.pem()).expect("crt");
        std::fs::write(at("mixed.key"), other.signing_key.serialize_pem()).expect("key");
        // A self-signed certificate marked CA, alone, with another key: no chain to reorder.
        std::fs::write(at("alone.crt"), ca.pem()).expect("crt");
        std::fs::write(at("alone.key"), other.signing_key.serialize_pem()).expect("key");
        let (_, problems) = CertStore::open(dir.path());
        let said = |stem: &str| {
            let found = problems.iter().find(|p| p.contains(&format!("{stem}.key")));
            found.cloned().unwrap_or_default()
        };
        let mixed = said("mixed");
        assert!(
            mixed.contains("mixed.crt") && !mixed.contains("CA"),
            "{problems:?}"
        );
        assert!(
            said("wrong").contains("its first certificate is a CA's"),
            "{problems:?}"
        );
        let alone = said("alone");
        assert!(
            alone.contains("alone.crt") && !alone.contains("CA"),
            "{problems:?}"
        );
    }

    /// Writes `dir/stem.crt` + `.key` for `name`, valid from `from` to `to` (Unix seconds).
    fn write_pair(
        dir: &Path,
        stem: &str,
        name: &str,
        valid: (i64, i64),
    ) -> CertificateDer<'static> {
        write_pair_of(&rcgen::PKCS_ECDSA_P256_SHA256, dir, stem, name, valid)
    }

    /// As [`write_pair`], with a key of `algorithm`.
    fn write_pair_of(
        algorithm: &'static rcgen::SignatureAlgorithm,
        dir: &Path,
        stem: &str,
        name: &str,
        (from, to): (i64, i64),
    ) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate_for(algorithm).expect("key");
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
        let date = |secs: i64| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64);
            let utc = crate::utc::UtcTime::of(at);
            rcgen::date_time_ymd(utc.year as i32, utc.month as u8, utc.day as u8)
        };
        (params.not_before, params.not_after) = (date(from), date(to));
        let cert = params.self_signed(&key).expect("cert");
        std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).expect("crt");
        std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).expect("key");
        cert.der().clone()
    }

    const ANY: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::RSA_PSS_SHA256,
    ];

    fn served_for(store: &CertStore, name: &str) -> CertificateDer<'static> {
        served_to(store, name, ANY)
    }

    fn served_to(
        store: &CertStore,
        name: &str,
        offered: &[SignatureScheme],
    ) -> CertificateDer<'static> {
        let index = store.index.load();
        index.find(Some(name), offered).expect("a certificate").cert[0].clone()
    }

    #[test]
    fn a_name_with_an_ecdsa_and_an_rsa_pair_serves_each_client_one_it_can_verify() {
        let dir = tempfile::tempdir().expect("temp dir");
        let now = unix_now();
        let valid = (now - 60, now + 86_400);
        let rsa = write_pair_of(
            &rcgen::PKCS_RSA_SHA256,
            dir.path(),
            "a-rsa",
            "a.example",
            valid,
        );
        let ecdsa = write_pair(dir.path(), "a-ecdsa", "a.example", valid);
        let (store, problems) = CertStore::open(dir.path());
        assert!(problems.is_empty(), "{problems:?}");
        let rsa_only = &[SignatureScheme::RSA_PSS_SHA256];
        assert_eq!(served_to(&store, "a.example", ANY), ecdsa);
        assert_eq!(served_to(&store, "a.example", rsa_only), rsa);
        // An expired ECDSA pair beside a valid RSA one: the RSA one serves everyone.
        let day = 86_400;
        write_pair(
            dir.path(),
            "a-ecdsa",
            "a.example",
            (now - 9 * day, now - day),
        );
        assert_eq!(store.reload().len(), 1);
        assert_eq!(served_to(&store, "a.example", ANY), rsa);
    }

    #[test]
    fn of_two_pairs_for_a_name_the_valid_one_serves_then_the_one_valid_longest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let now = unix_now();
        let day = 86_400;
        // By file name the expired and the future ones come first.
        let _expired = write_pair(
            dir.path(),
            "a-1-old",
            "a.example",
            (now - 90 * day, now - day),
        );
        let _future = write_pair(
            dir.path(),
            "a-2-future",
            "a.example",
            (now + day, now + 90 * day),
        );
        let shorter = write_pair(dir.path(), "a-3", "a.example", (now - day, now + 30 * day));
        let (store, problems) = CertStore::open(dir.path());
        assert_eq!(served_for(&store, "a.example"), shorter);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems
            .iter()
            .any(|p| p.contains("a-1-old.crt: the certificate has expired")));
        assert!(problems
            .iter()
            .any(|p| p.contains("a-2-future.crt: the certificate is not valid yet")));
        // A renewal beside it, named to sort last: the one valid longest serves.
        let renewed = write_pair(dir.path(), "b", "a.example", (now - 60, now + 90 * day));
        assert!(store.reload().len() == 2);
        assert_eq!(served_for(&store, "a.example"), renewed);
        // And a name's trailing dot is the same name.
        assert_eq!(served_for(&store, "A.Example."), renewed);
    }

    /// A .crt holding the key (the two files swapped) says so, as a .key holding the
    /// certificate does.
    #[test]
    fn a_key_where_the_certificate_should_be_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let now = unix_now();
        write_pair(dir.path(), "a", "a.example", (now - 60, now + 86_400));
        let (crt, key) = (dir.path().join("a.crt"), dir.path().join("a.key"));
        let tmp = dir.path().join("a.tmp");
        std::fs::rename(&crt, &tmp).expect("swap");
        std::fs::rename(&key, &crt).expect("swap");
        std::fs::rename(&tmp, &key).expect("swap");
        let (_, problems) = CertStore::open(dir.path());
        assert!(
            problems[0].contains("a.crt: no PEM certificate found (it holds a private key: are the .crt and .key swapped?)"),
            "{problems:?}"
        );
    }

    /// Files an editor saved with a UTF-8 byte order mark first load as OpenSSL loads them.
    #[test]
    fn a_byte_order_mark_before_the_pem_is_read_past() {
        let dir = tempfile::tempdir().expect("temp dir");
        let now = unix_now();
        let served = write_pair(dir.path(), "a", "a.example", (now - 60, now + 86_400));
        for ext in ["crt", "key"] {
            let path = dir.path().join(format!("a.{ext}"));
            let pem = std::fs::read(&path).expect("pem");
            std::fs::write(&path, [&b"\xef\xbb\xbf"[..], &pem].concat()).expect("bom");
        }
        let (store, problems) = CertStore::open(dir.path());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(served_for(&store, "a.example"), served);
    }

    #[test]
    fn a_damaged_certificate_in_the_chain_fails_the_pair() {
        let dir = tempfile::tempdir().expect("temp dir");
        let now = unix_now();
        write_pair(dir.path(), "a", "a.example", (now - 60, now + 86_400));
        let crt = dir.path().join("a.crt");
        let leaf = std::fs::read_to_string(&crt).expect("crt");
        let intermediate = leaf.replacen("MII", "M#I", 1);
        std::fs::write(&crt, format!("{leaf}{intermediate}")).expect("crt");
        let (store, problems) = CertStore::open(dir.path());
        assert!(store.is_empty());
        assert!(
            problems[0].contains("certificate 2 of the chain is not valid PEM"),
            "{problems:?}"
        );
    }
}
