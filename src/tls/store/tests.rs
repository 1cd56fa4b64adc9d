//! Unit tests of `store`.

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
fn write_pair(dir: &Path, stem: &str, name: &str, valid: (i64, i64)) -> CertificateDer<'static> {
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

#[test]
fn a_pair_whose_certificate_is_deleted_but_not_its_key_is_said() {
    let dir = tempfile::tempdir().expect("dir");
    let now = unix_now();
    write_pair(
        dir.path(),
        "kept",
        "kept.test",
        (now - 86_400, now + 86_400),
    );
    write_pair(
        dir.path(),
        "half",
        "half.test",
        (now - 86_400, now + 86_400),
    );
    write_pair(
        dir.path(),
        "whole",
        "whole.test",
        (now - 86_400, now + 86_400),
    );
    let (store, problems) = CertStore::open(dir.path());
    assert_eq!((store.len(), problems.len()), (3, 0), "{problems:?}");
    std::fs::remove_file(dir.path().join("half.crt")).expect("rm crt");
    std::fs::remove_file(dir.path().join("whole.crt")).expect("rm crt");
    std::fs::remove_file(dir.path().join("whole.key")).expect("rm key");
    let problems = store.reload();
    assert_eq!(store.len(), 1);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("half.crt is gone but")
            && problems[0].contains("half.key is still there")
            && problems[0].contains("pair half (half.test")
            && problems[0].contains("no longer serves"),
        "{problems:?}"
    );
    // Said once: the next reload finds no pair to lose.
    assert_eq!(store.reload(), Vec::<String>::new());
}

#[test]
fn each_serving_pair_says_when_it_expires_in_metrics() {
    let dir = tempfile::tempdir().expect("dir");
    let now = unix_now();
    write_pair(
        dir.path(),
        "a\"b",
        "quoted.test",
        (now - 86_400, now + 40 * 86_400),
    );
    write_pair(
        dir.path(),
        "plain",
        "plain.test",
        (now - 86_400, now + 10 * 86_400),
    );
    let (store, _) = CertStore::open(dir.path());
    let mut text = String::new();
    store.render_prometheus(&mut text);
    let value = |series: &str| -> i64 {
        let line = text.lines().find(|l| l.starts_with(series)).expect(series);
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number")
    };
    // rcgen writes whole days: the end of the day named.
    let plain = value("aralez_certificate_not_after_seconds{pair=\"plain\"}");
    assert!((plain - (now + 10 * 86_400)).abs() <= 86_400, "{text}");
    let quoted = value("aralez_certificate_not_after_seconds{pair=\"a\\\"b\"}");
    assert!(quoted > plain, "{text}");
    assert!(text.contains("# TYPE aralez_certificate_not_after_seconds gauge"));
}
