//! Forwarding: turns a client request into a backend request (hop-by-hop removal,
//! X-Forwarded-* and X-Request-Id, the route's headers, upgrades), hands it to the upstream
//! balancer, and turns the backend's response into the client's (SPEC §5, §6.2).
//!
//! It knows nothing of routes or policies: the router gives it the route's backends and header
//! rules. Bodies stream both ways; [`encode`] compresses one on the way when a policy asks.

pub mod encode;
pub mod read_ahead;
pub mod tee;
pub mod upgrade;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::future::{self, FutureExt as _};
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::{Either, Full};

use crate::upstream::balancer;
use crate::upstream::{
    keep_served_by, BackendSet, Failed, FailedAt, Outgoing, PooledBody, Timeouts,
};
use crate::vocab::forwarded::{self, Forwarded};
use crate::vocab::headers::X_REQUEST_ID;
use crate::vocab::hop_by_hop::{self, ProxyFields};
use crate::vocab::request_body::{BytesIn, RequestBody};
use crate::vocab::tried::TriedBackend;
use crate::vocab::{authority_host, token_param, ClientBody, ClientConn, ProxyError};

/// The backend's body as it came, or compressed on the way (`layers::compress`).
pub type BackendBody = Either<PooledBody, encode::Encoded<PooledBody>>;

/// The backend's body on its way to the client: as it comes, or copied aside as it passes
/// (`layers::cache` keeps the copy).
pub type StreamedBody = Either<BackendBody, tee::Tee<BackendBody>>;

/// What the client gets: the backend's body, or one the proxy wrote itself.
pub type RespBody = Either<StreamedBody, Full<Bytes>>;

/// A route's header rules, compiled once per snapshot.
#[derive(Debug, Default)]
pub struct HeaderRules {
    /// Set on the request to the backend.
    pub to_backend: Box<[(HeaderName, HeaderValue)]>,
    /// Set on the response to the client.
    pub to_client: Box<[(HeaderName, HeaderValue)]>,
}

/// The forwarding step: limits for the backend exchange.
pub struct Forwarder {
    pub timeouts: Timeouts,
}

impl Forwarder {
    /// Forwards `req` to one of `backends` with `rules` applied; an upgrade request gets its
    /// connections joined when the backend switches protocols. `request_id` is the request's
    /// `X-Request-Id` when its map does not have it yet (any the client sent is replaced).
    ///
    /// Not an `async fn`: the request is made the backend's before the future is, and the
    /// future is the balancer's with the response step mapped on, so every request's future
    /// holds no copy of the request (an `async fn` keeps its arguments twice).
    ///
    /// When the exchange fails with a backend (a 502, 503 or 504), the answer is the proxy's
    /// own, built here for a gRPC client (`grpc`) or not, and names that backend ([`FailedAt`])
    /// for the access log; with no backend tried it is the error. An exchange dropped unfinished
    /// (the client left) leaves its backend in `tried`, for the log line of the 499.
    pub fn forward<'a>(
        &'a self,
        conn: &'a ClientConn,
        backends: &'a BackendSet,
        rules: &'a HeaderRules,
        mut req: Request<ClientBody>,
        (request_id, tried): (Option<&HeaderValue>, Option<&'a TriedBackend<'a>>),
        grpc: bool,
    ) -> impl Future<Output = Result<Response<RespBody>, ProxyError>> + Send + 'a {
        // Boxed: rare, and the future below holds it beside the balancer's.
        let client_upgrade = upgrade::take(&mut req).map(Box::new);
        // What is not sent at once is rare, and boxed: a refusal, or a body still on its way.
        let aside = |answer| future::Either::Left(answer);
        if client_upgrade.is_none() {
            if req.method() == Method::CONNECT {
                // An extended CONNECT that cannot become an upgrade never reaches a backend.
                return aside(refusal(ProxyError::MethodNotAllowed));
            }
            // With no backend in rotation the 503 comes at once, not after the upload.
            if read_ahead::wanted(&req, grpc) && backends.any_usable() {
                match read_ahead::read_now(&mut req) {
                    Ok(None) => {}
                    Err(error) => return aside(refusal(error)),
                    Ok(Some(ahead)) => {
                        let request_id = request_id.cloned();
                        let stall = self.timeouts.response;
                        return aside(Box::pin(async move {
                            read_ahead::read_rest(&mut req, ahead, stall).await?;
                            let id = request_id.as_ref();
                            self.forward(conn, backends, rules, req, (id, tried), grpc)
                                .await
                        }));
                    }
                }
            }
        }
        let ask = client_upgrade.as_ref().map(|u| &u.ask);
        let out = outgoing((conn, request_id), rules, req, ask);
        let sending = balancer::send(backends, out, conn.worker, self.timeouts, tried);
        future::Either::Right(sending.map(move |sent| match client_upgrade {
            Some(client) => match sent {
                Ok(resp) => answer_upgrade(resp, *client, conn, rules),
                Err(failed) => failure_answer(failed, grpc),
            },
            None => match sent {
                Ok(resp) => Ok(finish_response(resp, rules)),
                Err(failed) => failure_answer(failed, grpc),
            },
        }))
    }
}

/// A forwarding that ends before it starts.
type Aside<'a> = Pin<Box<dyn Future<Output = Result<Response<RespBody>, ProxyError>> + Send + 'a>>;

fn refusal<'a>(error: ProxyError) -> Aside<'a> {
    Box::pin(future::ready(Err(error)))
}

/// The answer to an exchange that failed: the proxy's own, naming the backend it failed with.
fn failure_answer(failed: Failed, grpc: bool) -> Result<Response<RespBody>, ProxyError> {
    let Failed { error, at } = failed;
    let at = at.ok_or(error)?;
    let mut resp = error.response_for(grpc).map(Either::Right);
    resp.extensions_mut().insert(FailedAt(at));
    Ok(resp)
}

/// The backend's answer to an upgrade request: the two connections joined if it switched
/// protocols, else an ordinary response. A 2xx that switched nothing cannot answer an HTTP/2
/// extended CONNECT, where a 2xx says the tunnel is open (RFC 8441 §5): a 502 then (h2 reset
/// the stream instead, as the answer had a body).
fn answer_upgrade(
    resp: Response<PooledBody>,
    client: upgrade::ClientUpgrade,
    conn: &ClientConn,
    rules: &HeaderRules,
) -> Result<Response<RespBody>, ProxyError> {
    // A refusal names the backend, in the warning and the access log.
    let refused = |resp: &Response<PooledBody>| {
        let at = crate::upstream::served_by(resp).map(|served| served.0.clone());
        failure_answer(
            Failed {
                error: ProxyError::UpgradeRefused,
                at,
            },
            false,
        )
    };
    let backend = || crate::upstream::served_by(&resp).map_or("-", |s| &*s.0.label);
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        if !resp.headers().contains_key(http::header::UPGRADE) {
            // RFC 9110 §15.2.2: a 101 says what it switched to; the client is not told a
            // protocol the backend never named.
            tracing::warn!(
                backend = backend(),
                "backend's 101 names no protocol (no Upgrade field)"
            );
            return refused(&resp);
        }
        if !client.ask.accepted_by(resp.headers()) {
            tracing::warn!(
                backend = backend(),
                "backend's Sec-WebSocket-Accept does not answer the key sent to it"
            );
            return refused(&resp);
        }
        Ok(upgrade::bridge(resp, client, &conn.tunnels))
    } else if client.ask.over_h2 && resp.status().is_success() {
        tracing::warn!(backend = backend(), status = %resp.status(), "backend did not switch protocols for an extended CONNECT");
        refused(&resp)
    } else {
        Ok(finish_response(resp, rules))
    }
}

/// The backend request: headers rewritten, the token parameter gone, HTTP/1.1 form, and whether
/// it can safely be sent twice.
fn outgoing(
    client: (&ClientConn, Option<&HeaderValue>),
    rules: &HeaderRules,
    req: Request<ClientBody>,
    upgrade: Option<&upgrade::UpgradeAsk>,
) -> Outgoing {
    let (mut parts, body) = req.into_parts();
    let (deferred, no_host) = prepare_headers(&mut parts, client, rules);
    if let Some(ask) = upgrade {
        upgrade::prepare_backend_request(&mut parts, ask);
    }
    token_param::strip_from(&mut parts.uri);
    to_origin_form(&mut parts);
    let replayable = is_idempotent(&parts.method) && body.is_end_stream();
    let counter = parts.extensions.remove::<BytesIn>();
    Outgoing {
        head: parts,
        deferred,
        no_host,
        body: Either::Left(RequestBody::new(body, counter)),
        replayable,
    }
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Header rewrites that do not depend on which backend is chosen. `X-Forwarded-*`, and the
/// `request_id` not yet in the map, wait for the head to be written (returned) when neither the
/// client nor a route rule set any of them. Also returned: whether the request has no host at
/// all (an HTTP/1.0 request without `Host`, an HTTP/2 one without `:authority`), for the
/// chosen backend's own to be sent.
fn prepare_headers(
    parts: &mut Parts,
    (conn, request_id): (&ClientConn, Option<&HeaderValue>),
    rules: &HeaderRules,
) -> (Option<forwarded::Deferred>, bool) {
    let host_field = parts.headers.get(header::HOST).cloned();
    let host_in_map = host_field.is_some();
    let client_host = host_field.or_else(|| authority_host(&parts.uri));
    let headers = &mut parts.headers;
    let sent = hop_by_hop::remove_hop_by_hop_from_request(headers);
    if sent.claims && !conn.trusted {
        hop_by_hop::remove_proxy_claims(headers);
    }
    let fields = Forwarded {
        client_ip: conn.forwarded_for.clone(),
        tls: conn.tls,
        host: client_host.clone(),
    };
    // Nearly always empty.
    let set_by_rules = ProxyFields::among(rules.to_backend.iter().map(|(name, _)| name));
    let forwarded = if sent.forwarded || set_by_rules.forwarded {
        fields.merge_into(headers);
        None
    } else {
        Some(fields)
    };
    if request_id.is_some() && sent.request_id {
        // The client's own, not kept.
        headers.remove(&X_REQUEST_ID);
    }
    // A rule that sets the id wins, as it does every other field.
    let request_id = request_id.filter(|_| !set_by_rules.request_id).cloned();
    // The client's own `Host` stays, unless its `Connection` named it (no need to look then).
    let mut no_host = false;
    if !host_in_map || (sent.connection_named && !headers.contains_key(header::HOST)) {
        match client_host {
            Some(host) => drop(headers.insert(header::HOST, host)),
            None => no_host = true,
        }
    }
    set_listed(headers, &rules.to_backend);
    if no_host
        && rules
            .to_backend
            .iter()
            .any(|(name, _)| name == header::HOST)
    {
        no_host = false;
    }
    (forwarded::Deferred::new(forwarded, request_id), no_host)
}

/// Sets a route's header list on `headers`: each name replaces what was there, and a name
/// listed more than once (two `Set-Cookie`s) is sent with every value listed.
#[inline]
fn set_listed(headers: &mut http::HeaderMap, listed: &[(HeaderName, HeaderValue)]) {
    if listed.is_empty() {
        return;
    }
    for (at, (name, value)) in listed.iter().enumerate() {
        // A `Set-Cookie` goes beside the backend's own: each names its own cookie, and one in
        // place of the backend's took the application's session away (nginx adds it too).
        let beside = *name == http::header::SET_COOKIE;
        if beside || listed[..at].iter().any(|(earlier, _)| earlier == name) {
            headers.append(name.clone(), value.clone());
        } else {
            headers.insert(name.clone(), value.clone());
        }
    }
}

/// The request head in HTTP/1.1 form (origin-form target, `Host`); the pool rewrites it for a
/// backend that speaks HTTP/2.
fn to_origin_form(head: &mut Parts) {
    let path = match head.uri.path_and_query() {
        // `http://x?q=1` has an empty path: origin-form starts with `/` (RFC 9112 §3.2.1), and
        // a backend answers `GET ?q=1` with 400.
        Some(path) if path.as_str().starts_with('?') => {
            PathAndQuery::try_from(format!("/{}", path.as_str()))
                .unwrap_or_else(|_| PathAndQuery::from_static("/"))
        }
        Some(path) => path.clone(),
        None => PathAndQuery::from_static("/"),
    };
    head.version = Version::HTTP_11;
    head.uri = Uri::from(path);
}

/// Strips hop-by-hop headers from the backend's response and adds the route's client headers.
///
/// A 204 or 304 has no body by definition: it gets an empty one and the backend's is never read
/// (its `Content-Length` describes a body that is not there, which an HTTP/2 backend connection
/// reports as a protocol error). The answer to HEAD is made bodiless for every listener where
/// responses leave the server (`server::accept`), so the backend's is never read either.
fn finish_response(resp: Response<PooledBody>, rules: &HeaderRules) -> Response<RespBody> {
    let (mut parts, body) = resp.into_parts();
    if !body.hop_by_hop_gone() {
        hop_by_hop::remove_hop_by_hop(&mut parts.headers);
    }
    set_listed(&mut parts.headers, &rules.to_client);
    let bodiless = parts.status == http::StatusCode::NO_CONTENT
        || parts.status == http::StatusCode::NOT_MODIFIED;
    if bodiless {
        if parts.status == http::StatusCode::NO_CONTENT {
            // RFC 9110 §8.6: never on a 204 (a 304's still describes the 200's body).
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        keep_served_by(&mut parts, &body);
        return Response::from_parts(parts, Either::Right(Full::new(Bytes::new())));
    }
    Response::from_parts(parts, Either::Left(Either::Left(Either::Left(body))))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::{BodyExt as _, Empty};

    use super::*;
    use crate::vocab::WorkerId;

    /// The router boxes this future once per request and it lives until the response head:
    /// its size is memory held for every request in flight (as many as there are busy
    /// connections). It was 12,432 bytes before the rare paths (hyper's client, opening a
    /// connection) were boxed and the request stopped being kept twice at each level; about
    /// 3,100 after; 1,984 once no level below the balancer kept a moved-out request (or a
    /// level of its own for the stale-connection retry).
    #[test]
    fn the_forwarding_future_stays_small() {
        let forwarder = Forwarder {
            timeouts: Timeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(1),
            },
        };
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let conn = ClientConn::new(peer, false, WorkerId(0));
        let backends = BackendSet::new(Box::new([]), None, false);
        let rules = HeaderRules::default();
        let body = ClientBody::Stream(Empty::new().map_err(|e| match e {}).boxed_unsync());
        let forwarding = forwarder.forward(
            &conn,
            &backends,
            &rules,
            Request::new(body),
            (None, None),
            false,
        );
        let size = std::mem::size_of_val(&forwarding);
        assert!(size <= 2560, "the forwarding future grew to {size} bytes");
    }

    /// An absolute-form target goes to the backend in origin form, with a `/` before a query
    /// that has no path (it went as `GET ?q=1`).
    #[test]
    fn origin_form_starts_with_a_slash() {
        for (target, want) in [
            ("http://x?q=1", "/?q=1"),
            ("http://x", "/"),
            ("http://x/a?b", "/a?b"),
            ("/p", "/p"),
        ] {
            let (mut head, ()) = Request::get(target).body(()).unwrap().into_parts();
            to_origin_form(&mut head);
            assert_eq!(head.uri.to_string(), want, "{target}");
        }
    }

    /// The `Host` a backend gets: the client's (looked for again only when its `Connection`
    /// named fields, which may have taken `Host` with them), else the URI's authority.
    #[test]
    fn the_backend_gets_the_clients_host() {
        let conn = ClientConn::new(([127, 0, 0, 1], 1).into(), false, WorkerId(0));
        let rules = HeaderRules::default();
        /// The request's URI and fields, and the `Host` its backend gets.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("/", &[("host", "a.test")], "a.test"),
            ("/", &[("host", "a.test"), ("connection", "host, x-a")], "a.test"),
            ("/", &[("host", "a.test"), ("connection", "x-a")], "a.test"),
            ("http://b.test:81/", &[], "b.test:81"),
            ("http://b.test/", &[("host", "a.test")], "a.test"),
        ];
        for (uri, fields, host) in cases {
            let mut req = Request::get(*uri).body(()).expect("request");
            *req.headers_mut() = crate::vocab::headers::map_of(fields);
            let (mut parts, ()) = req.into_parts();
            prepare_headers(&mut parts, (&conn, None), &rules);
            let sent: Vec<_> = parts.headers.get_all(header::HOST).iter().collect();
            assert_eq!(sent, [*host], "{uri} {fields:?}");
        }
    }
}
