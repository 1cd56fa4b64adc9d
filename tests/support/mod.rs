//! Test support: the real `aralez` binary as a child process, real backends (hyper servers) and
//! real clients over HTTP/1.1 or h2c, all on 127.0.0.1 with OS-chosen ports.
//!
//! - [`Backend`] (backend.rs): the one mock backend, and [`bind_local`]/[`bind`], which every
//!   test server binds with.
//! - [`Upstreams`] (upstreams.rs): upstreams.yaml as typed values.
//! - [`allow_connections`], [`open_in_batches`] (limits.rs): what a test with thousands of
//!   connections needs.
//! - [`eventually`], [`eventually_async`], [`eventually_blocking`], [`ProxyProcess::wait_log`]:
//!   wait for a condition with a deadline instead of sleeping and hoping.
#![allow(dead_code)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

mod backend;
mod limits;
pub mod pebble;
pub mod ports;
pub mod redis;
pub mod scripted;
pub mod tools;
pub mod upstreams;

pub use backend::*;
#[allow(unused_imports)] // only the tests with thousands of connections
pub use limits::{allow_connections, open_in_batches};
#[allow(unused_imports)] // each test file uses some of them
pub use upstreams::{
    default_route, default_route_to, host_route, http1_route, unused_route, Discovery, Host, Path,
    Service, Upstreams,
};

pub type ClientBody = BoxBody<Bytes, Infallible>;

/// The proxy under test, killed on drop.
pub struct ProxyProcess {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl ProxyProcess {
    /// Starts `aralez -c main.yaml` with the given upstreams file and extra main.yaml lines.
    pub fn start(upstreams: &str, main_extra: &str) -> ProxyProcess {
        Self::start_env(upstreams, main_extra, &[])
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the proxy, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A body of `total` bytes in 64 KiB chunks, produced as it is read.
pub fn generated_body(total: usize) -> ClientBody {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let stream = futures_util::stream::unfold(total, move |left| {
        let chunk = chunk.clone();
        async move {
            if left == 0 {
                return None;
            }
            let n = left.min(chunk.len());
            Some((Ok::<_, Infallible>(Frame::data(chunk.slice(..n))), left - n))
        }
    });
    StreamBody::new(stream).boxed()
}

pub fn full(data: impl Into<Bytes>) -> ClientBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The protocols the matrix runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2c,
}

pub const PROTOCOLS: [Proto; 2] = [Proto::H1, Proto::H2c];

/// One client connection to the proxy.
pub enum Client {
    H1(http1::SendRequest<ClientBody>),
    H2(http2::SendRequest<ClientBody>),
}

impl Client {
    pub async fn connect(proto: Proto, addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect to proxy");
        stream.set_nodelay(true).unwrap();
        Client::handshake(proto, stream).await
    }

    /// Speaks `proto` on an established connection (plain or TLS).
    pub async fn handshake<IO>(proto: Proto, io: IO) -> Client
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        match proto {
            Proto::H1 => {
                let (send, conn) = http1::handshake(io).await.expect("h1 handshake");
                tokio::spawn(conn);
                Client::H1(send)
            }
            Proto::H2c => {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .expect("h2 handshake");
                tokio::spawn(conn);
                Client::H2(send)
            }
        }
    }

    /// Sends a request for `path` to `host` (as `Host` over h1, `:authority` over h2).
    pub async fn send(
        &mut self,
        method: Method,
        host: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
        body: ClientBody,
    ) -> Response<Incoming> {
        self.try_send(method, host, path, headers, body)
            .await
            .expect("response from proxy")
    }

    /// [`Client::send`], with a failed exchange as an error instead of a panic.
    pub async fn try_send(
        &mut self,
        method: Method,
        host: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
        body: ClientBody,
    ) -> Result<Response<Incoming>, hyper::Error> {
        let mut builder = Request::builder().method(method);
        match self {
            Client::H1(_) => {
                builder = builder.uri(path);
                if let Some(h) = host {
                    builder = builder.header("host", h);
                }
            }
            Client::H2(_) => {
                let authority = host.unwrap_or("localhost");
                builder = builder.uri(format!("http://{authority}{path}"));
            }
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder.body(body).expect("request");
        match self {
            Client::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Client::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }

    pub async fn get(&mut self, host: &str, path: &str) -> Response<Incoming> {
        self.send(Method::GET, Some(host), path, &[], full(Bytes::new()))
            .await
    }
}

/// Reads a whole response body.
pub async fn body_bytes(resp: Response<Incoming>) -> Bytes {
    resp.into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes()
}

/// A response's header as text ("" when absent).
pub fn header(resp: &Response<Incoming>, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .unwrap_or_default()
}

/// HTTP/2 frames written and read by hand (RFC 9113 §4, §6): the preface, frame types and
/// flags, and the frames in what a peer sent.
pub mod frame {
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;

    /// One frame the proxy sent.
    pub struct Frame {
        pub kind: u8,
        pub flags: u8,
        pub stream: u32,
        pub payload: Vec<u8>,
    }

    /// The whole frames in `bytes` (which follow no preface), in order.
    pub fn frames(bytes: &[u8]) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 9 <= bytes.len() {
            let len = (usize::from(bytes[at]) << 16)
                | (usize::from(bytes[at + 1]) << 8)
                | usize::from(bytes[at + 2]);
            let end = at + 9 + len;
            if end > bytes.len() {
                break;
            }
            let stream =
                u32::from_be_bytes([bytes[at + 5], bytes[at + 6], bytes[at + 7], bytes[at + 8]]);
            out.push(Frame {
                kind: bytes[at + 3],
                flags: bytes[at + 4],
                stream: stream & 0x7fff_ffff,
                payload: bytes[at + 9..end].to_vec(),
            });
            at = end;
        }
        out
    }
}

/// An HTTP/2 frame written by hand (RFC 9113 §4.1): its 9-byte header, then `payload`.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("a frame's payload fits 24 bits")
        .to_be_bytes();
    assert_eq!(len[0], 0, "a frame's payload fits 24 bits");
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// How often the polling helpers look again.
const POLL: Duration = Duration::from_millis(20);

/// A temp dir with `upstreams.yaml` and `main.yaml` (two workers, a plain listener on a free
/// port, info logs, its own upgrade socket and pid file, then `main_extra`): the dir and
/// main.yaml's path.
pub fn write_config(upstreams: &str, main_extra: &str) -> (tempfile::TempDir, PathBuf) {
    write_config_listening(upstreams, main_extra, "127.0.0.1:0")
}

pub fn write_config_listening(
    upstreams: &str,
    main_extra: &str,
    listen: &str,
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("upstreams.yaml"), upstreams).expect("write upstreams");
    // Each proxy its own upgrade socket: a second instance on the same one is refused.
    let upgrade_sock = if main_extra.contains("upgrade_sock:") {
        String::new()
    } else {
        format!(
            "upgrade_sock: \"{}\"\n",
            dir.path().join("aralez.sock").display()
        )
    };
    // Two workers unless the test says how many.
    let threads = if main_extra.contains("threads:") {
        ""
    } else {
        "threads: 2\n"
    };
    let main = format!(
        "{threads}proxy_address_http: \"{listen}\"\nupstreams_conf: \"upstreams.yaml\"\nlog_level: info\npid_file: \"{}\"\n{upgrade_sock}{main_extra}\n",
        dir.path().join("aralez.pid").display()
    );
    let path = dir.path().join("main.yaml");
    std::fs::write(&path, main).expect("write main");
    (dir, path)
}

/// Polls `check` until it holds or `limit` passes; whether it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    // tokio's clock: the wall clock, or virtual time in a paused-clock test.
    let start = tokio::time::Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    check()
}

/// [`eventually`] for code that is not async (it blocks the thread between looks).
pub fn eventually_blocking(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(POLL);
    }
    check()
}

/// Polls the async `check` until it gives a value or `limit` passes (for checks that send
/// requests).
pub async fn eventually_async<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `find` until it gives a value or `limit` passes.
pub async fn eventually_some<T>(limit: Duration, mut find: impl FnMut() -> Option<T>) -> Option<T> {
    let mut found = None;
    eventually(limit, || {
        found = find();
        found.is_some()
    })
    .await;
    found
}

// ---- Operations helpers (process control, signals, logs) ----

/// The binary under test: this build's, or `ARALEZ_TEST_BINARY` (e.g. a release build, for a
/// measurement the debug build would distort).
pub fn binary() -> PathBuf {
    std::env::var_os("ARALEZ_TEST_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_aralez")))
}

impl ProxyProcess {
    /// Starts the binary with extra arguments on the config `conf` (another process's dir).
    pub fn spawn_args(conf: &std::path::Path, args: &[&str]) -> ProxyProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = Command::new(binary());
        command.args(args).arg("-c").arg(conf);
        Self::spawn_command(command, dir)
    }

    /// Like `start`, with environment variables for the proxy.
    pub fn start_env(upstreams: &str, main_extra: &str, env: &[(&str, &str)]) -> ProxyProcess {
        Self::start_binary(&binary(), upstreams, main_extra, env)
    }

    /// Like `start_env`, running `program` (another build of aralez) instead of [`binary`].
    pub fn start_binary(
        program: &std::path::Path,
        upstreams: &str,
        main_extra: &str,
        env: &[(&str, &str)],
    ) -> ProxyProcess {
        let (dir, main) = write_config(upstreams, main_extra);
        let mut command = Command::new(program);
        command.arg("-c").arg(main);
        command.envs(env.iter().copied());
        Self::spawn_command(command, dir)
    }

    /// [`ProxyProcess::start`] with the plain listener on `listen` (a port chosen by the test).
    pub fn start_on(upstreams: &str, main_extra: &str, listen: SocketAddr) -> ProxyProcess {
        let (dir, main) = write_config_listening(upstreams, main_extra, &listen.to_string());
        let mut command = Command::new(binary());
        command.arg("-c").arg(main);
        Self::spawn_command(command, dir)
    }

    /// [`ProxyProcess::start`] from a shell that first runs `prelude` (e.g. `ulimit -Sn 256`).
    pub fn start_after(upstreams: &str, main_extra: &str, prelude: &str) -> ProxyProcess {
        let (dir, main) = write_config(upstreams, main_extra);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("{prelude} && exec \"$0\" -c \"$1\""))
            .arg(env!("CARGO_BIN_EXE_aralez"))
            .arg(main);
        Self::spawn_command(command, dir)
    }

    /// Starts the binary logging to `log_file` in its directory (nothing on stdout), on a port
    /// chosen here; ready when the port accepts. Its log is the file: `log_text` stays empty.
    pub fn start_logging_to_file(upstreams: &str, main_extra: &str) -> ProxyProcess {
        Self::start_logging_to(upstreams, "aralez.log", main_extra)
    }

    /// [`ProxyProcess::start_logging_to_file`] with `log_file: "{log_file}"` (a rotation form, say).
    pub fn start_logging_to(upstreams: &str, log_file: &str, main_extra: &str) -> ProxyProcess {
        let addr: SocketAddr = ([127, 0, 0, 1], ports::free_port()).into();
        let extra = format!("log_file: \"{log_file}\"\n{main_extra}");
        let (dir, main) = write_config_listening(upstreams, &extra, &addr.to_string());
        let mut child = Command::new(binary())
            .arg("-c")
            .arg(main)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn aralez");
        let up = eventually_blocking(Duration::from_secs(20), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.path().join("aralez.log")).unwrap_or_default();
            panic!("proxy did not start on {addr}; aralez.log:\n{log}");
        }
        ProxyProcess {
            child,
            addr,
            dir,
            log: Arc::default(),
        }
    }

    fn spawn_command(mut command: Command, dir: tempfile::TempDir) -> ProxyProcess {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn aralez");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        for stream in [
            Box::new(stdout) as Box<dyn std::io::Read + Send>,
            Box::new(stderr),
        ] {
            let log = log.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(addr) = address_after(&line, "listening on http://") {
                        let _ = tx.send(addr);
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "proxy did not start; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        ProxyProcess {
            child,
            addr,
            dir,
            log,
        }
    }

    /// Sends `signal` to the proxy.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the proxy");
    }

    /// Waits up to `limit` for the proxy to exit; its status, or None if still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut status = None;
        eventually_blocking(limit, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }

    /// Waits for the process to exit (at most `limit`) and asserts it exited 0; `what` and the
    /// log say which otherwise.
    pub fn expect_clean_exit(&mut self, limit: Duration, what: &str) {
        let status = tokio::task::block_in_place(|| self.wait_exit(limit));
        assert_eq!(
            status.map(|s| s.code()),
            Some(Some(0)),
            "{what}: {}",
            self.log_text()
        );
    }

    /// The address logged after `marker` (e.g. "admin API on http://"), waiting up to 10 s.
    pub fn logged_addr(&self, marker: &str) -> SocketAddr {
        let mut found = None;
        eventually_blocking(Duration::from_secs(10), || {
            found = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| address_after(l, marker));
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no `{marker}` in the log:\n{}", self.log_text()))
    }

    /// How many log lines so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits up to `limit` until at least `n` log lines contain `needle`; whether they do.
    pub async fn wait_log_count(&self, needle: &str, n: usize, limit: Duration) -> bool {
        eventually(limit, || self.log_count(needle) >= n).await
    }

    /// Waits up to `limit` for a log line containing `needle`, panicking with the log if none
    /// comes.
    pub async fn wait_log(&self, needle: &str, limit: Duration) {
        assert!(
            self.wait_log_count(needle, 1, limit).await,
            "no `{needle}` in the log within {limit:?}:\n{}",
            self.log_text()
        );
    }
}

/// The `IP:port` that follows `marker` in `line`.
pub fn address_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = line.split(marker).nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// One plain HTTP/1.1 GET on a new connection; (status, headers, body).
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let mut client = Client::connect(Proto::H1, addr).await;
    let resp = client
        .send(
            Method::GET,
            Some("localhost"),
            path,
            headers,
            full(Bytes::new()),
        )
        .await;
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, body_bytes(resp).await)
}

/// A server on a free port that takes connections and never answers nor closes them (for as
/// long as the test's runtime runs): an upstream, API server or ACME server gone silent.
pub async fn silent_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    addr
}

/// Reads the admin API's `/metrics` (master key `k`) and returns the value of `series`.
pub async fn metric(admin: SocketAddr, series: &str) -> Option<f64> {
    let (_, _, body) = http_get(admin, "/metrics", &[("x-api-key", "k")]).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// A self-signed certificate for `names`, written as `dir/{stem}.crt` + `dir/{stem}.key`;
/// returns its DER for clients to trust.
pub fn write_self_signed(
    dir: &std::path::Path,
    stem: &str,
    names: &[&str],
) -> rustls_pki_types::CertificateDer<'static> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(names).expect("certificate");
    std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}.key")), signing_key.serialize_pem()).unwrap();
    cert.der().clone()
}

/// A client TLS config trusting exactly `roots`, offering `alpn`.
pub fn tls_client_config(
    roots: &[rustls_pki_types::CertificateDer<'static>],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).expect("root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

impl Client {
    /// Connects over TLS with SNI `server_name`; HTTP/2 when ALPN picks it, else HTTP/1.1.
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect to proxy");
        let name =
            rustls_pki_types::ServerName::try_from(server_name.to_string()).expect("server name");
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .expect("TLS handshake");
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Client::handshake(if h2 { Proto::H2c } else { Proto::H1 }, tls).await
    }
}

/// Writes the file the way editors and config tools do: a temp file renamed over it.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A TLS acceptor for a test backend: self-signed for 127.0.0.1 and backend.local, offering `alpn`.
pub fn tls_backend_acceptor(alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(vec![
        "127.0.0.1".to_string(),
        "backend.local".to_string(),
    ])
    .expect("certificate");
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
    tls_acceptor_for(vec![cert.der().clone()], key, alpn)
}

/// A TLS acceptor serving `chain` with `key`, offering `alpn`.
pub fn tls_acceptor_for(
    chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A TLS backend: answers like [`Backend`] over TLS, counting requests and health probes apart.
/// Displays as its address.
pub struct TlsBackend {
    pub addr: SocketAddr,
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
    pub probes: Arc<std::sync::atomic::AtomicUsize>,
}

impl TlsBackend {
    /// Health probes seen so far.
    pub fn probes(&self) -> usize {
        self.probes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl std::fmt::Display for TlsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

/// A TLS backend answering like [`Backend`], offering `alpn`; self-signed for 127.0.0.1.
pub async fn start_tls_backend(name: &'static str, alpn: &[&[u8]]) -> TlsBackend {
    let acceptor = tls_backend_acceptor(alpn);
    serve_tls_backend(name, acceptor, any_local()).await
}

/// Serves [`Backend`]'s answers over TLS with `acceptor` on `addr` (port 0: any).
pub async fn serve_tls_backend(
    name: &'static str,
    acceptor: tokio_rustls::TlsAcceptor,
    addr: SocketAddr,
) -> TlsBackend {
    let answers = Answers::plain(name);
    let (requests, probes) = answers.counters();
    let addr = serve_tls(acceptor, addr, move |tls| {
        let answers = answers.clone();
        async move {
            let svc = service_fn(move |req| answer(answers.clone(), req));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        }
    })
    .await;
    TlsBackend {
        addr,
        requests,
        probes,
    }
}

/// A TLS server on `addr` (port 0: any): each connection's handshake with `acceptor`, then
/// `serve` on the established stream, in a task of its own. Returns the address.
pub async fn serve_tls<F, Fut>(
    acceptor: tokio_rustls::TlsAcceptor,
    addr: SocketAddr,
    serve: F,
) -> SocketAddr
where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    serve_tcp(addr, move |stream| {
        let (acceptor, serve) = (acceptor.clone(), serve.clone());
        async move {
            if let Ok(tls) = acceptor.accept(stream).await {
                serve(tls).await;
            }
        }
    })
    .await
}

/// A TCP server on `addr` (port 0: any): `serve` on each connection, in a task of its own (a
/// backend that answers by hand). Returns the address.
pub async fn serve_tcp<F, Fut>(addr: SocketAddr, serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = bind(addr).await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream));
        }
    });
    addr
}

/// A test certificate authority and one leaf it signed.
pub struct TestPki {
    pub ca: rustls_pki_types::CertificateDer<'static>,
    pub ca_pem: String,
    pub leaf: rustls_pki_types::CertificateDer<'static>,
    pub leaf_pem: String,
    pub leaf_key: rustls_pki_types::PrivateKeyDer<'static>,
    pub leaf_key_pem: String,
}

/// A new CA and a leaf for `names` signed by it (ECDSA P-256 keys, valid from yesterday for 90
/// days, the key usages a public CA would set). The leaf's common name is the first name.
pub fn test_pki(names: &[&str]) -> TestPki {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let yesterday = rcgen::date_time_ymd(1970, 1, 1) + now - Duration::from_secs(86_400);
    let in_90_days = yesterday + Duration::from_secs(90 * 86_400);

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "aralez test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca_params.not_before, ca_params.not_after) = (yesterday, in_90_days);
    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);

    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut leaf_params = CertificateParams::new(names.clone()).expect("leaf params");
    if let Some(first) = names.first() {
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf_params.use_authority_key_identifier_extension = true;
    (leaf_params.not_before, leaf_params.not_after) = (yesterday, in_90_days);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = leaf_params
        .signed_by(&leaf_key, &issuer)
        .expect("leaf certificate");
    TestPki {
        ca: ca.der().clone(),
        ca_pem: ca.pem(),
        leaf: leaf.der().clone(),
        leaf_pem: leaf.pem(),
        leaf_key: rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        leaf_key_pem: leaf_key.serialize_pem(),
    }
}

/// The proxy with a TLS listener of `grade` (certificates from `cert_dir`) sending every host to
/// `backend`, without health checks; returns it with the TLS listener's address.
pub fn start_tls_proxy(
    backend: &Backend,
    cert_dir: &std::path::Path,
    grade: &str,
) -> (ProxyProcess, SocketAddr) {
    let yaml = default_route(&[backend]);
    let main = format!(
        "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"\nproxy_tls_grade: {grade}",
        cert_dir.display()
    );
    let proxy = ProxyProcess::start(&yaml, &main);
    let tls = proxy.logged_addr("listening on https://");
    (proxy, tls)
}
