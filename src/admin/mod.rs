//! The admin API (SPEC §9) on `config_address`: `POST /conf`, `POST /jwt`, `GET /status`
//! (`?history` adds the traffic totals and the last minutes' samples), `GET /metrics` (and
//! `HEAD`), and the status page `GET /`. Every endpoint needs the master key, except that
//! `metrics_key` also opens the three read-only ones; with no key configured they answer 403 and
//! say why. It runs on the control-plane runtime and never touches the request path.

mod auth;
pub mod cluster;
mod history;
mod jwt;
mod leftover;
mod listen;
mod purge;
mod refusals;
mod status_page;

pub use history::History;
pub use listen::{bind, AdminBound, AdminError, AdminListeners, Inherited};

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::service::service_fn;
use tokio::sync::watch;

use crate::discovery::{ReloadError, Reloader};
use crate::metrics::{BackendUp, Metrics};
use crate::server::per_client::PerClient;
use crate::server::{AcceptLoop, ConnInfo, Limits};
use crate::vocab::ClientBody;
use auth::Access;
use refusals::RefusalLog;

/// How many connections one client address may hold to the admin API (of its 64).
const ADMIN_CONNECTIONS_PER_CLIENT: usize = 16;

/// Largest `POST /conf` body accepted (read only once the key has been checked): what a file
/// may hold, so that a file the watch applies can be pushed (cluster mode) or posted too.
const MAX_CONF_BODY: usize = crate::config::yaml::MAX_FILE_BYTES as usize;
/// Largest `POST /jwt` body: its key travels inside it, so it is read unauthenticated.
const MAX_JWT_BODY: usize = 4 * 1024;
/// How long a request body may take to arrive.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connections the admin API serves at once (each listener).
pub const MAX_CONNECTIONS: usize = 64;

/// What the admin API needs.
pub struct Admin {
    pub reloader: Arc<Reloader>,
    /// `JWT_KEY` from the environment, else `master_key`.
    pub master_key: Option<String>,
    pub config_api_enabled: bool,
    pub metrics: Arc<Metrics>,
    /// `metrics_key`: opens `/metrics`, `/status` and the status page (read-only) and nothing
    /// else.
    pub metrics_key: Option<String>,
    /// The last minutes of traffic, sampled by a task [`start`] spawns.
    pub history: Arc<History>,
    /// The response cache, for `POST /cache/purge` and its series in `/metrics`.
    pub cache: Option<Arc<crate::layers::cache::Store>>,
    /// `limits_store`'s series in `/metrics`.
    pub shared_limits: Option<Arc<crate::layers::shared_limits::SharedLimits>>,
    /// Cluster mode's master: where accepted configurations go on to.
    pub cluster: Option<Arc<cluster::Cluster>>,
    /// `acme:`'s series in `/metrics`.
    pub acme: Option<Arc<crate::control::acme::Acme>>,
    /// The certificate directory's pairs, for their expiry series in `/metrics`.
    pub certificates: Option<Arc<crate::tls::CertStore>>,
    /// One `POST /conf` body read and applied at a time ([`ConfTurn`]).
    pub conf_turn: ConfTurn,
}

/// The turn of a `POST /conf` body: read, parsed and applied one at a time. Parsing holds
/// about 50 times a body's size (a 7 MB body peaked at 280 MB), and sixteen connections of one
/// client posting at once held 1.5 GB.
#[derive(Default)]
pub struct ConfTurn(tokio::sync::Mutex<()>);

/// How long a `POST /conf` waits for the one before it (a body of 8 MiB takes seconds).
const CONF_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

type Reply = Response<Full<Bytes>>;

const NO_ACME: &str = "acme is not configured (no acme: block in main.yaml)";

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let body = body.into();
    // Said in the head, so a HEAD gets the length its GET would (hyper sends none for a body
    // it leaves out).
    let length = header::HeaderValue::from(body.len());
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_LENGTH, length);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

fn text(status: StatusCode, body: impl Into<String>) -> Reply {
    let mut body = body.into();
    body.push('\n');
    reply(status, "text/plain; charset=utf-8", body)
}

/// Serves the API on `listener` (over TLS with `tls`) through the common accept helper, until
/// `shutdown` turns true and its connections have drained.
pub async fn serve(
    listener: std::net::TcpListener,
    admin: Arc<Admin>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    let accept = AcceptLoop {
        name: "admin API",
        listener,
        tls,
        limits,
        open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        parked: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        proxy_protocol: false,
        // One address that holds its connections open takes at most a quarter of the places.
        per_client: Some(PerClient::new(ADMIN_CONNECTIONS_PER_CLIENT)),
        refusals: None,
    };
    let refusals = Arc::new(RefusalLog::default());
    let make = move |conn: ConnInfo| {
        let (admin, refusals) = (admin.clone(), refusals.clone());
        service_fn(move |req: Request<ClientBody>| {
            let (admin, refusals) = (admin.clone(), refusals.clone());
            Box::pin(async move {
                let http1 = req.version() < http::Version::HTTP_2;
                let asked = (req.method().clone(), req.uri().path().to_string());
                // Over HTTP/1 hyper reads (or closes on) what the answer left of the body.
                let (req, leftover) = match http1 {
                    true => (req, None),
                    false => {
                        let (req, leftover) = leftover::Leftover::watch(req);
                        (req, Some(leftover))
                    }
                };
                let mut reply = admin.answer(req).await;
                if let Some(leftover) = leftover {
                    leftover.discard().await;
                }
                refusals.note(conn.peer, &asked, reply.status());
                // A refusal ends an HTTP/1 connection: connections kept alive to collect 403s
                // held the API's places (64, 16 an address) from the clients with the key.
                if http1 && reply.status() == StatusCode::FORBIDDEN {
                    let close = http::HeaderValue::from_static("close");
                    reply.headers_mut().insert(http::header::CONNECTION, close);
                }
                Ok::<_, Infallible>(reply)
            })
        })
    };
    accept.run(make, shutdown).await;
}

impl Admin {
    async fn answer(&self, req: Request<ClientBody>) -> Reply {
        match (req.method(), req.uri().path()) {
            (&Method::POST, "/jwt") => self.jwt(req).await,
            (&Method::POST, "/conf") => self.guarded(req, Self::conf).await,
            (&Method::POST, "/cache/purge") => self.guarded(req, Self::purge).await,
            // Aralez's ACME endpoints, any method, behind the master key.
            (_, "/acme_create") => self.guarded(req, Self::acme_create).await,
            (_, path) if path.starts_with("/acme_order/") => {
                self.guarded(req, Self::acme_order).await
            }
            (&Method::GET | &Method::HEAD, "/status") => self.read_only(req, Self::status).await,
            (&Method::GET | &Method::HEAD, "/metrics") => self.read_only(req, Self::metrics).await,
            (&Method::GET | &Method::HEAD, "/") => {
                self.read_only(req, |_, _| async { status_page::response() })
                    .await
            }
            (_, path @ ("/" | "/jwt" | "/conf" | "/status" | "/metrics" | "/cache/purge")) => {
                // RFC 9110 §15.5.6: a 405 says what is allowed.
                let allowed = match path {
                    "/jwt" | "/conf" | "/cache/purge" => "POST",
                    _ => "GET, HEAD",
                };
                let mut refused = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
                refused
                    .headers_mut()
                    .insert(http::header::ALLOW, http::HeaderValue::from_static(allowed));
                refused
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "unknown endpoint (try /, /conf, /jwt, /status, /metrics, /cache/purge, /acme_create, /acme_order/<domain>)",
            ),
        }
    }

    async fn guarded<'a, F, Fut>(&'a self, req: Request<ClientBody>, handler: F) -> Reply
    where
        F: FnOnce(&'a Self, Request<ClientBody>) -> Fut,
        Fut: std::future::Future<Output = Reply>,
    {
        match auth::check(&req, self.master_key.as_deref()) {
            Access::Granted => handler(self, req).await,
            Access::NoMasterKey => text(
                StatusCode::FORBIDDEN,
                "forbidden: no master_key is configured (set master_key in main.yaml or JWT_KEY)",
            ),
            Access::Denied => text(StatusCode::FORBIDDEN, "forbidden: missing or wrong key"),
        }
    }

    /// For what only reads (`/metrics`, `/status`, `/`): the `metrics_key` opens it too, so a
    /// scraper never holds the key that can rewrite the config.
    async fn read_only<'a, F, Fut>(&'a self, req: Request<ClientBody>, handler: F) -> Reply
    where
        F: FnOnce(&'a Self, Request<ClientBody>) -> Fut,
        Fut: std::future::Future<Output = Reply>,
    {
        if self.metrics_key.is_some()
            && auth::check(&req, self.metrics_key.as_deref()) == Access::Granted
        {
            return handler(self, req).await;
        }
        self.guarded(req, handler).await
    }

    async fn conf(&self, req: Request<ClientBody>) -> Reply {
        if !self.config_api_enabled {
            return text(
                StatusCode::FORBIDDEN,
                "forbidden: the config API is disabled (config_api_enabled: false)",
            );
        }
        let save = req.uri().query().is_some_and(asks_to_save);
        let pushed_by = req.headers().get(cluster::PUSHED_BY_MASTER);
        let req_from_master = pushed_by.is_some();
        if let Some(master) = pushed_by {
            let master = master.to_str().unwrap_or("(a name not in ASCII)");
            let master: String = master.chars().take(cluster::SHOWN_MASTER_NAME).collect();
            tracing::info!("cluster: a configuration pushed by master {master}");
        }
        // Not for a master's push: a master among its own workers would wait for itself
        // (its push waits for this answer); a master pushes one body at a time.
        let turn = async {
            match req_from_master {
                false => Some(self.conf_turn.0.lock().await),
                true => None,
            }
        };
        let Ok(_conf_turn) = tokio::time::timeout(CONF_TURN_WAIT, turn).await else {
            let why = format!("another configuration is being applied; not read (waited {CONF_TURN_WAIT:?}), try again");
            let mut busy = text(StatusCode::SERVICE_UNAVAILABLE, why);
            busy.headers_mut()
                .insert(header::RETRY_AFTER, http::HeaderValue::from_static("5"));
            return busy;
        };
        let body = match read_body(req, MAX_CONF_BODY).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let Ok(yaml) = std::str::from_utf8(&body) else {
            let why = "the body is not UTF-8 text";
            self.reloader.refuse_text(why);
            return text(StatusCode::BAD_REQUEST, why);
        };
        if crate::config::is_blank_text(yaml.as_bytes()) {
            // A missing file given to curl (`--data-binary @typo`) sends nothing, a template that
            // rendered nothing only comments: not taken for "no routes" everywhere (an emptied
            // file is refused alike).
            let why =
                "the body is empty; nothing changed (to remove every route, send `upstreams: {}`)";
            self.reloader.refuse_text(why);
            return text(StatusCode::BAD_REQUEST, why);
        }
        let from_master = req_from_master;
        // On a master, one body at a time from its apply to its push (see `Cluster::turn`);
        // not for a master's own push, which it does not pass on (a master among its own
        // workers would wait for itself).
        let _turn = match &self.cluster {
            Some(cluster) if !from_master => Some(cluster.turn().await),
            _ => None,
        };
        let reloader = self.reloader.clone();
        let text_of = yaml.to_string();
        let outcome =
            tokio::task::spawn_blocking(move || reloader.apply_text(&text_of, save)).await;
        match outcome {
            Ok(Ok(warnings)) => {
                let done = if save { "applied and saved" } else { "applied" };
                let done = match warnings.is_empty() {
                    true => done.to_string(),
                    false => format!("{done}, with warnings:\n{}", warnings.join("\n")),
                };
                let Some(cluster) = &self.cluster else {
                    return text(StatusCode::OK, done);
                };
                if from_master {
                    // A master among another master's workers (or its own): passing it on
                    // again would go round without end.
                    tracing::warn!("a master pushed a configuration to this master: applied, not passed on (check worker_nodes)");
                    return text(
                        StatusCode::OK,
                        format!("{done}; not passed on (it came from a master)"),
                    );
                }
                // The master passes what it accepted on to every worker.
                let (all, lines) = cluster.push_all(yaml, save).await;
                let status = if all {
                    StatusCode::OK
                } else {
                    StatusCode::BAD_GATEWAY
                };
                text(status, format!("{done}\nworkers:\n{}", lines.join("\n")))
            }
            Ok(Err(ReloadError::Invalid(issues))) => {
                let lines: Vec<String> = issues.errors().map(ToString::to_string).collect();
                text(
                    StatusCode::BAD_REQUEST,
                    format!("rejected; nothing changed:\n{}", lines.join("\n")),
                )
            }
            Ok(Err(e @ ReloadError::Save { .. })) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("not applied: {e}"),
            ),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("not applied: {e}"),
            ),
        }
    }

    async fn acme_create(&self, _: Request<ClientBody>) -> Reply {
        let Some(acme) = &self.acme else {
            return text(StatusCode::NOT_FOUND, NO_ACME);
        };
        match acme.account_within().await {
            Ok(account) => text(StatusCode::OK, account.id()),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to create account {e}"),
            ),
        }
    }

    async fn acme_order(&self, req: Request<ClientBody>) -> Reply {
        let Some(acme) = &self.acme else {
            return text(StatusCode::NOT_FOUND, NO_ACME);
        };
        let domain = req.uri().path()["/acme_order/".len()..].trim_matches('/');
        // What check-config refuses in `acme.domains`: the CA refuses it too (an IP address,
        // a single label), after an account and an order were spent on it.
        if domain.is_empty() {
            return text(
                StatusCode::BAD_REQUEST,
                "name the domain: /acme_order/<domain>",
            );
        }
        if let Some(why) = crate::config::acme_conf::not_orderable(domain) {
            return text(StatusCode::BAD_REQUEST, format!("`{domain}` {why}"));
        }
        match acme.order_now(domain).await {
            Ok(said) => reply(StatusCode::OK, "text/plain", said),
            // The CA failed or refused: not this server's error.
            Err(e) if e.is_the_servers() => {
                text(StatusCode::BAD_GATEWAY, format!("Bad Gateway: {e}"))
            }
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: {e}"),
            ),
        }
    }

    async fn purge(&self, req: Request<ClientBody>) -> Reply {
        let body = match read_body(req, MAX_JWT_BODY).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let (status, json) = purge::purge(self.cache.as_deref(), &body).await;
        reply(status, "application/json", json)
    }

    async fn jwt(&self, req: Request<ClientBody>) -> Reply {
        if self.master_key.is_none() {
            return text(
                StatusCode::FORBIDDEN,
                "forbidden: no master_key is configured",
            );
        }
        // A key presented outside the body (header or query) is checked before any body is read.
        let presents_key = auth::presented_key(&req).is_some();
        if presents_key && auth::check(&req, self.master_key.as_deref()) == Access::Denied {
            return text(StatusCode::FORBIDDEN, "forbidden: missing or wrong key");
        }
        let body = match read_body(req, MAX_JWT_BODY).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let request: jwt::TokenRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("expected JSON {{master_key, owner, valid}}: {e}"),
                )
            }
        };
        let Some(master) = self.master_key.as_deref() else {
            return text(
                StatusCode::FORBIDDEN,
                "forbidden: no master_key is configured",
            );
        };
        if !crate::layers::auth::ct_eq(request.master_key.as_bytes(), master.as_bytes()) {
            return text(StatusCode::FORBIDDEN, "forbidden: wrong master_key");
        }
        let minutes = match jwt::valid_minutes(&request) {
            Ok(minutes) => minutes,
            Err(why) => return text(StatusCode::BAD_REQUEST, why),
        };
        match jwt::issue(&request, minutes, master) {
            Ok(token) => reply(
                StatusCode::CREATED,
                "application/json",
                serde_json::json!({ "token": token }).to_string(),
            ),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot sign: {e}"),
            ),
        }
    }

    async fn status(&self, req: Request<ClientBody>) -> Reply {
        let flag = |name: &str| {
            req.uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == name))
        };
        let (live_only, with_history) = (flag("live"), flag("history"));
        let snapshot = self.reloader.snapshot.load_full();
        let mut routes: Vec<serde_json::Value> = snapshot
            .routes()
            .map(|route| {
                let backends: Vec<serde_json::Value> = route
                    .backends
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (b, route.backends.in_rotation_at(i)))
                    .filter(|(_, up)| !live_only || *up)
                    .map(|(b, up)| serde_json::json!({ "address": &*b.label, "up": up, "protocol": b.wire().map_or("detecting", |w| w.name()) }))
                    .collect();
                serde_json::json!({ "host": &*route.host, "path": &*route.prefix, "backends": backends })
            })
            .collect();
        routes.sort_by(|a, b| {
            (a["host"].as_str(), a["path"].as_str()).cmp(&(b["host"].as_str(), b["path"].as_str()))
        });
        let mut answer = serde_json::json!({ "routes": routes });
        // Asked for by a cluster master; left out otherwise, so the shape stays Aralez's.
        if flag("digest") {
            answer["config_digest"] = self.reloader.config_digest().into();
        }
        if let Some(cluster) = &self.cluster {
            answer["workers"] = cluster.status_json();
        }
        if with_history {
            answer["totals"] = history::totals_json(&self.metrics.totals());
            answer["history"] = self.history.to_json(tokio::time::Instant::now());
        }
        reply(StatusCode::OK, "application/json", answer.to_string())
    }

    async fn metrics(&self, _req: Request<ClientBody>) -> Reply {
        let snapshot = self.reloader.snapshot.load_full();
        // A backend listed twice on a path (it then counts twice) is one series: a duplicate
        // series is invalid exposition, and Prometheus fails the scrape's samples.
        let backends = snapshot.routes().flat_map(|route| {
            let listed = route.backends.iter().enumerate();
            listed
                .filter(|&(i, b)| !route.backends.iter().take(i).any(|e| e.label == b.label))
                .map(move |(i, b)| BackendUp {
                    host: &route.host,
                    path: &route.prefix,
                    backend: &b.label,
                    up: route.backends.in_rotation_at(i),
                })
        });
        let mut text = self.metrics.render_prometheus(backends);
        if let Some(cache) = &self.cache {
            cache.render_prometheus(&mut text);
        }
        if let Some(limits) = &self.shared_limits {
            limits.render_prometheus(&mut text);
        }
        if let Some(acme) = &self.acme {
            acme.render_prometheus(&mut text);
        }
        if let Some(certificates) = &self.certificates {
            certificates.render_prometheus(&mut text);
        }
        reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            text,
        )
    }
}

async fn read_body(req: Request<ClientBody>, max: usize) -> Result<Bytes, Reply> {
    use http_body::Body as _;
    // A body announced too large is refused before a byte of it is read.
    if req.body().size_hint().lower() > max as u64 {
        return Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body over {max} bytes"),
        ));
    }
    let collect = Limited::new(req.into_body(), max).collect();
    let Ok(collected) = tokio::time::timeout(BODY_TIMEOUT, collect).await else {
        return Err(text(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {BODY_TIMEOUT:?}"),
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body over {max} bytes"),
            ))
        }
        Err(e) => Err(text(
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )),
    }
}

/// Serves the bound admin listeners on `runtime` until `shutdown` turns true; returns the
/// serving tasks (they end after their drain).
pub fn start(
    runtime: &tokio::runtime::Runtime,
    main: &crate::config::MainConfig,
    listeners: AdminListeners,
    admin: Arc<Admin>,
    shutdown: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let limits = Limits {
        header_timeout: main.client_header_timeout,
        max_header_bytes: main.max_request_header_bytes,
        max_connections: MAX_CONNECTIONS,
        keepalive: None,
        grace_period: main.grace_period,
        idle_timeout: main.client_idle_timeout,
        send_timeout: main.client_send_timeout,
        backend_wait: main.upstream_response_timeout,
        max_streams: 16,
    };
    let mut tasks = Vec::new();
    for (listener, acceptor) in listeners.0 {
        if let Ok(local) = listener.local_addr() {
            let scheme = if acceptor.is_some() { "https" } else { "http" };
            tracing::info!("admin API on {scheme}://{local}");
        }
        let served = serve(
            listener,
            admin.clone(),
            acceptor,
            limits.clone(),
            shutdown.clone(),
        );
        tasks.push(runtime.spawn(served));
    }
    // The status page's history, sampled while someone may read it.
    if !tasks.is_empty() {
        let sampler = admin
            .history
            .clone()
            .run(admin.metrics.clone(), shutdown.clone());
        tasks.push(runtime.spawn(sampler));
    }
    tasks
}

/// Whether a `/conf` query asks for the file to be written: `save`, or `save=` anything but a
/// word for no (`save=false` wrote the file all the same).
fn asks_to_save(query: &str) -> bool {
    query.split('&').any(|pair| match pair.split_once('=') {
        None => pair == "save",
        Some((name, value)) => {
            name == "save"
                && !matches!(
                    value.to_ascii_lowercase().as_str(),
                    "false" | "0" | "no" | "off"
                )
        }
    })
}
