//! Connections that start with a PROXY protocol header (`proxy_protocol: true`): the header
//! names the client, within the header timeout counted from the accept, and the connection is
//! served from there as any other (over TLS when the listener is).

use std::sync::Arc;

use super::{serve_plain, serve_tls, MakeService, OpenConnection, Shared};
use crate::server::client_tcp::ClientTcp;
use crate::server::proxy_protocol::{self, Header};

/// A connection that starts with a PROXY protocol header naming the client.
pub(super) async fn serve_proxied<F: MakeService>(
    shared: Arc<Shared<F>>,
    mut counted: OpenConnection,
    mut stream: ClientTcp,
    tls: Option<tokio_rustls::TlsAcceptor>,
    deadline: tokio::time::Instant,
) {
    let (name, socket_peer) = (shared.name, counted.peer);
    let read = tokio::time::timeout_at(deadline, proxy_protocol::read_header(&mut stream));
    match read.await {
        Ok(Ok(Header::Proxied { source, .. })) => counted.peer = source,
        Ok(Ok(Header::Local)) => {}
        Ok(Err(e)) => {
            let what =
                format!("{name}: connection from {socket_peer} closed (proxy_protocol is on)");
            shared.said_bad_proxy_header(&what, &e);
            return;
        }
        Err(_) => {
            let limit = shared.limits.header_timeout;
            let what =
                format!("{name}: connection from {socket_peer} closed (proxy_protocol is on)");
            shared.said_bad_proxy_header(&what, &format!("no PROXY header within {limit:?}"));
            return;
        }
    }
    match tls {
        None => serve_plain(shared, counted, stream).await,
        // Boxed: the handshake and the session would make every plain connection's task larger.
        Some(acceptor) => Box::pin(serve_tls(shared, counted, stream, acceptor, deadline)).await,
    }
}
