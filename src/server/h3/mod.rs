//! HTTP/3 on the TLS listener's port (`http3: true`): one QUIC endpoint (quinn) on UDP, shared
//! by a runtime of its own with as many threads as there are workers, serving hyperium's h3.
//! One endpoint rather than one per worker with SO_REUSEPORT: the kernel would hash a client
//! that changed address (a connection migration) to another worker's socket, which does not
//! know its connection.
//!
//! Each request enters the same [`observe::handle`] -> router -> layers -> proxy path as
//! HTTP/1.1 and HTTP/2. The TLS side is the proxy listener's certificate store (hot reload
//! applies to new connections), TLS 1.3 only (QUIC's), ALPN `h3`, no 0-RTT (replayable).
//!
//! Limits: `max_connections` QUIC connections at once (more are refused), the handshake
//! within `client_header_timeout`, an idle connection closed after `client_idle_timeout`
//! (QUIC's idle timeout), [`MAX_CLIENT_STREAMS`] requests at once per connection, headers of at
//! most `max_header_bytes`; quinn limits what an unvalidated address is sent (3x what it sent)
//! and, past [`RETRY_ABOVE`] handshakes in progress, new clients must first prove their address
//! (a stateless retry). Shutdown sends GOAWAY on every connection and lets its requests finish
//! within the grace period.

mod stream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::server::ResolvesServerCert;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::observe::ConnCtx;
use super::real_client::RequestIds;
use super::{H3Side, Limits, Serving, MAX_CLIENT_STREAMS};
use crate::vocab::{ClientConn, CountedSlot, TlsFacts, WorkerId};

/// How long QUIC's idle timer outlasts the longest quiet time a live connection may have.
const QUIC_IDLE_MARGIN: Duration = Duration::from_secs(5);
/// How long a connection told to close still takes requests sent before its GOAWAY arrived,
/// once none is in flight.
const LATE_REQUESTS: Duration = Duration::from_secs(1);
/// How long a finished connection waits for the client to close it.
const LINGER: Duration = Duration::from_secs(2);
/// How long the endpoint, once every connection has ended, is given to send their closes (they
/// go at once; quinn's endpoint turns idle only after three probe timeouts of draining, which
/// held every stop 200 ms).
const CLOSES_SENT_WITHIN: Duration = Duration::from_millis(50);

/// Handshakes in progress past which a new client must first prove its address.
pub const RETRY_ABOVE: usize = 64;

/// Why HTTP/3 could not start.
#[derive(Debug, thiserror::Error)]
pub enum H3Error {
    #[error("the QUIC TLS configuration: {0}")]
    Tls(String),
    #[error("the UDP socket {addr}: {source}")]
    Socket {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The rustls side of QUIC: the proxy listener's certificates, TLS 1.3, ALPN `h3`, no 0-RTT.
fn quic_server_config(
    resolver: Arc<dyn ResolvesServerCert>,
    limits: &Limits,
) -> Result<quinn::ServerConfig, H3Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| H3Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| H3Error::Tls(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(MAX_CLIENT_STREAMS.into())
        // The client's control stream and its two QPACK streams, and a spare.
        .max_concurrent_uni_streams(4u32.into())
        // QUIC's own idle timer sees no packet while a request waits for its backend: it
        // must outlast that wait, and `client_idle_timeout` is kept by the connection's loop,
        // which counts only the time without a request.
        .max_idle_timeout(quic_idle_timeout(limits).try_into().ok());
    config.transport_config(Arc::new(transport));
    config.migration(true);
    Ok(config)
}

/// QUIC's idle timeout: past `client_idle_timeout` and the longest wait for a backend, so that
/// only a peer that is gone meets it.
fn quic_idle_timeout(limits: &Limits) -> Duration {
    limits.idle_timeout.max(limits.backend_wait) + QUIC_IDLE_MARGIN
}

/// Starts HTTP/3 on a thread of its own; it returns once `shutdown` turned true and its
/// connections drained (or the grace period ran out).
pub fn spawn(
    side: H3Side,
    serving: Serving,
    limits: Limits,
    threads: usize,
    shutdown: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, H3Error> {
    let config = quic_server_config(side.resolver, &limits)?;
    let addr = side.socket.local_addr().map_err(|source| H3Error::Socket {
        addr: ([0, 0, 0, 0], 0).into(),
        source,
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("aralez-h3")
        .enable_all()
        .build()
        .map_err(|source| H3Error::Socket { addr, source })?;
    std::thread::Builder::new()
        .name("aralez-h3".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut shutdown = shutdown;
                if let Some(pid) = side.previous_owner {
                    tokio::select! {
                        () = previous_exits(pid) => {}
                        () = until_stopped(&mut shutdown) => return,
                    }
                }
                let quic_runtime = match quinn::default_runtime() {
                    Some(rt) => rt,
                    None => return tracing::error!("http/3: no async runtime for QUIC"),
                };
                let endpoint = quinn::Endpoint::new(
                    quinn::EndpointConfig::default(),
                    Some(config),
                    side.socket,
                    quic_runtime,
                );
                match endpoint {
                    Ok(endpoint) => {
                        side.offered
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        serve(endpoint, serving, limits, side.hsts, shutdown).await;
                    }
                    Err(e) => tracing::error!("http/3: the QUIC endpoint on {addr}: {e}"),
                }
            })
        })
        .map_err(|source| H3Error::Socket { addr, source })
}

/// Returns once process `pid` is gone. Two readers of one UDP socket would split each QUIC
/// connection's packets between them, so after a live upgrade the new instance reads only once
/// the old one (draining its own connections) has exited; meanwhile the kernel queues what
/// arrives, and a client's handshake waits (or retransmits) rather than fails.
async fn previous_exits(pid: i32) {
    tracing::info!("http/3: waiting for the previous instance (pid {pid}) to exit before reading the QUIC socket");
    let pid = nix::unistd::Pid::from_raw(pid);
    while nix::sys::signal::kill(pid, None).is_ok() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!("http/3: the previous instance exited; serving HTTP/3");
}

/// Accepts connections until shutdown, then drains them.
async fn serve(
    endpoint: quinn::Endpoint,
    serving: Serving,
    limits: Limits,
    hsts: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let handshaking = Arc::new(AtomicUsize::new(0));
    let request_ids = Arc::new(RequestIds::new());
    let mut connections = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = until_stopped(&mut shutdown) => break,
        };
        let Some(incoming) = incoming else { break };
        let Some(place) = CountedSlot::reserve(&open, limits.max_connections) else {
            incoming.refuse();
            continue;
        };
        let busy = handshaking.load(Ordering::Relaxed) >= RETRY_ABOVE;
        if busy && !incoming.remote_address_validated() && incoming.may_retry() {
            if let Err(e) = incoming.retry() {
                e.into_incoming().refuse();
            }
            continue;
        }
        let conn = Accepted {
            serving: serving.clone(),
            limits: limits.clone(),
            handshaking: handshaking.clone(),
            request_ids: request_ids.clone(),
            hsts,
        };
        connections.spawn(conn.serve(incoming, place, shutdown.clone()));
        // Reap what finished, so the set holds only live connections.
        while connections.try_join_next().is_some() {}
    }
    // While the connections drain, new ones are neither served nor refused: their clients
    // retransmit, and after a live upgrade the next instance answers them once this one exits.
    let drained = async {
        loop {
            tokio::select! {
                next = connections.join_next() => if next.is_none() { break },
                Some(incoming) = endpoint.accept() => incoming.ignore(),
            }
        }
    };
    if tokio::time::timeout(limits.grace_period, drained)
        .await
        .is_err()
    {
        // Those still open are told so.
        connections.abort_all();
        endpoint.close(0u32.into(), b"shutting down");
    }
    // The last connections' CONNECTION_CLOSE frames may still be queued with their drivers:
    // the runtime ending now dropped them unsent, 3 times in 8 in a probe's runs, and those
    // clients waited out their idle timeout. A closing endpoint refuses new connections, so
    // this is kept short; what arrives later waits in the socket for the next instance, if any.
    let _ = tokio::time::timeout(CLOSES_SENT_WITHIN, endpoint.wait_idle()).await;
}

/// Returns once `shutdown` is true (the guard `wait_for` gives is dropped here).
async fn until_stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// One accepted QUIC connection and what it shares with the others.
struct Accepted {
    serving: Serving,
    limits: Limits,
    handshaking: Arc<AtomicUsize>,
    request_ids: Arc<RequestIds>,
    hsts: bool,
}

impl Accepted {
    /// Serves the connection `incoming` asks for, holding its `place` among the open ones.
    async fn serve(
        self,
        incoming: quinn::Incoming,
        _place: CountedSlot,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let peer = incoming.remote_address();
        let handshake = {
            let _handshaking = CountedSlot::take(&self.handshaking);
            let connecting = match incoming.accept() {
                Ok(connecting) => connecting,
                Err(e) => {
                    tracing::debug!(%peer, "http/3: refused: {e}");
                    return;
                }
            };
            tokio::time::timeout(self.limits.header_timeout, connecting).await
        };
        let conn = match handshake {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::debug!(%peer, "http/3: handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "http/3: no handshake within {:?}", self.limits.header_timeout);
                return;
            }
        };
        let ctx = Arc::new(self.context(&conn, peer));
        let quic = conn.clone();
        let built = h3::server::builder()
            .max_field_section_size(self.limits.max_header_bytes as u64)
            .build::<_, Bytes>(h3_quinn::Connection::new(conn))
            .await;
        let mut h3 = match built {
            Ok(h3) => h3,
            Err(e) => {
                tracing::debug!(%peer, "http/3: the connection did not start: {e}");
                return;
            }
        };
        let mut requests = JoinSet::new();
        let mut closing = false;
        loop {
            // Told to close and its last request done: it ends a moment later (requests the
            // client sent before it saw the GOAWAY are still taken meanwhile), not when the
            // client lets it idle out, which held a stop, and a live upgrade's takeover of the
            // QUIC socket, for as long.
            let done = closing && requests.is_empty();
            // No request for `client_idle_timeout` (counted from the last one's end): asked to
            // close, as an HTTP/2 connection is.
            let idle = !closing && requests.is_empty();
            let accepted = tokio::select! {
                accepted = h3.accept() => accepted,
                () = until_stopped(&mut shutdown), if !closing => {
                    closing = true;
                    // GOAWAY: no new requests; the ones in flight finish.
                    let _ = h3.shutdown(0).await;
                    continue;
                }
                () = tokio::time::sleep(self.limits.idle_timeout), if idle => {
                    closing = true;
                    let _ = h3.shutdown(0).await;
                    continue;
                }
                Some(_) = requests.join_next(), if !requests.is_empty() => continue,
                () = tokio::time::sleep(LATE_REQUESTS), if done => break,
            };
            match accepted {
                Ok(Some(resolver)) => {
                    let ctx = ctx.clone();
                    // Each request head within `client_header_timeout`, as on TCP: a stream that
                    // trickles its head (or sends none) is dropped, not held.
                    let head_within = self.limits.header_timeout;
                    let send_within = self.limits.send_timeout;
                    let quic = quic.clone();
                    requests.spawn(async move {
                        let head = tokio::time::timeout(head_within, resolver.resolve_request());
                        match head.await {
                            Ok(Ok((head, stream))) => {
                                stream::answer(ctx, head, stream, send_within, quic).await
                            }
                            Ok(Err(e)) => {
                                tracing::debug!("http/3: a request head was refused: {e}")
                            }
                            Err(_) => {
                                tracing::debug!("http/3: no request head within {head_within:?}")
                            }
                        }
                    });
                    while requests.try_join_next().is_some() {}
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(%peer, "http/3: connection ended: {e}");
                    break;
                }
            }
        }
        while requests.join_next().await.is_some() {}
        // The last answers may still be on their way: closing now would cut them short, so
        // the client is given a moment to read them and close the connection itself.
        let _ = tokio::time::timeout(LINGER, quic.closed()).await;
    }

    /// What every request of the connection shares (as a TLS listener's connection would).
    fn context(&self, conn: &quinn::Connection, peer: SocketAddr) -> ConnCtx {
        let sni = conn
            .handshake_data()
            .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|data| data.server_name)
            .map(Arc::<str>::from);
        let serving = &self.serving;
        let mut client = ClientConn::new(peer, true, WorkerId(usize::MAX));
        client.trusted = serving.trusted.trusts(peer.ip());
        client.tls_facts = TlsFacts {
            version: Some("TLSv1.3"),
            sni,
        };
        ConnCtx {
            router: serving.router.clone(),
            metrics: serving.metrics.clone(),
            access_log: serving.access_log.clone(),
            client,
            hsts: self.hsts,
            alt_svc: None,
            trusted: serving.trusted.clone(),
            request_ids: self.request_ids.clone(),
        }
    }
}
