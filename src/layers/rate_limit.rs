//! `rate_limit` (SPEC §8.3): requests per second per client IP and host, with a burst of the same
//! size; over it, [`ProxyError::RateLimited`] (429, `Retry-After: 1`) and the request goes no
//! further. The counters live in one process-wide [`Table`] (built at start, passed in), so the limit holds
//! across workers.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use http::Request;
use tower::{Layer, Service};

use super::limiter::{Rate, Table, Tat};
use super::shared_limits::{Counter, SharedLimits, Verdict};
use crate::vocab::ProxyError;

/// A route's compiled rate limit.
#[derive(Debug)]
pub struct RateLimit {
    pub rate: Rate,
    /// Which host (or path) the counters belong to.
    scope: u64,
    table: Arc<Table<Tat>>,
    /// `limits_store`: counted across instances.
    shared: Option<Arc<SharedLimits>>,
}

impl RateLimit {
    /// A limit counting in `table`, the one table of its kind built at start and shared by
    /// every route and worker, so a limit holds process-wide.
    pub fn new(rate: Rate, scope: u64, table: Arc<Table<Tat>>) -> RateLimit {
        RateLimit {
            rate,
            scope,
            table,
            shared: None,
        }
    }

    /// The same limit counted across instances through `shared`, when given.
    pub fn shared(mut self, shared: Option<Arc<SharedLimits>>) -> RateLimit {
        self.shared = shared;
        self
    }

    fn verdict(&self, ip: IpAddr) -> Verdict {
        let (scope, rate) = (self.scope, self.rate);
        match &self.shared {
            Some(shared) => shared.check(Counter { ip, scope, rate }),
            None if self.table.admit(self.table.key((ip, scope)), rate) => Verdict::Admit,
            None => Verdict::Refuse,
        }
    }
}

/// Applies a route's rate limit (or nothing) to one client's requests.
#[derive(Clone, Copy)]
pub struct RateLimitLayer<'a> {
    limit: Option<&'a RateLimit>,
    client: IpAddr,
    /// The worker serving the request (its Redis connection).
    slot: usize,
}

impl<'a> RateLimitLayer<'a> {
    pub fn new(limit: Option<&'a RateLimit>, client: IpAddr, slot: usize) -> Self {
        RateLimitLayer {
            limit,
            client,
            slot,
        }
    }
}

impl<'a, S> Layer<S> for RateLimitLayer<'a> {
    type Service = RateLimitService<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            layer: *self,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct RateLimitService<'a, S> {
    layer: RateLimitLayer<'a>,
    inner: S,
}

type Answer<R> = Result<R, ProxyError>;
/// A request waiting for Redis's decision, then the inner answer.
type Asking<'a, R> = Pin<Box<dyn Future<Output = Answer<R>> + Send + 'a>>;

impl<'a, S, B> Service<Request<B>> for RateLimitService<'a, S>
where
    S: Service<Request<B>, Error = ProxyError> + Clone + Send + 'a,
    S::Future: Send + 'a,
    B: Send + 'a,
{
    type Response = S::Response;
    type Error = ProxyError;
    type Future = Either<Ready<Answer<S::Response>>, Either<S::Future, Asking<'a, S::Response>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(limit) = self.layer.limit else {
            return Either::Right(Either::Left(self.inner.call(req)));
        };
        match limit.verdict(self.layer.client) {
            Verdict::Admit => Either::Right(Either::Left(self.inner.call(req))),
            Verdict::Refuse => Either::Left(ready(Err(ProxyError::RateLimited))),
            Verdict::Ask(counter, unseen) => {
                let Some(shared) = limit.shared.as_deref() else {
                    return Either::Right(Either::Left(self.inner.call(req)));
                };
                // The ready service goes to the request; its clone stays for the next.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let slot = self.layer.slot;
                Either::Right(Either::Right(Box::pin(async move {
                    if shared.ask(counter, unseen, slot).await {
                        inner.call(req).await
                    } else {
                        Err(ProxyError::RateLimited)
                    }
                })))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::ServiceExt;

    fn counting_inner(
        count: Arc<AtomicUsize>,
    ) -> impl Service<
        Request<()>,
        Response = u16,
        Error = ProxyError,
        Future = Ready<Result<u16, ProxyError>>,
    > + Clone {
        tower::service_fn(move |_req: Request<()>| {
            count.fetch_add(1, Ordering::SeqCst);
            ready(Ok::<_, ProxyError>(200u16))
        })
    }

    async fn send(
        limit: Option<&RateLimit>,
        ip: [u8; 4],
        inner_count: &Arc<AtomicUsize>,
    ) -> Result<u16, ProxyError> {
        RateLimitLayer::new(limit, IpAddr::from(ip), 0)
            .layer(counting_inner(inner_count.clone()))
            .oneshot(Request::new(()))
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn ten_per_second_then_429_and_back_after_a_second() {
        let table = Arc::new(Table::new());
        let limit = RateLimit::new(Rate::per_second(10).unwrap(), 1, table);
        let inner = Arc::new(AtomicUsize::new(0));
        let mut results = Vec::new();
        for _ in 0..12 {
            results.push(send(Some(&limit), [127, 0, 0, 2], &inner).await);
        }
        assert!(results[..10].iter().all(|r| *r == Ok(200)));
        assert_eq!(results[10..], [Err(ProxyError::RateLimited); 2]);
        assert_eq!(
            inner.load(Ordering::SeqCst),
            10,
            "refused requests never reach the inner service"
        );
        assert_eq!(
            send(Some(&limit), [127, 0, 0, 3], &inner).await,
            Ok(200),
            "another client is not affected"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..10 {
            assert_eq!(send(Some(&limit), [127, 0, 0, 2], &inner).await, Ok(200));
        }
        assert_eq!(
            send(Some(&limit), [127, 0, 0, 2], &inner).await,
            Err(ProxyError::RateLimited)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_passes_everything() {
        let inner = Arc::new(AtomicUsize::new(0));
        for _ in 0..1000 {
            assert_eq!(send(None, [127, 0, 0, 2], &inner).await, Ok(200));
        }
        assert_eq!(inner.load(Ordering::SeqCst), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn scopes_count_separately() {
        let table = Arc::new(Table::new());
        let rate = Rate::per_second(1).unwrap();
        let (a, b) = (
            RateLimit::new(rate, 1, table.clone()),
            RateLimit::new(rate, 2, table),
        );
        let inner = Arc::new(AtomicUsize::new(0));
        assert_eq!(send(Some(&a), [10, 0, 0, 1], &inner).await, Ok(200));
        assert_eq!(
            send(Some(&a), [10, 0, 0, 1], &inner).await,
            Err(ProxyError::RateLimited)
        );
        assert_eq!(send(Some(&b), [10, 0, 0, 1], &inner).await, Ok(200));
    }
}
