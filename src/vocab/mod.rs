//! The request vocabulary every data-path module shares, at the bottom of the import order: it
//! imports nothing from the crate. It owns the proxy's error type and its one mapping to
//! responses ([`ProxyError`]), the facts about a client connection ([`ClientConn`], with the
//! [`WorkerId`] serving it), header rules of forwarding ([`headers`]), host and path
//! normalisation ([`normalise`]) and the `araleztoken` query parameter ([`token_param`]).

pub mod error;
pub mod headers;
pub mod normalise;
pub mod token_param;

use std::net::SocketAddr;

use http::HeaderValue;

pub use error::ProxyError;

/// Which worker thread serves a connection: the index of its listener, its slot in every
/// backend's pool and its shard of the metrics. The one notion of worker identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkerId(pub usize);

/// Facts about the client connection a request came in on.
#[derive(Clone, Debug)]
pub struct ClientConn {
    pub peer: SocketAddr,
    pub tls: bool,
    /// The worker serving the connection.
    pub worker: WorkerId,
    /// The peer's IP, ready to append to `X-Forwarded-For`.
    pub forwarded_for: HeaderValue,
}

impl ClientConn {
    pub fn new(peer: SocketAddr, tls: bool, worker: WorkerId) -> ClientConn {
        ClientConn {
            peer,
            tls,
            worker,
            forwarded_for: headers::client_ip_value(peer.ip()),
        }
    }
}

/// The host the client addressed: `Host`, else the URI's authority (HTTP/2 `:authority`).
pub fn request_host(parts_headers: &http::HeaderMap, uri: &http::Uri) -> Option<HeaderValue> {
    if let Some(h) = parts_headers.get(http::header::HOST) {
        return Some(h.clone());
    }
    uri.authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}
