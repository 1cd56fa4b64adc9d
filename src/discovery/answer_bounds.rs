//! Bounds on each answer of the Kubernetes API server, as a layer under kube's client: at most
//! [`MAX_ANSWER_BYTES`] and one deadline for the whole answer, body included (kube's own
//! timeouts are per read, so a body that trickles a byte at a time never ends, and a line with
//! no end grew in memory without limit). A watch may stay open for its server-side timeout
//! (kube asks for 290 s), and one that ends sooner than [`MIN_WATCH`] after it began is held
//! to it: kube starts the next watch at once when one ends cleanly, so a server that closes
//! each watch at once was asked thousands of times a second. So is one cut mid-answer (kube
//! takes the cut for an end and says nothing): it is held alike, and said, at most once a
//! minute with a count.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::vocab::said_every::SaidEvery;

/// The largest answer read.
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;
/// The whole of an answer that is not a watch.
pub const LIST_DEADLINE: Duration = Duration::from_secs(60);
/// The whole of a watch: kube's 290 s server-side timeout, and some slack.
pub const WATCH_DEADLINE: Duration = Duration::from_secs(330);
/// The least time a watch lasts.
pub const MIN_WATCH: Duration = Duration::from_secs(1);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an answer was cut.
#[derive(Debug, thiserror::Error)]
pub enum Cut {
    #[error("the answer is larger than {} MiB", MAX_ANSWER_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("the answer did not end within {0:?}")]
    TooSlow(Duration),
}

/// How often a watch cut mid-answer is said at most.
const CUTS_SAID_EVERY: Duration = Duration::from_secs(60);

/// Wraps every answer of the inner service in an [`AnswerBody`].
#[derive(Clone)]
pub struct AnswerBoundsLayer {
    cuts: Arc<SaidEvery>,
}

impl AnswerBoundsLayer {
    pub fn new() -> AnswerBoundsLayer {
        AnswerBoundsLayer {
            cuts: Arc::new(SaidEvery::new(CUTS_SAID_EVERY)),
        }
    }
}

impl<S> Layer<S> for AnswerBoundsLayer {
    type Service = AnswerBounds<S>;

    fn layer(&self, inner: S) -> AnswerBounds<S> {
        AnswerBounds {
            inner,
            cuts: self.cuts.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AnswerBounds<S> {
    inner: S,
    cuts: Arc<SaidEvery>,
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for AnswerBounds<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<AnswerBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let limit = if watch { WATCH_DEADLINE } else { LIST_DEADLINE };
        let began = Instant::now();
        let deadline = began + limit;
        let answer = self.inner.call(req);
        let cuts = watch.then(|| self.cuts.clone());
        Box::pin(async move {
            let resp = tokio::time::timeout_at(deadline, answer)
                .await
                .map_err(|_| Box::new(Cut::TooSlow(limit)) as BoxError)?
                .map_err(Into::into)?;
            let ends_no_sooner = watch.then(|| began + MIN_WATCH);
            Ok(resp.map(|inner| AnswerBody {
                inner,
                read: 0,
                limit,
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
                ends_no_sooner,
                ending: None,
                cuts,
            }))
        })
    }
}

/// An answer's body, cut when it grows past [`MAX_ANSWER_BYTES`] or outlasts its deadline.
pub struct AnswerBody<B> {
    inner: B,
    read: u64,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    /// A watch's end is held until then.
    ends_no_sooner: Option<Instant>,
    /// The inner body has ended, cleanly or with an error; its end waits for
    /// `ends_no_sooner`, on the deadline's timer.
    ending: Option<Option<BoxError>>,
    /// Where a watch's cuts are said (none for other answers).
    cuts: Option<Arc<SaidEvery>>,
}

impl<B> AnswerBody<B> {
    /// The inner body ended (with `error`, if it was cut): the end now, or held on the
    /// deadline's timer until `ends_no_sooner` (pending then).
    fn end(&mut self, error: Option<BoxError>, cx: &mut Context<'_>) -> Poll<Option<BoxError>> {
        if let (Some(e), Some(cuts)) = (&error, &self.cuts) {
            if let Some(since) = cuts.due_note(Instant::now()) {
                tracing::warn!("kubernetes: a watch was cut before its end: {e}; each is watched again a second after it began at the soonest{since}");
            }
        }
        match self.ends_no_sooner.filter(|at| Instant::now() < *at) {
            Some(at) => {
                self.deadline.as_mut().reset(at);
                self.ending = Some(error);
                self.held_end(cx)
            }
            None => Poll::Ready(error),
        }
    }

    /// The held end, once its time has come.
    fn held_end(&mut self, cx: &mut Context<'_>) -> Poll<Option<BoxError>> {
        std::task::ready!(self.deadline.as_mut().poll(cx));
        Poll::Ready(self.ending.take().flatten())
    }
}

impl<B> Body for AnswerBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ending.is_some() {
            return this.held_end(cx).map(|e| e.map(Err));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(Cut::TooSlow(this.limit)))));
        }
        let frame = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return this.end(Some(e.into()), cx).map(|e| e.map(Err)),
            None => return this.end(None, cx).map(|e| e.map(Err)),
        };
        if let Some(data) = frame.data_ref() {
            this.read = this.read.saturating_add(data.len() as u64);
            if this.read > MAX_ANSWER_BYTES {
                return Poll::Ready(Some(Err(Box::new(Cut::TooLarge))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        // A watch's end may have to wait: it is only said by its last poll.
        self.ends_no_sooner.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty, StreamBody};

    type Boxed = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

    fn bounded(inner: Boxed, watch: bool) -> AnswerBody<Boxed> {
        let began = Instant::now();
        let limit = if watch { WATCH_DEADLINE } else { LIST_DEADLINE };
        AnswerBody {
            inner,
            read: 0,
            limit,
            deadline: Box::pin(tokio::time::sleep_until(began + limit)),
            ends_no_sooner: watch.then(|| began + MIN_WATCH),
            ending: None,
            cuts: watch.then(|| Arc::new(SaidEvery::new(CUTS_SAID_EVERY))),
        }
    }

    /// A byte now and then, never the end: cut at the deadline, however steady the trickle.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_answer_is_cut_at_its_deadline() {
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"x"))), ()))
        });
        let started = Instant::now();
        let read = bounded(StreamBody::new(trickle).boxed_unsync(), false)
            .collect()
            .await;
        let error = read.expect_err("cut").to_string();
        assert!(error.contains("did not end within 60s"), "{error}");
        assert_eq!(started.elapsed(), LIST_DEADLINE);
    }

    /// A watch that ends at once ends a second after it began.
    #[tokio::test(start_paused = true)]
    async fn a_short_watch_ends_no_sooner_than_a_second() {
        let started = Instant::now();
        let empty = Empty::new().map_err(|never| match never {}).boxed_unsync();
        bounded(empty, true).collect().await.expect("a clean end");
        assert_eq!(started.elapsed(), MIN_WATCH);
        let empty = Empty::new().map_err(|never| match never {}).boxed_unsync();
        let started = Instant::now();
        bounded(empty, false).collect().await.expect("a clean end");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    /// A watch cut mid-answer (kube takes the cut for an end and watches again at once) ends
    /// no sooner than a clean one: a server that cut each watch was asked 1,400 times a second.
    #[tokio::test(start_paused = true)]
    async fn a_watch_cut_at_once_ends_no_sooner_than_a_second() {
        let cut = futures_util::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"{\"type\":\"MODIF"))),
            Err::<Frame<Bytes>, BoxError>("connection closed before message completed".into()),
        ]);
        let started = Instant::now();
        let read = bounded(StreamBody::new(cut).boxed_unsync(), true)
            .collect()
            .await;
        let error = read.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("before message completed"), "{error}");
        assert_eq!(started.elapsed(), MIN_WATCH);
    }
}
