//! What is wrong with a certificate or key file, in an operator's words: the PEM reader's own
//! errors print byte lists (`missing section end marker: [45, 45, ...]`) and "no items found"
//! for a key that is there but encrypted, and the signer says only that the key is none it
//! knows for an RSA key too short to use. Certificate files not named as pairs are named too.

use std::path::Path;

use rustls_pki_types::pem;
use rustls_pki_types::CertificateDer;

/// RSA keys shorter than this are refused by the signer (aws-lc-rs).
const MIN_RSA_BITS: usize = 2048;

/// Why a certificate's PEM block could not be read.
pub fn certificate_reason(error: &pem::Error) -> String {
    match error {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "the file ends before its `-----END {}-----` line: written only in part?",
            line_text(end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => {
            format!("a malformed BEGIN line: `{}`", line_text(line))
        }
        pem::Error::Base64Decode(why) => format!("its base64 is damaged: {why}"),
        other => other.to_string(),
    }
}

/// What to add to "no PEM certificate found" for `crt_pem`: a key in its place says the
/// pair's two files may be swapped (as [`key_reason`] says of a certificate in the key's).
pub fn no_certificate_hint(crt_pem: &[u8]) -> &'static str {
    let holds_a_key = crt_pem.windows(16).any(|w| w == b"PRIVATE KEY-----");
    match holds_a_key {
        true => " (it holds a private key: are the .crt and .key swapped?)",
        false => "",
    }
}

/// Why `key_pem` gave no private key (`error` is the PEM reader's).
pub fn key_reason(key_pem: &[u8], error: &pem::Error) -> String {
    let holds = |text: &str| key_pem.windows(text.len()).any(|w| w == text.as_bytes());
    if holds("ENCRYPTED PRIVATE KEY") || holds("Proc-Type: 4,ENCRYPTED") {
        return "the key is encrypted with a passphrase, which aralez cannot ask for; \
                decrypt it with `openssl pkey -in KEY -out KEY`"
            .to_string();
    }
    if !matches!(error, pem::Error::NoItemsFound) {
        return certificate_reason(error);
    }
    if holds("BEGIN CERTIFICATE") {
        return "it holds a certificate, not a key: are the .crt and .key swapped?".to_string();
    }
    "no PEM private key in it (`BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or \
     `BEGIN EC PRIVATE KEY`)"
        .to_string()
}

/// Why the signer refused a key (`error` is its own), said of the leaf's public key when that
/// explains it: an RSA key under 2048 bits.
pub fn signer_reason(leaf: &CertificateDer<'_>, error: &impl std::fmt::Display) -> String {
    use x509_parser::public_key::PublicKey;
    let parsed = x509_parser::parse_x509_certificate(leaf.as_ref());
    let rsa_bits = parsed
        .ok()
        .and_then(|(_, cert)| match cert.public_key().parsed() {
            Ok(PublicKey::RSA(rsa)) => Some(rsa.key_size()),
            _ => None,
        });
    match rsa_bits {
        Some(bits) if bits > 0 && bits < MIN_RSA_BITS => format!(
            "an RSA key of {bits} bits; at least {MIN_RSA_BITS} are needed (nginx's OpenSSL \
             refuses short keys at its default security level too)"
        ),
        _ => error.to_string(),
    }
}

/// Certificate files of `dir` that are not read, as a problem to report: certbot's
/// `fullchain.pem` and `privkey.pem`, a `.cer` (pairs are `NAME.crt` + `NAME.key`).
pub fn not_pair_files(dir: &Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut unread: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            [".pem", ".cer", ".cert"]
                .iter()
                .any(|ext| name.ends_with(ext))
        })
        .collect();
    if unread.is_empty() {
        return None;
    }
    unread.sort();
    Some(format!(
        "{}: {} not read: a pair is NAME.crt (the chain, the server's certificate first) \
         beside NAME.key (link or copy the files under those names)",
        dir.display(),
        unread.join(", ")
    ))
}

/// A PEM line as text, at most 80 characters of it.
fn line_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.trim().chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;

    #[test]
    fn a_half_written_certificate_says_so_in_words() {
        let whole = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let half = &whole[..whole.len() / 2];
        let error = CertificateDer::pem_slice_iter(half.as_bytes())
            .find_map(Result::err)
            .expect("an error");
        let reason = certificate_reason(&error);
        assert!(
            reason.contains("`-----END CERTIFICATE-----` line: written only in part?"),
            "{reason}"
        );
        assert!(!reason.contains("[45"), "{reason}");
    }

    #[test]
    fn an_encrypted_key_and_a_certificate_for_a_key_are_named() {
        let key = include_bytes!("../../tests/fixtures/tls/encrypted.key");
        let error = PrivateKeyDer::from_pem_slice(key).expect_err("encrypted");
        assert!(key_reason(key, &error).contains("encrypted with a passphrase"));
        let crt = include_bytes!("../../tests/fixtures/tls/encrypted.crt");
        let error = PrivateKeyDer::from_pem_slice(crt).expect_err("no key");
        assert!(key_reason(crt, &error).contains("are the .crt and .key swapped?"));
        let error = PrivateKeyDer::from_pem_slice(b"nothing").expect_err("no key");
        assert!(key_reason(b"nothing", &error).contains("no PEM private key in it"));
    }

    #[test]
    fn a_short_rsa_key_is_named_with_its_size() {
        let crt = include_bytes!("../../tests/fixtures/tls/rsa1024.crt");
        let key = include_bytes!("../../tests/fixtures/tls/rsa1024.key");
        let leaf = CertificateDer::from_pem_slice(crt).expect("certificate");
        let der = PrivateKeyDer::from_pem_slice(key).expect("key");
        let error = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der)
            .expect_err("a 1024-bit key is refused");
        let reason = signer_reason(&leaf, &error);
        assert!(reason.contains("an RSA key of 1024 bits"), "{reason}");
    }

    /// The messages as an operator meets them: a directory with a short RSA key, an encrypted
    /// key and certbot's file names loads none of them and says why for each.
    #[test]
    fn a_directory_of_unusable_files_says_why_for_each() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fixture = |name: &str| {
            let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
            std::fs::read(from.join(name)).expect("fixture")
        };
        let put = |name: &str, bytes: Vec<u8>| std::fs::write(dir.path().join(name), bytes);
        put("old.crt", fixture("rsa1024.crt")).expect("write");
        put("old.key", fixture("rsa1024.key")).expect("write");
        put("locked.crt", fixture("encrypted.crt")).expect("write");
        put("locked.key", fixture("encrypted.key")).expect("write");
        put("fullchain.pem", fixture("encrypted.crt")).expect("write");
        put("privkey.pem", fixture("encrypted.key")).expect("write");
        let (store, problems) = super::super::CertStore::open(dir.path());
        assert!(store.is_empty());
        let said = |what: &str| problems.iter().any(|p| p.contains(what));
        assert!(
            said("old.key: no usable PEM private key (an RSA key of 1024 bits"),
            "{problems:?}"
        );
        assert!(
            said("locked.key: no usable PEM private key (the key is encrypted"),
            "{problems:?}"
        );
        assert!(
            said("fullchain.pem, privkey.pem not read: a pair is NAME.crt"),
            "{problems:?}"
        );
    }
}
