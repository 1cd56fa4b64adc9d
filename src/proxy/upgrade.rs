//! Protocol upgrades (WebSocket and any other `Upgrade:` protocol) over HTTP/1.1, with no config:
//! the request keeps its `Upgrade` and `Connection: upgrade` headers, and when the backend answers
//! `101 Switching Protocols` both upgraded connections are joined and bytes flow both ways until
//! either side closes (a half-close is passed on, the other direction keeps going).
//!
//! Upgraded connections leave hyper's HTTP handling, so HTTP timeouts no longer apply to them.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{Either, Full};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::RespBody;
use crate::upstream::PooledBody;

/// A client's request to switch protocols.
pub struct ClientUpgrade {
    /// The `Upgrade` header as the client sent it.
    pub protocol: HeaderValue,
    on_client: OnUpgrade,
}

/// Takes the upgrade out of an HTTP/1.1 request that asks for one (`Connection: upgrade` and an
/// `Upgrade` header), before hop-by-hop headers are removed.
pub fn take<B>(req: &mut Request<B>) -> Option<ClientUpgrade> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let wants = req.headers().get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    });
    let protocol = req.headers().get(header::UPGRADE)?.clone();
    if !wants {
        return None;
    }
    let on_client = req.extensions_mut().remove::<OnUpgrade>()?;
    Some(ClientUpgrade {
        protocol,
        on_client,
    })
}

/// Puts the upgrade headers back on the request to the backend (after hop-by-hop removal).
pub fn restore_request_headers(headers: &mut HeaderMap, protocol: &HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol.clone());
}

/// Answers the client with the backend's 101 and joins the two upgraded connections.
pub fn bridge(resp: Response<PooledBody>, client: ClientUpgrade) -> Response<RespBody> {
    let (mut parts, _body) = resp.into_parts();
    let protocol = parts
        .headers
        .get(header::UPGRADE)
        .cloned()
        .unwrap_or(client.protocol);
    let on_server = parts.extensions.remove::<OnUpgrade>();
    super::headers::remove_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts.headers.insert(header::UPGRADE, protocol);
    parts.status = StatusCode::SWITCHING_PROTOCOLS;
    tokio::spawn(async move {
        let Some(on_server) = on_server else {
            tracing::warn!("backend switched protocols but its connection cannot be upgraded");
            return;
        };
        match tokio::try_join!(client.on_client, on_server) {
            Ok((client_io, server_io)) => {
                let (mut c, mut s) = (TokioIo::new(client_io), TokioIo::new(server_io));
                if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut s).await {
                    tracing::debug!("upgraded connection ended: {e}");
                }
            }
            Err(e) => tracing::debug!("upgrade did not complete: {e}"),
        }
    });
    Response::from_parts(parts, Either::Right(Full::new(Bytes::new())))
}
