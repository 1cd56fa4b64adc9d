//! The request vocabulary every data-path module shares, at the bottom of the import order: it
//! imports nothing from the crate. It owns the proxy's error type and its one mapping to
//! responses ([`ProxyError`]), the facts about a client connection ([`ClientConn`], with the
//! [`WorkerId`] serving it), header rules of forwarding ([`headers`]), the hop-by-hop fields
//! ([`hop_by_hop`]), where a parsed head's fields lie ([`field_offsets`]), the request id a
//! response carries back ([`late_id`]), host and path normalisation ([`normalise`]), the
//! `araleztoken` query parameter ([`token_param`]), `client_max_body_size` on bodies of no declared length ([`body_cap`]), a line said at most once a period ([`said_every`]), quality values ([`qvalue`]), what trailers may cross ([`trailers`]), what the cache did ([`CacheStatus`]) and the link to a Redis server that shared
//! state uses ([`redis_link`]).

pub mod acme_challenges;
pub mod body_cap;
pub mod error;
pub mod error_text;
pub mod field_offsets;
pub mod forwarded;
pub mod headers;
pub mod hop_by_hop;
pub mod late_id;
pub mod normalise;
pub mod qvalue;
pub mod redis_link;
pub mod request_body;
pub mod said_every;
pub mod token_param;
pub mod trailers;
pub mod tried;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

pub use error::ProxyError;
pub use request_body::ClientBody;

/// On an answer of a cached route: what the cache did (`HIT`, `MISS`, `EXPIRED`, ...), the word
/// its `X-Cache-Status` says, for the access log's `cache` field (nginx's
/// `$upstream_cache_status`). Other answers carry none, and their extensions stay unallocated.
#[derive(Clone, Copy, Debug)]
pub struct CacheStatus(pub &'static str);

/// Which worker thread serves a connection: the index of its listener, its slot in every
/// backend's pool and its shard of the metrics. The one notion of worker identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkerId(pub usize);

/// Facts about the client connection a request came in on.
#[derive(Clone, Debug)]
pub struct ClientConn {
    /// The connection's peer: the socket's, or the client a PROXY protocol header named.
    pub peer: SocketAddr,
    /// The client the request is from: the peer, or, when the peer is a trusted proxy, the
    /// address its `X-Forwarded-For` gives (set per request). Limits and logs key on it.
    pub client_ip: IpAddr,
    /// The peer is in `trusted_proxies`: its `X-Forwarded-For` and `X-Request-Id` are believed.
    pub trusted: bool,
    pub tls: bool,
    /// The worker serving the connection.
    pub worker: WorkerId,
    /// The peer's IP, ready to append to `X-Forwarded-For`.
    pub forwarded_for: HeaderValue,
    /// What an upgraded connection (WebSocket) of this client still answers to.
    pub tunnels: Arc<TunnelLimits>,
    /// What the TLS handshake settled (empty on plain connections), for the access log.
    pub tls_facts: TlsFacts,
}

/// The TLS version and server name of a client connection.
#[derive(Clone, Debug, Default)]
pub struct TlsFacts {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: Option<&'static str>,
    pub sni: Option<Arc<str>>,
}

impl ClientConn {
    pub fn new(peer: SocketAddr, tls: bool, worker: WorkerId) -> ClientConn {
        ClientConn::with_tunnels(peer, tls, worker, Arc::default())
    }

    pub fn with_tunnels(
        peer: SocketAddr,
        tls: bool,
        worker: WorkerId,
        tunnels: Arc<TunnelLimits>,
    ) -> ClientConn {
        ClientConn {
            peer,
            client_ip: peer.ip(),
            trusted: false,
            tls,
            worker,
            forwarded_for: headers::client_ip_value(peer.ip()),
            tunnels,
            tls_facts: TlsFacts::default(),
        }
    }
}

/// Held by the tunnel an HTTP/2 stream becomes (an extended CONNECT, RFC 8441): its client
/// connection counts it as a request in flight while it lives. The stream's response ends as
/// the tunnel opens, so without it the connection looked idle, was asked to close and was cut
/// a header timeout later with the tunnel busy. Put on the request by the server; type-erased,
/// as the server's guard is not this layer's to know.
#[derive(Clone)]
pub struct StreamHeld(pub Arc<dyn std::any::Any + Send + Sync>);

/// Limits an upgraded connection keeps once it has left HTTP: it still counts among the
/// listener's open connections, it is closed when no byte has crossed it for `idle`, and a
/// draining worker waits for it (`live`) as for a request in flight.
#[derive(Debug)]
pub struct TunnelLimits {
    /// The listener family's count of open connections (the one `max_connections` caps).
    pub open: Arc<AtomicUsize>,
    /// The worker's open tunnels.
    pub live: Arc<AtomicUsize>,
    pub idle: Duration,
}

impl Default for TunnelLimits {
    fn default() -> TunnelLimits {
        TunnelLimits {
            open: Arc::default(),
            live: Arc::default(),
            idle: Duration::from_secs(60),
        }
    }
}

impl TunnelLimits {
    /// Counts an open tunnel among the listener's connections and the worker's tunnels until
    /// the slots are dropped.
    pub fn count_tunnel(&self) -> [CountedSlot; 2] {
        [CountedSlot::take(&self.open), CountedSlot::take(&self.live)]
    }
}

/// One place in a shared count (open connections of a listener or of a backend), given back
/// when dropped.
pub struct CountedSlot(Arc<AtomicUsize>);

impl CountedSlot {
    /// Takes a place whatever the count.
    pub fn take(count: &Arc<AtomicUsize>) -> CountedSlot {
        count.fetch_add(1, Ordering::Relaxed);
        CountedSlot(count.clone())
    }

    /// Takes a place among at most `max`, if one is free.
    pub fn reserve(count: &Arc<AtomicUsize>, max: usize) -> Option<CountedSlot> {
        let taken = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < max).then_some(n + 1)
        });
        taken.is_ok().then(|| CountedSlot(count.clone()))
    }
}

impl Drop for CountedSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The host a request without `Host` addressed: the URI's authority (HTTP/2 `:authority`).
pub fn authority_host(uri: &http::Uri) -> Option<HeaderValue> {
    uri.authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}
