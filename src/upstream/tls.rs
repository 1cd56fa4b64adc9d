//! TLS to backends (`https://` entries, SPEC §6.3): ALPN offers `h2,http/1.1` and the backend's
//! choice decides the protocol. Like Aralez (and nginx by default) the backend's certificate is
//! not verified; the handshake's signatures still are, so the session is bound to the key the
//! backend presented. SNI is the request's host when it is a name, else none.

use std::sync::{Arc, LazyLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Accepts any certificate, but checks the handshake signatures with the provider's algorithms.
#[derive(Debug)]
struct UnverifiedCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for UnverifiedCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config(alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // Not user input: aws-lc-rs supports rustls' default versions, so this cannot fail.
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default TLS versions");
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(UnverifiedCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

static OFFER_H2: LazyLock<Arc<ClientConfig>> =
    LazyLock::new(|| client_config(&[b"h2", b"http/1.1"]));
static ONLY_H1: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| client_config(&[b"http/1.1"]));

/// Runs the handshake on `stream`; returns the TLS stream and whether the backend chose h2.
pub async fn handshake(
    stream: TcpStream,
    host: &str,
    offer_h2: bool,
) -> std::io::Result<(TlsStream<TcpStream>, bool)> {
    let name = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    };
    let config = if offer_h2 {
        OFFER_H2.clone()
    } else {
        ONLY_H1.clone()
    };
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Ok((tls, h2))
}
