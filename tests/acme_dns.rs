//! DNS-01 (`acme_dns_provider`) against Debian's pebble: aralez publishes each challenge's TXT
//! record through a provider's API, waits until pebble-challtestsrv's DNS answers it
//! (`acme.dns_resolver`), and pebble validates it there. The provider is a fake of the
//! documented API (answers from `tests/fixtures/dns/`) that checks the credentials as the
//! real one would and puts each record it is given into pebble-challtestsrv (its `/set-txt`),
//! taking it out again on delete. One test per provider: Cloudflare (a wildcard and its apex
//! in one certificate: two values under one name), Route 53 (SigV4-signed XML, a change
//! waited for until INSYNC), DigitalOcean (the zone found among the account's domains, a
//! wildcard alone).

use crate::support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use support::pebble::*;
use support::ports::free_port;
use support::*;

const CLOUDFLARE_RECORD: &str = include_str!("fixtures/dns/cloudflare_create_record.json");
const CLOUDFLARE_DELETED: &str = include_str!("fixtures/dns/cloudflare_delete_record.json");
const CLOUDFLARE_ERROR: &str = include_str!("fixtures/dns/cloudflare_error.json");
const ROUTE53_CHANGE: &str = include_str!("fixtures/dns/route53_change_rrsets.xml");
const ROUTE53_INSYNC: &str = include_str!("fixtures/dns/route53_get_change.xml");
const ROUTE53_ERROR: &str = include_str!("fixtures/dns/route53_error.xml");
const DO_DOMAINS: &str = include_str!("fixtures/dns/digitalocean_list_domains.json");
const DO_RECORD: &str = include_str!("fixtures/dns/digitalocean_create_record.json");
const DO_ERROR: &str = include_str!("fixtures/dns/digitalocean_error.json");

const TOKEN: &str = "test-token";
const ZONE: &str = "Z1D633PJN98FT9";

/// What the fake provider was asked.
#[derive(Default)]
struct Seen {
    /// Live records: id -> (name, value).
    records: BTreeMap<u64, (String, String)>,
    next_id: u64,
    created: usize,
    deleted: usize,
    refused: usize,
}

/// A fake DNS provider API on a loopback port, writing into pebble-challtestsrv.
struct FakeProvider {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl FakeProvider {
    async fn start(challtestsrv: SocketAddr) -> FakeProvider {
        let listener = bind_local().await;
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let state = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, state.clone(), challtestsrv));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeProvider { addr, seen }
    }

    fn url(&self, base: &str) -> String {
        format!("http://{}{base}", self.addr)
    }

    fn counts(&self) -> (usize, usize, usize, usize) {
        let seen = self.seen.lock().unwrap();
        (seen.created, seen.deleted, seen.records.len(), seen.refused)
    }
}

fn reply(status: StatusCode, body: String) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(body)))
        .expect("response"))
}

async fn answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
    challtestsrv: SocketAddr,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let provider = Provider { seen, challtestsrv };
    if let Some(rest) = path.strip_prefix("/client/v4/zones/") {
        if header("authorization") != format!("Bearer {TOKEN}") {
            provider.seen.lock().unwrap().refused += 1;
            return reply(StatusCode::FORBIDDEN, CLOUDFLARE_ERROR.to_string());
        }
        return provider.cloudflare(&parts.method, rest, &body).await;
    }
    if let Some(rest) = path.strip_prefix("/2013-04-01/") {
        let auth = header("authorization");
        let signed = auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIATEST/")
            && auth.contains(
                "/us-east-1/route53/aws4_request, SignedHeaders=host;x-amz-date, Signature=",
            )
            && header("x-amz-date").len() == 16;
        if !signed {
            provider.seen.lock().unwrap().refused += 1;
            return reply(StatusCode::FORBIDDEN, ROUTE53_ERROR.to_string());
        }
        return provider.route53(&parts.method, rest, &body).await;
    }
    if let Some(rest) = path.strip_prefix("/v2/") {
        if header("authorization") != format!("Bearer {TOKEN}") {
            provider.seen.lock().unwrap().refused += 1;
            return reply(StatusCode::UNAUTHORIZED, DO_ERROR.to_string());
        }
        return provider.digitalocean(&parts.method, rest, &body).await;
    }
    reply(StatusCode::NOT_FOUND, String::new())
}

struct Provider {
    seen: Arc<Mutex<Seen>>,
    challtestsrv: SocketAddr,
}

impl Provider {
    /// Records `value` under `name` here and in pebble-challtestsrv; its id.
    async fn create(&self, name: &str, value: &str) -> u64 {
        let id = {
            let mut seen = self.seen.lock().unwrap();
            seen.next_id += 1;
            seen.created += 1;
            let id = 28_448_433 + seen.next_id;
            seen.records
                .insert(id, (name.to_string(), value.to_string()));
            id
        };
        self.sync(name).await;
        id
    }

    async fn delete(&self, id: u64) -> bool {
        let removed = {
            let mut seen = self.seen.lock().unwrap();
            let removed = seen.records.remove(&id);
            seen.deleted += usize::from(removed.is_some());
            removed
        };
        match removed {
            Some((name, _)) => {
                self.sync(&name).await;
                true
            }
            None => false,
        }
    }

    /// pebble-challtestsrv's TXT values for `name` made what the records here say.
    async fn sync(&self, name: &str) {
        let values: Vec<String> = {
            let seen = self.seen.lock().unwrap();
            seen.records
                .values()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .collect()
        };
        let host = format!("{}.", name.trim_end_matches('.'));
        post_json(
            self.challtestsrv,
            "/clear-txt",
            serde_json::json!({ "host": host }),
        )
        .await;
        for value in values {
            let set = serde_json::json!({ "host": host, "value": value });
            post_json(self.challtestsrv, "/set-txt", set).await;
        }
    }

    async fn cloudflare(
        &self,
        method: &Method,
        rest: &str,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let Some(records) = rest.strip_prefix(&format!("{ZONE}/dns_records")) else {
            return reply(StatusCode::NOT_FOUND, CLOUDFLARE_ERROR.to_string());
        };
        if *method == Method::POST && records.is_empty() {
            let asked: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            assert_eq!(asked["type"], "TXT", "{asked}");
            let (name, value) = (
                asked["name"].as_str().unwrap_or(""),
                asked["content"].as_str().unwrap_or(""),
            );
            let id = self.create(name, value).await;
            let mut answer: serde_json::Value = serde_json::from_str(CLOUDFLARE_RECORD).unwrap();
            answer["result"]["id"] = format!("{id:x}").into();
            answer["result"]["name"] = name.into();
            answer["result"]["content"] = value.into();
            return reply(StatusCode::OK, answer.to_string());
        }
        let id = records.trim_start_matches('/');
        let id = u64::from_str_radix(id, 16).unwrap_or(0);
        if *method == Method::DELETE && self.delete(id).await {
            let mut answer: serde_json::Value = serde_json::from_str(CLOUDFLARE_DELETED).unwrap();
            answer["result"]["id"] = format!("{id:x}").into();
            return reply(StatusCode::OK, answer.to_string());
        }
        reply(StatusCode::NOT_FOUND, CLOUDFLARE_ERROR.to_string())
    }

    async fn route53(
        &self,
        method: &Method,
        rest: &str,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if *method == Method::GET && rest.starts_with("change/") {
            return reply(StatusCode::OK, ROUTE53_INSYNC.to_string());
        }
        if *method != Method::POST || rest != format!("hostedzone/{ZONE}/rrset/") {
            return reply(StatusCode::NOT_FOUND, ROUTE53_ERROR.to_string());
        }
        let xml = String::from_utf8_lossy(body);
        let text = |tag: &str| {
            let open = format!("<{tag}>");
            xml.split(&open)
                .skip(1)
                .filter_map(|s| s.split(&format!("</{tag}>")).next())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let (action, name) = (text("Action").concat(), text("Name").concat());
        let name = name.trim_end_matches('.').to_string();
        assert_eq!(text("Type").concat(), "TXT", "{xml}");
        let live: Vec<u64> = {
            let seen = self.seen.lock().unwrap();
            seen.records
                .iter()
                .filter(|(_, (n, _))| *n == name)
                .map(|(id, _)| *id)
                .collect()
        };
        for id in live {
            self.delete(id).await;
        }
        if action == "UPSERT" {
            for value in text("Value") {
                self.create(&name, value.trim_matches('"')).await;
            }
        }
        reply(StatusCode::OK, ROUTE53_CHANGE.to_string())
    }

    async fn digitalocean(
        &self,
        method: &Method,
        rest: &str,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if *method == Method::GET && rest == "domains" {
            let mut answer: serde_json::Value = serde_json::from_str(DO_DOMAINS).unwrap();
            let mut zone = answer["domains"][0].clone();
            zone["name"] = "do.test".into();
            answer["domains"].as_array_mut().unwrap().push(zone);
            return reply(StatusCode::OK, answer.to_string());
        }
        let Some(records) = rest.strip_prefix("domains/do.test/records") else {
            return reply(StatusCode::NOT_FOUND, DO_ERROR.to_string());
        };
        if *method == Method::POST && records.is_empty() {
            let asked: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let (relative, value) = (
                asked["name"].as_str().unwrap_or(""),
                asked["data"].as_str().unwrap_or(""),
            );
            let id = self.create(&format!("{relative}.do.test"), value).await;
            let mut answer: serde_json::Value = serde_json::from_str(DO_RECORD).unwrap();
            answer["domain_record"]["id"] = id.into();
            answer["domain_record"]["name"] = relative.into();
            answer["domain_record"]["data"] = value.into();
            return reply(StatusCode::CREATED, answer.to_string());
        }
        let id = records.trim_start_matches('/').parse().unwrap_or(0);
        if *method == Method::DELETE && self.delete(id).await {
            return reply(StatusCode::NO_CONTENT, String::new());
        }
        reply(StatusCode::NOT_FOUND, DO_ERROR.to_string())
    }
}

/// POSTs `json` to pebble-challtestsrv's management API.
async fn post_json(addr: SocketAddr, path: &str, json: serde_json::Value) {
    let mut client = Client::connect(Proto::H1, addr).await;
    let resp = client
        .send(
            Method::POST,
            Some("localhost"),
            path,
            &[],
            full(json.to_string()),
        )
        .await;
    assert!(
        resp.status().is_success(),
        "challtestsrv {path}: {}",
        resp.status()
    );
}

/// aralez ordering `domains` by DNS-01 through `provider` with `env`; the certificate file
/// stem it should write. Returns once it logged the issuance (or panics with its log).
async fn issue(
    pebble: &Pebble,
    provider: &str,
    domains: &str,
    env: &[(&str, &str)],
) -> (ProxyProcess, tempfile::TempDir) {
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    let main = main_for(
        pebble,
        certs.path(),
        state.path(),
        &format!(
            "  dns_resolver: \"{}\"\nacme_dns_provider: {provider}\n",
            pebble.dns
        ),
    )
    .replace("  challenge: http-01\n", "")
    .replace("domains: [\"acme.test\"]", &format!("domains: {domains}"));
    let proxy = ProxyProcess::start_env(&unused_route(), &main, env);
    assert!(
        logs(&proxy, "acme: certificate issued").await,
        "{}",
        proxy.log_text()
    );
    (proxy, certs)
}

#[tokio::test]
async fn cloudflare_publishes_a_wildcard_and_its_apex_under_one_name() {
    let Some(pebble) = Pebble::start(free_port()).await else {
        return;
    };
    let fake = FakeProvider::start(pebble.challtestsrv).await;
    let base = fake.url("/client/v4");
    let env = [
        ("CLOUDFLARE_API_TOKEN", TOKEN),
        ("CLOUDFLARE_ZONE_ID", ZONE),
        ("CLOUDFLARE_BASE_URL", base.as_str()),
    ];
    let (proxy, certs) = issue(
        &pebble,
        "cloudflare",
        "[\"*.wild.test\", \"wild.test\"]",
        &env,
    )
    .await;
    assert!(certs.path().join("_wildcard.wild.test.crt").exists());
    let root = pebble.root().await;
    assert!(
        serves(&proxy, "a.wild.test", root.clone()).await,
        "the wildcard"
    );
    assert!(serves(&proxy, "wild.test", root).await, "the apex");
    // Two values under `_acme-challenge.wild.test`, both taken down after.
    assert_eq!(fake.counts(), (2, 2, 0, 0));
    drop(proxy);

    // A token the API refuses: the order fails with Cloudflare's error, and is counted.
    let env = [
        ("CLOUDFLARE_API_TOKEN", "wrong"),
        ("CLOUDFLARE_ZONE_ID", ZONE),
        ("CLOUDFLARE_BASE_URL", base.as_str()),
    ];
    let certs = tempfile::tempdir().expect("certificate dir");
    let state = tempfile::tempdir().expect("state dir");
    let main = main_for(
        &pebble,
        certs.path(),
        state.path(),
        &format!(
            "  dns_resolver: \"{}\"\nacme_dns_provider: cloudflare\n",
            pebble.dns
        ),
    )
    .replace("  challenge: http-01\n", "");
    let proxy = ProxyProcess::start_env(&unused_route(), &main, &env);
    assert!(
        logs(&proxy, "acme: order failed").await,
        "{}",
        proxy.log_text()
    );
    assert!(
        proxy.log_text().contains("Authentication error"),
        "{}",
        proxy.log_text()
    );
    assert_eq!(fake.counts().3, 1);
}

#[tokio::test]
async fn route53_upserts_a_signed_change_and_deletes_it_after() {
    let Some(pebble) = Pebble::start(free_port()).await else {
        return;
    };
    let fake = FakeProvider::start(pebble.challtestsrv).await;
    let endpoint = fake.url("");
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIATEST"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_HOSTED_ZONE_ID", "/hostedzone/Z1D633PJN98FT9"),
        ("AWS_ENDPOINT_URL_ROUTE_53", endpoint.as_str()),
    ];
    let (proxy, certs) = issue(&pebble, "route53", "[\"r53.test\"]", &env).await;
    assert!(certs.path().join("r53.test.crt").exists());
    assert!(serves(&proxy, "r53.test", pebble.root().await).await);
    assert_eq!(fake.counts(), (1, 1, 0, 0));
}

#[tokio::test]
async fn digitalocean_finds_the_zone_and_issues_a_wildcard() {
    let Some(pebble) = Pebble::start(free_port()).await else {
        return;
    };
    let fake = FakeProvider::start(pebble.challtestsrv).await;
    let base = fake.url("/v2");
    let env = [
        ("DO_AUTH_TOKEN", TOKEN),
        ("DIGITALOCEAN_BASE_URL", base.as_str()),
    ];
    let (proxy, certs) = issue(&pebble, "digitalocean", "[\"*.do.test\"]", &env).await;
    assert!(certs.path().join("_wildcard.do.test.crt").exists());
    assert!(serves(&proxy, "x.do.test", pebble.root().await).await);
    assert_eq!(fake.counts(), (1, 1, 0, 0));
}
