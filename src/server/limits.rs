//! A listener's per-connection limits ([`Limits`]) and the hyper server settings made from
//! them ([`Builders`]): header size, HTTP/2 streams and flow-control windows, and the timers
//! each connection runs under.

use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;

use super::idle::Timers;
use super::listener::TcpKeepalive;

/// How long an HTTP/1 connection carries no request before it parks ([`super::park`]): long
/// enough that a busy keep-alive connection never does, short enough that idle ones give their
/// buffers back soon.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// Connection-level limits of one listener.
#[derive(Clone, Debug)]
pub struct Limits {
    /// For the TLS handshake and each request head.
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub keepalive: Option<TcpKeepalive>,
    /// How long in-flight requests may finish after shutdown is asked.
    pub grace_period: Duration,
    /// A connection that carries no request for this long is asked to close.
    pub idle_timeout: Duration,
    /// A connection whose open requests make no progress for this long is closed.
    pub send_timeout: Duration,
    /// The longest a request may wait for its backend's answer, or its next bytes
    /// (`upstream_response_timeout`): a connection is not idle meanwhile.
    pub backend_wait: Duration,
    /// Streams one HTTP/2 connection may open at once.
    pub max_streams: u32,
}

impl Limits {
    pub fn timers(&self) -> Timers {
        Timers {
            idle: self.idle_timeout,
            head: self.header_timeout,
            send: self.send_timeout,
            park: PARK_AFTER,
        }
    }
}

/// What one client HTTP/2 stream may send ahead of the backend's reading of its body: the
/// proxy's buffer for it. 1 MiB, against nginx's 64 KiB preread and HAProxy's 64 KiB window,
/// keeps an upload's first round trip full.
const CLIENT_STREAM_WINDOW: u32 = 1 << 20;

/// The same for a whole client HTTP/2 connection: 16 streams may sit full before the others on
/// the connection wait.
const CLIENT_CONNECTION_WINDOW: u32 = 16 << 20;

/// What one client HTTP/2 stream's answer may hold in the proxy beyond what the socket took:
/// hyper's 400 KiB let a client that grants a large window and never reads make 100 streams a
/// connection hold 0.5 MiB each (and their backend connections). 64 KiB, as HTTP/1's read-ahead
/// and HAProxy's 16 KiB buffers, still keeps a download's socket fed between polls.
const CLIENT_STREAM_SEND_BUFFER: usize = 64 * 1024;

fn http_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // The request-head deadline is the connection's own timer (`idle::drive`), not hyper's
        // per-request one.
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(limits.max_streams)
        // Fixed windows, not hyper's adaptive ones: what a client may send ahead of the
        // backend's reading is what the proxy holds, and adaptive windows grow to 16 MiB a
        // stream (and cost a lock and a PING's bookkeeping on every poll of the connection).
        .initial_stream_window_size(CLIENT_STREAM_WINDOW)
        .initial_connection_window_size(CLIENT_CONNECTION_WINDOW)
        .max_send_buf_size(CLIENT_STREAM_SEND_BUFFER)
        // RFC 8441: WebSocket from HTTP/2 clients (extended CONNECT).
        .enable_connect_protocol();
    builder
}

/// The HTTP/1 settings of [`http_builder`], for connections known to speak HTTP/1: a parked
/// connection served again.
fn http1_builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
}

/// The HTTP server settings, three ways: sniffing the protocol from the first bytes, with
/// HTTP/1.1 upgrades (plain connections, and TLS unless ALPN chose h2), and HTTP/2 only for TLS
/// connections whose ALPN chose h2: a client that agreed on h2 and then sends something else
/// gets the connection closed (RFC 9113 §3.4), not an HTTP/1.1 answer. (hyper-util ignores
/// `http2_only` when serving with upgrades; HTTP/2 needs none, CONNECT is handled inside.)
/// And HTTP/1 only, with upgrades, for a parked connection served again.
pub struct Builders {
    pub sniffing: auto::Builder<TokioExecutor>,
    pub h2_only: auto::Builder<TokioExecutor>,
    pub http1: http1::Builder,
}

impl Builders {
    /// The three, made once per accept loop from its listener's limits.
    pub fn new(limits: &Limits) -> Builders {
        let sniffing = http_builder(limits);
        Builders {
            h2_only: sniffing.clone().http2_only(),
            sniffing,
            http1: http1_builder(limits),
        }
    }
}
