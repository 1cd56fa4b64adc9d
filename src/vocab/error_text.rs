//! An error as a log line shows it: with every cause under it, since the top error of a client
//! library often says only what failed (`client error (Connect)`), and its causes why.

/// The TLS error behind a failed handshake's `e`, if it was one (not a socket's), either side's.
pub fn tls_error_of(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// `e` with every cause under it (`client error (Connect): tcp connect error: Connection
/// refused (os error 111)`); a cause the text already holds is not said twice.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Top(#[source] std::io::Error);

    #[test]
    fn every_cause_is_said_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            with_causes(&Top(refused)),
            "client error (Connect): refused"
        );
    }
}
