//! Client TLS handshakes that failed, by why (`aralez_tls_handshake_failures_total{reason}`):
//! per connection, not per request, so one set of counters for the process.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a client's TLS handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// No protocol version, cipher suite, group or signature scheme in common.
    Incompatible,
    /// No certificate for the name asked (nor a default one).
    NoCertificate,
    /// The client ended it with an alert: it refused the certificate, most often.
    ClientAlert,
    /// What the client sent was not TLS as it should be.
    Malformed,
    /// Not finished within `client_header_timeout`.
    Timeout,
    /// The connection closed or broke during it.
    Closed,
    Other,
}

impl TlsFailure {
    pub(super) const ALL: [TlsFailure; 7] = [
        TlsFailure::Incompatible,
        TlsFailure::NoCertificate,
        TlsFailure::ClientAlert,
        TlsFailure::Malformed,
        TlsFailure::Timeout,
        TlsFailure::Closed,
        TlsFailure::Other,
    ];

    /// The `reason` label's value, and the log's word.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::Incompatible => "incompatible",
            TlsFailure::NoCertificate => "no_certificate",
            TlsFailure::ClientAlert => "client_alert",
            TlsFailure::Malformed => "malformed",
            TlsFailure::Timeout => "timeout",
            TlsFailure::Closed => "closed",
            TlsFailure::Other => "other",
        }
    }

    /// Why the handshake that failed with `error` did.
    pub fn of(error: &std::io::Error) -> TlsFailure {
        match crate::vocab::error_text::tls_error_of(error) {
            None => TlsFailure::Closed,
            Some(rustls::Error::PeerIncompatible(_)) => TlsFailure::Incompatible,
            Some(rustls::Error::AlertReceived(_)) => TlsFailure::ClientAlert,
            Some(
                rustls::Error::InvalidMessage(_)
                | rustls::Error::InappropriateMessage { .. }
                | rustls::Error::InappropriateHandshakeMessage { .. }
                | rustls::Error::PeerMisbehaved(_)
                | rustls::Error::DecryptError,
            ) => TlsFailure::Malformed,
            Some(rustls::Error::General(text)) if text.contains("no server certificate") => {
                TlsFailure::NoCertificate
            }
            Some(_) => TlsFailure::Other,
        }
    }
}

/// The counters, one per [`TlsFailure`].
#[derive(Default)]
pub(super) struct TlsFailures([AtomicU64; TlsFailure::ALL.len()]);

impl TlsFailures {
    pub(super) fn count(&self, why: TlsFailure) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn each(&self) -> impl Iterator<Item = (TlsFailure, u64)> + '_ {
        let counts = self.0.iter().map(|n| n.load(Ordering::Relaxed));
        TlsFailure::ALL.into_iter().zip(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_errors_are_told_apart() {
        let tls = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let incompatible = rustls::PeerIncompatible::NoCipherSuitesInCommon;
        let cases = [
            (
                tls(rustls::Error::PeerIncompatible(incompatible)),
                "incompatible",
            ),
            (
                tls(rustls::Error::AlertReceived(
                    rustls::AlertDescription::UnknownCA,
                )),
                "client_alert",
            ),
            (
                tls(rustls::Error::General(
                    "no server certificate chain resolved".into(),
                )),
                "no_certificate",
            ),
            (
                std::io::Error::from(std::io::ErrorKind::ConnectionReset),
                "closed",
            ),
        ];
        for (error, word) in cases {
            assert_eq!(TlsFailure::of(&error).as_str(), word, "{error}");
        }
    }
}
