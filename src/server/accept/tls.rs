//! The TLS side of accepting a connection: a plain HTTP request on the TLS port answered with a
//! 400, the handshake under the header timeout, what the access log shows of the session, and
//! the choice between HTTP/2 (ALPN h2) and the HTTP/1 serving every other connection gets.

use std::net::SocketAddr;
use std::sync::Arc;

use http::StatusCode;
use hyper_util::rt::TokioIo;

use super::{h2_refusals, serve_parking, ConnInfo, MakeService, OpenConnection, Shared};
use crate::metrics::TlsFailure;
use crate::server::client_tcp::ClientTcp;
use crate::server::h2_guard::FloodGuard;
use crate::server::idle::{self, Activity};
use crate::server::plain_on_tls::{self, FirstBytes};
use crate::server::settle::ReleaseWhenSettled;
use crate::server::tracked::{HeadWriter, Tracked};
use crate::vocab::acme_challenges::ACME_TLS_ALPN;
use crate::vocab::TlsFacts;

/// Runs the TLS handshake (by `deadline`), then serves: HTTP/2 only when ALPN chose h2.
pub(super) async fn serve_tls<F: MakeService>(
    shared: Arc<Shared<F>>,
    counted: OpenConnection,
    mut stream: ClientTcp,
    acceptor: tokio_rustls::TlsAcceptor,
    deadline: tokio::time::Instant,
) {
    let peer = counted.peer;
    if !Box::pin(judged_as_tls(&shared, &mut stream, deadline, peer)).await {
        return;
    }
    let Some(stream) = handshake(acceptor, stream, deadline, peer, &shared).await else {
        return;
    };
    let session = stream.get_ref().1;
    let info = ConnInfo {
        peer,
        tls: true,
        tls_facts: tls_facts(session),
    };
    // A TLS-ALPN-01 validation (RFC 8737) ends with the handshake: no HTTP on it.
    if session.alpn_protocol() == Some(ACME_TLS_ALPN) {
        return;
    }
    if session.alpn_protocol() != Some(b"h2") {
        return serve_parking(shared, counted, stream, info).await;
    }
    let activity = Activity::new(shared.draining.clone());
    activity.mark_http2();
    counted.serves(&activity);
    let refusals = h2_refusals(&shared, &info);
    let service = Tracked::new(shared.make.make(info), activity.clone(), HeadWriter::Hyper);
    let (drain, idle) = (shared.drain.clone(), shared.limits.timers());
    let stream = ReleaseWhenSettled::new(stream, activity.clone());
    let io = TokioIo::new(FloodGuard::new(stream, peer));
    let conn = shared.builders.h2_only.serve_connection(io, service);
    let conn = idle::drive_boxed(conn.into_owned(), drain, activity, idle);
    counted.run(h2::refusals::scope(refusals, conn)).await;
}

/// Whether the connection goes on to the TLS handshake: not when it ended before its first
/// byte, nor when it is a plain HTTP request, answered here with a 400 (logged and counted as
/// a refused request) within `deadline`.
async fn judged_as_tls<F>(
    shared: &Shared<F>,
    stream: &mut ClientTcp,
    deadline: tokio::time::Instant,
    peer: SocketAddr,
) -> bool {
    let first = tokio::time::timeout_at(deadline, plain_on_tls::first_bytes(stream)).await;
    match first {
        Ok(FirstBytes::Tls) => true,
        Ok(FirstBytes::Nothing) | Err(_) => false,
        Ok(FirstBytes::PlainHttp) => {
            tracing::debug!(%peer, "{}: a plain HTTP request on the TLS port", shared.name);
            if let Some(refusals) = &shared.refusals {
                let plain = TlsFacts::default();
                refusals.refused(
                    peer.ip(),
                    &plain,
                    StatusCode::BAD_REQUEST,
                    plain_on_tls::BODY_BYTES,
                );
            }
            let answered = tokio::time::timeout_at(deadline, plain_on_tls::answer(stream));
            let _ = answered.await;
            false
        }
    }
}

/// The TLS handshake, by `deadline`; `None` (logged) when it fails or is late. Its state is
/// boxed, freed once it ends, and so is the session it makes (over a kilobyte), which moves as
/// a pointer from then on: a connection's task keeps room for neither.
async fn handshake<F>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: ClientTcp,
    deadline: tokio::time::Instant,
    peer: SocketAddr,
    shared: &Shared<F>,
) -> Option<Box<tokio_rustls::server::TlsStream<ClientTcp>>> {
    let handshake = Box::pin(tokio::time::timeout_at(deadline, acceptor.accept(stream)));
    let (why, said) = match handshake.await {
        Ok(Ok(stream)) => return Some(Box::new(stream)),
        Ok(Err(e)) => (TlsFailure::of(&e), e.to_string()),
        Err(_) => (TlsFailure::Timeout, "not finished in time".to_string()),
    };
    handshake_failed(shared, peer, why, &said);
    None
}

/// Counts a failed handshake, and says it at most once a second (a scanner makes thousands):
/// nginx logs each at `info`, HAProxy each in its log.
#[cold]
fn handshake_failed<F>(shared: &Shared<F>, peer: SocketAddr, why: TlsFailure, said: &str) {
    if let Some(refusals) = &shared.refusals {
        refusals.metrics.tls_handshake_failed(why);
    }
    let listener = shared.name;
    match shared.tls_failures.due_note(tokio::time::Instant::now()) {
        Some(more) => tracing::info!(
            "client {peer}: {listener}: TLS handshake failed ({}): {said}{more}",
            why.as_str()
        ),
        None => tracing::debug!(%peer, "{listener}: TLS handshake failed: {said}"),
    }
}

/// What the access log shows of a finished handshake.
fn tls_facts(session: &rustls::ServerConnection) -> TlsFacts {
    TlsFacts {
        version: session.protocol_version().map(|v| match v {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => "TLS",
        }),
        sni: session.server_name().map(Arc::from),
    }
}
