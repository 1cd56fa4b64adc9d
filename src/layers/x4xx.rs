//! `x4xx_limit` (SPEC §8.3): 4xx responses per second tolerated per client IP and host. Past
//! that, every request gets [`ProxyError::TooMany4xx`] (429, `Retry-After: 1`) until the client
//! has been quiet for a second. Counters live in one process-wide table (built at start, passed in;
//! all workers).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::limiter::{Rate, Strikes, Table};
use super::shared_limits::{Counter, SharedLimits};
use crate::vocab::ProxyError;

/// A route's compiled 4xx limit.
#[derive(Debug)]
pub struct X4xxLimit {
    pub rate: Rate,
    scope: u64,
    table: Arc<Table<Strikes>>,
    /// `limits_store`: 4xx answers counted across instances, blocks shared.
    shared: Option<Arc<SharedLimits>>,
}

impl X4xxLimit {
    /// A limit counting in `table`, the one table of its kind built at start and shared by
    /// every route and worker, so a limit holds process-wide.
    pub fn new(rate: Rate, scope: u64, table: Arc<Table<Strikes>>) -> X4xxLimit {
        X4xxLimit {
            rate,
            scope,
            table,
            shared: None,
        }
    }

    /// The same limit counted across instances through `shared`, when given.
    pub fn shared(mut self, shared: Option<Arc<SharedLimits>>) -> X4xxLimit {
        self.shared = shared;
        self
    }

    /// Counts a 4xx answer to `ip`, here and (when shared) in Redis.
    fn record(&self, key: u64, ip: std::net::IpAddr) {
        self.table.record_4xx(key, self.rate);
        if let Some(shared) = &self.shared {
            let (scope, rate) = (self.scope, self.rate);
            shared.record_4xx(Counter { ip, scope, rate });
        }
    }
}

/// Applies a route's 4xx limit (or nothing) to one client's requests.
#[derive(Clone, Copy)]
pub struct X4xxLayer<'a> {
    limit: Option<&'a X4xxLimit>,
    client: IpAddr,
}

impl<'a> X4xxLayer<'a> {
    pub fn new(limit: Option<&'a X4xxLimit>, client: IpAddr) -> Self {
        X4xxLayer { limit, client }
    }
}

impl<'a, S> Layer<S> for X4xxLayer<'a> {
    type Service = X4xxService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        X4xxService {
            limit: self.limit,
            client: self.client,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct X4xxService<'a, S> {
    limit: Option<&'a X4xxLimit>,
    client: IpAddr,
    inner: S,
}

type Answer<R> = Result<Response<R>, ProxyError>;

impl<'a, S, B, R> Service<Request<B>> for X4xxService<'a, S>
where
    S: Service<Request<B>, Response = Response<R>, Error = ProxyError>,
{
    type Response = Response<R>;
    type Error = ProxyError;
    type Future = Either<Ready<Answer<R>>, Either<Counting<'a, S::Future>, S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(limit) = self.limit else {
            return Either::Right(Either::Right(self.inner.call(req)));
        };
        let key = limit.table.key((self.client, limit.scope));
        if !limit.table.admit_4xx(key) {
            return Either::Left(ready(Err(ProxyError::TooMany4xx)));
        }
        Either::Right(Either::Left(Counting {
            inner: self.inner.call(req),
            limit,
            key,
            client: self.client,
        }))
    }
}

pin_project! {
    /// The inner answer, with a 4xx counted against the client.
    pub struct Counting<'a, F> {
        #[pin]
        inner: F,
        limit: &'a X4xxLimit,
        key: u64,
        client: IpAddr,
    }
}

impl<F, R> Future for Counting<'_, F>
where
    F: Future<Output = Answer<R>>,
{
    type Output = Answer<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.inner.poll(cx));
        let status = match &answer {
            Ok(resp) => resp.status(),
            // The route's own `rate_limit` refusing a client a little over its rate: counted,
            // they kept it blocked for as long as it kept sending, not served at its rate.
            Err(ProxyError::RateLimited) => return Poll::Ready(answer),
            Err(err) => err.status(),
        };
        if status.is_client_error() {
            this.limit.record(*this.key, *this.client);
        }
        Poll::Ready(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::ServiceExt;

    /// An inner service answering with the status given in the request's URI path (`/404`).
    fn inner(
        count: Arc<AtomicUsize>,
    ) -> impl Service<
        Request<()>,
        Response = Response<()>,
        Error = ProxyError,
        Future = Ready<Answer<()>>,
    > + Clone {
        tower::service_fn(move |req: Request<()>| {
            count.fetch_add(1, Ordering::SeqCst);
            let code: u16 = req.uri().path()[1..].parse().unwrap_or(200);
            let mut resp = Response::new(());
            *resp.status_mut() = http::StatusCode::from_u16(code).unwrap();
            ready(Ok::<_, ProxyError>(resp))
        })
    }

    async fn send(limit: &X4xxLimit, ip: [u8; 4], path: &str, count: &Arc<AtomicUsize>) -> u16 {
        let req = Request::builder().uri(path).body(()).unwrap();
        match X4xxLayer::new(Some(limit), IpAddr::from(ip))
            .layer(inner(count.clone()))
            .oneshot(req)
            .await
        {
            Ok(resp) => resp.status().as_u16(),
            Err(err) => err.status().as_u16(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn too_many_4xx_block_until_a_quiet_second() {
        let table = Arc::new(Table::new());
        let limit = X4xxLimit::new(Rate::per_second(2).unwrap(), 9, table);
        let count = Arc::new(AtomicUsize::new(0));
        let me = [127, 0, 0, 2];
        // 2xx answers never count.
        for _ in 0..20 {
            assert_eq!(send(&limit, me, "/200", &count).await, 200);
        }
        assert_eq!(send(&limit, me, "/404", &count).await, 404);
        assert_eq!(
            send(&limit, me, "/401", &count).await,
            401,
            "the second 4xx still goes out (two are tolerated)"
        );
        let before = count.load(Ordering::SeqCst);
        assert_eq!(
            send(&limit, me, "/200", &count).await,
            429,
            "then the client is blocked"
        );
        assert_eq!(
            count.load(Ordering::SeqCst),
            before,
            "blocked requests stay in the proxy"
        );
        assert_eq!(
            send(&limit, [127, 0, 0, 3], "/200", &count).await,
            200,
            "others are not"
        );
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(
            send(&limit, me, "/200", &count).await,
            429,
            "knocking restarts the quiet second"
        );
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(send(&limit, me, "/200", &count).await, 429);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            send(&limit, me, "/200", &count).await,
            200,
            "free after a quiet second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn proxy_errors_in_the_4xx_range_count_too() {
        let table = Arc::new(Table::new());
        let limit = X4xxLimit::new(Rate::per_second(1).unwrap(), 9, table);
        let failing = tower::service_fn(|_req: Request<()>| {
            ready(Err::<Response<()>, _>(ProxyError::TokenRequired))
        });
        let ip = IpAddr::from([10, 1, 1, 1]);
        for expected in [ProxyError::TokenRequired, ProxyError::TooMany4xx] {
            let got = X4xxLayer::new(Some(&limit), ip)
                .layer(failing)
                .oneshot(Request::new(()))
                .await;
            assert_eq!(got.unwrap_err(), expected);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limits_own_refusals_do_not_count() {
        let table = Arc::new(Table::new());
        let limit = X4xxLimit::new(Rate::per_second(1).unwrap(), 9, table);
        let limited = tower::service_fn(|_req: Request<()>| {
            ready(Err::<Response<()>, _>(ProxyError::RateLimited))
        });
        let ip = IpAddr::from([10, 1, 1, 2]);
        for _ in 0..10 {
            let got = X4xxLayer::new(Some(&limit), ip)
                .layer(limited)
                .oneshot(Request::new(()))
                .await;
            assert_eq!(
                got.unwrap_err(),
                ProxyError::RateLimited,
                "never TooMany4xx"
            );
        }
    }
}
