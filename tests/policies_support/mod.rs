//! Helpers for the policy and health-check tests: an auth service for forward auth, clients bound to a chosen source address, and JWT makers.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

use crate::support::{bind_local, full, Client, ClientBody, Proto};

/// Connects to the proxy from a chosen source address (127.0.0.0/8 acts as many clients).
pub async fn connect_from(proto: Proto, proxy: SocketAddr, source: IpAddr) -> Client {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
        .expect("bind source");
    let stream = socket.connect(proxy).await.expect("connect to proxy");
    stream.set_nodelay(true).unwrap();
    Client::handshake(proto, stream).await
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An HS256 token over `claims` (JSON text).
pub fn hs256(secret: &str, claims: &str) -> String {
    let claims: serde_json::Value = serde_json::from_str(claims).unwrap();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// A token with a hand-written header (`alg: none`, RS256) and the given signature part.
pub fn forged(alg: &str, claims: &str, signature: &str) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(format!("{{\"alg\":\"{alg}\",\"typ\":\"JWT\"}}"));
    format!("{header}.{}.{signature}", b64.encode(claims))
}

/// A forward-auth service: decides by the `X-Forwarded-Uri` it is sent. `/ok...` -> 200 with
/// `Remote-User: alice` and `X-Auth-Groups: staff`; `/redirect...` -> 302 to a login page;
/// `/hang...` -> never answers; anything else -> 401 with a body. Remembers the last request's
/// headers.
pub struct AuthService {
    pub addr: SocketAddr,
    pub asked: Arc<AtomicUsize>,
    pub last: Arc<Mutex<Vec<(String, String)>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl AuthService {
    pub async fn start() -> AuthService {
        let listener = bind_local().await;
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(Mutex::new(Vec::new()));
        let (a, l) = (asked.clone(), last.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (a, l) = (a.clone(), l.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (a, l) = (a.clone(), l.clone());
                        async move { Ok::<_, Infallible>(decide(&a, &l, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        AuthService {
            addr,
            asked,
            last,
            _task: task,
        }
    }

    pub fn last_header(&self, name: &str) -> Option<String> {
        self.last
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

async fn decide(
    asked: &AtomicUsize,
    last: &Mutex<Vec<(String, String)>>,
    req: Request<Incoming>,
) -> Response<ClientBody> {
    asked.fetch_add(1, Ordering::SeqCst);
    *last.lock().unwrap() = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
        .collect();
    let uri = req
        .headers()
        .get("x-forwarded-uri")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let builder = Response::builder();
    if uri.starts_with("/ok") {
        builder
            .status(200)
            .header("remote-user", "alice")
            .header("x-auth-groups", "staff")
            .header("x-unrelated", "not copied")
            .body(full(Bytes::new()))
            .unwrap()
    } else if uri.starts_with("/redirect") {
        builder
            .status(302)
            .header("location", "https://login.example/")
            .header("set-cookie", "auth_state=xyz")
            .body(full("go log in"))
            .unwrap()
    } else if uri.starts_with("/hang") {
        std::future::pending::<()>().await;
        unreachable!()
    } else {
        builder
            .status(401)
            .header("www-authenticate", "Bearer realm=\"sso\"")
            .body(full("who are you?"))
            .unwrap()
    }
}
