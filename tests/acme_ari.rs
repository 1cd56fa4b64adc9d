//! ACME Renewal Information (RFC 9773). Debian's pebble (2.4) has no `renewalInfo`, so a small
//! HTTPS server stands in front of its directory: it serves pebble's directory with a
//! `renewalInfo` URL of its own added (every other URL still points at pebble), and answers
//! that URL with the suggested window the test sets, as RFC 9773 §4.2 shapes it, with a
//! `Retry-After`. The certificate identifier aralez asks with is checked against what
//! `openssl x509` reads from the certificate (its AKI key id and serial).

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use support::pebble::*;
use support::ports::free_port;
use support::*;

/// The window the stand-in suggests, and the identifiers it was asked about.
#[derive(Default)]
struct Ari {
    window: Option<(SystemTime, SystemTime)>,
    asked: Vec<String>,
}

/// A stand-in for pebble on a TLS port of its own, passing every request on with its own
/// `Host` (so pebble's URLs name the stand-in and every later request comes through it too),
/// with two changes: the directory gains `renewalInfo`, and an order's answer repeats the
/// `replaces` its request carried (RFC 9773 §5, which pebble 2.4 does not know). Returns the
/// directory URL.
async fn ari_front(pebble: &Pebble, ari: Arc<Mutex<Ari>>) -> String {
    use rustls_pki_types::pem::PemObject;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(pebble.listener_key_pem.as_bytes())
        .expect("pebble's key");
    let acceptor = tls_acceptor_for(vec![pebble.listener_cert.clone()], key, &[b"http/1.1"]);
    let pebble_addr: SocketAddr = pebble
        .directory
        .trim_start_matches("https://")
        .trim_end_matches("/dir")
        .parse()
        .expect("pebble's address");
    let front = Front {
        ari,
        pebble: pebble_addr,
        ca: pebble.ca.clone(),
        host: format!("127.0.0.1:{}", free_port()),
    };
    let addr: SocketAddr = front.host.parse().expect("address");
    let url = format!("https://{}/dir", front.host);
    let front = Arc::new(front);
    serve_tls(acceptor, addr, move |tls| {
        let front = front.clone();
        async move {
            let svc = service_fn(move |req| {
                let front = front.clone();
                async move { front.answer(req).await }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        }
    })
    .await;
    url
}

struct Front {
    ari: Arc<Mutex<Ari>>,
    pebble: SocketAddr,
    ca: rustls_pki_types::CertificateDer<'static>,
    /// The stand-in's own `host:port`.
    host: String,
}

impl Front {
    async fn answer(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let path = req.uri().path().to_string();
        if let Some(id) = path.strip_prefix("/renewal-info/") {
            return Ok(self.renewal_info(id));
        }
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        let headers: Vec<(&str, &str)> = content_type
            .map(|t| ("content-type", t))
            .into_iter()
            .collect();
        let config = tls_client_config(std::slice::from_ref(&self.ca), &[b"http/1.1"]);
        let mut client = Client::connect_tls(self.pebble, "localhost", config).await;
        let resp = client
            .send(
                parts.method.clone(),
                Some(&self.host),
                &path,
                &headers,
                full(body.clone()),
            )
            .await;
        let (mut head, answer) = resp.into_parts();
        let mut answer = answer
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut json: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        if path == "/dir" {
            json["renewalInfo"] = format!("https://{}/renewal-info", self.host).into();
            answer = Bytes::from(json.to_string());
        } else if path.starts_with("/order-plz") {
            json["replaces"] = jws_payload(&body)["replaces"].clone();
            answer = Bytes::from(json.to_string());
        }
        head.headers.remove("content-length");
        head.headers.remove("transfer-encoding");
        Ok(Response::from_parts(head, Full::new(answer)))
    }

    fn renewal_info(&self, id: &str) -> Response<Full<Bytes>> {
        let mut ari = self.ari.lock().unwrap();
        ari.asked.push(id.to_string());
        let Some((start, end)) = ari.window else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::new()))
                .expect("response");
        };
        let window = serde_json::json!({ "suggestedWindow": {
            "start": aralez::utc::rfc3339(start), "end": aralez::utc::rfc3339(end) } });
        Response::builder()
            .header("retry-after", "60")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(window.to_string())))
            .expect("response")
    }
}

/// The payload of a flattened JWS (RFC 7515 §7.2.2), as JSON.
fn jws_payload(body: &[u8]) -> serde_json::Value {
    let jws: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let payload = jws["payload"].as_str().unwrap_or_default();
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap_or_default();
    serde_json::from_slice(&decoded).unwrap_or_default()
}

/// RFC 9773 §4.1's identifier of the certificate at `crt`, from `openssl x509`'s reading.
fn openssl_identifier(crt: &std::path::Path) -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-serial",
            "-ext",
            "authorityKeyIdentifier",
            "-in",
        ])
        .arg(crt)
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let hex = |s: &str| -> Vec<u8> {
        let digits: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
        (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex"))
            .collect()
    };
    let serial = text
        .lines()
        .find_map(|l| l.strip_prefix("serial="))
        .expect("a serial");
    let mut serial = hex(serial);
    // DER's INTEGER content: a leading zero when the top bit is set.
    if serial.first().is_some_and(|b| b & 0x80 != 0) {
        serial.insert(0, 0);
    }
    let key_id = text
        .lines()
        .skip_while(|l| !l.contains("Authority Key Identifier"))
        .nth(1)
        .expect("an AKI")
        .trim()
        .trim_start_matches("keyid:");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!("{}.{}", b64.encode(hex(key_id)), b64.encode(serial))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_renewal_window_decides_when_a_fresh_certificate_is_renewed() {
    let Some(Issued {
        pebble,
        http,
        yaml,
        main: direct,
        certs,
        state: _state,
        proxy,
        backend: _backend,
    }) = issued_for_acme_test().await
    else {
        return;
    };
    drop(proxy);
    let crt = certs.path().join("acme.test.crt");
    let first = std::fs::read(&crt).expect("certificate");
    let first_id = openssl_identifier(&crt);

    // Through the stand-in: a window that opened an hour ago renews the fresh certificate now.
    let ari = Arc::new(Mutex::new(Ari::default()));
    let now = SystemTime::now();
    ari.lock().unwrap().window = Some((
        now - Duration::from_secs(3600),
        now - Duration::from_secs(60),
    ));
    let front = ari_front(&pebble, ari.clone()).await;
    let with_ari = direct.replace(&pebble.directory, &front);
    let proxy = ProxyProcess::start_on(&yaml, &with_ari, http);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    assert!(proxy
        .log_text()
        .contains("the server suggests renewing between"));
    assert_ne!(std::fs::read(&crt).expect("certificate"), first, "renewed");
    assert_eq!(ari.lock().unwrap().asked.first(), Some(&first_id));
    drop(proxy);

    // A window three weeks away: the certificate is kept, and the wait says so.
    ari.lock().unwrap().window = Some((
        now + Duration::from_secs(21 * 86_400),
        now + Duration::from_secs(22 * 86_400),
    ));
    let second = std::fs::read(&crt).expect("certificate");
    let proxy = ProxyProcess::start_on(&yaml, &with_ari, http);
    assert!(
        logs(&proxy, "a fresh certificate exists; renewal in").await,
        "{}",
        proxy.log_text()
    );
    let line = proxy
        .log_text()
        .lines()
        .find(|l| l.contains("renewal in"))
        .unwrap_or_default()
        .to_string();
    let hours: u64 = line
        .split("renewal in ")
        .nth(1)
        .and_then(|rest| rest.split('h').next())
        .and_then(|h| h.parse().ok())
        .expect("hours");
    assert!((21 * 24 - 1..22 * 24).contains(&hours), "{line}");
    assert_eq!(std::fs::read(&crt).expect("certificate"), second);
    assert_eq!(
        ari.lock().unwrap().asked.last(),
        Some(&openssl_identifier(&crt))
    );
}
