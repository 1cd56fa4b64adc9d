//! TLS to backends (`https://` entries and detected TLS backends, SPEC §6.3): ALPN offers
//! `h2,http/1.1` and the backend's choice decides the protocol. Like Aralez (and nginx by
//! default) the backend's certificate is not verified unless `upstream_tls_verify: true`; the
//! handshake's signatures always are, so the session is bound to the key the backend presented.
//! Verification uses the system's trust store (`SSL_CERT_FILE` / `SSL_CERT_DIR` override it) and
//! checks the certificate against the SNI name. SNI is the request's host when it is a name,
//! else the backend's host.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

/// The system's trust anchors, loaded once (the first verified backend connection, or
/// [`load_trust_store`] at startup).
static SYSTEM_ROOTS: LazyLock<Arc<rustls::RootCertStore>> = LazyLock::new(|| {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!("trust store for upstream_tls_verify: {error}");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            "no trusted certificates found: verified backends will fail their handshakes"
        );
    }
    tracing::debug!(added, ignored, "trust store loaded for upstream_tls_verify");
    Arc::new(roots)
});

/// Loads the trust store now (off the request path), when some backend will need it.
pub fn load_trust_store() {
    LazyLock::force(&SYSTEM_ROOTS);
}

fn client_config(alpn: &[&[u8]], verify: bool) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // Not user input: aws-lc-rs supports rustls' default versions, so this cannot fail.
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default TLS versions");
    let mut config = if verify {
        builder
            .with_root_certificates(SYSTEM_ROOTS.clone())
            .with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(UnverifiedCertificate(provider)))
            .with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

const H2_AND_H1: &[&[u8]] = &[b"h2", b"http/1.1"];
const H1: &[&[u8]] = &[b"http/1.1"];
static OFFER_H2: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| client_config(H2_AND_H1, false));
static ONLY_H1: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| client_config(H1, false));
static VERIFIED_OFFER_H2: LazyLock<Arc<ClientConfig>> =
    LazyLock::new(|| client_config(H2_AND_H1, true));
static VERIFIED_ONLY_H1: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| client_config(H1, true));

/// A backend's TLS stream whose end without `close_notify` is an end, not an error. Many
/// servers close that way (Python's `ssl`, some appliances); an answer whose body ends with the
/// connection (HTTP/1.0, no `Content-Length`) was then cut with an error although all of it had
/// come. nginx and curl take it as the end too. A body of known length that ends early is still
/// an error (hyper counts its bytes).
pub type BackendTls = ClosedIsEnd<TlsStream<TcpStream>>;

pin_project_lite::pin_project! {
    /// `inner`, with `UnexpectedEof` read as the end of the stream.
    pub struct ClosedIsEnd<S> {
        #[pin]
        inner: S,
    }
}

impl<S> ClosedIsEnd<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead> AsyncRead for ClosedIsEnd<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.project().inner.poll_read(cx, buf) {
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite> AsyncWrite for ClosedIsEnd<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Runs the handshake on `stream`; returns the TLS stream and whether the backend chose h2.
/// `verify`: check the certificate chain against the trust store and `host`.
pub async fn handshake(
    stream: TcpStream,
    host: &str,
    offer_h2: bool,
    verify: bool,
) -> std::io::Result<(BackendTls, bool)> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    };
    let config = match (offer_h2, verify) {
        (true, false) => OFFER_H2.clone(),
        (false, false) => ONLY_H1.clone(),
        (true, true) => VERIFIED_OFFER_H2.clone(),
        (false, true) => VERIFIED_ONLY_H1.clone(),
    };
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Ok((ClosedIsEnd { inner: tls }, h2))
}
