//! Helpers for the policy and health-check tests: a backend whose answers the test controls, an
//! auth service for forward auth, clients bound to a chosen source address, and JWT makers.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;

use crate::support::{full, Client, ClientBody, Proto};

/// Marks health probes (the proxy's `User-Agent` for them).
pub const PROBE_AGENT: &str = "aralez-health-check";

/// A backend answering the status the test sets (0: accept, read, never answer), with
/// `x-backend: <name>` and two `Set-Cookie` headers of its own. Counts proxied requests and health
/// probes separately.
pub struct StatusBackend {
    pub name: &'static str,
    pub addr: SocketAddr,
    status: Arc<AtomicU16>,
    pub requests: Arc<AtomicUsize>,
    pub probes: Arc<AtomicUsize>,
    tasks: Mutex<Option<JoinSet<()>>>,
}

impl StatusBackend {
    pub async fn start(name: &'static str, status: u16) -> StatusBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let status = Arc::new(AtomicU16::new(status));
        let requests = Arc::new(AtomicUsize::new(0));
        let probes = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let (st, rq, pr) = (status.clone(), requests.clone(), probes.clone());
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (st, rq, pr) = (st.clone(), rq.clone(), pr.clone());
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (st, rq, pr) = (st.clone(), rq.clone(), pr.clone());
                        async move { Ok::<_, Infallible>(answer(name, &st, &rq, &pr, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        StatusBackend {
            name,
            addr,
            status,
            requests,
            probes,
            tasks: Mutex::new(Some(tasks)),
        }
    }

    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }

    /// Stops listening and drops every connection.
    pub fn stop(&self) {
        if let Some(mut set) = self.tasks.lock().unwrap().take() {
            set.abort_all();
        }
    }
}

impl Drop for StatusBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn answer(
    name: &'static str,
    status: &AtomicU16,
    requests: &AtomicUsize,
    probes: &AtomicUsize,
    req: Request<Incoming>,
) -> Response<ClientBody> {
    let probe = req
        .headers()
        .get("user-agent")
        .is_some_and(|v| v == PROBE_AGENT);
    if probe {
        probes.fetch_add(1, Ordering::SeqCst);
    } else {
        requests.fetch_add(1, Ordering::SeqCst);
    }
    let code = status.load(Ordering::SeqCst);
    if code == 0 {
        std::future::pending::<()>().await;
    }
    let seen = |h: &str| {
        req.headers()
            .get(h)
            .map(|v| v.to_str().unwrap_or("?").to_string())
            .unwrap_or_else(|| "-".into())
    };
    Response::builder()
        .status(code)
        .header("x-backend", name)
        // The target as a path and query, whether it came in HTTP/1.1 or HTTP/2 (absolute).
        .header(
            "x-seen-uri",
            req.uri().path_and_query().map_or("/", |p| p.as_str()),
        )
        .header("x-seen-remote-user", seen("remote-user"))
        .header("x-seen-auth-groups", seen("x-auth-groups"))
        .header("set-cookie", format!("app={name}; Path=/"))
        .header("set-cookie", "theme=dark; Path=/")
        .body(full(name))
        .unwrap()
}

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
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
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
