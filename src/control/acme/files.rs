//! The ACME client's files: where a certificate of a set of names is kept in the watched
//! certificate directory (`<first name>.crt`/`.key`, a wildcard `*.example.com` as
//! `_wildcard.example.com`), what the certificate there covers and when it expires, and
//! atomic writes (temporary name, sync, rename; mode 0600).

use std::path::{Path, PathBuf};

use super::AcmeError;

/// What the certificate on disk says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnDisk {
    /// Seconds since the epoch.
    pub not_before: u64,
    pub not_after: u64,
}

/// The file name (without extension) of the certificate of `names`.
pub fn stem(names: &[String]) -> String {
    let first = names.first().map_or("acme", String::as_str);
    match first.strip_prefix("*.") {
        Some(rest) => format!("_wildcard.{rest}"),
        None => first.to_string(),
    }
}

/// `<dir>/<stem>.<ext>`.
pub fn cert_path(dir: &Path, names: &[String], ext: &str) -> PathBuf {
    dir.join(format!("{}.{ext}", stem(names)))
}

/// The certificate at `path`, when it can be read and covers every one of `names`.
pub fn read_covering(path: &Path, names: &[String]) -> Option<OnDisk> {
    with_certificate(path, |cert| covering(cert, names))
}

/// `read` applied to the (first) certificate of the PEM file at `path`.
pub fn with_certificate<T>(
    path: &Path,
    read: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> Option<T>,
) -> Option<T> {
    let pem =
        crate::config::file_bytes::read_regular(path, crate::config::yaml::MAX_FILE_BYTES).ok()?;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = block.parse_x509().ok()?;
    read(&cert)
}

fn covering(
    cert: &x509_parser::certificate::X509Certificate<'_>,
    names: &[String],
) -> Option<OnDisk> {
    let sans: Vec<String> = cert
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
    if !names.iter().all(|d| sans.contains(d)) {
        return None;
    }
    Some(OnDisk {
        not_before: cert.validity().not_before.timestamp().max(0) as u64,
        not_after: cert.validity().not_after.timestamp().max(0) as u64,
    })
}

/// Writes `bytes` to `path` through a temporary file and a rename (mode 0600).
pub fn write_atomically(path: &Path, bytes: &[u8], what: &'static str) -> Result<(), AcmeError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_are_kept_under_a_file_name_without_a_star() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            stem(&names(&["*.example.com", "example.com"])),
            "_wildcard.example.com"
        );
        assert_eq!(stem(&names(&["www.example.com"])), "www.example.com");
    }
}
