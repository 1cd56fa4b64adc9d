//! gRPC through the proxy with no gRPC config: a tonic client and server in the test, all four
//! call kinds, over the plain listener (h2c) and the TLS listener (h2 by ALPN), to h2c and TLS
//! backends, pinned by scheme or detected; deadlines and cancellations reach the backend.

use crate::support;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use support::*;
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
}

type MsgStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;
type BoxFut<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

fn msg(text: impl Into<String>) -> Msg {
    Msg { text: text.into() }
}

/// Backend calls that ended because the client went away (RST_STREAM through the proxy).
static CANCELLED_AT_BACKEND: AtomicUsize = AtomicUsize::new(0);

/// Counts a cancellation when dropped while armed.
struct CancelWatch(bool);

impl Drop for CancelWatch {
    fn drop(&mut self) {
        if self.0 {
            CANCELLED_AT_BACKEND.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct Unary;
impl tonic::server::UnaryService<Msg> for Unary {
    type Response = Msg;
    type Future = BoxFut<Result<Response<Msg>, Status>>;
    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        // The deadline the backend was given (`grpc-timeout`), as the proxy passed it on.
        let deadline = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        Box::pin(async move {
            let text = req.into_inner().text;
            match text.as_str() {
                "fail" => Err(Status::not_found("no such thing")),
                "deadline" => Ok(Response::new(msg(deadline))),
                "expire" => Err(Status::deadline_exceeded("deadline passed at the backend")),
                "hang" => {
                    // Never answers: only a cancellation ends it (and counts on drop).
                    let _watch = CancelWatch(true);
                    std::future::pending().await
                }
                _ => Ok(Response::new(msg(format!("echo {text}")))),
            }
        })
    }
}

struct Count;
impl tonic::server::ServerStreamingService<Msg> for Count {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFut<Result<Response<MsgStream>, Status>>;
    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        let n: usize = req.into_inner().text.parse().unwrap_or(0);
        Box::pin(async move {
            let s = futures_util::stream::iter((0..n).map(|i| Ok(msg(i.to_string()))));
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

/// Streams a message every 10 ms until the client cancels.
struct Forever;
impl tonic::server::ServerStreamingService<Msg> for Forever {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFut<Result<Response<MsgStream>, Status>>;
    fn call(&mut self, _: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let s =
                futures_util::stream::unfold((0u64, CancelWatch(true)), |(i, watch)| async move {
                    // Kept: the stream's pace, a message every 10 ms for as long as it lives.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Some((Ok(msg(i.to_string())), (i + 1, watch)))
                });
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

struct Join;
impl tonic::server::ClientStreamingService<Msg> for Join {
    type Response = Msg;
    type Future = BoxFut<Result<Response<Msg>, Status>>;
    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let mut stream = req.into_inner();
            let mut parts = Vec::new();
            while let Some(m) = stream.next().await {
                parts.push(m?.text);
            }
            Ok(Response::new(msg(parts.join("+"))))
        })
    }
}

struct Shout;
impl tonic::server::StreamingService<Msg> for Shout {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFut<Result<Response<MsgStream>, Status>>;
    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let s = req
                .into_inner()
                .map(|m| m.map(|m| msg(m.text.to_uppercase())));
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

/// The service, routed by path by hand (no codegen, so no protoc needed).
#[derive(Clone)]
struct Echo;

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFut<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
            Ok(match req.uri().path() {
                "/test.Echo/Unary" => grpc.unary(Unary, req).await,
                "/test.Echo/Count" => grpc.server_streaming(Count, req).await,
                "/test.Echo/Forever" => grpc.server_streaming(Forever, req).await,
                "/test.Echo/Join" => grpc.client_streaming(Join, req).await,
                "/test.Echo/Shout" => grpc.streaming(Shout, req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

async fn grpc_backend() -> std::net::SocketAddr {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_grpc(stream));
        }
    });
    addr
}

/// The same service over TLS (self-signed, ALPN h2 only).
async fn tls_grpc_backend() -> std::net::SocketAddr {
    serve_tls(tls_backend_acceptor(&[b"h2"]), any_local(), serve_grpc).await
}

async fn serve_grpc<IO>(stream: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| {
        let mut echo = Echo;
        tower::Service::call(&mut echo, req.map(tonic::body::Body::new))
    });
    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
        .http2_only()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await;
}

type Client = tonic::client::Grpc<tonic::transport::Channel>;

fn path(method: &str) -> PathAndQuery {
    PathAndQuery::try_from(format!("/test.Echo/{method}")).unwrap()
}

async fn unary(
    client: &mut Client,
    text: &str,
    timeout: Option<Duration>,
) -> Result<String, Status> {
    client
        .ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let mut req = Request::new(msg(text));
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    let resp = client
        .unary(req, path("Unary"), ProstCodec::<Msg, Msg>::default())
        .await?;
    Ok(resp.into_inner().text)
}

/// Starts a server-streaming call of `method` with `text`; its stream of answers.
async fn server_stream(client: &mut Client, method: &str, text: &str) -> Streaming<Msg> {
    client.ready().await.unwrap();
    let codec = ProstCodec::<Msg, Msg>::default();
    let resp = client.server_streaming(Request::new(msg(text)), path(method), codec);
    resp.await.unwrap().into_inner()
}

async fn all_four_kinds(client: &mut Client, label: &str) {
    assert_eq!(
        unary(client, "hi", None).await.unwrap(),
        "echo hi",
        "{label}"
    );

    let stream = server_stream(client, "Count", "5").await;
    let got: Vec<String> = stream.map(|m| m.unwrap().text).collect().await;
    assert_eq!(got, ["0", "1", "2", "3", "4"], "{label}: server streaming");

    client.ready().await.unwrap();
    let parts = futures_util::stream::iter(["a", "b", "c"].map(msg));
    let resp = client
        .client_streaming(
            Request::new(parts),
            path("Join"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .unwrap();
    assert_eq!(resp.into_inner().text, "a+b+c", "{label}: client streaming");

    client.ready().await.unwrap();
    let words = futures_util::stream::iter(["x", "yz"].map(msg));
    let resp = client
        .streaming(
            Request::new(words),
            path("Shout"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .unwrap();
    let got: Vec<String> = resp.into_inner().map(|m| m.unwrap().text).collect().await;
    assert_eq!(got, ["X", "YZ"], "{label}: bidi");

    // A trailers-only error passes unchanged; the client's deadline reaches the backend.
    let err = unary(client, "fail", None).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::NotFound, "no such thing"),
        "{label}"
    );
    let seen = unary(client, "deadline", Some(Duration::from_millis(1500)))
        .await
        .unwrap();
    // grpc-timeout is digits and a unit (H, M, S, m, u, n); 1.5 s in whatever unit tonic chose.
    let (digits, unit) = seen.split_at(seen.len().saturating_sub(1));
    let scale = match unit {
        "S" => 1e9,
        "m" => 1e6,
        "u" => 1e3,
        "n" => 1.0,
        _ => 0.0,
    };
    let nanos = digits.parse::<f64>().unwrap_or(0.0) * scale;
    assert!(
        (1.0e9..=1.5e9).contains(&nanos),
        "{label}: backend saw grpc-timeout {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2c_and_tls_with_no_grpc_config() {
    let backend = grpc_backend().await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "grpc", &["grpc.local"]);
    let route = |server: String| Host::new().path("/", Path::addrs(&[server]).healthcheck(false));
    let yaml = Upstreams::new()
        .host("grpc.local", route(format!("h2c://{backend}")))
        // No scheme and no health checks: detected on first use all the same (before, this
        // backend got HTTP/1.1 and every call failed).
        .host("bare.local", route(backend.to_string()))
        .host("down.local", route("h2c://127.0.0.1:1".into()))
        .render();
    let main = format!(
        "access_log: error\nproxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&yaml, &main);

    let plain = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .origin("http://grpc.local".parse().unwrap())
        .connect()
        .await
        .unwrap();
    all_four_kinds(&mut tonic::client::Grpc::new(plain), "h2c").await;
    let bare = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .origin("http://bare.local".parse().unwrap())
        .connect()
        .await
        .unwrap();
    all_four_kinds(&mut tonic::client::Grpc::new(bare), "detected, unchecked").await;

    let tls_addr = proxy.logged_addr("listening on https://");
    let pem = pem_of(&root);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name("grpc.local");
    let secure = tonic::transport::Channel::from_shared(format!("https://{tls_addr}"))
        .unwrap()
        .origin("https://grpc.local".parse().unwrap())
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    all_four_kinds(&mut tonic::client::Grpc::new(secure), "tls").await;

    // No reachable backend: HTTP 200 with grpc-status 14 (UNAVAILABLE), not an HTML page.
    let down = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .origin("http://down.local".parse().unwrap())
        .connect()
        .await
        .unwrap();
    let err = unary(&mut tonic::client::Grpc::new(down), "hi", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // ... logged (`access_log: error`) as the 5xx it stands for; the calls answered are not.
    proxy
        .wait_log("host=\"down.local\"", Duration::from_secs(5))
        .await;
    let log = proxy.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("host=\"down.local\""))
        .unwrap();
    assert!(line.contains(" status=50"), "{line}");
    assert!(!log.contains("host=\"grpc.local\""), "{log}");
}

/// A client on the plain listener for `authority`.
async fn plain_client(proxy: &ProxyProcess, authority: &str) -> Client {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .origin(format!("http://{authority}").parse().unwrap())
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_to_detected_and_tls_backends_with_deadlines_and_cancellation() {
    let h2c = grpc_backend().await;
    let tls = tls_grpc_backend().await;
    // No scheme and health checks on: detected (h2c by the preface; TLS by the handshake).
    let route = |server: String| Host::new().path("/", Path::addrs(&[server]).hc_interval(1));
    let yaml = Upstreams::new()
        .host("h2c.local", route(h2c.to_string()))
        .host("tls.local", route(tls.to_string()))
        .host("pinned-tls.local", route(format!("https://{tls}")))
        .render();
    let proxy = ProxyProcess::start(&yaml, "");
    for host in ["h2c.local", "tls.local", "pinned-tls.local"] {
        all_four_kinds(&mut plain_client(&proxy, host).await, host).await;
    }

    let mut client = plain_client(&proxy, "h2c.local").await;
    // A DEADLINE_EXCEEDED from the backend passes unchanged.
    let err = unary(&mut client, "expire", None).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::DeadlineExceeded, "deadline passed at the backend")
    );
    // The client's deadline expires first: the proxy cancels the backend's call.
    let before = CANCELLED_AT_BACKEND.load(Ordering::SeqCst);
    let err = unary(&mut client, "hang", Some(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(
        backend_cancels_since(before).await,
        "the backend's call was not cancelled after the deadline"
    );

    // A server stream the client drops is reset at the backend too.
    let before = CANCELLED_AT_BACKEND.load(Ordering::SeqCst);
    let mut stream = server_stream(&mut client, "Forever", "").await;
    for _ in 0..3 {
        stream.next().await.unwrap().unwrap();
    }
    drop(stream);
    assert!(
        backend_cancels_since(before).await,
        "the backend's stream was not reset after the client cancelled"
    );
}

/// Whether the backend counts a cancelled call beyond `before` within 3 s.
async fn backend_cancels_since(before: usize) -> bool {
    eventually(Duration::from_secs(3), || {
        CANCELLED_AT_BACKEND.load(Ordering::SeqCst) > before
    })
    .await
}

fn pem_of(der: &rustls_pki_types::CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}
