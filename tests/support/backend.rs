//! The one mock backend every test uses, and the listener helpers every test server binds with.
//!
//! [`Backend`] answers each request with facts about what it saw (`x-seen-*` headers); its status
//! is set by the test and can change while it runs; it counts accepted connections, proxied
//! requests and health probes apart; it can be stopped and started again on the same address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;

use super::{eventually_some, full, generated_body, ClientBody};

/// Marks health probes: the `User-Agent` the proxy sends them with.
pub const PROBE_AGENT: &str = "aralez-health-check";

/// `127.0.0.1:0`: any free port on the loopback address.
pub fn any_local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A listener on `127.0.0.1` bound as the proxy binds its own (the connections it accepts
/// inherit its socket options), for an accept loop a test runs in process.
pub fn proxy_listener() -> std::net::TcpListener {
    let mut bound = aralez::server::bind_reuseport(any_local(), 1).expect("bind");
    bound.remove(0)
}

/// A listener bound as [`proxy_listener`] is, but handing connections over as their handshakes
/// end (no TCP_DEFER_ACCEPT): for tests on tokio's paused clock that time a silent connection
/// from its accept, which the kernel's deferral (real time) would hold back.
pub fn undeferred_listener() -> std::net::TcpListener {
    let options = aralez::server::ListenOptions {
        defer_accept: false,
        ..Default::default()
    };
    aralez::server::listener::bind_one(any_local(), options).expect("bind")
}

/// A listener on `127.0.0.1` with a port the OS picks: what every test server binds.
pub async fn bind_local() -> TcpListener {
    bind(any_local()).await
}

/// Binds `addr` (port 0: any) as tokio's `TcpListener::bind` does (SO_REUSEADDR). A port just
/// given up by a stopped server (whose tasks are aborted, so its listener closes a moment later)
/// is retried for up to 2 s; any other error panics with the address.
pub async fn bind(addr: SocketAddr) -> TcpListener {
    let listener = eventually_some(Duration::from_secs(2), || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .unwrap_or_else(|e| panic!("socket for {addr}: {e}"));
        socket
            .set_reuseaddr(true)
            .unwrap_or_else(|e| panic!("SO_REUSEADDR for {addr}: {e}"));
        match socket.bind(addr) {
            Ok(()) => Some(
                socket
                    .listen(1024)
                    .unwrap_or_else(|e| panic!("listen on {addr}: {e}")),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => None,
            Err(e) => panic!("bind {addr}: {e}"),
        }
    })
    .await;
    listener.unwrap_or_else(|| panic!("{addr} stays in use"))
}

/// The protocols a [`Backend`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaks {
    /// HTTP/1.1 and h2c by prior knowledge.
    Both,
    /// HTTP/1.1 only (it answers the HTTP/2 preface with an error).
    H1Only,
    /// h2c only, with this SETTINGS_MAX_CONCURRENT_STREAMS.
    H2Limited(u32),
}

/// What a backend's answers depend on, shared by its connections.
#[derive(Clone)]
pub(crate) struct Answers {
    name: &'static str,
    /// The status to answer; 0: read the request and never answer.
    status: Arc<AtomicU16>,
    cookies: bool,
    /// Health probes are read and never answered; requests are.
    probes_hang: bool,
    requests: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
}

impl Answers {
    /// Answers as `name` with status 200, no cookies, counters of its own.
    pub(crate) fn plain(name: &'static str) -> Answers {
        Answers {
            name,
            status: Arc::new(AtomicU16::new(200)),
            cookies: false,
            probes_hang: false,
            requests: Arc::default(),
            probes: Arc::default(),
        }
    }

    /// Its (requests, probes) counters.
    pub(crate) fn counters(&self) -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
        (self.requests.clone(), self.probes.clone())
    }
}

/// How to start a [`Backend`]: see [`Backend::builder`].
pub struct BackendBuilder {
    name: &'static str,
    speaks: Speaks,
    status: u16,
    cookies: bool,
    probes_hang: bool,
}

impl BackendBuilder {
    /// Speaks HTTP/1.1 only.
    pub fn h1_only(mut self) -> Self {
        self.speaks = Speaks::H1Only;
        self
    }

    /// Speaks h2c only, announcing SETTINGS_MAX_CONCURRENT_STREAMS = `streams`.
    pub fn h2c_limited(mut self, streams: u32) -> Self {
        self.speaks = Speaks::H2Limited(streams);
        self
    }

    /// The status it answers at first (0: accept, read, never answer); see [`Backend::set_status`].
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Adds two `Set-Cookie` headers of its own to every answer: `app=<name>; Path=/` and
    /// `theme=dark; Path=/`.
    pub fn cookies(mut self) -> Self {
        self.cookies = true;
        self
    }

    /// Reads health probes and never answers them, while it answers requests: a backend whose
    /// health check is stuck, or that takes its new connections late, but that serves.
    pub fn hanging_probes(mut self) -> Self {
        self.probes_hang = true;
        self
    }

    /// Starts on a port of 127.0.0.1 the OS picks.
    pub async fn start(self) -> Backend {
        self.start_on(any_local()).await
    }

    /// Starts on `addr` (e.g. to bring a stopped backend back on its address).
    pub async fn start_on(self, addr: SocketAddr) -> Backend {
        let listener = bind(addr).await;
        let answers = Answers {
            name: self.name,
            status: Arc::new(AtomicU16::new(self.status)),
            cookies: self.cookies,
            probes_hang: self.probes_hang,
            requests: Arc::default(),
            probes: Arc::default(),
        };
        Backend::serve(listener, self.speaks, answers)
    }
}

/// A test backend: answers every request with facts about what it saw.
///
/// Response headers: `x-backend` (its name), `x-seen-host`, `x-seen-xff`, `x-seen-request-id`, `x-seen-proto`,
/// `x-seen-fwd-host`, `x-seen-forwarded-lines` (values of the three `X-Forwarded-*` fields),
/// `x-seen-request-id-lines` (values of `X-Request-Id`), `x-seen-te` (the `TE` values, `|`-joined),
/// `x-seen-uri` (path and query), `x-seen-target` (the request target as
/// received: absolute over HTTP/2), `x-seen-version`, `x-seen-headers` (every header name, sorted,
/// comma-joined), `x-seen-remote-user`, `x-seen-auth-groups`. Paths: `/big/<bytes>` streams that
/// many bytes; `/sized/<bytes>` sends that many in one piece, with a `Content-Length`; `/echo...` streams the request body back; `/slow/<ms>` answers after that long;
/// anything else answers `name` as the body. HTTP/1.1 responses also carry hop-by-hop headers the
/// proxy must drop.
///
/// Counters: `accepts` (connections), `requests` (everything but health probes) and `probes`
/// (requests with the proxy's probe `User-Agent`, [`PROBE_AGENT`]).
pub struct Backend {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub accepts: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
    pub probes: Arc<AtomicUsize>,
    status: Arc<AtomicU16>,
    tasks: Arc<Mutex<Option<JoinSet<()>>>>,
}

impl Backend {
    /// A backend to configure: HTTP/1.1 and h2c, status 200, no cookies until told otherwise.
    pub fn builder(name: &'static str) -> BackendBuilder {
        BackendBuilder {
            name,
            speaks: Speaks::Both,
            status: 200,
            cookies: false,
            probes_hang: false,
        }
    }

    /// A backend speaking HTTP/1.1 and h2c (prior knowledge), answering 200.
    pub async fn start(name: &'static str) -> Backend {
        Self::builder(name).start().await
    }

    fn serve(listener: TcpListener, speaks: Speaks, answers: Answers) -> Backend {
        let addr = listener.local_addr().expect("listener address");
        let accepts = Arc::new(AtomicUsize::new(0));
        let tasks = Arc::new(Mutex::new(Some(JoinSet::new())));
        let (acc, set, ans) = (accepts.clone(), tasks.clone(), answers.clone());
        let accept_loop = async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                acc.fetch_add(1, Ordering::SeqCst);
                let ans = ans.clone();
                let conn = async move {
                    let svc = service_fn(move |req| answer(ans.clone(), req));
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match speaks {
                        Speaks::Both => {}
                        Speaks::H1Only => builder = builder.http1_only(),
                        Speaks::H2Limited(streams) => {
                            builder.http2().max_concurrent_streams(streams);
                            builder = builder.http2_only();
                        }
                    }
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                };
                if let Some(set) = set.lock().unwrap().as_mut() {
                    set.spawn(conn);
                }
            }
        };
        if let Some(set) = tasks.lock().unwrap().as_mut() {
            set.spawn(accept_loop);
        }
        Backend {
            name: answers.name,
            addr,
            accepts,
            requests: answers.requests,
            probes: answers.probes,
            status: answers.status,
            tasks,
        }
    }

    /// Answers `status` from now on (0: accept, read, never answer).
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Requests served so far, health probes not counted.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Health probes seen so far.
    pub fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (probes' included).
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every open connection.
    pub fn stop(&self) {
        if let Some(mut set) = self.tasks.lock().unwrap().take() {
            set.abort_all();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One answer of a [`Backend`] (or a TLS backend answering like one).
pub(crate) async fn answer(
    ans: Answers,
    req: Request<Incoming>,
) -> Result<Response<ClientBody>, Infallible> {
    let probe = req
        .headers()
        .get("user-agent")
        .is_some_and(|v| v == PROBE_AGENT);
    if probe {
        ans.probes.fetch_add(1, Ordering::SeqCst);
        if ans.probes_hang {
            std::future::pending::<()>().await;
        }
    } else {
        ans.requests.fetch_add(1, Ordering::SeqCst);
    }
    let code = ans.status.load(Ordering::SeqCst);
    if code == 0 {
        std::future::pending::<()>().await;
    }
    let name = ans.name;
    let seen = |h: &str| {
        req.headers()
            .get(h)
            .cloned()
            .unwrap_or(HeaderValue::from_static("-"))
    };
    let mut names: Vec<&str> = req.headers().keys().map(HeaderName::as_str).collect();
    names.sort_unstable();
    let mut builder = Response::builder()
        .status(code)
        .header("x-backend", name)
        .header("x-seen-host", seen("host"))
        .header("x-seen-xff", seen("x-forwarded-for"))
        .header("x-seen-request-id", seen("x-request-id"))
        .header("x-seen-proto", seen("x-forwarded-proto"))
        .header("x-seen-fwd-host", seen("x-forwarded-host"))
        .header(
            "x-seen-uri",
            req.uri().path_and_query().map_or("/", |p| p.as_str()),
        )
        .header("x-seen-target", req.uri().to_string())
        .header("x-seen-version", format!("{:?}", req.version()))
        .header("x-seen-headers", names.join(","))
        .header("x-seen-forwarded-lines", forwarded_lines(req.headers()))
        .header(
            "x-seen-request-id-lines",
            req.headers().get_all("x-request-id").iter().count(),
        )
        .header("x-seen-remote-user", seen("remote-user"))
        .header("x-seen-auth-groups", seen("x-auth-groups"))
        .header("x-seen-authorization", seen("authorization"))
        .header("x-seen-te", fields_of(req.headers(), "te"))
        .header("x-seen-cookie-fields", fields_of(req.headers(), "cookie"));
    if ans.cookies {
        builder = builder
            .header("set-cookie", format!("app={name}; Path=/"))
            .header("set-cookie", "theme=dark; Path=/");
    }
    if req.version() == http::Version::HTTP_11 {
        // Hop-by-hop headers the proxy must not pass on to its client.
        builder = builder
            .header("keep-alive", "timeout=5")
            .header("x-hop", "must-go")
            .header("connection", "x-hop");
    }
    let path = req.uri().path().to_string();
    let body: ClientBody = if let Some(n) = path.strip_prefix("/big/") {
        generated_body(n.parse().unwrap_or(0))
    } else if let Some(n) = path.strip_prefix("/sized/") {
        full(vec![b'x'; n.parse().unwrap_or(0)])
    } else if path.starts_with("/echo") {
        echo_until_error(req.into_body())
    } else if path.starts_with("/collect") {
        // The whole request body first, then an answer: its length.
        let read = req.into_body().collect().await.map(|b| b.to_bytes().len());
        full(read.map_or_else(|_| "broken".to_string(), |n| n.to_string()))
    } else if let Some(ms) = path.strip_prefix("/pause/") {
        paused_body(Duration::from_millis(ms.parse().unwrap_or(0)))
    } else if let Some(ms) = path.strip_prefix("/slow/") {
        let ms: u64 = ms.parse().unwrap_or(0);
        // The point of /slow/: an answer that really takes this long.
        tokio::time::sleep(Duration::from_millis(ms)).await;
        full(name)
    } else {
        full(name)
    };
    Ok(builder.body(body).expect("backend response"))
}

/// `first,` at once, then `rest` after `pause`: a backend quiet in the middle of its answer.
fn paused_body(pause: Duration) -> ClientBody {
    let frames = futures_util::stream::unfold(0, move |sent| async move {
        let data: &'static [u8] = match sent {
            0 => b"first,",
            1 => {
                tokio::time::sleep(pause).await;
                b"rest"
            }
            _ => return None,
        };
        Some((
            Ok::<_, Infallible>(hyper::body::Frame::data(data.into())),
            sent + 1,
        ))
    });
    http_body_util::StreamBody::new(frames).boxed()
}

/// The request's body as the answer's, ended at the first error. A request body fails when the
/// proxy gave up on it (its client went away), so the answer has nobody to reach; ending it is
/// quieter than failing the connection's task, and a test comparing bodies reports the mismatch.
fn echo_until_error(body: Incoming) -> ClientBody {
    let frames = futures_util::stream::unfold(body, |mut body| async move {
        match body.frame().await? {
            Ok(frame) => Some((Ok::<_, Infallible>(frame), body)),
            Err(_) => None,
        }
    });
    http_body_util::StreamBody::new(frames).boxed()
}

/// Every `name` field, joined with `|`, or `-` without one.
fn fields_of(headers: &http::HeaderMap, name: &str) -> String {
    let fields: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .collect();
    if fields.is_empty() {
        "-".into()
    } else {
        fields.join("|")
    }
}

/// How many `X-Forwarded-For`, `-Proto` and `-Host` values a request carried, all three together.
fn forwarded_lines(headers: &http::HeaderMap) -> String {
    ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"]
        .iter()
        .map(|name| headers.get_all(*name).iter().count())
        .sum::<usize>()
        .to_string()
}
