//! The lookup structure handshakes read: names (exact and wildcard) to the certificates that
//! serve them, and the fallback for no SNI or no match.
//!
//! A name may have one certificate of each key type (ECDSA, Ed25519, RSA), as nginx takes two
//! `ssl_certificate` lines: a handshake gets the first, in that order, whose key the client can
//! verify with a signature scheme it offers (rustls has already left out the schemes no offered
//! cipher suite can use), so an old client that knows only RSA still connects while the others
//! get the smaller, faster ECDSA key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls::{SignatureAlgorithm, SignatureScheme};

/// One loaded pair: its key and chain, and what the index chooses by (the store reads it).
#[derive(Clone, Debug)]
pub struct LoadedPair {
    pub key: Arc<CertifiedKey>,
    /// DNS names from the SAN extension, plus the subject CN; lower case.
    pub names: Vec<String>,
    /// The leaf's validity, in seconds since the Unix epoch (an unreadable one: always valid).
    pub valid: (i64, i64),
}

impl LoadedPair {
    /// Whether the leaf is valid at `now` (seconds since the Unix epoch).
    pub(super) fn valid_at(&self, now: i64) -> bool {
        self.valid.0 <= now && now <= self.valid.1
    }
}

/// The certificates of one name, the most preferred first; never empty.
#[derive(Clone, Debug)]
pub(super) struct Choices(Vec<Arc<CertifiedKey>>);

impl Choices {
    /// The first certificate the client can verify with one of `offered`; else the first (the
    /// handshake then fails as it would have with that one alone).
    fn for_client(&self, offered: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        if let [only] = self.0.as_slice() {
            return Some(only.clone());
        }
        let verifiable = self
            .0
            .iter()
            .find(|key| key.key.choose_scheme(offered).is_some());
        verifiable.or(self.0.first()).cloned()
    }
}

/// Where a key type comes among one name's certificates: ECDSA first (the smaller and faster
/// signature, the one every current client verifies), then Ed25519, then RSA.
fn preference(key: &CertifiedKey) -> u8 {
    match key.key.algorithm() {
        SignatureAlgorithm::ECDSA => 0,
        SignatureAlgorithm::ED25519 => 1,
        SignatureAlgorithm::RSA => 2,
        _ => 3,
    }
}

#[derive(Default)]
pub(super) struct Index {
    exact: HashMap<String, Choices>,
    /// `*.example.com` stored as `example.com`.
    wildcard: HashMap<String, Choices>,
    /// For no SNI or no match: the certificates of the default pair's first name (so its RSA
    /// counterpart too), or the pair alone when it names nothing.
    fallback: Option<Choices>,
}

impl Index {
    /// The index of `pairs` at `now` (seconds since the Unix epoch). Where pairs of one key
    /// type share a name, one valid now beats one that is not, then the one valid longest (a
    /// renewed certificate beside the one it replaces, whatever their file names), then the
    /// first by file name. Of a name's key types, those valid now serve, if any is.
    pub(super) fn build(pairs: &BTreeMap<String, LoadedPair>, now: i64) -> Index {
        let rank = |pair: &LoadedPair| (pair.valid_at(now), pair.valid.1);
        let mut best: HashMap<&str, BTreeMap<u8, &LoadedPair>> = HashMap::new();
        for pair in pairs.values() {
            let key_type = preference(&pair.key);
            for name in &pair.names {
                let of_name = best.entry(name).or_default();
                let chosen = of_name.entry(key_type).or_insert(pair);
                if rank(pair) > rank(chosen) {
                    *chosen = pair;
                }
            }
        }
        let mut index = Index::default();
        for (name, of_name) in best {
            let any_valid = of_name.values().any(|pair| pair.valid_at(now));
            let serving = of_name
                .values()
                .filter(|pair| pair.valid_at(now) || !any_valid);
            let choices = Choices(serving.map(|pair| pair.key.clone()).collect());
            match name.strip_prefix("*.") {
                Some(suffix) => index.wildcard.insert(suffix.to_string(), choices),
                None => index.exact.insert(name.to_string(), choices),
            };
        }
        let default = pairs.get("default").or_else(|| pairs.values().next());
        index.fallback = default.map(|pair| {
            let of_its_name = pair
                .names
                .first()
                .and_then(|name| match name.strip_prefix("*.") {
                    Some(suffix) => index.wildcard.get(suffix),
                    None => index.exact.get(name),
                });
            of_its_name
                .cloned()
                .unwrap_or_else(|| Choices(vec![pair.key.clone()]))
        });
        index
    }

    /// The certificate for SNI `sni` and a client offering `offered`.
    pub(super) fn find(
        &self,
        sni: Option<&str>,
        offered: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        // A fully qualified name's trailing dot names the same host (as Host routing reads it).
        let sni = sni.map(|name| name.strip_suffix('.').unwrap_or(name));
        if let Some(name) = sni.map(str::to_ascii_lowercase) {
            if let Some(choices) = self.exact.get(&name) {
                return choices.for_client(offered);
            }
            if let Some((_, parent)) = name.split_once('.') {
                if let Some(choices) = self.wildcard.get(parent) {
                    return choices.for_client(offered);
                }
            }
        }
        self.fallback.as_ref()?.for_client(offered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::PrivateKeyDer;

    /// A CertifiedKey with a throwaway key of `algorithm` and an empty chain.
    fn key_of(algorithm: &'static rcgen::SignatureAlgorithm) -> Arc<CertifiedKey> {
        let key = rcgen::KeyPair::generate_for(algorithm).expect("key");
        let der = PrivateKeyDer::try_from(key.serialize_der()).expect("der");
        let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der).expect("signer");
        Arc::new(CertifiedKey::new(Vec::new(), signer))
    }

    fn one(key: &Arc<CertifiedKey>) -> Choices {
        Choices(vec![key.clone()])
    }

    const ANY: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::RSA_PSS_SHA256,
    ];

    #[test]
    fn wildcard_and_fallback_lookup() {
        let ck = || key_of(&rcgen::PKCS_ECDSA_P256_SHA256);
        let (a, w, d) = (ck(), ck(), ck());
        let mut index = Index::default();
        index.exact.insert("a.example".into(), one(&a));
        index.wildcard.insert("example".into(), one(&w));
        index.fallback = Some(one(&d));
        let found = |sni| index.find(sni, ANY).expect("a certificate");
        assert!(Arc::ptr_eq(&found(Some("A.Example")), &a));
        assert!(Arc::ptr_eq(&found(Some("b.example")), &w));
        assert!(Arc::ptr_eq(&found(Some("x.y.example")), &d));
        assert!(Arc::ptr_eq(&found(None), &d));
    }

    #[test]
    fn of_two_key_types_the_client_gets_one_it_can_verify() {
        let ecdsa = key_of(&rcgen::PKCS_ECDSA_P256_SHA256);
        let rsa = key_of(&rcgen::PKCS_RSA_SHA256);
        let mut index = Index::default();
        index.exact.insert(
            "a.example".into(),
            Choices(vec![ecdsa.clone(), rsa.clone()]),
        );
        let for_client = |offered| index.find(Some("a.example"), offered).expect("one");
        assert!(Arc::ptr_eq(&for_client(ANY), &ecdsa));
        let rsa_only = &[SignatureScheme::RSA_PKCS1_SHA256];
        assert!(Arc::ptr_eq(&for_client(rsa_only), &rsa));
        // Neither verifiable: the preferred one, for the handshake to fail on.
        let ed_only = &[SignatureScheme::ED25519];
        assert!(Arc::ptr_eq(&for_client(ed_only), &ecdsa));
    }
}
