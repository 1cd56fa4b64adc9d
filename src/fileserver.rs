//! The built-in static file server (SPEC §10): GET/HEAD, content types, ranges, conditional
//! requests and `index.html` through tower-http's `ServeDir`; no listings, no dotfiles, no escape
//! from the folder. It runs on the control-plane runtime, off the proxy's workers.

use std::convert::Infallible;
use std::path::PathBuf;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tower::ServiceExt;
use tower_http::services::ServeDir;

use crate::routing::normalise;

type FileBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Serves `folder` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, folder: PathBuf) {
    let dir = ServeDir::new(folder).append_index_html_on_directories(true);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!("file server: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let dir = dir.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let dir = dir.clone();
                async move { Ok::<_, Infallible>(answer(dir, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(dir: ServeDir, req: Request<Incoming>) -> Response<FileBody> {
    if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
    }
    let path = normalise::path(req.uri().path());
    if path.split('/').any(|segment| segment.starts_with('.')) {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    }
    match dir.oneshot(req).await {
        Ok(resp) => resp.map(|b| b.map_err(std::io::Error::other).boxed_unsync()),
        Err(never) => match never {},
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<FileBody> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}
